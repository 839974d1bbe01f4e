"""The backend contract: what a protocol's sums run on, and who may open them.

A backend has two halves that never live in the same process in a real deployment:

- :class:`ClientBackend`, in each client: turns a flat float vector into a wire field
  (``protect``) and reads an aggregate the server sent back (``open``). It may hold secret
  keys (or key shares).
- :class:`ServerBackend`, in the server: loads uploaded fields into opaque *handles*, forms
  weighted sums of handles, and ships a handle back as a field. It never holds a secret key;
  ``can_read`` says whether it can look inside a handle at all (only ``plain`` can).

**Key model** (``ServerBackend.key_model``) — who may open an aggregate:

- ``"none"``: nothing is encrypted (``plain``); the server reads every handle.
- ``"shared"``: every client holds the one secret key (``ckks``); any single client can
  open an aggregate: a client asked to reveal one for the server (a *decryptor*) decrypts
  it and floods the result, and a protocol's client half opens what the server sends it.
- ``"threshold"``: no client alone can; opening a sum takes t of the n clients' shares of
  its one-time key sum, combined by whoever is to learn the result.

**Reveal authorisation.** Whatever is opened — revealed to the server
(:meth:`ServerBackend.reveal`) or sent to clients to open themselves
(:meth:`ServerBackend.release`) — a key-holding client opens only what it can check: on
``ckks`` a weighted sum of uploads whose every contributor signed the same descriptor
(``secagg.ckks.release``; the threshold holders check the same), within its own policy and
budgets. The weights the engine
accounts are the round's (``RoundContext.releases``).

**Weights** of every sum satisfy |w| ≤ ``MAX_WEIGHT`` on every backend
(``secagg.server.round`` enforces it): encrypted sums need it for their headroom.

**Options**: each backend declares its own option group (:class:`BackendOption`), which the
registry (``secagg.backends.BACKENDS``) turns into CLI flags and config keys; the engine and
the CLI name no backend option themselves. A new backend is a module plus a registry entry.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from secagg.errors import ConfigError, ProtocolStateError
from secagg.options import Option
from secagg.wire import Envelope, Field

#: the largest |weight| a sum may use on any backend
MAX_WEIGHT = 1.0


#: one setting of a backend (config ``backend_options.<key>``, CLI ``--<flag>``)
BackendOption = Option


class ClientBackend(ABC):
    """A backend's client half: protects this client's vectors for upload and opens what
    the server sends back (the module docstring has the contract)."""

    name: str

    @abstractmethod
    def protect(
        self, values: np.ndarray, weight: float | None = None, *, basis: str = "", request: str = ""
    ) -> Field:
        """Encode (and, if the backend encrypts, encrypt) a flat vector for upload.
        ``weight``: the planned weight the server asks the client to apply itself (only a
        client-weighted CKKS preset does; the others refuse one, :func:`no_client_weight`).
        ``basis``: what the values were made from (``secagg.clients.policy.upload_basis``);
        ``request``: which request of this client they answer (a retried request is
        another: its upload of the same basis may not be released beside the first)."""

    @abstractmethod
    def open(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        """Read an aggregate field the server sent; decrypt it if needed."""

    def check_own_weight(self, envelope: Envelope, name: str, weight: float) -> None:
        """Refuse (ReleaseRefused) unless the release ``name`` in ``envelope`` lists this
        client's upload with ``weight`` (LARC's α: what the server claims it weighted the
        client with must be what the signed descriptor says). Plain sends no descriptor."""

    def handlers(self) -> dict[str, Callable[[Envelope], dict[str, Field]]]:
        """Phases the backend itself answers (key setup, reveals); none for plain."""
        return {}

    #: seconds spent on uploads' value-independent part, beside training (prepare_upload)
    offline_seconds: float = 0.0
    #: seconds spent opening released aggregates for the server (decrypt, flood, decode:
    #: a reveal's value-dependent floor, beside the checks its answer also makes)
    opening_seconds: float = 0.0

    def prepare_upload(self, n_values: int) -> None:
        """Start, beside the client's training, the part of its next upload of ``n_values``
        values that does not depend on them (``secagg.secret.ckks_masks``); the next
        :meth:`protect` of that size uses it. Nothing on a backend without such a part."""

    def note_source(self, phase: str, model_id: str | None) -> None:
        """What this client's next uploads are: answers to ``phase``, made from the model
        ``model_id`` (``secagg.clients.policy.model_identity``). A backend that keeps a run ledger
        counts a client's uploads of one phase as one vector over the run (of one model,
        where the protocol's weights vary: ``secagg.backends.coalition.RunLedger``).
        Nothing on a backend without consents."""

    def discard_prepared(self) -> None:
        """Wipe whatever :meth:`prepare_upload` made that no upload used: the client calls
        it at the end of every request, answered or refused."""

    #: whether this client lives to make its next upload in memory (False for a process
    #: that answers one message, as a Flower node's: what it committed would be lost)
    commits_ahead: bool = True

    def commit_next_upload(self, n_values: int) -> dict[str, Field]:
        """Reply fields a training upload carries about this client's next one (on ckks the
        seeds it will use: ``secagg.secret.ckks_masks``); none here."""
        return {}

    def prepare_release(self, envelope: Envelope, n_values: int) -> None:
        """Start, beside training, the check of a release the training request says this
        client will be asked to open (on ckks a precomputed check); nothing here."""

    def state_dict(self) -> dict[str, Any]:
        """What this half remembers between messages (keys, key setup, counters), for a
        client that runs as a fresh process per message (``Client.export_state``).

        Values are JSON-able, 1-D numpy arrays, or ``bytes`` (secret key material): the
        caller keeps secrets in opaque fields and the blob on the client's own node."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take over what :meth:`state_dict` exported; on error, leave this half as it was."""
        if state:
            raise ConfigError(
                f"the {self.name} client backend keeps no state, got "
                f"{sorted(state)}: restore a state exported by a {self.name} "
                "client"
            )


