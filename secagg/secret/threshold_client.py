"""Client half of the threshold backend: one-time keys, sealed shares, and the holder's rules.

Every upload is masked under a fresh key that the client Shamir-shares among the key holders
(t of c: the roster's clients, or a committee of c of them) inside the upload itself, each
share sealed for its holder
(``secagg.threshold.params`` has the construction). The client keeps no key: what it holds
between messages is its long-term identity and the record of what it answered.

As a holder it answers a request for its share of a release only if it can check it, from
its own provisioning alone:

- kind, policy (contributors, weight floor and cap, length) and budget, as on ckks;
- every contributor signed the release's descriptor (its consent binds its own upload's
  digest, which commits to the masked blocks and to every sealed share);
- its own sealed share from each contributor is the one that digest names, and opens;
- on ``lean``, the weights the clients applied add up to at most 1 (the headroom);
- the holder set T has at least t of the holders, itself among them (a client off the
  committee holds no share and answers no request for one);
- **one contributor set per upload**: an upload that entered a release with the set S never
  enters one with another set (two sums over sets that differ by one client give that
  client's key, and so its upload, by difference);
- **no second answer with another holder set**: a release it answered for T is answered
  again only for T (a retried threshold decryption with another set is the attack of
  Okada et al., eprint 2025/409; Lattigo's SECURITY.md forbids it).

Its answer, s_j = Σ_i w_i·[k_i]_j, is one ring element, computed from its shares alone: no
upload or server-chosen polynomial enters it, so a crafted upload can extract nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends import Provision
from secagg.backends.base import own_weight
from secagg.ckks.release import Descriptor, check_entries, server_multipliers
from secagg.errors import (
    ConfigError,
    KeySetupError,
    MalformedCiphertext,
    ProtocolStateError,
    ReleaseRefused,
)
from secagg.secret.consenting import (
    check_applied_total,
    read_release,
    restored_count,
)
from secagg.secret.holder import KeyHoldingClient
from secagg.secret.share_relay import release_label, seal, unseal
from secagg.threshold.combine import open_checked
from secagg.threshold.params import (
    CHECK_BLOCKS,
    SHARE_SEED_BYTES,
    ThresholdPreset,
    Upload,
    check_sum,
    check_t,
    decode,
    encode,
    holder_xs,
    holders_of,
    public_seed,
    share_label,
    upload_message,
    with_check,
)
from secagg.threshold.ring import ring
from secagg.wire import Envelope, Field

_PREFIX = len(b"secagg threshold upload v2") + 16  # context and fingerprint in a preimage


def share_payloads(ring_, key: np.ndarray, t: int, n: int) -> list[bytes]:
    """What each of the n holders is sent of ``key``'s Shamir shares (t of n, x = 1 … n): the
    first t − 1 a fresh 32-byte seed whose uniform expansion is the share, the others the
    share itself, on the polynomial of degree < t through (0, key) and the seeded points."""
    seeds = [os.urandom(SHARE_SEED_BYTES) for _ in range(t - 1)]
    known = [key, *(ring_.public(seed, 1)[0] for seed in seeds)]
    known_x = list(range(t))  # 0 for the key, 1 … t − 1 for the seeded holders
    whole = [
        ring_.to_bytes(ring_.combine(known, ring_.lagrange(known_x, at=x))) for x in range(t, n + 1)
    ]
    return [*seeds, *whole]


class UnopenedShare(ReleaseRefused):
    """A contributor's sealed key share does not open for this holder (dealt garbage, or
    moved by the relay)."""


def _unopened(clients: list[str]) -> Field:
    return wire.config({"clients": list(clients)})


class ThresholdClient(KeyHoldingClient):
    name = "threshold"
    STATE_BACKEND = "threshold"
    #: this half's own parts of its state, besides every key-holding half's (HolderState)
    STATE_EXTRAS = ("open_shares", "answered", "sets", "descriptors")

    def __init__(
        self,
        client_id: str,
        preset: ThresholdPreset,
        provision: Provision,
        options: Mapping[str, Any],
    ):
        """What :class:`~secagg.secret.holder.KeyHoldingClient` takes (``preset``: one of
        ``secagg.threshold.params.PRESETS``). The roster's clients, or a committee of
        ``options``' ``committee`` of them, are the key holders (shares are sealed for them,
        and their shares for this client); ``threshold_t``: how many holders open a sum (0:
        a strict majority of the holders), and every release withstands t − 1 colluders.
        The provisioned ``open_budget`` counts the sums it opens itself, ``share_budget``
        the sealed shares of such sums it gives at most (default ``open_budget``);
        ``decryption_budget`` the shares of reveals to the server it gives at most."""
        self.ring = ring(preset.ring_dim, preset.prime)
        super().__init__(client_id, preset, provision, options)
        share_budget = provision.share_budget
        if share_budget is not None and (not isinstance(share_budget, int) or share_budget < 0):
            raise KeySetupError(f"share_budget must be a count, got {share_budget!r}")
        self.open_shares = 0
        self.share_budget = self.open_budget if share_budget is None else share_budget
        if set(self.signers) != set(self.roster) and provision.signers and provision.roster:
            raise KeySetupError(f"{client_id}: its two rosters name different clients")
        #: release (descriptor hash, hex) -> the holder set it was answered for
        self.answered: dict[str, list[str]] = {}
        #: upload digest -> the releases (hashes) it entered that this holder answered, and
        #: each such release's descriptor, kept once (a release of n uploads is one record,
        #: not n copies: their sets, weights and bases, ``_check_history``)
        self.sets: dict[str, list[str]] = {}
        self.descriptors: dict[str, dict[str, Any]] = {}

    def _colluders(self, options: Mapping[str, Any]) -> int:
        """t − 1, t from the holders and ``threshold_t`` (both set here)."""
        try:
            self.holders = holders_of(self.roster, options["committee"])
            self.t = check_t(options["threshold_t"], len(self.holders))
        except ConfigError as exc:
            raise KeySetupError(f"{self.id}: {exc}") from None
        return self.t - 1

    @property
    def params(self) -> str:
        return self.preset.fingerprint

    def handlers(self) -> dict[str, Callable[[Envelope], dict[str, Field]]]:
        return {
            "consent": self.on_consent,
            "decrypt_share": self.on_decrypt_share,
            "open_share": self.on_open_share,
        }

    # ---- state between messages ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The identities (secret bytes) and the record of what this client answered; no
        key of an upload outlives the upload."""
        return {
            **self._held_state(),
            "open_shares": self.open_shares,
            "answered": {r: list(t) for r, t in self.answered.items()},
            "sets": {d: list(rs) for d, rs in self.sets.items()},
            "descriptors": {r: dict(c) for r, c in self.descriptors.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load and check everything before assigning anything, so a bad state leaves this
        half as it was."""
        held = self._restored(state)
        open_shares = restored_count(self.id, state["open_shares"], "open share count")
        answered = state["answered"]
        if not isinstance(answered, dict) or not all(
            isinstance(k, str)
            and isinstance(v, list)
            and all(isinstance(c, str) and c in self.roster for c in v)
            for k, v in answered.items()
        ):
            raise KeySetupError(f"{self.id}: the state's record of answered releases is garbled")
        sets, descriptors = self._restored_record(state["sets"], state["descriptors"])
        self._take(held)
        self.answered = {r: list(v) for r, v in answered.items()}
        self.sets, self.descriptors = sets, descriptors
        self.open_shares = open_shares

    # ---- data path -----------------------------------------------------------------------------
    def protect(
        self, values: np.ndarray, weight: float | None = None, *, basis: str = "", request: str = ""
    ) -> Field:
        """Mask ``values`` under a fresh key and deal its shares, sealed, in the upload; on
        ``lean`` ``weight`` (the planned weight) times ``values``, the integer applied
        remembered: this client consents only to sums listing that weight."""
        applied = own_weight(self.id, self.preset, weight)
        factor = 1.0 if applied is None else applied / self.preset.client_weight_unit
        messages = with_check(
            encode(self.preset, values, self.preset.client_bound(len(self.roster)), factor)
        )
        key = self.ring.key()  # one-time: it leaves this method only as sealed shares
        body = self.ring.to_bytes(self.ring.mask(key, public_seed(self.preset, basis), messages))
        payloads = share_payloads(self.ring, key, self.t, len(self.holders))
        del key
        label = share_label(self.preset, hashlib.sha256(body).digest())
        sealed = tuple(
            self._identity.wrap(payloads[j], self.roster[h], self.id, h, label)
            for j, h in enumerate(self.holders)
        )
        upload = Upload(body, sealed, b"")
        digest = upload.digest(self.preset)
        signature = self._signer.sign(upload_message(self.id, digest))
        self._record_upload(digest, basis, request, applied, len(values))
        return wire.ciphertext(Upload(body, sealed, signature).parts())

    def open(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        """A sum the server sent this client to open (LARC's Ĝ, RegAgg's centre, a
        server-blind update): at least t holders' shares of its key sum, each sealed for
        this client and this release (so each holder checked the release, consents
        included), checked for consistency, combined, and the sum unmasked. At most
        ``open_budget`` times."""
        self._check_open_budget()
        info = envelope.config(f"{name}.release")
        if not isinstance(info, dict) or set(info) != {
            "descriptor",
            "holders",
            "recipients",
            "divisor",
        }:
            raise ReleaseRefused(f"{self.id}: {name} comes without its release")
        d = Descriptor.from_config(info["descriptor"])
        if d.kind != "open" or d.name != name or d.n_values != length:
            raise ReleaseRefused(
                f"{self.id}: asked to open {name!r} of {length} values, got a release of "
                f"kind {d.kind!r} for {d.name!r} of {d.n_values}"
            )
        self.policy.check(d)
        self._check_applied(d)
        holders, recipients, divisor = info["holders"], info["recipients"], info["divisor"]
        if (
            not isinstance(holders, list)
            or len(set(map(str, holders))) != len(holders)
            or not all(h in self.holders for h in holders)
        ):
            raise ReleaseRefused(f"{self.id}: {name}: shares from {holders!r:.80}")
        if not isinstance(recipients, list) or self.id not in recipients:
            raise ReleaseRefused(f"{self.id}: {name} was not sealed for this client")
        if not isinstance(divisor, (int, float)) or not 0.0 < divisor <= 1.0:
            raise ReleaseRefused(f"{self.id}: {name}: divisor {divisor!r} is not in (0, 1]")
        bodies = envelope.ciphertext_parts(name)
        sealed = envelope.ciphertext_parts(f"{name}.sealed")
        keys = envelope.ciphertext_parts(f"{name}.keys")
        if (
            len(bodies) != 1
            or d.chunks != self.preset.blocks(d.n_values)
            or len(sealed) != len(holders)
            or len(keys) != len(recipients) * len(holders)
        ):
            raise ReleaseRefused(f"{self.id}: {name}: the shares do not match the release")
        total = self._load_rows(bodies[0], d.chunks + CHECK_BLOCKS, name)
        label = release_label(self.preset.fingerprint, d.hash())
        me = recipients.index(self.id)
        shares = {}
        for i, holder in enumerate(holders):
            (blob,) = unseal(
                self._identity,
                self.id,
                holder,
                self.roster[holder],
                [sealed[i]],
                keys[i * len(recipients) + me],
                label,
            )
            shares[holder] = self._load_rows(blob, 1, name)[0]
        seed = public_seed(self.preset, d.basis)
        multipliers = server_multipliers(self.preset.weighted_by_clients, d.weights.values())
        centred, _ = open_checked(
            self.ring,
            shares,
            holder_xs(self.holders),
            self.t,
            lambda key_sum: self.ring.unmask(total, key_sum, seed),
            lambda centred: check_sum(self.preset, centred, multipliers),
        )
        self.opens += 1
        return decode(self.preset, centred, d.n_values, float(divisor))

    # ---- releases: consent (the base), then shares -------------------------------------------
    def on_decrypt_share(self, env: Envelope) -> dict[str, Field]:
        """This holder's share of a checked release's key sum, for the server; or, if some
        contributors' sealed shares do not open, no share and their names (``unopened``)."""
        share, fresh, unopened = self._share(
            env, "reveal", self.decryptions, self.decryption_budget
        )
        if share is None:
            return {"share": wire.ciphertext([]), "unopened": _unopened(unopened)}
        if fresh:
            self.decryptions += 1
        return {
            "share": wire.ciphertext([self.ring.to_bytes(share)]),
            "unopened": _unopened([]),
        }

    def on_open_share(self, env: Envelope) -> dict[str, Field]:
        """This holder's share of a checked release that clients will open, sealed for each
        recipient (the server relays it and cannot open it)."""
        ids = env.config("recipients").get("ids")
        if (
            not isinstance(ids, list)
            or not ids
            or len(set(map(str, ids))) != len(ids)
            or not all(isinstance(r, str) and r in self.roster for r in ids)
        ):
            raise ReleaseRefused(
                f"{self.id}: the recipients of a share must be distinct clients of this "
                f"client's roster, got {ids!r:.120}"
            )
        share, fresh, unopened = self._share(env, "open", self.open_shares, self.share_budget)
        if share is None:
            return {
                "sealed": wire.ciphertext([]),
                "keys": wire.ciphertext([]),
                "unopened": _unopened(unopened),
            }
        d = Descriptor.from_config(env.config("release").get("descriptor"))
        label = release_label(self.preset.fingerprint, d.hash())
        sealed, keys = seal(
            self._identity,
            self.id,
            [self.ring.to_bytes(share)],
            {r: self.roster[r] for r in ids},
            label,
        )
        if fresh:
            self.open_shares += 1
        return {
            "sealed": wire.ciphertext(sealed),
            "keys": wire.ciphertext(keys),
            "unopened": _unopened([]),
        }

    def _share(
        self, env: Envelope, kind: str, used: int, budget: int
    ) -> tuple[np.ndarray | None, bool, list[str]]:
        """(s_j = Σ_i w_i·[k_i]_j for a release of ``kind`` this holder checked (the module
        docstring's rules), whether it is a first answer (a repeat for the same holder set
        costs no budget: it tells the server nothing new), []); or (None, False, the
        contributors whose sealed share for this holder does not open): a client that dealt
        garbage is named, so that the server can leave it out, and nothing is recorded."""
        d, signatures = read_release(
            self.id,
            env.config("release"),
            kind,
            self.policy,
            f"a {kind} share request",
            uploads=self.uploads,
        )
        release = d.hash().hex()
        asked = env.config("holders").get("ids")
        if (
            not isinstance(asked, list)
            or len(set(map(str, asked))) != len(asked)
            or not all(h in self.holders for h in asked)
            or self.id not in asked
            or len(asked) < self.t
        ):
            raise ReleaseRefused(
                f"{self.id}: a share request must name at least t = {self.t} distinct key "
                f"holders, itself among them; got {asked!r:.120}"
            )
        holder_set = sorted(asked)
        fresh = release not in self.answered
        if not fresh and self.answered[release] != holder_set:
            raise ReleaseRefused(
                f"{self.id}: {d.name}: it answered this release for holders "
                f"{self.answered[release]}; refusing another holder set"
            )
        if fresh and used >= budget:
            raise ProtocolStateError(
                f"{self.id} refuses {kind} share {used + 1}: its configuration allows {budget}"
            )
        self._check_history(d, release)
        self._check_applied(d)
        preimages = [bytes(p) for p in env.ciphertext_parts("preimages")]
        blobs = [bytes(p) for p in env.ciphertext_parts("shares")]
        if d.chunks != self.preset.blocks(d.n_values) or not (
            len(preimages) == len(blobs) == len(d.entries)
        ):
            raise ReleaseRefused(f"{self.id}: {d.name}: the shares do not match the release")
        check_entries(d, signatures, preimages, self.signers, chunk_bytes=None)
        me = self.holders.index(self.id)
        mine, unopened = [], []
        for (client, _, _), preimage, blob in zip(d.entries, preimages, blobs):
            try:
                mine.append(self._unsealed_share(d.name, client, preimage, blob, me))
            except UnopenedShare:
                unopened.append(client)
        if unopened:
            return None, False, unopened
        weights = server_multipliers(self.preset.weighted_by_clients, (k for _, k, _ in d.entries))
        share = self.ring.combine(mine, weights)  # the shares as they are: no stacked copy
        self.answered[release] = holder_set
        self.descriptors.setdefault(release, d.to_config())
        for _, _, digest in d.entries:
            seen = self.sets.setdefault(digest, [])
            if release not in seen:
                seen.append(release)
        return share, fresh, []

    def _check_history(self, d: Descriptor, release: str) -> None:
        """``d`` against the releases this holder answered before (``coalition``'s rules 2
        and 4 as a holder sees them): its uploads entered releases over this same set only,
        and its weightings with theirs pass the policy. (Rule 3 is the contributors': only a
        client knows which of its uploads answered which request.)"""
        before = {r for _, _, digest in d.entries for r in self.sets.get(digest, ())}
        before.discard(release)
        earlier = [Descriptor.from_config(self.descriptors[r]) for r in sorted(before)]
        self.policy.check_weightings(d, earlier)

    def _restored_record(
        self, sets: object, descriptors: object
    ) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
        """The exported record of answered releases, checked: every descriptor read as a
        server's would be and filed under its own hash, every upload's releases among them."""
        garbled = KeySetupError(f"{self.id}: the state's record of releases is garbled")
        if not isinstance(descriptors, dict) or not isinstance(sets, dict):
            raise garbled
        try:
            read = {r: Descriptor.from_config(c) for r, c in descriptors.items()}
        except ReleaseRefused:
            raise garbled from None
        if any(d.hash().hex() != r for r, d in read.items()) or not all(
            isinstance(d, str) and isinstance(rs, list) and all(r in read for r in rs)
            for d, rs in sets.items()
        ):
            raise garbled
        return {d: list(rs) for d, rs in sets.items()}, {r: d.to_config() for r, d in read.items()}

    def _unsealed_share(
        self, name: str, sender: str, preimage: bytes, blob: bytes, me: int
    ) -> np.ndarray:
        """This holder's share of ``sender``'s one-time key: the sealed blob must be the one
        the consented upload's digest names at this holder's position, and open."""
        n = len(self.holders)
        if len(preimage) != _PREFIX + 32 * (n + 1):
            raise ReleaseRefused(f"{self.id}: {name}: {sender}'s upload does not match the roster")
        blocks_digest = preimage[_PREFIX : _PREFIX + 32]
        listed = preimage[_PREFIX + 32 * (me + 1) : _PREFIX + 32 * (me + 2)]
        if hashlib.sha256(blob).digest() != listed:
            raise ReleaseRefused(f"{self.id}: {name}: the share sent as {sender}'s is not its own")
        try:
            raw = self._identity.unwrap(
                blob,
                self.roster[sender],
                sender,
                self.id,
                share_label(self.preset, blocks_digest),
            )
        except KeySetupError:
            raise UnopenedShare(
                f"{self.id}: {name}: the key share from {sender} does not open"
            ) from None
        if len(raw) == SHARE_SEED_BYTES:
            return self.ring.public(raw, 1)[0]
        return self._load_rows(raw, 1, name)[0]

    def _check_applied(self, d: Descriptor) -> None:
        """On ``lean``: the weights the clients applied, as they signed them, add up to at
        most 1 (each rounded to the nearest unit: half a unit each over at most), since each
        checked its values against the whole headroom."""
        if not self.preset.weighted_by_clients:
            return
        if any(k <= 0 for _, k, _ in d.entries):
            raise ReleaseRefused(f"{self.id}: {d.name!r} lists an applied weight below one unit")
        check_applied_total(self.id, d, self.preset.client_weight_unit)

    def _load_rows(self, blob: bytes | memoryview, rows: int, name: str) -> np.ndarray:
        try:
            return self.ring.from_bytes(bytes(blob), rows)
        except (ValueError, MalformedCiphertext) as exc:
            raise ReleaseRefused(f"{self.id}: {name}: {exc}") from None
