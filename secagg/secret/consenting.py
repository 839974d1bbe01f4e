"""A client's side of a verified release: its signing identity, its release policy, and
the consent it signs (``secagg.ckks.release`` says what it rests on). Both encrypted
backends' client halves use it; it takes the signing key, so only client code imports it.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from secagg import wire
from secagg.backends.coalition import RunLedger
from secagg.ckks.release import Descriptor, ReleasePolicy, consent_message, signature_bytes
from secagg.errors import KeySetupError, ReleaseRefused
from secagg.secret.keywrap import KeyWrapper
from secagg.wire import Field


def public_bytes(signer: Ed25519PrivateKey) -> bytes:
    return signer.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def release_identity(
    client_id: str,
    signing_key: bytes | None,
    signers: Mapping[str, bytes] | None,
    min_contributors: int,
    min_weight_share: float,
    reveal_length: int | tuple[int, ...] | None,
    max_weight_share: float = 0.5,
    *,
    max_weight: int | None = None,
    colluders: int = 0,
) -> tuple[Ed25519PrivateKey, dict[str, bytes], ReleasePolicy]:
    """The client's Ed25519 key (a fresh one without ``signing_key``), the signers' roster
    (only itself without ``signers``; its own entry must be its key) and its policy, with
    the weight bound of its preset and the colluders its backend must withstand
    (``ReleasePolicy``)."""
    signer = (
        Ed25519PrivateKey.from_private_bytes(signing_key)
        if signing_key is not None
        else Ed25519PrivateKey.generate()
    )
    roster = dict(signers) if signers is not None else {client_id: public_bytes(signer)}
    if roster.get(client_id) != public_bytes(signer):
        raise KeySetupError(f"{client_id}'s signing key is not its key in the roster")
    try:
        policy = ReleasePolicy(
            min_contributors,
            min_weight_share,
            reveal_length,
            max_weight_share,
            max_weight=max_weight,
            colluders=colluders,
        )
    except ValueError as exc:
        raise KeySetupError(f"{client_id}: {exc}") from None
    return signer, roster, policy


def consent(
    client_id: str,
    d: Descriptor,
    *,
    policy: ReleasePolicy,
    uploads: dict[str, dict[str, int]],
    bases: Mapping[str, str],
    releases_per_upload: Mapping[str, int],
    signer: Ed25519PrivateKey,
    applied: Mapping[str, int] | None = None,
    released: dict[str, list[dict[str, Any]]] | None = None,
    origins: Mapping[str, str] | None = None,
    roster: Collection[str] | None = None,
    ledger: RunLedger | None = None,
) -> dict[str, Field]:
    """Sign ``d`` if it holds one of this client's ``uploads`` (digest -> releases so far,
    by kind; counted here) made from ``d``'s basis (``bases``: digest -> what the upload was
    made from), within ``releases_per_upload`` and ``policy``; with ``applied``
    (a client-weighted preset: digest -> the integer weight the client multiplied that
    upload by), only if ``d`` lists its upload with that weight. ``released`` (digest ->
    the descriptors of the releases that upload entered, recorded here) holds what a
    coalition has already seen: ``d`` must be over the same uploads as they were, its
    weightings together must pass the policy (``secagg.backends.coalition``, rules 2 and
    4), and no upload of this client made from the same basis for another request
    (``origins``: digest -> the request it answered) may have entered a release (rule 3).
    With ``roster``, every entry must be one of its clients; with ``ledger`` (the client's
    record of the whole run, ``secagg.backends.coalition.RunLedger``), ``d`` must keep the
    run rule with every release the client entered before.

    Cheap checks come first (the roster, the budget, the run ledger: linear in the request),
    the exact two-weighting check last: a request padded with strangers or past the budget
    is refused before it costs more than reading it, and a refusal records nothing."""
    if roster is not None:
        strangers = [client for client, _, _ in d.entries if client not in roster]
        if strangers:
            raise ReleaseRefused(
                f"{client_id}: release {d.name!r} lists {len(strangers)} client(s) not in its "
                f"roster ({strangers[0][:40]!r}{', ...' if len(strangers) > 1 else ''})"
            )
    policy.check(d)
    check_not_reattributed(client_id, d, uploads)
    mine = [digest for client, _, digest in d.entries if client == client_id]
    if not mine or mine[0] not in uploads:
        raise ReleaseRefused(
            f"{client_id}: release {d.name!r} lists no upload this client made as its own "
            "(replayed or reattributed)"
        )
    if bases.get(mine[0], "") != d.basis:
        raise ReleaseRefused(
            f"{client_id}: release {d.name!r} sums uploads made from another model, settings "
            "or request than its own upload (a client sums only what it itself did)"
        )
    if applied is not None:
        listed = [k for client, k, _ in d.entries if client == client_id][0]
        if applied.get(mine[0]) != listed:
            raise ReleaseRefused(
                f"{client_id}: release {d.name!r} lists its upload with weight {listed}; "
                f"it applied {applied.get(mine[0])} before encrypting"
            )
    used = uploads[mine[0]]
    limit = releases_per_upload.get(d.kind, 0)
    if used.get(d.kind, 0) >= limit:
        raise ReleaseRefused(
            f"{client_id}: its upload already entered {used.get(d.kind, 0)} release(s) of "
            f"kind {d.kind!r}; its configuration allows {limit} (a second weighting of "
            "the same uploads would single one out)"
        )
    if ledger is not None:
        ledger.check(client_id, d, mine[0], policy)
    record = released if released is not None else {}
    policy.check_weightings(d, [Descriptor.from_config(c) for c in record.get(mine[0], [])])
    origin = (origins or {}).get(mine[0], "")
    if any(
        other != mine[0]
        and record.get(other)
        and bases.get(other) == d.basis
        and (origins or {}).get(other, "") != origin
        for other in uploads
    ):
        raise ReleaseRefused(
            f"{client_id}: another of its uploads made from the same request entered a "
            f"release already; one upload per client per request (a retried upload of the "
            "same update released beside the first would give it by difference)"
        )
    used[d.kind] = used.get(d.kind, 0) + 1
    if ledger is not None:
        ledger.record(d, mine[0])
    record.setdefault(mine[0], []).append(d.to_config())
    signature = signer.sign(consent_message(client_id, d))
    return {"consent": wire.config({"signature": base64.b64encode(signature).decode()})}


def check_not_reattributed(client_id: str, d: Descriptor, uploads: Mapping[str, object]) -> None:
    """Refuse a release that lists one of this client's own uploads under another sender: a
    colluding client that re-uploads a victim's ciphertext as its own (and a server that
    drops the victim's) is stopped by the victim, whichever role it has in the release."""
    for client, _, digest in d.entries:
        if client != client_id and digest in uploads:
            raise ReleaseRefused(
                f"{client_id}: release {d.name!r} lists one of its own uploads under {client}"
            )


