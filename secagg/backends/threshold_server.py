"""Server half of the threshold backend: sums masked uploads, relays sealed shares, unmasks.

The server holds no key and no share: each upload carries its client's one-time key shares
sealed for their holders (``secagg.threshold.params``). To reveal Σ_i w_i·x_i it forms
Σ_i w_i·b_i, gathers every contributor's consent to the release's descriptor, and asks every
holder (the roster's clients, or its committee) for its share of K = Σ_i w_i·k_i, sending
each holder the sealed shares addressed to it. t answers suffice (the rest may be offline);
with more than t the shares are checked for consistency, and a holder whose share is off is
named and excluded (``secagg.threshold.combine``). The server then unmasks Σ w_i b_i − a·K.
For a sum the clients open themselves, the holders seal their shares for the recipients, and
the server relays what it cannot open.

There is no key setup: the holders and their x-coordinates follow from the provisioned roster
(``holders_of``: all of it, or a committee of ``--threshold-committee`` clients), and t is each
client's own configuration (``--threshold-t``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secagg import wire
from secagg.backends.base import RunningSum, ServerBackend, applied_weight
from secagg.backends.consent import ReleaseRecord, gather_consents
from secagg.ckks.release import (
    Descriptor,
    Entry,
    ReleasePolicy,
    common_basis,
    server_multipliers,
    upload_basis_of,
)
from secagg.errors import (
    ConfigError,
    ConsentRefused,
    MalformedCiphertext,
    RoundAborted,
    RoundSkipped,
    UnexpectedField,
)
from secagg.threshold.combine import ShareMismatch, open_checked
from secagg.threshold.params import (
    ThresholdPreset,
    Upload,
    check_sum,
    check_t,
    decode,
    holder_xs,
    holders_of,
    public_seed,
    server_weight,
    upload_message,
)
from secagg.threshold.ring import Ring, ring
from secagg.wire import Envelope, Field


@dataclass
class ThresholdHandle:
    #: Σ w_i·b_i mod p, (blocks, N) uint64 (one upload's blocks before it is summed)
    total: np.ndarray
    n_values: int
    #: one upload (weight 0 until summed) or a sum's uploads with their integer weights;
    #: ``seeds`` holds each upload's digest preimage (what its digest hashes)
    entries: tuple[Entry, ...] = field(default_factory=tuple)
    #: each contributor's sealed key shares, in holder order
    sealed: dict[str, tuple[bytes, ...]] = field(default_factory=dict)
    summed: bool = False
    #: what the decoded sum is divided by (a running sum's normaliser)
    divisor: float = 1.0


def aborted(ctx, phase: str, message: str) -> RoundAborted:
    return RoundAborted(message, round=ctx.round, phase=phase, exclusions=ctx.excluded)


class ThresholdServer(ServerBackend):
    name = "threshold"
    upload_kind = wire.CIPHERTEXT
    can_read = False
    key_model = "threshold"
    who_can_decrypt = (
        "any t of the n key holders together, for one consented sum (one-time keys, "
        "Shamir-shared t of n): no client alone; the server with fewer than t holders learns "
        "nothing more"
    )
    # signed consents to releases; the contributors whose sealed share a holder could not open
    declares = ("consent", "unopened")

    def __init__(
        self,
        preset: ThresholdPreset,
        *,
        signers: Mapping[str, bytes] | None = None,
        t: int = 0,
        committee: int = 0,
        policy: ReleasePolicy | None = None,
    ):
        """Parameters:
        preset: the parameter set.
        signers: the clients' public signing keys (the roster of holders); the server checks
            each upload's signature and each consent with them.
        t: how many holders' shares open a sum (0: a strict majority of the holders).
        committee: how many of the roster's clients hold key shares (0: all of them).
        policy: the release policy the clients hold (the run's options; its colluders are
            set to t − 1 here): a release they would refuse skips the round instead of being
            asked for (``ReleaseRecord``).
        """
        self.preset = preset
        self.ring = ring(preset.ring_dim, preset.prime)
        self.signers = dict(signers) if signers is not None else None
        self.weights_at_client = preset.weighted_by_clients
        self._t = t
        self.committee = committee
        self.policy = policy if policy is not None else ReleasePolicy(max_weight=preset.max_weight)
        self.holders: list[str] = holders_of(self.signers, committee) if self.signers else []
        #: every client that may contribute (the holders are all or some of them)
        self.roster: list[str] = sorted(self.signers) if self.signers else []
        self.releases = ReleaseRecord(self.policy)
        #: how many reveals named each holder off the polynomial of the sum that checked:
        #: one named in :data:`SET_ASIDE_AFTER` of them is asked no more (``asked``)
        self.named_off: dict[str, int] = {}

    @property
    def by_groups(self) -> bool:
        return bool(self.releases.groups)

    def sitting_out(self, clients) -> dict[str, str]:
        return self.releases.sitting_out(clients)

    @property
    def asked(self) -> list[str]:
        """The holders a release asks for shares: every holder but those named off the
        polynomial in :data:`SET_ASIDE_AFTER` reveals (a liar found over rounds is set
        aside; with fewer than t left, every holder is asked again)."""
        kept = [h for h in self.holders if self.named_off.get(h, 0) < SET_ASIDE_AFTER]
        return kept if len(kept) >= self.t else list(self.holders)

    @property
    def t(self) -> int:
        return check_t(self._t, len(self.holders))

    def setup_config(self) -> dict[str, Any]:
        return {"preset": self.preset.name, "params": self.preset.fingerprint}

    def setup(self, ctx, decryption_budget: int) -> None:
        """Nothing to make: keys are one-time and dealt with each upload. Without a
        provisioned roster (tests), the holders are the run's clients."""
        if not self.holders:
            self.roster = sorted(ctx.active)
            self.holders = holders_of(self.roster, self.committee)
        m = self.policy.min_contributors
        self.policy = replace(self.policy, colluders=self.t - 1)
        self.releases = ReleaseRecord(self.policy)
        self.releases.deal(self.roster)
        if self.releases.groups:
            need = self.t - 1 + m
            small = min(len(self.releases.members(g)) for g in set(self.releases.groups.values()))
            if small < need:
                raise ConfigError(
                    f"participation groups of {small} clients cannot hide an upload among "
                    f"{m} honest ones with t - 1 = {self.t - 1} colluding: each group needs "
                    f"{need} (fewer --participation-groups, or a lower --threshold-t)"
                )
        if m > 1 and len(self.roster) < self.t - 1 + m:
            raise ConfigError(
                f"threshold with {len(self.roster)} clients and t = {self.t}: t − 1 colluding "
                f"clients and the server would read every honest upload from any sum, since a "
                f"release must hold {m} honest uploads whoever colludes ({self.t - 1 + m} in "
                "all). Run more clients, a lower --threshold-t, or --backend-option "
                "min_contributors=1 to accept releases of single uploads"
            )

    # ---- aggregation -------------------------------------------------------------------------
    def load(self, envelope: Envelope, name: str, length: int) -> ThresholdHandle:
        parts = [bytes(p) for p in envelope.ciphertext_parts(name)]
        upload = Upload.from_parts(self.preset, parts, length, len(self.holders))
        digest = upload.digest(self.preset)
        if self.signers is not None:
            try:
                Ed25519PublicKey.from_public_bytes(self.signers[envelope.sender]).verify(
                    upload.signature, upload_message(envelope.sender, digest)
                )
            except (InvalidSignature, KeyError, ValueError):
                raise MalformedCiphertext(
                    f"{envelope.sender}'s upload is not signed by its roster key"
                ) from None
        blocks = self.ring.from_bytes(upload.blocks, self.preset.upload_blocks(length))
        entry = Entry(envelope.sender, 0, upload.preimage(self.preset), upload_basis_of(envelope))
        return ThresholdHandle(blocks, length, (entry,), {envelope.sender: upload.sealed})

    def weighted_sum(
        self, handles: Sequence[ThresholdHandle], weights: Sequence[float]
    ) -> ThresholdHandle:
        if self.weights_at_client:
            raise ConfigError(
                f"threshold preset {self.preset.name!r} only adds uploads their clients "
                "weighted before masking (a streaming run's planned weights); this protocol "
                "weights after the uploads arrive: use the wide preset"
            )
        if any(h.summed or len(h.entries) != 1 for h in handles):
            raise MalformedCiphertext("only fresh uploads can be summed")
        ks = [server_weight(w, self.preset) for w in weights]
        kept = [(h, k) for h, k in zip(handles, ks) if k != 0]
        if not kept:
            raise MalformedCiphertext("a sum needs at least one non-zero weight")
        # the uploads as they are: no stacked copy of all of them
        total = self.ring.combine([h.total for h, _ in kept], [k for _, k in kept])
        return ThresholdHandle(
            total.reshape(kept[0][0].total.shape),
            handles[0].n_values,
            tuple(replace(h.entries[0], k=k) for h, k in kept),
            {c: v for h, _ in kept for c, v in h.sealed.items()},
            summed=True,
        )

    def running_sum(self, length: int) -> ThresholdRunningSum:
        return ThresholdRunningSum(self, length)

    def to_field(self, handle: ThresholdHandle) -> Field:
        return wire.ciphertext([self.ring.to_bytes(handle.total)])

    # ---- releases ----------------------------------------------------------------------------
    def descriptor(self, ctx, handle: ThresholdHandle, kind: str, name: str) -> Descriptor:
        if not handle.summed or not handle.entries:
            raise MalformedCiphertext(f"{name}: only a weighted sum of uploads can be released")
        return Descriptor(
            kind,
            name,
            ctx.round,
            handle.n_values,
            self.preset.blocks(handle.n_values),
            tuple((e.client, e.k, e.digest) for e in handle.entries),
            common_basis(handle.entries),
        )

    def _shares(
        self, ctx, handle: ThresholdHandle, name: str, kind: str, extra: dict[str, Field]
    ) -> tuple[Descriptor, dict[str, Envelope]]:
        """Every reachable holder's answer to a release of ``kind``: the descriptor with the
        contributors' consents, and for each holder the sealed shares addressed to it.
        Fewer than t answers stop the round (``RoundAborted``, with every exclusion)."""
        d = self.descriptor(ctx, handle, kind, name)
        consents = gather_consents(ctx, d, self.signers, self.releases)
        asked = self.asked
        common = {
            "release": wire.config({"descriptor": d.to_config(), "consents": consents}),
            "holders": wire.config({"ids": asked}),
            "preimages": wire.ciphertext([e.seeds for e in handle.entries]),
            **extra,
        }
        requests = {
            h: {
                **common,
                "shares": wire.ciphertext([handle.sealed[e.client][j] for e in handle.entries]),
            }
            for j, h in enumerate(self.holders)
            if h in asked
        }
        phase = {"reveal": "decrypt_share", "open": "open_share"}[kind]
        expect = (
            {"share": wire.CIPHERTEXT}
            if kind == "reveal"
            else {"sealed": wire.CIPHERTEXT, "keys": wire.CIPHERTEXT}
        )
        replies = ctx.ask(
            phase,
            requests,
            expect={**expect, "unopened": wire.CONFIG},
            reach_excluded=True,
            on_reply=_unopened_reply,
        )
        named = {h: unopened for h, (_, unopened) in replies.items() if unopened}
        answers = {h: env for h, (env, unopened) in replies.items() if not unopened}
        if len(answers) < self.t:
            # contributors whose sealed shares most of the named-holders could not open dealt
            # garbage: they leave the run, the round makes no update (as a refused consent)
            counts: dict[str, int] = {}
            for clients in named.values():
                for c in set(clients):
                    counts[c] = counts.get(c, 0) + 1
            culprits = sorted(c for c, k in counts.items() if 2 * k > len(replies))
            missing = [h for h in asked if h not in answers]
            message = (
                f"{name}: {len(answers)} of {len(self.holders)} holders answered and t = "
                f"{self.t} are needed: "
                + "; ".join(
                    f"{h}: "
                    + (
                        f"shares of {named[h]} do not open"
                        if h in named
                        else str(ctx.excluded.get(h, "no answer"))
                    )
                    for h in missing
                )
            )
            if culprits:
                raise ConsentRefused(
                    message + f"; {culprits} dealt key shares their holders cannot open",
                    culprits=culprits,
                    round=ctx.round,
                    phase=phase,
                    exclusions=ctx.excluded,
                )
            raise aborted(ctx, phase, message)
        return d, answers

    def release(self, ctx, handle: ThresholdHandle, name: str) -> dict[str, Field]:
        """Fields that let the round's clients open ``handle``: the sum, its descriptor and
        at least t holders' shares of its key sum, each sealed for every recipient (the
        server relays them and can open none)."""
        recipients = list(ctx.active)
        d, replies = self._shares(
            ctx, handle, name, "open", {"recipients": wire.config({"ids": recipients})}
        )
        answered, sealed, keys = [], [], []
        for h in self.holders:
            if h not in replies:
                continue
            s, k = replies[h].ciphertext_parts("sealed"), replies[h].ciphertext_parts("keys")
            if len(s) != 1 or len(k) != len(recipients):
                ctx.exclude(
                    h,
                    "open_share",
                    MalformedCiphertext(
                        f"{len(s)} sealed share(s) and {len(k)} key(s) for one share and "
                        f"{len(recipients)} recipient(s)"
                    ),
                )
                continue
            answered.append(h)
            sealed.append(bytes(s[0]))
            keys += [bytes(b) for b in k]
        if len(answered) < self.t:
            raise aborted(ctx, "open_share", f"{name}: {len(answered)} usable shares, t = {self.t}")
        info = {
            "descriptor": d.to_config(),
            "holders": answered,
            "recipients": recipients,
            "divisor": handle.divisor,
        }
        return {
            name: self.to_field(handle),
            f"{name}.release": wire.config(info),
            f"{name}.sealed": wire.ciphertext(sealed),
            f"{name}.keys": wire.ciphertext(keys),
        }

    def reveal(self, ctx, handle: ThresholdHandle, name: str) -> tuple[np.ndarray, str]:
        """The holders' shares of the consented sum's key sum, checked and combined; the
        sum unmasked. Names who answered, and t of n."""
        d, replies = self._shares(ctx, handle, name, "reveal", {})
        shares = {}
        for h in self.holders:
            if h not in replies:
                continue
            parts = replies[h].ciphertext_parts("share")
            try:
                if len(parts) != 1:
                    raise MalformedCiphertext(f"{len(parts)} shares in one answer")
                shares[h] = self.ring.from_bytes(bytes(parts[0]), 1)[0]
            except MalformedCiphertext as exc:
                ctx.exclude(h, "decrypt_share", exc)
        seed = public_seed(self.preset, d.basis)
        multipliers = server_multipliers(self.preset.weighted_by_clients, d.weights.values())
        try:
            centred, off = open_checked(
                self.ring,
                shares,
                holder_xs(self.holders),
                self.t,
                lambda key_sum: self.ring.unmask(handle.total, key_sum, seed),
                lambda centred: check_sum(self.preset, centred, multipliers),
            )
        except ShareMismatch as exc:
            raise RoundSkipped(
                f"{name}: {exc}; the round is skipped",
                round=ctx.round,
                phase="decrypt_share",
                exclusions=ctx.excluded,
            ) from None
        values = decode(self.preset, centred, handle.n_values, handle.divisor)
        by = f"holders {','.join(shares)} ({len(shares)} of {len(self.holders)}, t = {self.t})"
        if off:
            # named, not blamed: a lying holder and a dealer that sealed it a share off its
            # own polynomial look alike from the combined shares (``combine``); named in
            # SET_ASIDE_AFTER reveals, it is asked no more (the run goes on without its
            # shares: a policy that changes who answers, said here and in the audit)
            by += f"; off the polynomial: {','.join(off)} (a wrong share, or a dealer's)"
            for h in off:
                self.named_off[h] = self.named_off.get(h, 0) + 1
            aside = [h for h in off if self.named_off[h] == SET_ASIDE_AFTER]
            if aside and len(self.asked) < len(self.holders):
                by += f"; set aside from now on: {','.join(aside)}"
        return values, by


