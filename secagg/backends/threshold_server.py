"""Server half of the threshold backend (OpenFHE): relays the key chain, sums, fuses.

The server holds no key share. Key setup is a chain through the server: holder i gets
holder i−1's public key, adds its own share (``MultipartyKeyGen``) and signs the link
(holders, index, digests of the key it got and the key it made); every holder then checks
the whole signed chain before it accepts the joint key. A server that skipped a holder,
spliced in a key of its own or reordered the chain is refused (``threshold_client``).

An aggregate is revealed by fusing every holder's partial decryption with its c0 (the
server's own part). A holder computes its partial on Σ k_i·c1_i that it recomputed from the
uploads' c1 halves, after checking that every contributor signed the release's descriptor
(``secagg.ckks.release``: the same descriptors, consents and policy as ckks), so the server
obtains partials of consented sums only. n-of-n: a holder that does not answer stops the
reveal, and the run (re-keying without it is future work).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import RunningSum, ServerBackend
from secagg.backends.consent import gather_consents
from secagg.ckks.release import Descriptor, Entry, common_basis, upload_basis_of
from secagg.errors import KeySetupError, MalformedCiphertext, RoundAborted, UnexpectedField
from secagg.threshold.params import ThresholdContext, ThresholdPreset, c1_digest, quantise
from secagg.wire import Envelope, Field


@dataclass
class ThresholdHandle:
    chunks: list  # OpenFHE ciphertexts, one per 4096 values
    n_values: int
    #: one upload (weight 0 until summed) or a sum's uploads with their integer weights;
    #: ``seeds`` holds the upload's joined c1 halves (what its digest names)
    entries: tuple[Entry, ...] = field(default_factory=tuple)
    #: each entry's c1 halves, chunk by chunk (what holders recompute the sum from)
    halves: dict[str, list[bytes]] = field(default_factory=dict)
    summed: bool = False
    #: what the decrypted sum is divided by (a running sum of planned weights normalised
    #: over the clients that arrived: depth 0 cannot multiply by 1/normaliser)
    divisor: float = 1.0


def aborted(ctx, phase: str, message: str) -> RoundAborted:
    """The round stops in ``phase`` (n-of-n: every holder is needed), with its exclusions."""
    return RoundAborted(message, round=ctx.round, phase=phase, exclusions=ctx.excluded)


class ThresholdServer(ServerBackend):
    name = "threshold"
    upload_kind = wire.CIPHERTEXT
    can_read = False
    key_model = "threshold"
    # the signed links of the key chain, key-install receipts, signed consents to releases
    declares = ("key_link", "installed", "consent")

    def __init__(self, preset: ThresholdPreset, *, signers: Mapping[str, bytes] | None = None):
        self.context = ThresholdContext(preset)
        self.preset = preset
        self.signers = dict(signers) if signers is not None else None
        self.holders: list[str] = []

    def setup_config(self) -> dict[str, Any]:
        return {"preset": self.preset.name, "params": self.context.fingerprint}

    # ---- key setup: the chain ----------------------------------------------------------------
    def setup(self, ctx, decryption_budget: int) -> None:
        setup = wire.config(self.setup_config())
        holders = list(ctx.active)
        links: list[dict[str, Any]] = []
        previous: bytes | None = None
        for index, holder in enumerate(holders):
            request = {
                "setup": setup,
                "chain": wire.config({"holders": holders, "index": index, "links": links}),
            }
            if previous is not None:
                request["previous"] = wire.ciphertext([previous])
            reply = ctx.ask(
                "key_chain",
                {holder: request},
                expect={"public_key": wire.CIPHERTEXT, "key_link": wire.CONFIG},
                on_reply=_chain_reply,
            )
            if holder not in reply:
                raise aborted(
                    ctx,
                    "key_chain",
                    f"key holder {holder} did not add its share to the threshold key "
                    f"({ctx.excluded.get(holder)}); every holder must",
                )
            previous, link = reply[holder]
            links.append(link)
        install = {
            c: {
                "setup": setup,
                "chain": wire.config({"holders": holders, "links": links}),
                "joint_key": wire.ciphertext([previous or b""]),
            }
            for c in holders
        }
        done = ctx.ask(
            "key_install",
            install,
            expect={"installed": wire.CONFIG},
            on_reply=lambda _, env: env.config("installed"),  # a JSON list excludes its sender
        )
        refused = [c for c in holders if c not in done]
        if refused:
            raise aborted(
                ctx,
                "key_install",
                f"holders {refused} refused the joint key: "
                + "; ".join(f"{c}: {ctx.excluded.get(c)}" for c in refused),
            )
        for c, receipt in done.items():
            if receipt != {"params": self.context.fingerprint}:
                raise KeySetupError(f"{c} installed other parameters")
        self.holders = holders

    # ---- aggregation -------------------------------------------------------------------------
    def load(self, envelope: Envelope, name: str, length: int) -> ThresholdHandle:
        parts = [bytes(p) for p in envelope.ciphertext_parts(name)]
        chunks = self.context.load_ciphertexts(parts, length)
        halves = [self.context.c1_half(ct) for ct in chunks]
        entry = Entry(envelope.sender, 0, b"".join(halves), upload_basis_of(envelope))
        return ThresholdHandle(chunks, length, (entry,), {envelope.sender: halves})

    def weighted_sum(
        self, handles: Sequence[ThresholdHandle], weights: Sequence[float]
    ) -> ThresholdHandle:
        if any(h.summed or len(h.entries) != 1 for h in handles):
            raise MalformedCiphertext("only fresh uploads can be summed")
        ks = [quantise(w, self.preset.weight_bits) for w in weights]
        kept = [(h, k) for h, k in zip(handles, ks) if k != 0]
        if not kept:
            raise MalformedCiphertext("a sum needs at least one non-zero weight")
        chunks = self.context.weighted_sum([h.chunks for h, _ in kept], [k for _, k in kept])
        return ThresholdHandle(
            chunks,
            handles[0].n_values,
            tuple(replace(h.entries[0], k=k) for h, k in kept),
            {c: v for h, _ in kept for c, v in h.halves.items()},
            summed=True,
        )

    def running_sum(self, length: int) -> ThresholdRunningSum:
        return ThresholdRunningSum(self, length)

    def to_field(self, handle: ThresholdHandle) -> Field:
        from secagg.threshold.params import serialize

        return wire.ciphertext([serialize(ct) for ct in handle.chunks])

    # ---- releases ----------------------------------------------------------------------------
    def descriptor(self, ctx, handle: ThresholdHandle, kind: str, name: str) -> Descriptor:
        if not handle.summed or not handle.entries:
            raise MalformedCiphertext(f"{name}: only a weighted sum of uploads can be released")
        return Descriptor(
            kind,
            name,
            ctx.round,
            handle.n_values,
            len(handle.chunks),
            tuple((e.client, e.k, c1_digest(handle.halves[e.client])) for e in handle.entries),
            common_basis(handle.entries),
        )

    def _shares(
        self, ctx, handle: ThresholdHandle, name: str, kind: str, extra: dict[str, Field]
    ) -> tuple[Descriptor, dict[str, Any], dict[str, Envelope]]:
        """Every holder's answer to a release of ``kind`` (its descriptor, the
        contributors' consents and c1 halves, and ``extra``); n-of-n: a holder that does
        not answer stops the round (``RoundAborted``, with every exclusion)."""
        d = self.descriptor(ctx, handle, kind, name)
        consents = gather_consents(ctx, d, self.signers)
        request = {
            "release": wire.config({"descriptor": d.to_config(), "consents": consents}),
            "halves": wire.ciphertext([b for e in handle.entries for b in handle.halves[e.client]]),
            **extra,
        }
        phase = {"reveal": "decrypt_share", "open": "open_share"}[kind]
        expect = (
            {"partial": wire.CIPHERTEXT}
            if kind == "reveal"
            else {"sealed": wire.CIPHERTEXT, "keys": wire.CIPHERTEXT}
        )
        replies = ctx.ask(
            phase, {h: request for h in self.holders}, expect=expect, reach_excluded=True
        )
        missing = [h for h in self.holders if h not in replies]
        if missing:
            raise aborted(
                ctx,
                phase,
                f"{name}: holders {missing} sent no share and the threshold key needs all "
                "of them (n-of-n); the run stops: "
                + "; ".join(f"{h}: {ctx.excluded.get(h, 'no answer')}" for h in missing),
            )
        return d, consents, replies

    def release(self, ctx, handle: ThresholdHandle, name: str) -> dict[str, Field]:
        """Fields that let the round's clients open ``handle``: the sum's c0 halves, its
        descriptor, and every holder's partial decryption sealed for them (the server
        relays the shares and can fuse none of them)."""
        recipients = list(ctx.active)
        d, _, replies = self._shares(
            ctx, handle, name, "open", {"recipients": wire.config({"ids": recipients})}
        )
        chunks = len(handle.chunks)
        sealed, keys = [], []
        for h in self.holders:
            s, k = replies[h].ciphertext_parts("sealed"), replies[h].ciphertext_parts("keys")
            if len(s) != chunks or len(k) != len(recipients):
                raise aborted(
                    ctx,
                    "open_share",
                    f"{name}: holder {h} sent {len(s)} sealed chunk(s) and {len(k)} key(s) "
                    f"for {chunks} chunk(s) and {len(recipients)} recipient(s)",
                )
            sealed += [bytes(b) for b in s]
            keys += [bytes(b) for b in k]
        info = {
            "descriptor": d.to_config(),
            "holders": self.holders,
            "recipients": recipients,
            "divisor": handle.divisor,
        }
        return {
            name: wire.ciphertext([self.context.c0_half(ct) for ct in handle.chunks]),
            f"{name}.release": wire.config(info),
            f"{name}.sealed": wire.ciphertext(sealed),
            f"{name}.keys": wire.ciphertext(keys),
        }

    def reveal(self, ctx, handle: ThresholdHandle, name: str) -> tuple[np.ndarray, str]:
        """Every holder's partial decryption of the consented sum, fused with its c0."""
        _, _, replies = self._shares(ctx, handle, name, "reveal", {})
        try:
            partials = [
                [self.context.load_partial(p) for p in replies[h].ciphertext_parts("partial")]
                for h in self.holders
            ]
            if any(len(p) != len(handle.chunks) for p in partials):
                raise MalformedCiphertext("a partial decryption has the wrong number of chunks")
            c0s = [self.context.c0(ct) for ct in handle.chunks]
            values = self.context.fuse(c0s, partials, handle.n_values) / handle.divisor
        except MalformedCiphertext as exc:
            raise aborted(
                ctx,
                "decrypt_share",
                f"{name}: the holders' partial decryptions do not fuse ({exc})",
            ) from None
        return values, "holders " + ",".join(self.holders)