def read_release(
    client_id: str,
    info: object,
    kind: str,
    policy: ReleasePolicy,
    what: str,
    name: str | None = None,
    uploads: Mapping[str, object] | None = None,
) -> tuple[Descriptor, dict[str, bytes]]:
    """A release as a server sent it ({"descriptor", "consents"}), read and checked against
    ``kind`` (and ``name``) and ``policy``: (descriptor, the consents' signature bytes).
    The caller checks the signatures against the entries (``release.check_entries``)."""
    if not isinstance(info, dict) or set(info) != {"descriptor", "consents"}:
        raise ReleaseRefused(f"{client_id}: {what} comes without a release descriptor")
    d = Descriptor.from_config(info["descriptor"])
    if d.kind != kind or (name is not None and d.name != name):
        raise ReleaseRefused(
            f"{client_id}: asked to {kind} {name or what!r}, got a release of kind "
            f"{d.kind!r} for {d.name!r}"
        )
    policy.check(d)
    check_not_reattributed(client_id, d, uploads or {})
    consents = info["consents"]
    if not isinstance(consents, dict):
        raise ReleaseRefused(f"{client_id}: consents must map clients to signatures")
    return d, {c: signature_bytes(s) for c, s in consents.items() if isinstance(s, str)}


# ---- restorable state shared by both encrypted client halves ---------------------------------
def as_bytes(value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise KeySetupError(f"key material must be bytes, got {type(value).__name__}")
    return bytes(value)


def restored_keys(
    client_id: str,
    state: Mapping[str, object],
    roster: Mapping[str, bytes],
    signers: Mapping[str, bytes],
) -> tuple[KeyWrapper, Ed25519PrivateKey]:
    """The X25519 identity and the Ed25519 signing key of an exported state, each checked
    against this client's own entry in its rosters (a state of another client is refused)."""
    wrapper = KeyWrapper.from_private_bytes(as_bytes(state["x25519_private"]))
    if wrapper.public_bytes != roster.get(client_id):
        raise KeySetupError(f"{client_id}: the state's identity is not this client's in its roster")
    signer = Ed25519PrivateKey.from_private_bytes(as_bytes(state["signing_key"]))
    if public_bytes(signer) != signers.get(client_id):
        raise KeySetupError(f"{client_id}: the state's signing key is not this client's")
    return wrapper, signer


def restored_count(client_id: str, value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise KeySetupError(f"{client_id}: {what} {value!r} is not a count")
    return value


def restored_uploads(client_id: str, uploads: object) -> dict[str, dict[str, int]]:
    """The record of releases each upload entered (``consent``'s ``uploads``)."""
    if not isinstance(uploads, dict) or not all(
        isinstance(d, str)
        and isinstance(kinds, dict)
        and all(isinstance(n, int) and n >= 0 for n in kinds.values())
        for d, kinds in uploads.items()
    ):
        raise KeySetupError(f"{client_id}: the state's upload record is garbled")
    return {d: dict(kinds) for d, kinds in uploads.items()}


def restored_bases(client_id: str, bases: object, what: str = "upload bases") -> dict[str, str]:
    """The record of what each upload was made from (``consent``'s ``bases``), or of another
    text per upload (``what``: ``origins``)."""
    if not isinstance(bases, dict) or not all(
        isinstance(d, str) and isinstance(b, str) for d, b in bases.items()
    ):
        raise KeySetupError(f"{client_id}: the state's record of {what} is garbled")
    return dict(bases)


def restored_releases(client_id: str, released: object) -> dict[str, list[dict[str, Any]]]:
    """The record of the releases each upload entered (``consent``'s ``released``), every
    descriptor read as a server's would be."""
    if not isinstance(released, dict) or not all(
        isinstance(d, str) and isinstance(rs, list) for d, rs in released.items()
    ):
        raise KeySetupError(f"{client_id}: the state's record of releases is garbled")
    try:
        return {
            d: [Descriptor.from_config(r).to_config() for r in rs] for d, rs in released.items()
        }
    except ReleaseRefused:
        raise KeySetupError(f"{client_id}: the state's record of releases is garbled") from None


@dataclass
class HolderState:
    """What a key-holding client half (``ckks``, ``threshold``) remembers between messages,
    besides its backend's own parts: its identities (secret), its decryption and open
    counts, and its consent records (the releases each upload entered, what each upload was
    made from, the integer weight applied to it). :meth:`restore` is the one check of an
    exported state for both halves: everything is checked before the half takes any of it."""

    identity: KeyWrapper
    signer: Ed25519PrivateKey
    decryptions: int
    opens: int
    uploads: dict[str, dict[str, int]]
    bases: dict[str, str]
    applied: dict[str, int]
    #: digest of each upload -> the descriptors of the releases it entered (``consent``)
    released: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: digest of each upload -> the request it answered (``consent``'s ``origins``)
    origins: dict[str, str] = field(default_factory=dict)
    #: every release of the run it entered (``secagg.backends.coalition.RunLedger``)
    ledger: RunLedger = field(default_factory=RunLedger)

    #: the keys of an exported state that every key-holding half writes
    KEYS: ClassVar[tuple[str, ...]] = (
        "preset",
        "params",
        "x25519_private",
        "signing_key",
        "decryptions",
        "opens",
        "uploads",
        "bases",
        "applied",
        "released",
        "origins",
        "run_ledger",
    )

    def export(self, preset: str, params: str) -> dict[str, Any]:
        """The state's common part (``x25519_private`` and ``signing_key`` are secret bytes:
        whoever reads them can act as this client)."""
        return {
            "preset": preset,
            "params": params,
            "x25519_private": self.identity.private_bytes(),
            "signing_key": self.signer.private_bytes_raw(),
            "decryptions": self.decryptions,
            "opens": self.opens,
            "uploads": {d: dict(kinds) for d, kinds in self.uploads.items()},
            "bases": dict(self.bases),
            "applied": dict(self.applied),
            "released": {d: [dict(r) for r in rs] for d, rs in self.released.items()},
            "origins": dict(self.origins),
            "run_ledger": self.ledger.to_config(),
        }

    @classmethod
    def restore(
        cls,
        client_id: str,
        state: Mapping[str, Any],
        *,
        backend: str,
        preset: str,
        params: str,
        extras: tuple[str, ...],
        roster: Mapping[str, bytes],
        signers: Mapping[str, bytes],
        ledger: RunLedger | None = None,
    ) -> HolderState:
        """The common part of ``state``, an export of a ``backend`` half under ``preset``
        (fingerprint ``params``) whose own parts are ``extras``; KeySetupError if it is not
        exactly that, or not this client's (its keys must be its entries in its rosters).
        ``ledger``: a fresh ledger under this client's own run rules, which takes the
        state's record (a record kept under other rules is refused)."""
        keys = cls.KEYS + extras
        if set(state) != set(keys):
            raise KeySetupError(
                f"{client_id}: a {backend} client state holds {list(keys)}, got {sorted(state)}"
            )
        if state["preset"] != preset or state["params"] != params:
            raise KeySetupError(
                f"{client_id}: the state was made under {backend} preset {state['preset']} "
                f"({state['params']}), this client runs {preset} ({params})"
            )
        identity, signer = restored_keys(client_id, state, roster, signers)
        applied = state["applied"]
        if not isinstance(applied, dict) or not all(
            isinstance(d, str) and isinstance(k, int) and k > 0 for d, k in applied.items()
        ):
            raise KeySetupError(f"{client_id}: the state's record of applied weights is garbled")
        run = ledger if ledger is not None else RunLedger()
        try:
            run.load(state["run_ledger"])
        except ValueError as exc:
            raise KeySetupError(f"{client_id}: {exc}") from None
        return cls(
            identity,
            signer,
            restored_count(client_id, state["decryptions"], "decryption count"),
            restored_count(client_id, state["opens"], "open count"),
            restored_uploads(client_id, state["uploads"]),
            restored_bases(client_id, state["bases"]),
            dict(applied),
            restored_releases(client_id, state["released"]),
            restored_bases(client_id, state["origins"], "request origins"),
            run,
        )


def check_listed_weight(client_id: str, info: object, weight: float, unit: int) -> None:
    """The release ``info`` (as a server sent it) lists ``client_id`` with the integer weight
    ``weight`` quantises to, k = round(|weight| · unit) with its sign; ``unit`` is the
    preset's ``max_weight`` (2^weight_bits where the server weights, the applied weight's
    unit where the clients do)."""
    if not isinstance(info, dict) or "descriptor" not in info:
        raise ReleaseRefused(f"{client_id}: a release comes without its descriptor")
    d = Descriptor.from_config(info["descriptor"])
    listed = [k for client, k, _ in d.entries if client == client_id]
    k = int(math.floor(abs(float(weight)) * unit + 0.5))
    if not listed or listed[0] != (-k if weight < 0 else k):
        raise ReleaseRefused(
            f"{client_id}: the request's weight for its upload is not the one the release "
            f"{d.name!r} lists"
        )


def check_applied_total(client_id: str, d: Descriptor, unit: int) -> None:
    """On a client-weighted preset: the weights the clients applied, as they signed them in
    ``d``, add up to at most 1 (each rounded to the nearest of ``unit``: half a unit each
    over at most), since each client checked its values against the whole headroom."""
    total = sum(k for _, k, _ in d.entries)
    if 2 * total > 2 * unit + len(d.entries):
        raise ReleaseRefused(
            f"{client_id}: the weights the clients applied to {d.name!r} add up to "
            f"{total / unit:.6g} > 1 (beyond the headroom)"
        )