#: a holder named off the polynomial in this many reveals is asked for shares no more
SET_ASIDE_AFTER = 2
#: coefficients folded at a time into a running sum (1 MB of uint64 per block)
FOLD_BLOCK = 1 << 17


def fold_into(ring_: Ring, acc: np.ndarray, upload: np.ndarray, factor: int) -> None:
    """acc ← acc + factor·upload mod p, in place, a block at a time: the sum holds one model's
    worth and no model-sized temporary (the ring's combine, which checks every coefficient of
    ``upload`` is below p, on each block)."""
    if upload.shape != acc.shape:
        raise MalformedCiphertext(f"an upload of shape {upload.shape}; the sum has {acc.shape}")
    flat, values = acc.reshape(-1), upload.reshape(-1)
    for start in range(0, flat.size, FOLD_BLOCK):
        block = slice(start, start + FOLD_BLOCK)
        flat[block] = ring_.combine([flat[block], values[block]], [1, factor])


class ThresholdRunningSum(RunningSum):
    """Σ w_i·upload_i folded as the uploads arrive (on ``lean`` the clients weighted, the
    server adds); the sealed shares are kept for the holders."""

    def __init__(self, server: ThresholdServer, length: int):
        self.server, self.length = server, length
        self._acc: np.ndarray | None = None
        self._entries: list[Entry] = []
        self._sealed: dict[str, tuple[bytes, ...]] = {}

    def add(self, handle: ThresholdHandle, weight: float) -> None:
        if handle.summed or handle.n_values != self.length or len(handle.entries) != 1:
            raise MalformedCiphertext("only fresh uploads of the model's length can be summed")
        preset = self.server.preset
        if preset.weighted_by_clients:
            k, factor = applied_weight(weight, preset), 1
        else:
            k = factor = server_weight(weight, preset)
            if k == 0:
                return
        ring_ = self.server.ring
        if self._acc is None:
            self._acc = ring_.combine([handle.total], [factor]).reshape(handle.total.shape)
        else:
            fold_into(ring_, self._acc, handle.total, factor)
        (entry,) = handle.entries
        self._entries.append(replace(entry, k=k))
        self._sealed.update(handle.sealed)

    def _result(self, normaliser: float) -> ThresholdHandle:
        if self._acc is None:
            raise MalformedCiphertext("an empty running sum")
        return ThresholdHandle(
            self._acc,
            self.length,
            tuple(self._entries),
            dict(self._sealed),
            summed=True,
            divisor=normaliser,
        )


def _unopened_reply(holder: str, env: Envelope) -> tuple[Envelope, list[str]]:
    """A holder's answer and the contributors whose shares it could not open (a list of
    client names, else UnexpectedField excludes the holder)."""
    clients = env.config("unopened").get("clients")
    if not isinstance(clients, list) or not all(isinstance(c, str) for c in clients):
        raise UnexpectedField(f"{holder} named unopened shares as {clients!r:.80}")
    return env, clients
