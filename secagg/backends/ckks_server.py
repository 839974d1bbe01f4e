"""Server half of the CKKS backend: a public context, homomorphic sums, a decryptor protocol.

The server holds no key. It runs the clients' key setup (relaying wrapped keys it cannot
open), sums uploads homomorphically, and has aggregates revealed by a decryptor client that
floods the decryption before returning it (see ``secagg/ckks/flooding.py``).

Every sum remembers what it is made of (each upload's client, integer weight and seeds), and
every release — revealed to the server or sent to clients to open — goes out with that
descriptor, the seeds, and each contributor's signed consent, which the server gathers in a
``consent`` phase: the clients check all three before they decrypt (``secagg/ckks/release.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import RunningSum, ServerBackend
from secagg.backends.consent import gather_consents
from secagg.ckks.first_polys import (
    FirstPolynomialSum,
    FreshLevel,
    first_polynomials,
    plaintext_blobs,
)
from secagg.ckks.presets import CKKSPreset
from secagg.ckks.public import (
    CiphertextSum,
    PublicCKKS,
    applied_weight,
    params_fingerprint,
    quantise,
    to_bytes,
)
from secagg.ckks.release import Descriptor, Entry
from secagg.errors import (
    ConfigError,
    KeySetupError,
    MalformedCiphertext,
    RoundAborted,
)
from secagg.wire import Envelope, Field


@dataclass
class CKKSHandle:
    ciphertexts: list  # seal.Ciphertext, one per chunk
    n_values: int
    scale: float
    #: what the handle is made of: one upload (weight 0 until it is summed), or a sum's
    #: uploads with their integer weights
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    @property
    def chunks(self) -> int:
        return len(self.ciphertexts)


@dataclass
class FirstPolysHandle:
    """An upload or a sum on a client-weighted preset: first polynomials only
    (``secagg.ckks.first_polys``: the server never expands a seed)."""

    first: np.ndarray  # (chunks, primes·N) uint64
    n_values: int
    scale: float
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    @property
    def chunks(self) -> int:
        return int(self.first.shape[0])


class CKKSServer(ServerBackend):
    name = "ckks"
    upload_kind = wire.CIPHERTEXT
    can_read = False
    key_model = "shared"
    # clients' public keys, key-install receipts, signed consents to releases
    declares = ("x25519_public", "installed", "consent")

    def __init__(self, preset: CKKSPreset, *, signers: Mapping[str, bytes] | None = None):
        """``signers``: the clients' public signing keys, if provisioned to the server: it
        then checks each consent and takes a client whose signature is bad out of the
        round. The clients check every consent regardless."""
        self.preset = preset
        self.public = PublicCKKS(preset)
        self.fingerprint = params_fingerprint(preset)
        #: the clients apply the planned weights themselves (a client-weighted preset)
        self.weights_at_client = preset.weighted_by_clients
        self._level = FreshLevel(self.public) if self.weights_at_client else None
        self.signers = dict(signers) if signers is not None else None
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
    def load(self, envelope: Envelope, name: str, length: int) -> CKKSHandle | FirstPolysHandle:
        parts = envelope.ciphertext_parts(name)
        if self._level is not None:  # the server only adds: first polynomials, seeds
            first, seeds = first_polynomials(self._level, parts, length)
            entry = (Entry(envelope.sender, 0, seeds),)
            return FirstPolysHandle(first, length, self.public.scale, entry)
        cts, seeds = self.public.load_upload(parts, length)
        return CKKSHandle(cts, length, self.public.scale, (Entry(envelope.sender, 0, seeds),))

    def weighted_sum(self, handles: Sequence[CKKSHandle], weights: Sequence[float]) -> CKKSHandle:
        if self.weights_at_client:
            raise ConfigError(
                f"CKKS preset {self.preset.name!r} only adds uploads their clients weighted "
                "before encrypting (a streaming run's planned weights); this protocol weights "
                "after the uploads arrive: use the compact or wide preset"
            )
        if any(h.scale != self.public.scale or len(h.entries) != 1 for h in handles):
            raise MalformedCiphertext("only fresh uploads can be summed")
        cts = self.public.weighted_sum([h.ciphertexts for h in handles], weights)
        return CKKSHandle(
            cts,
            handles[0].n_values,
            self.public.sum_scale,
            _weighted(self.preset, handles, weights),
        )

    def running_sum(self, length: int) -> RunningSum:
        if self._level is not None:
            return ClientWeightedSum(self._level, length)
        return CKKSRunningSum(self.public, length)

    def to_field(self, handle: CKKSHandle | FirstPolysHandle) -> Field:
        if isinstance(handle, FirstPolysHandle):
            assert self._level is not None
            return wire.ciphertext(plaintext_blobs(self._level, handle.first, handle.scale))
        return wire.ciphertext([to_bytes(ct) for ct in handle.ciphertexts])

    # ---- releases: consent, then a decryptor reveals or the clients open ---------------------
    def release(self, ctx, handle: CKKSHandle, name: str) -> dict[str, Field]:
        """Fields that let clients open ``handle`` themselves (kind ``open``)."""
        return self._release_fields(ctx, handle, name, "open", name)

    def _release_fields(
        self, ctx, handle: CKKSHandle, name: str, kind: str, field_name: str
    ) -> dict[str, Field]:
        """The aggregate, its descriptor with every contributor's consent, and the seeds."""
        if not handle.entries or any(e.k == 0 for e in handle.entries):
            raise MalformedCiphertext(f"{name}: only a weighted sum of uploads can be released")
        d = Descriptor(
            kind,
            name,
            ctx.round,
            handle.n_values,
            handle.chunks,
            tuple((e.client, e.k, e.digest) for e in handle.entries),
        )
        consents = self._consents(ctx, d)
        return {
            field_name: self.to_field(handle),
            f"{field_name}.release": wire.config(
                {"descriptor": d.to_config(), "consents": consents}
            ),
            f"{field_name}.seeds": wire.ciphertext([e.seeds for e in handle.entries]),
        }

    def _consents(self, ctx, d: Descriptor) -> dict[str, str]:
        return gather_consents(ctx, d, self.signers)

    def reveal(self, ctx, handle: CKKSHandle, name: str) -> tuple[np.ndarray, str]:
        """Ask a decryptor (rotating over the active clients) for a flooded decryption."""
        request = self._release_fields(ctx, handle, name, "reveal", "aggregate")
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
    added, then only the sum (and what it is made of) is kept."""

    def __init__(self, public: PublicCKKS, length: int):
        self.public = public
        self.length = length
        self._sum = CiphertextSum(public)
        self._entries: list[Entry] = []

    def add(self, handle: CKKSHandle, weight: float) -> None:
        if (
            handle.scale != self.public.scale
            or handle.n_values != self.length
            or len(handle.entries) != 1
        ):
            raise MalformedCiphertext("only fresh uploads of the model's length can be summed")
        if self._sum.add(handle.ciphertexts, weight, consume=True):
            self._entries += _weighted(self.public.preset, [handle], [weight])

    def _result(self, normaliser: float) -> CKKSHandle:
        cts = self._sum.result(normaliser)
        return CKKSHandle(cts, self.length, cts[0].scale, tuple(self._entries))


class ClientWeightedSum(RunningSum):
    """A running sum of uploads their clients multiplied by the planned weight the server
    sent them (a client-weighted preset): the server only adds their first polynomials
    (``secagg.ckks.first_polys``). Each entry records that weight as the integer its client
    applied, k = round(w · 2^client_weight_bits), which the client signs in its consent and
    a decryptor checks (``CKKSClient``)."""

    def __init__(self, level: FreshLevel, length: int):
        self.level = level
        self.length = length
        self._sum = FirstPolynomialSum(level)
        self._entries: list[Entry] = []

    def add(self, handle: FirstPolysHandle, weight: float) -> None:
        if (
            not isinstance(handle, FirstPolysHandle)
            or handle.n_values != self.length
            or len(handle.entries) != 1
        ):
            raise MalformedCiphertext("only fresh uploads of the model's length can be summed")
        k = applied_weight(weight, self.level.public.preset)
        self._sum.add(handle.first)
        (entry,) = handle.entries
        self._entries.append(Entry(entry.client, k, entry.seeds))

    def _result(self, normaliser: float) -> FirstPolysHandle:
        if self._sum.total is None:
            raise ConfigError("no upload was added to the sum")
        if not 0 < normaliser <= 1 + 1e-9:
            raise ConfigError(f"a running sum's normaliser must lie in (0, 1], got {normaliser}")
        # the sum is at Δ (the clients weighted); a renormalised one decodes at Δ·normaliser
        scale = self.level.public.scale * normaliser
        return FirstPolysHandle(self._sum.total, self.length, scale, tuple(self._entries))


def _weighted(
    preset: CKKSPreset, handles: Sequence[CKKSHandle], weights: Sequence[float]
) -> tuple[Entry, ...]:
    """The uploads' entries with the integer weights the sum multiplied them by (an upload
    whose weight rounds to 0 was not added)."""
    out = []
    for h, w in zip(handles, weights):
        k = quantise(w, preset.weight_bits)
        if k != 0:
            (entry,) = h.entries
            out.append(Entry(entry.client, k, entry.seeds))
    return tuple(out)