class ThresholdRunningSum(RunningSum):
    """Σ k_i·upload_i folded as the uploads arrive; the c1 halves are kept (holders need
    them to recompute the sum they partially decrypt)."""

    def __init__(self, server: ThresholdServer, length: int):
        self.server, self.length = server, length
        self._acc: list | None = None
        self._entries: list[Entry] = []
        self._halves: dict[str, list[bytes]] = {}

    def add(self, handle: ThresholdHandle, weight: float) -> None:
        if handle.summed or handle.n_values != self.length or len(handle.entries) != 1:
            raise MalformedCiphertext("only fresh uploads of the model's length can be summed")
        k = quantise(weight, self.server.preset.weight_bits)
        if k == 0:
            return
        context = self.server.context
        terms = [context.times(ct, k) for ct in handle.chunks]
        if self._acc is None:
            self._acc = terms  # fresh objects: ``times`` copies
        else:
            for acc, term in zip(self._acc, terms):
                context.cc.EvalAddInPlace(acc, term)
        (entry,) = handle.entries
        self._entries.append(replace(entry, k=k))
        self._halves.update(handle.halves)

    def _result(self, normaliser: float) -> ThresholdHandle:
        if self._acc is None:
            raise MalformedCiphertext("an empty running sum")
        return ThresholdHandle(
            self._acc,
            self.length,
            tuple(self._entries),
            dict(self._halves),
            summed=True,
            divisor=normaliser,
        )


def _chain_reply(holder: str, env: Envelope) -> tuple[bytes, dict[str, Any]]:
    """A key-chain reply: one public key and its link (UnexpectedField excludes the holder)."""
    parts = env.ciphertext_parts("public_key")
    if len(parts) != 1:
        raise UnexpectedField(f"{holder} sent {len(parts)} public keys in its key-chain reply")
    return bytes(parts[0]), env.config("key_link")
