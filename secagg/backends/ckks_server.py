"""Server half of the CKKS backend: a public context, homomorphic sums, a decryptor protocol.

The server holds no key. It runs the clients' key setup (relaying wrapped keys it cannot
open), sums uploads homomorphically, and has aggregates revealed by two decryptor clients
that each flood their decryption before returning it (see ``secagg/ckks/flooding.py``); it
applies their mean only if the two agree within the flooding (``CKKSServer.reveal``).

Every sum remembers what it is made of (each upload's client, integer weight and seeds), and
every release — revealed to the server or sent to clients to open — goes out with that
descriptor, the seeds, and each contributor's signed consent, which the server gathers in a
``consent`` phase: the clients check all three before they decrypt (``secagg/ckks/release.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import RunningSum, ServerBackend, applied_weight
from secagg.backends.consent import ReleaseRecord, gather_consents
from secagg.ckks.first_polys import (
    FirstPolynomialSum,
    FreshLevel,
    first_polynomials,
    plaintext_chunks,
)
from secagg.ckks.presets import CKKSPreset
from secagg.ckks.public import (
    KEY_REFUSED,
    SEED_INFO_BYTES,
    CiphertextSum,
    PublicCKKS,
    check_normaliser,
    checked_weight,
    is_key_id,
    params_fingerprint,
    quantise,
    to_bytes,
)
from secagg.ckks.release import (
    NEXT_SEEDS,
    PRECHECK,
    Descriptor,
    Entry,
    ReleasePolicy,
    common_basis,
    upload_basis_of,
)
from secagg.ckks.server_sums import (
    expander_for,
    required_expander,
    weighted_firsts,
)
from secagg.errors import (
    ClientInputError,
    ConfigError,
    DuplicateUpload,
    KeySetupError,
    MalformedCiphertext,
    RoundAborted,
    UnexpectedField,
)
from secagg.wire import Envelope, Field


class WrongDecryption(ClientInputError):
    """A decryptor's flooded decryption of a release disagrees, beyond the flooding bound,
    with two other decryptors' decryptions of the same release that agree with each other
    (``CKKSServer.reveal``): it is excluded from the round and named in the audit."""


#: each comparison of two honest decryptions raises a false alarm with probability at most
#: 2^-CHECK_BITS per test (two tests: per value and norm), whatever the number of values
CHECK_BITS = 40
#: the float64 decoding of two different decryptions differs by at most about N·2^-53 of
#: the largest value (N ≤ 8192 here: 2^-40); this leaves a factor of 16
DECODE_SLACK = 2.0**-36
#: the reply field in which a decryptor reports the flooding σ per revealed value
SIGMA_FIELD = "flooding_sigma"


def decryptions_agree(
    a: np.ndarray, sigma_a: float, b: np.ndarray, sigma_b: float, rounding: float = 0.0
) -> bool:
    """Whether two flooded decryptions of one release can both be honest.

    Both decrypt the same ciphertext, so the sum's own encryption error is the same in both
    and cancels: a − b = g + ρ, where g is the difference of the two floodings (each value
    an independent N(0, σ²) draw per decryptor: g_j ~ N(0, σ_a² + σ_b²), i.i.d.) and ρ the
    difference of their rounding (the noise's encoding to integer coefficients, at most
    ``rounding`` = N/scale per value, and float64 decoding, at most ``DECODE_SLACK`` times
    the largest value). Honest decryptors of one run report the same σ (it is computed
    from the descriptor and the run's provisioning, the same at every client). With
    s = sqrt(σ_a² + σ_b²), M values and x = CHECK_BITS·ln 2, a pair agrees when

    - every |a_j − b_j| ≤ τ·s + slack with τ = sqrt(2·(ln M + x)): since
      P(|Z| > τ) ≤ exp(−τ²/2), an honest pair fails with probability ≤ M·exp(−τ²/2) =
      2^-CHECK_BITS (τ = 7.7 for 8 values, 9.1 for 10^6);
    - ‖a − b‖ ≤ s·sqrt(M + 2·sqrt(M·x) + 2x) + slack·sqrt(M): ‖g‖²/s² is χ² with M degrees
      of freedom, which exceeds M + 2·sqrt(M·x) + 2x with probability ≤ exp(−x)
      (Laurent–Massart), so an honest pair fails with probability ≤ 2^-CHECK_BITS.

    A deviation that passes both is within the flooding's own size: at most τ·s on any
    value, and of norm at most about s·sqrt(2·sqrt(M·x)), against the flooding's own
    s·sqrt(M)."""
    if a.shape != b.shape or not math.isclose(sigma_a, sigma_b, rel_tol=1e-9, abs_tol=0.0):
        return False
    m = max(a.size, 1)
    s = math.hypot(sigma_a, sigma_b)
    largest, widest, squares = _compared(a, b)
    slack = rounding + DECODE_SLACK * (1.0 + largest)
    x = CHECK_BITS * math.log(2.0)
    if widest > math.sqrt(2 * (math.log(m) + x)) * s + slack:
        return False
    bound = s * math.sqrt(m + 2 * math.sqrt(m * x) + 2 * x) + slack * math.sqrt(m)
    return math.sqrt(squares) <= bound


def _compared(a: np.ndarray, b: np.ndarray, block: int = 1 << 17) -> tuple[float, float, float]:
    """max(|a|∞, |b|∞), |a − b|∞ and ‖a − b‖², a block at a time (no model-sized temporary)."""
    largest = widest = squares = 0.0
    for start in range(0, a.size, block):
        x, y = a[start : start + block], b[start : start + block]
        largest = max(largest, float(np.max(np.abs(x))), float(np.max(np.abs(y))))
        diff = x - y
        widest = max(widest, float(np.max(np.abs(diff))))
        squares += float(np.dot(diff, diff))
    return largest, widest, squares


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
    """An upload or a sum read and formed without SEAL's loader: first polynomials only
    (``secagg.ckks.first_polys``, ``secagg.ckks.server_sums``: the server never expands a
    seed). Every preset on the native path; the client-weighted one on either path."""

    first: np.ndarray  # (chunks, primes·N) uint64
    n_values: int
    scale: float
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    @property
    def chunks(self) -> int:
        return int(self.first.shape[0])


def wrapped_keys(client: str, env: Envelope, peers: list[str]) -> dict[str, bytes]:
    """The key ``client`` wrapped for each of ``peers`` (one part each, else UnexpectedField
    excludes it): a leader's ``key_generate`` reply and a holder's ``key_share`` reply."""
    blobs = {}
    for p in peers:
        parts = env.ciphertext_parts(f"wrapped_key.{p}")
        if len(parts) != 1:
            raise UnexpectedField(f"{client} wraps the key for {p} in {len(parts)} parts")
        blobs[p] = bytes(parts[0])
    return blobs


class CKKSServer(ServerBackend):
    name = "ckks"
    upload_kind = wire.CIPHERTEXT
    can_read = False
    key_model = "shared"
    who_can_decrypt = (
        "any one client (every client holds the one secret key); the server alone cannot"
    )
    # clients' public keys, key-install receipts, signed consents to releases, the flooding
    # σ a decryptor reports (from the descriptor and its provisioning, no client data)
    declares = ("x25519_public", "installed", "consent", SIGMA_FIELD)

    def __init__(
        self,
        preset: CKKSPreset,
        *,
        signers: Mapping[str, bytes] | None = None,
        policy: ReleasePolicy | None = None,
    ):
        """``signers``: the clients' public signing keys, if provisioned to the server: it
        then checks each consent and takes a client whose signature is bad out of the
        round. The clients check every consent regardless. ``policy``: the release policy
        the clients hold (the run's options): a release they would refuse skips the round
        instead of being asked for (``ReleaseRecord``)."""
        self.preset = preset
        self.public = PublicCKKS(preset)
        self.fingerprint = params_fingerprint(preset)
        #: the clients apply the planned weights themselves (a client-weighted preset)
        self.weights_at_client = preset.weighted_by_clients
        #: the preset's fresh level: how uploads are read natively (every upload on the
        #: client-weighted preset) and how every sum is released (its first polynomials)
        self._fresh = FreshLevel(self.public)
        self._level = self._fresh if self.weights_at_client else None
        self.signers = dict(signers) if signers is not None else None
        self.releases = ReleaseRecord(
            policy if policy is not None else ReleasePolicy(max_weight=preset.max_weight)
        )
        self.releases.deal(list(self.signers or ()))
        self._reveals = 0
        #: each client's seeds for its next upload, as its last upload committed them
        self._committed: dict[str, bytes] = {}
        #: the same, by seeds: who committed each (so that checking an upload's author is
        #: one lookup, not a scan of every client's: n² a round at n clients)
        self._committers: dict[bytes, set[str]] = {}

    @property
    def by_groups(self) -> bool:
        return bool(self.releases.groups)

    def sitting_out(self, clients) -> dict[str, str]:
        return self.releases.sitting_out(clients)

    def setup_config(self) -> dict[str, Any]:
        """What the server proposes: the parameter set. Everything a client's security rests
        on (the roster, flooding, the decryption budget) is in the client's own
        configuration, never in a server's message."""
        return {"preset": self.preset.name, "params": self.fingerprint}

    # ---- key setup: the clients make one CKKS key and share it through the server ----------
    def setup(self, ctx, decryption_budget: int) -> None:
        """Who is online (``key_hello``), then one leader makes the key and wraps it for the
        others, whose identities it takes from its own roster; the server relays the blobs.
        ``decryption_budget`` is the clients' business (their configuration holds it).

        No one client can end setup or have another client excluded:

        - a leader whose ``key_generate`` reply is unusable is excluded (``ask`` says why)
          and the next client in hello order makes the key; setup aborts only when no
          client is left to make it;
        - a peer whose wrapped key does not open, or opens to another key than the one the
          leader committed to (its key id), reports it (``KEY_REFUSED``) and installs
          nothing. The server cannot tell whether the sender or the peer lies, so one such
          dispute excludes neither: a client that installed the key wraps it again for the
          peer (``key_share``). A client in disputes with two different clients is
          excluded: an honest client never disputes another honest one, so with one
          malicious client that is the malicious one (:meth:`_settle`);
        - where no client that holds the key is left while some hold none, those make a new
          key: the next of them in hello order leads, and its key goes only to clients that
          hold none (setup happens once per client).
        """
        setup = wire.config(self.setup_config())
        hello = ctx.ask(
            "key_hello",
            {c: {"setup": setup} for c in ctx.active},
            expect={"x25519_public": wire.CONFIG},
        )
        if not hello:
            raise RoundAborted(
                "no client answered the key setup",
                round=ctx.round,
                phase="key_hello",
                exclusions=ctx.excluded,
            )
        keyless = list(hello)
        disputes: dict[str, set[str]] = {}  # client -> the clients it is in a dispute with
        while True:
            keyless = [c for c in keyless if c in ctx.active]
            if not keyless:
                raise RoundAborted(
                    f"no client could make the key: {ctx.excluded}",
                    round=ctx.round,
                    phase="key_generate",
                    exclusions=ctx.excluded,
                )
            leader, *peers = keyless
            made = self._generate(ctx, setup, leader, peers)
            if made is None:  # excluded, with its reason: the next client leads
                keyless = peers
                continue
            key, blobs = made
            offers = {p: (leader, blob) for p, blob in blobs.items()}
            keyless = self._distribute(ctx, setup, key, [leader], offers, disputes)
            if not keyless:
                return

    def _generate(
        self, ctx, setup: Field, leader: str, peers: list[str]
    ) -> tuple[str, dict[str, bytes]] | None:
        """The leader's key id and its wrapped key for each peer, or None if its reply is
        unusable (it is then excluded)."""

        def read(client: str, env: Envelope) -> tuple[str, dict[str, bytes]]:
            receipt = env.config("installed")
            if receipt.get("params") != self.fingerprint or not is_key_id(receipt.get("key")):
                raise UnexpectedField(f"{client} does not commit to a key of these parameters")
            return receipt["key"], wrapped_keys(client, env, peers)

        gen = ctx.ask(
            "key_generate",
            {leader: {"setup": setup, "peers": wire.config({"ids": peers})}},
            expect={
                "installed": wire.CONFIG,
                **{f"wrapped_key.{c}": wire.CIPHERTEXT for c in peers},
            },
            on_reply=read,
        )
        return gen.get(leader)

    def _distribute(
        self,
        ctx,
        setup: Field,
        key: str,
        holders: list[str],
        offers: dict[str, tuple[str, bytes]],
        disputes: dict[str, set[str]],
    ) -> list[str]:
        """Install the key (id ``key``) at every peer of ``offers`` (peer -> who wrapped it,
        the blob); a peer that reports its blob does not open is offered the key again by
        another holder. Returns the clients left without a key because no holder of it
        is left (they make a new one); empty when every client still in holds the key."""
        while offers:
            refused = self._install(ctx, setup, key, offers, holders)
            self._settle(ctx, refused, disputes)
            pending = [p for p in refused if p in ctx.active]
            offers = self._reshare(ctx, setup, pending, holders, disputes)
            stuck = [p for p in pending if p not in offers and p in ctx.active]
            if stuck and not any(h in ctx.active for h in holders):
                return stuck
            for p in stuck:  # only the client it disputes holds the key: no third to settle
                ctx.exclude(
                    p,
                    "key_install",
                    KeySetupError(
                        f"{p} cannot open the key from {sorted(disputes[p])} and no other "
                        "client holds it"
                    ),
                )
        return []

    def _install(
        self,
        ctx,
        setup: Field,
        key: str,
        offers: dict[str, tuple[str, bytes]],
        holders: list[str],
    ) -> dict[str, str]:
        """Ask each peer to install its offered blob; add those that did to ``holders``.
        Returns the peers that report their blob does not open, with its sender."""
        install = {
            p: {
                "setup": setup,
                "leader": wire.config({"id": sender, "key": key}),
                "wrapped_key": wire.ciphertext(blob),
            }
            for p, (sender, blob) in offers.items()
        }
        # receipts read inside ``ask``: one that is not a JSON object excludes its sender
        done = ctx.ask(
            "key_install",
            install,
            expect={"installed": wire.CONFIG},
            on_reply=lambda _, env: env.config("installed"),
        )
        refused = {}
        for c, receipt in done.items():
            if receipt.get("params") != self.fingerprint:
                ctx.exclude(c, "key_install", KeySetupError("installed other parameters"))
            elif receipt == {"params": self.fingerprint, "refused": KEY_REFUSED}:
                refused[c] = offers[c][0]
            elif receipt.get("key") != key:
                ctx.exclude(
                    c, "key_install", KeySetupError(f"{c} reports another key than {key[:16]}")
                )
            else:
                holders.append(c)
        return refused

    @staticmethod
    def _settle(ctx, refused: Mapping[str, str], disputes: dict[str, set[str]]) -> None:
        """Record each refusal as a dispute between the peer and the blob's sender, and
        exclude every client in disputes with two different clients: of two honest clients
        neither disputes the other (an honest sender's blob opens at an honest peer, which
        says so), so each dispute has a malicious party, and with one malicious client only
        it can be in two. One dispute alone excludes no one."""
        for peer, sender in refused.items():
            disputes.setdefault(peer, set()).add(sender)
            disputes.setdefault(sender, set()).add(peer)
        for c, others in disputes.items():
            if len(others) >= 2 and c in ctx.active:
                ctx.exclude(
                    c,
                    "key_install",
                    KeySetupError(
                        f"a wrapped key between {c} and each of {sorted(others)} is disputed "
                        f"(it does not open, or is another key than the leader's): {c} is "
                        "the one party to all these disputes"
                    ),
                )

    def _reshare(
        self,
        ctx,
        setup: Field,
        pending: list[str],
        holders: list[str],
        disputes: dict[str, set[str]],
    ) -> dict[str, tuple[str, bytes]]:
        """Another holder wraps the key again for each pending peer (one it has no dispute
        with, first in order); a holder whose ``key_share`` reply is unusable is excluded and
        the next is asked. Returns peer -> (holder, blob) for the peers some holder wrapped
        for."""
        offers: dict[str, tuple[str, bytes]] = {}
        waiting = list(pending)
        while waiting:
            plan: dict[str, list[str]] = {}
            for p in waiting:
                h = next(
                    (h for h in holders if h in ctx.active and h not in disputes.get(p, ())),
                    None,
                )
                if h is not None:
                    plan.setdefault(h, []).append(p)
            if not plan:
                break
            for h, peers in plan.items():
                got = ctx.ask(
                    "key_share",
                    {h: {"setup": setup, "peers": wire.config({"ids": peers})}},
                    expect={f"wrapped_key.{p}": wire.CIPHERTEXT for p in peers},
                    on_reply=lambda client, env, peers=peers: wrapped_keys(client, env, peers),
                )
                if h in got:
                    offers.update({p: (h, blob) for p, blob in got[h].items()})
                    waiting = [p for p in waiting if p not in peers]
        return offers

    # ---- aggregation -----------------------------------------------------------------------
    def load(self, envelope: Envelope, name: str, length: int) -> CKKSHandle | FirstPolysHandle:
        parts = envelope.ciphertext_parts(name)
        if self._level is not None:  # the server only adds: first polynomials, seeds
            first, seeds = first_polynomials(self._level, parts, length)
            self._check_author(envelope.sender, seeds)
            entry = (Entry(envelope.sender, 0, seeds, upload_basis_of(envelope)),)
            return FirstPolysHandle(first, length, self.public.scale, entry)
        if expander_for(self.public) is not None:  # server-weighted: SEAL's sum, natively
            first, seeds = first_polynomials(self._fresh, parts, length)
            self._check_author(envelope.sender, seeds)
            entry = (Entry(envelope.sender, 0, seeds, upload_basis_of(envelope)),)
            return FirstPolysHandle(first, length, self.public.scale, entry)
        cts, seeds = self.public.load_upload(parts, length)
        self._check_author(envelope.sender, seeds)
        entries = (Entry(envelope.sender, 0, seeds, upload_basis_of(envelope)),)
        return CKKSHandle(cts, length, self.public.scale, entries)

    def _check_author(self, sender: str, seeds: bytes) -> None:
        """Refuse an upload made on seeds another client committed for its own upload (the
        round's planned decryptors are sent the committed seeds ahead,
        :meth:`training_fields`): whoever sends them first, the seeds are their
        committer's, so the other sender is the one refused (else a decryptor could send
        an upload on a peer's seeds before the peer and have the peer's upload refused as
        the copy, ``RoundContext.loaded``)."""
        others = sorted(self._committers.get(bytes(seeds), set()) - {sender})
        if others:
            raise DuplicateUpload(
                f"{sender}'s upload is made on the seeds {others[0]} committed for its own"
            )

    def _commit(self, client: str, seeds: bytes | None) -> None:
        """Record ``client``'s committed next seeds (None: it committed none)."""
        before = self._committed.pop(client, None)
        if before is not None:
            holders = self._committers[before]
            holders.discard(client)
            if not holders:
                del self._committers[before]
        if seeds is not None:
            self._committed[client] = seeds
            self._committers.setdefault(seeds, set()).add(client)

    # ---- precomputed checks: committed seeds relayed to the planned decryptors ----------------
    train_reply_fields = {NEXT_SEEDS: wire.CIPHERTEXT}

    def remember_upload(self, client: str, envelope: Envelope) -> None:
        if NEXT_SEEDS not in envelope.fields:  # not masked ahead (TenSEAL's binding, off)
            self._commit(client, None)
            return
        parts = envelope.ciphertext_parts(NEXT_SEEDS)
        if len(parts) != 1 or not parts[0] or len(parts[0]) % SEED_INFO_BYTES:
            raise MalformedCiphertext(
                f"{client} commits its next seeds as one part of {SEED_INFO_BYTES} bytes a chunk"
            )
        self._commit(client, bytes(parts[0]))

    def training_fields(
        self, ctx: Any, client: str, weights: Mapping[str, float]
    ) -> dict[str, Field]:
        """For each of the round's two planned decryptors (the next in the rotation
        :meth:`reveal` follows), the planned uploads' committed seeds and integer weights,
        if every planned client committed: it expands the check while it trains."""
        active = list(ctx.active)
        planned = {active[(self._reveals + i) % len(active)] for i in range(min(2, len(active)))}
        return self._precheck(weights) if client in planned else {}

    def opening_fields(
        self, ctx: Any, client: str, weights: Mapping[str, float]
    ) -> dict[str, Field]:
        """For every client of a round that opens a sum of planned weights to its
        contributors (LARC's Ĝ), the planned uploads' committed seeds and integer weights:
        each expands the open's check while it trains."""
        return self._precheck(weights)

    def _precheck(self, weights: Mapping[str, float]) -> dict[str, Field]:
        """The planned uploads' committed seeds and integer weights, if every planned client
        committed (a hint: a client uses it only for exactly the release it names)."""
        if not weights or not set(weights) <= set(self._committed):
            return {}
        if self.weights_at_client:
            ks = {c: applied_weight(w, self.preset) for c, w in weights.items()}
        else:
            ks = {c: quantise(w, self.preset.weight_bits) for c, w in weights.items()}
        listed = [c for c in weights if ks[c] != 0]  # as a sum lists them (``_weighted``)
        return {
            PRECHECK: wire.config({"entries": [[c, ks[c]] for c in listed]}),
            f"{PRECHECK}.seeds": wire.ciphertext([self._committed[c] for c in listed]),
        }

    def weighted_sum(
        self, handles: Sequence[CKKSHandle | FirstPolysHandle], weights: Sequence[float]
    ) -> CKKSHandle | FirstPolysHandle:
        if self.weights_at_client:
            raise ConfigError(
                f"CKKS preset {self.preset.name!r} only adds uploads their clients weighted "
                "before encrypting (a streaming run's planned weights); this protocol weights "
                "after the uploads arrive: use the compact or wide preset"
            )
        if any(h.scale != self.public.scale or len(h.entries) != 1 for h in handles):
            raise MalformedCiphertext("only fresh uploads can be summed")
        native_read = [h for h in handles if isinstance(h, FirstPolysHandle)]
        if native_read:
            if len(native_read) != len(handles):
                raise MalformedCiphertext("uploads read on two paths cannot be summed together")
            return self._native_weighted_sum(native_read, weights)
        seal_read = [h for h in handles if isinstance(h, CKKSHandle)]
        if len(seal_read) != len(handles):
            raise MalformedCiphertext("only fresh uploads can be summed")
        cts = self.public.weighted_sum([h.ciphertexts for h in seal_read], weights)
        return CKKSHandle(
            cts,
            handles[0].n_values,
            self.public.sum_scale,
            _weighted(self.preset, handles, weights),
        )

    def _native_weighted_sum(
        self, handles: Sequence[FirstPolysHandle], weights: Sequence[float]
    ) -> FirstPolysHandle:
        """:meth:`weighted_sum` of uploads read natively: the first polynomial of the same
        sum, formed with SEAL's arithmetic on the arrays (``server_sums.weighted_firsts``)."""
        wb = self.preset.weight_bits
        ks = [checked_weight(w, wb) for w in weights]
        kept = [(h.first, k) for h, k in zip(handles, ks) if k != 0]
        if not kept:
            raise ConfigError("every weight rounds to zero at this preset's weight precision")
        firsts, factors = zip(*kept)
        return FirstPolysHandle(
            weighted_firsts(required_expander(self.public), firsts, factors),
            handles[0].n_values,
            self.public.sum_scale,
            _weighted(self.preset, handles, weights),
        )

    def running_sum(self, length: int) -> RunningSum:
        if self._level is not None:
            return ClientWeightedSum(self._level, length)
        return CKKSRunningSum(self.public, length)

    def to_field(self, handle: CKKSHandle | FirstPolysHandle) -> Field:
        """A sum as it is released: its first polynomials only, as plaintexts at the fresh
        level (a decryptor expands Σ k_i·a_i from the signed seeds itself and never reads a
        second polynomial from the server: ``first_polys``)."""
        if isinstance(handle, FirstPolysHandle):
            return wire.ciphertext_rows(plaintext_chunks(self._fresh, handle.first, handle.scale))
        blobs = [to_bytes(ct) for ct in handle.ciphertexts]  # SEAL's path: its sum, saved
        first, _, scale = self.public.aggregate_polynomials(blobs, handle.n_values)
        return wire.ciphertext_rows(plaintext_chunks(self._fresh, first, scale))

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
            common_basis(handle.entries),
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
        return gather_consents(ctx, d, self.signers, self.releases)

    def reveal(self, ctx, handle: CKKSHandle, name: str) -> tuple[np.ndarray, str]:
        """A checked reveal: two decryptors (rotating over the active clients) each decrypt
        the same checked release (one descriptor, one consent round), flooded
        independently, and report their σ; if the two agree within the flooding
        (:func:`decryptions_agree`) the result is their mean. If they disagree a third is
        asked: the pair that agrees is kept and the decryptor left out is excluded as
        :class:`WrongDecryption` (named in the audit); if no two agree, or no third
        decryptor answers, the round is aborted.

        Each decryptor is asked at most once per release and counts its decryption in its
        own budget (``CKKSClient.on_reveal``), which is the run's number of reveals: an
        honest run never asks a client beyond it, and the flooding's t (roster × budget)
        covers every decryption the clients can make, the check's included."""
        request = self._release_fields(ctx, handle, name, "reveal", "aggregate")
        active = list(ctx.active)
        queue = [active[(self._reveals + i) % len(active)] for i in range(len(active))]
        got: dict[str, tuple[np.ndarray, float]] = {}
        errors: dict[str, str | None] = {}

        def read(client: str, env) -> tuple[np.ndarray, float]:
            # decoded inside ``ask``: a reply of the wrong length, with a NaN or a negative
            # σ excludes the decryptor (and the next one is asked) instead of ending the run
            sigma = env.scalar(SIGMA_FIELD)
            if sigma < 0:
                raise UnexpectedField(f"{client} reports a negative flooding σ")
            values = env.vector_view(name, handle.n_values)  # only read: no copy of float64
            return values.astype(np.float64, copy=False), sigma

        def ask(wanted: int) -> None:
            while wanted > 0 and queue:
                batch = [c for c in queue[:wanted] if c in ctx.active]
                del queue[:wanted]
                replies = ctx.ask(
                    "reveal",
                    dict.fromkeys(batch, request),
                    expect={name: wire.VECTOR, SIGMA_FIELD: wire.SCALAR},
                    on_reply=read,
                )
                for c in batch:
                    if c in replies:
                        got[c] = replies[c]
                        wanted -= 1
                    else:
                        errors[c] = ctx.excluded.get(c)

        def abort(why: str) -> RoundAborted:
            return RoundAborted(
                f"{name}: {why}", round=ctx.round, phase="reveal", exclusions=ctx.excluded
            )

        rounding = self.preset.poly_modulus_degree / handle.scale

        def agree(x: str, y: str) -> bool:
            return decryptions_agree(*got[x], *got[y], rounding=rounding)

        def mean(x: str, y: str) -> np.ndarray:
            both = np.add(got[x][0], got[y][0])  # the replies are read-only views: one new array
            both /= 2
            return both

        ask(2)
        self._reveals += 2
        if len(got) < 2:
            raise abort(
                f"a reveal is checked by two decryptors; {len(got)} could decrypt ({errors})"
            )
        first, second = got
        if agree(first, second):
            return mean(first, second), first
        ask(1)
        if len(got) < 3:
            raise abort(
                f"the decryptions by {first} and {second} disagree beyond the flooding "
                f"and no third decryptor could settle which is wrong ({errors})"
            )
        third = list(got)[2]
        with_first, with_second = agree(first, third), agree(second, third)
        if with_first and with_second:
            # both are within the flooding of the third: either may be the wrong one (or the
            # first pair was a false alarm); keep the closer pair, exclude nobody
            closer = min(
                (first, second), key=lambda c: float(np.linalg.norm(got[c][0] - got[third][0]))
            )
            return mean(closer, third), closer
        if with_first or with_second:
            honest, wrong = (first, second) if with_first else (second, first)
            ctx.exclude(
                wrong,
                "reveal",
                WrongDecryption(
                    f"{wrong}'s decryption of {name} disagrees beyond the flooding with "
                    f"{honest}'s and {third}'s, which agree"
                ),
            )
            return mean(honest, third), honest
        raise abort(f"no two of the decryptions by {first}, {second} and {third} agree")


class CKKSRunningSum(RunningSum):
    """Homomorphic running sum of fresh uploads; each upload is multiplied in place and
    added, then only the sum (and what it is made of) is kept."""

    def __init__(self, public: PublicCKKS, length: int):
        self.public = public
        self.length = length
        self._sum = CiphertextSum(public)
        self._firsts: np.ndarray | None = None  # the sum of uploads read natively
        self._entries: list[Entry] = []

    def add(self, handle: CKKSHandle | FirstPolysHandle, weight: float) -> None:
        if (
            handle.scale != self.public.scale
            or handle.n_values != self.length
            or len(handle.entries) != 1
        ):
            raise MalformedCiphertext("only fresh uploads of the model's length can be summed")
        native_read = isinstance(handle, FirstPolysHandle)
        if (self._sum.chunks is not None and native_read) or (
            self._firsts is not None and not native_read
        ):
            raise MalformedCiphertext("uploads read on two paths cannot be summed together")
        if isinstance(handle, FirstPolysHandle):
            k = checked_weight(weight, self.public.preset.weight_bits)
            if k == 0:
                return
            if self._firsts is not None and handle.chunks != len(self._firsts):
                raise MalformedCiphertext(
                    f"{handle.chunks} chunks, the running sum has {len(self._firsts)}"
                )
            expander = required_expander(self.public)
            if self._firsts is None:
                self._firsts = weighted_firsts(expander, [handle.first], [k])
            else:
                self._firsts = weighted_firsts(expander, [self._firsts, handle.first], [1, k])
            self._entries += _weighted(self.public.preset, [handle], [weight])
        elif self._sum.add(handle.ciphertexts, weight, consume=True):
            self._entries += _weighted(self.public.preset, [handle], [weight])

    def _result(self, normaliser: float) -> CKKSHandle | FirstPolysHandle:
        if self._firsts is not None:
            check_normaliser(normaliser)
            # as CiphertextSum.result: the normaliser goes into the scale
            scale = self.public.sum_scale * normaliser
            return FirstPolysHandle(self._firsts, self.length, scale, tuple(self._entries))
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
        self._entries.append(replace(entry, k=k))

    def _result(self, normaliser: float) -> FirstPolysHandle:
        if self._sum.total is None:
            raise ConfigError("no upload was added to the sum")
        check_normaliser(normaliser)
        # the sum is at Δ (the clients weighted); a renormalised one decodes at Δ·normaliser
        scale = self.level.public.scale * normaliser
        return FirstPolysHandle(self._sum.total, self.length, scale, tuple(self._entries))


def _weighted(
    preset: CKKSPreset,
    handles: Sequence[CKKSHandle | FirstPolysHandle],
    weights: Sequence[float],
) -> tuple[Entry, ...]:
    """The uploads' entries with the integer weights the sum multiplied them by (an upload
    whose weight rounds to 0 was not added)."""
    out = []
    for h, w in zip(handles, weights):
        k = quantise(w, preset.weight_bits)
        if k != 0:
            (entry,) = h.entries
            out.append(replace(entry, k=k))
    return tuple(out)