def no_client_weight(backend: str, weight: float | None) -> None:
    """A backend whose server weights the sums refuses a weight sent for the client."""
    if weight is not None:
        raise ProtocolStateError(
            f"the {backend} backend weights uploads on the server; refusing a weight "
            "sent for the client to apply"
        )


class ClientWeightedPreset(Protocol):
    """What a parameter set says about who weights a sum (ckks's and threshold's presets)."""

    @property
    def name(self) -> str: ...

    @property
    def weighted_by_clients(self) -> bool: ...

    @property
    def client_weight_unit(self) -> int: ...


def applied_weight(weight: float, preset: ClientWeightedPreset) -> int:
    """The integer k a client of a client-weighted preset multiplies its update by, as
    k / unit: a planned weight in (0, 1] (anything else is refused: the openers' headroom
    check needs the applied weights to add up to at most 1)."""
    unit = preset.client_weight_unit
    w = float(weight)
    k = int(math.floor(w * unit + 0.5)) if 0.0 < w <= 1.0 else 0
    if k == 0:
        raise ConfigError(
            f"a planned weight must lie in (0, 1] and be at least 1/{unit}; got {weight!r}"
        )
    return k


def own_weight(client_id: str, preset: ClientWeightedPreset, weight: float | None) -> int | None:
    """The integer weight a client applies before protecting (None where the server weights):
    a client-weighted preset needs the planned weight, the others refuse one."""
    if preset.weighted_by_clients != (weight is not None):
        raise ProtocolStateError(
            f"{client_id}: preset {preset.name!r} "
            + (
                "needs the upload's planned weight (the client applies it)"
                if weight is None
                else "weights on the server; refusing a weight sent for the client to apply"
            )
        )
    if weight is None:
        return None
    try:
        return applied_weight(weight, preset)
    except ConfigError as exc:
        raise ProtocolStateError(f"{client_id}: {exc}") from None


class RunningSum(ABC):
    """Σ_i weight_i · handle_i, folded one upload at a time: the server adds each upload as
    it arrives and drops it, so a round holds one model's worth of state, not one per client.
    """

    @abstractmethod
    def add(self, handle: Any, weight: float) -> None:
        """Fold ``weight · handle`` in. Takes the handle over: the caller must not use it again."""

    def result(self, normaliser: float = 1.0) -> Any:
        """The sum divided by ``normaliser`` (in (0, 1]: the planned weights of the clients
        that did arrive), as a handle like ``weighted_sum``'s.

        Planned weights that sum to 1 up to round-off leave the sum as it is, so a round
        nobody dropped out of gives bit for bit what a buffered weighted sum gives."""
        return self._result(1.0 if abs(normaliser - 1.0) <= 1e-12 else normaliser)

    @abstractmethod
    def _result(self, normaliser: float) -> Any:
        """The sum divided by ``normaliser`` (exactly 1.0 when nothing is to be divided)."""


