"""Server half of the CKKS backend: a public context, homomorphic sums, a decryptor protocol.

The server holds no key. It runs the clients' key setup (relaying wrapped keys it cannot
open), sums uploads homomorphically, and has aggregates revealed by a decryptor client that
floods the decryption before returning it (see ``secagg/ckks/flooding.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import RunningSum, ServerBackend
from secagg.ckks.presets import CKKSPreset
from secagg.ckks.public import CiphertextSum, PublicCKKS, params_fingerprint, to_bytes
from secagg.errors import KeySetupError, MalformedCiphertext, RoundAborted
from secagg.wire import Envelope, Field


@dataclass
class CKKSHandle:
    ciphertexts: list  # seal.Ciphertext, one per chunk
    n_values: int
    scale: float


class CKKSServer(ServerBackend):
    name = "ckks"
    upload_kind = wire.CIPHERTEXT
    can_read = False
    key_model = "shared"
    declares = ("x25519_public", "installed")  # clients' public keys; key-install receipts

    def __init__(self, preset: CKKSPreset):
        self.preset = preset
        self.public = PublicCKKS(preset)
        self.fingerprint = params_fingerprint(preset)
        self._reveals = 0

    def setup_config(self) -> dict[str, Any]:
        """What the server proposes: the parameter set. Everything a client's security rests
        on (the roster, flooding, the decryption budget) is in the client's own
        configuration, never in a server's message."""
        return {"preset": self.preset.name, "params": self.fingerprint}

    # ---- key setup: the clients make one CKKS key and share it through the server ----------
    def setup(self, ctx, decryption_budget: int) -> None:
        """Who is online (``key_hello``), then one leader makes the key and wraps it for the
        others, whose identities it takes from its own roster; the server relays the blobs.
        ``decryption_budget`` is the clients' business (their configuration holds it)."""
        clients = list(ctx.active)
        setup = wire.config(self.setup_config())
        hello = ctx.ask(
            "key_hello",
            {c: {"setup": setup} for c in clients},
            expect={"x25519_public": wire.CONFIG},
        )
        if not hello:
            raise RoundAborted(
                "no client answered the key setup",
                round=ctx.round,
                phase="key_hello",
                exclusions=ctx.excluded,
            )
        leader, *others = list(hello)
        gen = ctx.ask(
            "key_generate",
            {leader: {"setup": setup, "peers": wire.config({"ids": others})}},
            expect={f"wrapped_key.{c}": wire.CIPHERTEXT for c in others},
        )
        if leader not in gen:
            raise RoundAborted(
                f"key leader {leader} failed: {ctx.excluded.get(leader)}",
                round=ctx.round,
                phase="key_generate",
                exclusions=ctx.excluded,
            )
        install = {
            c: {
                "setup": setup,
                "leader": wire.config({"id": leader}),
                "wrapped_key": wire.ciphertext(gen[leader].ciphertext_parts(f"wrapped_key.{c}")),
            }
            for c in others
        }
        done = ctx.ask("key_install", install, expect={"installed": wire.CONFIG})
        for c, env in done.items():
            receipt = env.config("installed")
            if not isinstance(receipt, dict) or receipt.get("params") != self.fingerprint:
                ctx.exclude(c, "key_install", KeySetupError("installed other parameters"))

    # ---- aggregation -----------------------------------------------------------------------
    def load(self, envelope: Envelope, name: str, length: int) -> CKKSHandle:
        parts = envelope.ciphertext_parts(name)
        return CKKSHandle(self.public.load_ciphertexts(parts, length), length, self.public.scale)

    def weighted_sum(self, handles: Sequence[CKKSHandle], weights: Sequence[float]) -> CKKSHandle:
        if any(h.scale != self.public.scale for h in handles):
            raise MalformedCiphertext("only fresh uploads can be summed")
        cts = self.public.weighted_sum([h.ciphertexts for h in handles], weights)
        return CKKSHandle(cts, handles[0].n_values, self.public.sum_scale)

    def running_sum(self, length: int) -> CKKSRunningSum:
        return CKKSRunningSum(self.public, length)

    def to_field(self, handle: CKKSHandle) -> Field:
        return wire.ciphertext([to_bytes(ct) for ct in handle.ciphertexts])

    # ---- reveal through a decryptor client ---------------------------------------------------
    def reveal(self, ctx, handle: CKKSHandle, name: str) -> tuple[np.ndarray, str]:
        """Ask a decryptor (rotating over the active clients) for a flooded decryption."""
        request = {
            "aggregate": self.to_field(handle),
            "reveal": wire.config({"name": name, "n_values": handle.n_values}),
        }
        errors = {}
        candidates = list(ctx.active)
        for attempt in range(len(candidates)):
            decryptor = candidates[(self._reveals + attempt) % len(candidates)]
            # decoded inside ``ask``: a reply of the wrong length or with a NaN excludes the
            # decryptor (and the next one is asked) instead of ending the run
            reply = ctx.ask(
                "reveal",
                {decryptor: request},
                expect={name: wire.VECTOR},
                on_reply=lambda _, env: env.vector(name, handle.n_values),
            )
            if decryptor in reply:
                self._reveals += 1
                return reply[decryptor], decryptor
            errors[decryptor] = ctx.excluded.get(decryptor)
        raise RoundAborted(
            f"no decryptor could reveal {name}: {errors}",
            round=ctx.round,
            phase="reveal",
            exclusions=ctx.excluded,
        )


class CKKSRunningSum(RunningSum):
    """Homomorphic running sum of fresh uploads; each upload is multiplied in place and
    added, then only the sum is kept."""

    def __init__(self, public: PublicCKKS, length: int):
        self.public = public
        self.length = length
        self._sum = CiphertextSum(public)

    def add(self, handle: CKKSHandle, weight: float) -> None:
        if handle.scale != self.public.scale or handle.n_values != self.length:
            raise MalformedCiphertext("only fresh uploads of the model's length can be summed")
        self._sum.add(handle.ciphertexts, weight, consume=True)

    def _result(self, normaliser: float) -> CKKSHandle:
        cts = self._sum.result(normaliser)
        return CKKSHandle(cts, self.length, cts[0].scale)
