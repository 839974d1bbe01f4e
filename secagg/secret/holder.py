"""The base of every key-holding client half (``ckks``, ``threshold``): what both hold and
check the same way.

A key-holding half is built from its client id, its backend's parameter set, its
:class:`~secagg.backends.Provision` whole (from the client's own configuration, never from
a server) and its backend's resolved options. :class:`KeyHoldingClient` owns what both
halves hold alike:

- the X25519 identity (:class:`~secagg.secret.keywrap.KeyWrapper`) and the roster of the
  run's identities, checked to list this client's own key;
- the Ed25519 signing key, the signers' roster and the release policy
  (:func:`~secagg.secret.consenting.release_identity`: the options' ``min_contributors``,
  ``min_weight_share`` and ``max_weight_share``, the preset's weight bound, the colluders
  the backend withstands);
- the budgets (reveals, opens) and the releases one upload may enter;
- the consent records (each upload's releases, basis, applied weight, origin) and the
  consent it signs;
- the common part of its exported state (:class:`~secagg.secret.consenting.HolderState`).

A subclass keeps what its backend does differently: its keys or shares, its handlers, its
uploads and openings, and its own parts of the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from secagg.backends import Provision
from secagg.backends.base import ClientBackend
from secagg.backends.coalition import RunLedger, participation_groups
from secagg.ckks.release import Descriptor
from secagg.errors import KeySetupError, ProtocolStateError
from secagg.secret.consenting import (
    HolderState,
    check_listed_weight,
    consent,
    public_bytes,
    release_identity,
)
from secagg.secret.keywrap import KeyWrapper
from secagg.wire import Envelope, Field


class KeyHoldingClient(ClientBackend):
    """A client half that holds a client's identity and signing key (see the module)."""

    #: the backend as a restored state's errors name it ("CKKS", "threshold")
    STATE_BACKEND: ClassVar[str]
    #: this half's own parts of its state, besides every key-holding half's (HolderState)
    STATE_EXTRAS: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, client_id: str, preset: Any, provision: Provision, options: Mapping[str, Any]
    ):
        """``provision``: this client's identity and roster (without an identity, a fresh
        one; without a roster, the client knows only itself), its signing key and the
        signers' roster (likewise), its budgets and ``releases_per_upload``; ``options``:
        the backend's resolved options (its release policy: ``min_contributors``,
        ``min_weight_share``, ``max_weight_share``)."""
        self.id = client_id
        self.preset = preset
        self._identity = (
            KeyWrapper.from_private_bytes(provision.identity)
            if provision.identity is not None
            else KeyWrapper()
        )
        self.roster = (
            dict(provision.roster) if provision.roster else {client_id: self._identity.public_bytes}
        )
        if self.roster.get(client_id) != self._identity.public_bytes:
            raise KeySetupError(f"{client_id}'s identity key is not its key in the roster")
        colluders = self._colluders(options)
        for what, count in (
            ("open_budget", provision.open_budget),
            ("decryption_budget", provision.decryption_budget),
        ):
            if not isinstance(count, int) or count < 0:
                raise KeySetupError(f"{what} must be a count, got {count!r}")
        self.decryption_budget, self.decryptions = provision.decryption_budget, 0
        self.open_budget, self.opens = provision.open_budget, 0
        self.reveal_length = provision.reveal_length
        self._signer, self.signers, self.policy = release_identity(
            client_id,
            provision.signing_key,
            provision.signers or None,
            options["min_contributors"],
            options["min_weight_share"],
            provision.reveal_length,
            options["max_weight_share"],
            max_weight=preset.max_weight,
            colluders=colluders,
        )
        self.releases_per_upload = dict(provision.releases_per_upload or {"reveal": 1, "open": 1})
        #: digest of each upload this client made -> releases it consented to, by kind
        self.uploads: dict[str, dict[str, int]] = {}
        #: digest of each upload -> what it was made from (``secagg.clients.policy``)
        self.bases: dict[str, str] = {}
        #: on a client-weighted preset, digest of each upload -> the integer weight applied
        self.applied: dict[str, int] = {}
        #: digest of each upload -> the descriptors of the releases it entered
        self.released: dict[str, list[dict[str, Any]]] = {}
        #: digest of each upload -> the request it answered (``protect``'s ``request``)
        self.origins: dict[str, str] = {}
        #: what its next uploads answer and are made from (``note_source``): their stream
        self._source: tuple[str, str] = ("", "")
        #: every release of the run this client entered (the run rule: ``coalition``)
        self.ledger = RunLedger(
            options.get("participation", "fixed"),
            provision.weights_vary,
            self._own_group(options, colluders),
        )

    def _own_group(self, options: Mapping[str, Any], colluders: int) -> list[str]:
        """With ``participation="groups"``, this client's group of the signers' roster
        (``coalition.participation_groups``: public, from names alone); KeySetupError if it
        cannot hide an upload among ``min_contributors`` honest ones whoever the colluders
        are (a group smaller than colluders + min_contributors)."""
        if options.get("participation") != "groups":
            return []
        try:
            dealt = participation_groups(list(self.signers), options["participation_groups"])
        except ValueError as exc:
            raise KeySetupError(f"{self.id}: {exc}") from None
        group = sorted(c for c, g in dealt.items() if g == dealt.get(self.id))
        need = colluders + options["min_contributors"]
        if len(group) < need:
            raise KeySetupError(
                f"{self.id}: its participation group has {len(group)} clients; with up to "
                f"{colluders} colluding, a group must hold {need} (fewer groups, or a lower t)"
            )
        return group

    def _colluders(self, options: Mapping[str, Any]) -> int:
        """How many colluding clients every release must withstand (``ReleasePolicy``),
        from the roster (set by now) and ``options``: none unless the backend says so."""
        return 0

    @property
    def signing_public(self) -> bytes:
        return public_bytes(self._signer)

    @property
    def params(self) -> str:
        """The fingerprint of this half's parameters, as its state records it."""
        raise NotImplementedError

    # ---- state between messages ------------------------------------------------------------
    def _held_state(self) -> dict[str, Any]:
        """The common part of :meth:`state_dict` (its private keys are secret bytes)."""
        held = HolderState(
            self._identity,
            self._signer,
            self.decryptions,
            self.opens,
            self.uploads,
            self.bases,
            self.applied,
            self.released,
            self.origins,
            self.ledger,
        )
        return held.export(self.preset.name, self.params)

    def _restored(self, state: Mapping[str, Any]) -> HolderState:
        """The common part of ``state``, checked (nothing assigned yet)."""
        return HolderState.restore(
            self.id,
            state,
            backend=self.STATE_BACKEND,
            preset=self.preset.name,
            params=self.params,
            extras=self.STATE_EXTRAS,
            roster=self.roster,
            signers=self.signers,
            ledger=RunLedger(
                self.ledger.participation, self.ledger.weights_vary, self.ledger.group
            ),
        )

    def _take(self, held: HolderState) -> None:
        """Assign a checked :meth:`_restored` common part."""
        self._identity, self._signer = held.identity, held.signer
        self.uploads, self.bases, self.applied = held.uploads, held.bases, held.applied
        self.released, self.origins = held.released, held.origins
        self.ledger = held.ledger
        self.decryptions, self.opens = held.decryptions, held.opens

    # ---- uploads and releases --------------------------------------------------------------
    def _record_upload(
        self, digest: str, basis: str, request: str, applied: int | None, n_values: int
    ) -> None:
        """Remember an upload this client made: what it was made from, the request it
        answered, its stream (its length: the run ledger's unknown vector) and, on a
        client-weighted preset, the integer weight applied to it."""
        self.uploads[digest], self.bases[digest] = {}, basis
        self.ledger.uploaded(digest, n_values, *self._source)
        self.origins[digest] = request
        if applied is not None:
            self.applied[digest] = applied

    def _check_open_budget(self) -> None:
        if self.opens >= self.open_budget:
            raise ProtocolStateError(
                f"{self.id} refuses to open aggregate {self.opens + 1}: its configuration "
                f"allows {self.open_budget}"
            )

    def check_own_weight(self, envelope: Envelope, name: str, weight: float) -> None:
        check_listed_weight(
            self.id, envelope.config(f"{name}.release"), weight, self.preset.max_weight
        )

    def on_consent(self, env: Envelope) -> dict[str, Field]:
        """Sign a release descriptor that holds this client's upload, once per kind per
        upload, if this client's policy accepts the sum it describes."""
        return consent(
            self.id,
            Descriptor.from_config(env.config("release")),
            policy=self.policy,
            uploads=self.uploads,
            bases=self.bases,
            releases_per_upload=self.releases_per_upload,
            signer=self._signer,
            applied=self.applied if self.preset.weighted_by_clients else None,
            released=self.released,
            origins=self.origins,
            roster=self.signers,
            ledger=self.ledger,
        )

    def note_source(self, phase: str, model_id: str | None) -> None:
        self._source = (phase, model_id or "")