class ServerBackend(ABC):
    """A backend's server half: loads uploads into handles, sums them with weights and
    reveals or releases a sum only as the contract allows; it never holds a secret key."""

    name: str
    #: who may open an aggregate: "none", "shared" or "threshold" (module docstring)
    key_model: str
    #: the same, as the audit states it to a reader (``audit_summary.json``)
    who_can_decrypt: str
    #: wire kind of a protected vector: what the server receives when a client uploads one
    upload_kind: str
    #: whether the server can read a handle (True only for the plaintext baseline)
    can_read: bool
    #: plaintext items the backend's own phases show the server (public keys, confirmations)
    declares: tuple[str, ...] = ()
    #: the clients apply a streamed sum's planned weights before protecting (the training
    #: request carries each one's ``upload_weight``) and the server only adds; such a
    #: backend can form no other weighted sum
    weights_at_client: bool = False
    #: fields a training reply may carry besides the upload (``ClientBackend.commit_next_upload``)
    train_reply_fields: Mapping[str, str] = {}

    def remember_upload(self, client: str, envelope: Envelope) -> None:
        """Read what a training reply's :attr:`train_reply_fields` say about ``client``'s
        next upload (ClientInputError if malformed); nothing here."""

    def training_fields(
        self, ctx: Any, client: str, weights: Mapping[str, float]
    ) -> dict[str, Field]:
        """Fields for ``client``'s training request in a round whose planned weights are
        ``weights`` (on ckks, a planned decryptor's precheck); none here."""
        return {}

    def opening_fields(
        self, ctx: Any, client: str, weights: Mapping[str, float]
    ) -> dict[str, Field]:
        """Fields for ``client``'s training request in a round that opens a sum of these
        planned weights to its contributors (``Protocol.opened_weights``: on ckks, every
        client's precheck); none here."""
        return {}

    @abstractmethod
    def load(self, envelope: Envelope, name: str, length: int) -> Any:
        """Validate an uploaded field and return a handle; raise ClientInputError if bad."""

    def upload_digests(self, handle: Any) -> tuple[str, ...]:
        """What names each upload a loaded ``handle`` holds (the digest of its seeds, fresh
        per encryption), by which a round refuses a second copy of one upload
        (``RoundContext.loaded``): the digests of the handle's ``entries`` where it lists
        them (ckks, threshold), none otherwise (plain)."""
        return tuple(entry.digest for entry in getattr(handle, "entries", ()))

    @abstractmethod
    def weighted_sum(self, handles: Sequence[Any], weights: Sequence[float]) -> Any:
        """Σ weights[i] · handles[i], without looking inside the handles."""

    @property
    def by_groups(self) -> bool:
        """Whether participation is by groups (:meth:`sitting_out` may leave clients out)."""
        return False

    def sitting_out(self, clients: Collection[str]) -> dict[str, str]:
        """Of ``clients`` (those whose upload arrived), the ones whose upload must stay out
        of the round's sums, with why: with ``--participation groups``, every member of a
        group with a member missing (``coalition.participation_groups``). None by default."""
        return {}

    @abstractmethod
    def running_sum(self, length: int) -> RunningSum:
        """An empty running sum of ``length``-value vectors."""

    @abstractmethod
    def to_field(self, handle: Any) -> Field:
        """Encode a handle (typically an aggregate) to send it to clients."""

    def read(self, handle: Any) -> np.ndarray:
        raise PermissionError(f"the {self.name} server backend cannot read ciphertexts")

    def setup(self, ctx: Any, decryption_budget: int) -> None:
        """Phases run once before round 0 (key setup); nothing for plain.
        ``decryption_budget``: how many aggregates the run will reveal at most."""

    def release(self, ctx: Any, handle: Any, name: str) -> dict[str, Field]:
        """The fields that let clients open ``handle`` themselves, the aggregate under
        ``name`` (and whatever a client needs to check it: on ckks the descriptor, the
        contributors' consents and the seeds)."""
        return {name: self.to_field(handle)}

    def reveal(self, ctx: Any, handle: Any, name: str) -> tuple[np.ndarray, str]:
        """Have an aggregate opened for the server; returns (values, who opened it)."""
        return self.read(handle), "server"
