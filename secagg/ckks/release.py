"""Verified releases: a client opens only a weighted sum of signed uploads it can check.

A *release* is an aggregate the server wants opened, either revealed to the server by a
decryptor client (kind ``reveal``) or sent to clients who open it themselves (kind ``open``:
LARC's Ĝ, RegAgg's centre, a server-blind update). It travels with

- its *descriptor*: kind, name, round, number of values and of chunks, and one entry per
  contributing upload: (client, integer weight k_i, digest of the upload's seeds);
- the seeds of every contributing upload (public randomness: one 64-byte seed per chunk);
- every contributor's Ed25519 signature over the descriptor (its *consent*).

Why a client can check it. A seeded upload is (c0_i, a_i), with a_i expanded from the seed
and c0_i = −a_i·s + Δ·m_i + e_i. The sum is (Σ k_i c0_i, Σ k_i a_i), and the server sends
its first polynomial only: the opener expands the seeds itself (SEAL does, as when it loads
an upload) and forms the second, Σ k_i a_i, from the signed seeds and weights, so no second
polynomial the server chose is ever decrypted with. The first polynomial it cannot check and
need not: for any c0' the server sends, c0' + (Σ k_i a_i)·s = (c0' − Σ k_i c0_i) + Σ k_i(Δ·m_i +
e_i), and the server knows the offset c0' − Σ k_i c0_i (it holds every c0_i): it learns what
the honest sum would give, shifted by a value it chose. The flooding noise goes into the
ciphertext before decryption, so even a wrap-around mod q that such an offset provokes is
decided on flooded values (``ckks_keys.SecretKeyHolder.decrypt_flooded``).

What an opener enforces, all from its own configuration (:class:`ReleasePolicy`):

- every entry is signed by its client under the client's roster key, and a client signs only
  descriptors that hold its own upload's digest, at most once per kind per upload: no
  replayed or reattributed upload, and no second weighting of the same uploads (no
  differencing of two sums to single one client out);
- at least ``min_contributors`` non-zero weights, each |k_i| ≥ ``min_share``·Σ|k|/m for m
  contributors (no one-hot sums);
- exactly its model's number of values;
- flooding sized from this sum's own error bound (``flooding.error_bound``).

Nothing here holds a secret: signing happens in the client backend, which holds the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import tenseal.sealapi as seal
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secagg.ckks import native
from secagg.ckks.public import (
    CIPHERTEXT_META,
    COUNT,
    SEAL_HEADER,
    SEED_INFO_BYTES,
    PublicCKKS,
    ciphertext_raw_bytes,
    seal_header,
    uncompressed_blob,
)
from secagg.errors import ConfigError, ReleaseRefused

KINDS = ("reveal", "open")
#: an upload's reply field committing its client's next upload's seeds (``offline``)
NEXT_SEEDS = "next_seeds"
#: a planned decryptor's training-request field: the round's planned uploads, as
#: [client, integer weight] in ``precheck`` and their committed seeds in ``precheck.seeds``
PRECHECK = "precheck"
SIGNATURE_BYTES = 64
_CONSENT_CONTEXT = b"secagg release consent v1"


def seed_digest(seeds: bytes) -> str:
    """What names an upload: SHA-256 of its chunks' seeds (fresh per encryption)."""
    return hashlib.sha256(seeds).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One contributing upload: whose, with which integer weight, and its seeds."""

    client: str
    k: int
    seeds: bytes  # chunks × (PRNG type byte + 64-byte seed)
    #: what the upload was made from, as its client says (``secagg.clients.policy``)
    basis: str = ""

    @property
    def digest(self) -> str:
        return seed_digest(self.seeds)


def upload_basis_of(envelope: Any) -> str:
    """The basis a client listed with its upload (a ``basis`` config field), or ""."""
    if "basis" not in envelope.fields:
        return ""
    value = envelope.config("basis").get("basis")
    return value if isinstance(value, str) and len(value) <= 128 else ""


def common_basis(entries: Sequence[Entry]) -> str:
    """The basis most contributors list (ties: the first listed). Contributors whose upload
    was made from another one refuse the release and leave the run (a client that lies about
    its basis costs the round, not the run)."""
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.basis] = counts.get(e.basis, 0) + 1
    return max(counts, key=lambda b: counts[b]) if counts else ""


@dataclass(frozen=True)
class Descriptor:
    kind: str
    name: str
    round: int
    n_values: int
    chunks: int
    entries: tuple[tuple[str, int, str], ...]  # (client, k, digest)
    #: what every contributing upload was made from (round, phase, model, settings): a
    #: client consents only if it is its own upload's (``secagg.clients.policy``)
    basis: str = ""

    def to_config(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "kind": self.kind,
            "name": self.name,
            "round": self.round,
            "n_values": self.n_values,
            "chunks": self.chunks,
            "entries": [list(e) for e in self.entries],
        }

    def hash(self) -> bytes:
        """SHA-256 of the canonical JSON: what every contributor signs."""
        return self._hash

    @cached_property
    def _hash(self) -> bytes:
        # once per descriptor: a release's n consents are each checked against it (n² work
        # for n contributors otherwise)
        text = json.dumps(self.to_config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).digest()

    @property
    def weights(self) -> dict[str, int]:
        return {client: k for client, k, _ in self.entries}

    @classmethod
    def from_config(cls, cfg: Any) -> Descriptor:
        """A descriptor from a server's message; ReleaseRefused for anything malformed."""
        if not isinstance(cfg, dict) or set(cfg) != {
            "basis",
            "kind",
            "name",
            "round",
            "n_values",
            "chunks",
            "entries",
        }:
            raise ReleaseRefused(f"a release descriptor has fields {sorted(_keys(cfg))}")
        kind, name, entries = cfg["kind"], cfg["name"], cfg["entries"]
        counts = (cfg["round"], cfg["n_values"], cfg["chunks"])
        if kind not in KINDS or not isinstance(name, str):
            raise ReleaseRefused(f"a release is of kind {KINDS} with a name, got {kind!r}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ReleaseRefused(f"round, n_values and chunks must be counts, got {counts}")
        if not isinstance(entries, list) or not all(
            isinstance(e, list)
            and len(e) == 3
            and isinstance(e[0], str)
            and isinstance(e[1], int)
            and not isinstance(e[1], bool)
            and isinstance(e[2], str)
            for e in entries
        ):
            raise ReleaseRefused("release entries must be [client, integer weight, digest]")
        clients = [e[0] for e in entries]
        if len(set(clients)) != len(clients):
            raise ReleaseRefused(f"a release names a client twice: {clients}")
        digests = [e[2] for e in entries]
        if len(set(digests)) != len(digests):
            raise ReleaseRefused("a release lists one upload twice (under two senders)")
        basis = cfg["basis"]
        if not isinstance(basis, str) or len(basis) > 128:
            raise ReleaseRefused("a release's basis must be a digest")
        return cls(kind, name, *counts, tuple((c, k, d) for c, k, d in entries), basis)


def server_multipliers(weighted_by_clients: bool, ks: Iterable[int]) -> list[int]:
    """What the server multiplied each listed upload by in a sum (its second polynomial, its
    noise, its key share): the integer weight k, or 1 on a client-weighted preset, where the
    clients weighted before protecting and the server only added."""
    return [1 if weighted_by_clients else k for k in ks]


def _keys(cfg: Any) -> list[str]:
    return [str(k) for k in cfg] if isinstance(cfg, dict) else [type(cfg).__name__]


def consent_message(client: str, descriptor: Descriptor) -> bytes:
    """What ``client`` signs: a fixed context, its id (length-prefixed), the descriptor hash."""
    who = client.encode()
    return _CONSENT_CONTEXT + len(who).to_bytes(4, "big") + who + descriptor.hash()


def signature_bytes(text: str) -> bytes:
    """A signature as it travels (base64 in a config field); b"" if it is not base64, which
    no check accepts."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


def verify_consent(
    public_key: bytes, client: str, descriptor: Descriptor, signature: bytes
) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            signature, consent_message(client, descriptor)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class ReleasePolicy:
    """What an opener accepts, from its own configuration.

    Parameters:
        min_contributors: the fewest uploads with a non-zero weight a sum may have.
        min_share: each contributor's |k_i| must be at least ``min_share`` times the mean
            |k|: the default 0.01 refuses a one-hot sum and one where the other five of six
            uploads have less than 0.17% of the dominant one's weight each; it lets through
            the skewed weights protocols legitimately use (RegCostAgg's reach 6% of the mean
            on TCGA-BRCA). A larger share protects a dominant client better and refuses
            more protocols' sums.
        n_values: the only number of values a release may have (the model's size), or the
            only numbers (the model's size and what the protocol releases besides, such as
            Ensemble's scores of an evaluation set), or None: any.
        max_share: no contributor's |k_i| may exceed this fraction of Σ|k| (sums of three
            or more; two-upload sums have the floor only): at the default 1/2 the others
            together weigh at least as much as the largest, so the sum is never mostly one
            upload.
        max_weight: the largest |k_i| (2^weight_bits of the backend's preset; None: no
            bound, for tests of the other rules only): a weight beyond it could vanish
            modulo the prime (``secagg.backends.coalition``, rule 1).
        colluders: how many clients may collude with the server (t − 1 on threshold, 0 on
            ckks): a release must leave ``min_contributors`` honest terms of weight at least
            ``min_share`` of the largest whoever they are (``coalition``, rule 4).
        participation: the run rule the clients keep (``coalition.RunLedger``): ``fixed``,
            one contributor set for the run; ``groups`` (``groups`` of them), whole groups;
            ``per-round``, none beyond these rules. The clients take theirs from their own
            options; the server's copy pauses releases the clients would refuse.
    """

    min_contributors: int = 2
    min_share: float = 0.01
    n_values: int | tuple[int, ...] | None = None
    max_share: float = 0.5
    max_weight: int | None = None
    colluders: int = 0
    participation: str = "per-round"
    #: with ``participation="groups"``: how many groups the roster is dealt into
    groups: int = 0

    def __post_init__(self):
        if self.min_contributors < 1 or not 0.0 <= self.min_share <= 1.0:
            raise ValueError("min_contributors must be >= 1 and min_share in [0, 1]")
        if not 0.0 < self.max_share <= 1.0:
            raise ValueError("max_share must lie in (0, 1]")
        if self.max_weight is not None and self.max_weight < 1:
            raise ValueError("max_weight must be a positive integer bound")
        if self.colluders < 0:
            raise ValueError("colluders must be a count")

    def check(self, d: Descriptor) -> None:
        ks = [abs(k) for _, k, _ in d.entries]
        if any(k == 0 for k in ks):
            raise ReleaseRefused(f"{d.name}: a release lists a contributor of weight 0")
        if self.max_weight is not None and any(k > self.max_weight for k in ks):
            raise ReleaseRefused(
                f"{d.name}: a weight of {max(ks)} units is beyond this client's bound of "
                f"{self.max_weight} (|w| <= 1); a weight that large can vanish modulo the "
                "prime and single one upload out"
            )
        if len(ks) < self.min_contributors:
            raise ReleaseRefused(
                f"{d.name}: {len(ks)} contributor(s); this client opens sums of at least "
                f"{self.min_contributors}"
            )
        floor = self.min_share * sum(ks) / len(ks)
        small = {c: k for c, k, _ in d.entries if abs(k) < floor}
        if small:
            raise ReleaseRefused(
                f"{d.name}: weights {small} are below {self.min_share:g} of the mean "
                f"{sum(ks) / len(ks):.0f} (a sum one upload dominates); this client's "
                "min_weight_share refuses it"
            )
        # a dominant contributor: the others must weigh at least as much as it does together
        # (default 1/2 of Σ|k|), or the sum is nearly its update alone (review: five uploads
        # at the floor gave the sixth's to 0.35 %). Sums of three or more: with two, the cap
        # would force equal weights, and a dropout would end the seed (the floor applies)
        top = max(ks)
        if len(ks) > 2 and top > self.max_share * sum(ks) * (1 + 1e-9):
            raise ReleaseRefused(
                f"{d.name}: one weight is {top / sum(ks):.3f} of the total; this client's "
                f"max_weight_share allows {self.max_share:g}"
            )
        allowed = (self.n_values,) if isinstance(self.n_values, int) else self.n_values
        if allowed is not None and d.n_values not in allowed:
            raise ReleaseRefused(
                f"{d.name}: this client opens {' or '.join(map(str, allowed))} values (its "
                f"model's size, and what its protocol releases); the release has {d.n_values}"
            )
        self.check_weightings(d, ())

    def check_weightings(self, d: Descriptor, earlier: Sequence[Descriptor]) -> None:
        """``d`` with the ``earlier`` releases of its uploads (as this client saw them):
        over the same uploads only, and every combination of their weightings keeps
        ``min_contributors`` honest terms of weight ``min_share`` of the largest, whoever
        the ``colluders`` are (``secagg.backends.coalition``, rules 2 and 4)."""
        from secagg.backends.coalition import weakest_share

        listed = sorted((c, digest) for c, _, digest in d.entries)
        for before in earlier:
            if sorted((c, digest) for c, _, digest in before.entries) != listed:
                raise ReleaseRefused(
                    f"{d.name}: its uploads entered a release over another set of uploads "
                    f"({before.name!r}, round {before.round}); one set per upload (two sums "
                    "over sets that differ give an upload by difference)"
                )
        if self.min_contributors < 2:
            return  # a client that accepts one-upload releases accepts being singled out
        order = [c for c, _ in listed]
        rows = [[weights[c] for c in order] for weights in (b.weights for b in (*earlier, d))]
        need = self.colluders + self.min_contributors
        if len(order) < need:
            raise ReleaseRefused(
                f"{d.name}: {len(order)} contributor(s); with up to {self.colluders} "
                f"colluding with the server, this client opens sums of at least {need} "
                f"({self.min_contributors} honest whoever colludes)"
            )
        share = weakest_share(rows, self.colluders, self.min_contributors)
        if share <= 0.0 or share < self.min_share:
            what = "its weights" if len(rows) == 1 else f"its {len(rows)} weightings together"
            hint = (
                " (fewer colluders, a lower --threshold-t, let more weightings through)"
                if len(rows) > 1 and self.colluders
                else ""
            )
            raise ReleaseRefused(
                f"{d.name}: {what} let the server and {self.colluders} colluding client(s) "
                f"form a sum in which fewer than {self.min_contributors} honest uploads weigh "
                f"{self.min_share:g} of the largest (weakest share {share:.3g}); this client "
                f"refuses a release that singles an upload out{hint}"
            )


def check_entries(
    d: Descriptor,
    signatures: Mapping[str, bytes],
    seeds: Sequence[bytes],
    signers: Mapping[str, bytes],
    *,
    chunk_bytes: int | None = SEED_INFO_BYTES,
) -> None:
    """Every entry signed by its client's roster key, with seeds matching its digest.

    ``seeds``: per entry, the bytes its digest names (on ckks, one seed of ``chunk_bytes``
    per chunk; on threshold, the upload's c1 halves, of no fixed size: None)."""
    if len(seeds) != len(d.entries):
        raise ReleaseRefused(f"{d.name}: {len(seeds)} seed sets for {len(d.entries)} entries")
    for (client, _, digest), seed_bytes in zip(d.entries, seeds):
        if client not in signers:
            raise ReleaseRefused(f"{d.name}: {client!r} is not in this client's roster")
        signature = signatures.get(client, b"")
        if len(signature) != SIGNATURE_BYTES or not verify_consent(
            signers[client], client, d, signature
        ):
            raise ReleaseRefused(f"{d.name}: no valid consent from {client}")
        wrong_size = chunk_bytes is not None and len(seed_bytes) != d.chunks * chunk_bytes
        if wrong_size or seed_digest(seed_bytes) != digest:
            raise ReleaseRefused(f"{d.name}: the seeds sent for {client} are not its upload's")


@dataclass(frozen=True)
class ExpandedAggregate:
    """An aggregate as the native path opens it (``SecretKeyHolder``): per chunk its first
    polynomial C0, the server's (checked: ``first_polys.checked_first_sums``), and its
    second, the Σ k_i·a_i of the entries' seeds, expanded by this opener, never the
    server's; both (chunks, primes·N) uint64."""

    first: np.ndarray
    second: np.ndarray
    scale: float


class SecondPolynomials:
    """Recomputes Σ k_i·a_i from the entries' seeds, the second polynomial an opener
    decrypts a release with (the server sends only the first: ``first_polys``).

    ``template``: an uncompressed seeded ciphertext of the preset (any: the opener encrypts
    one itself); its seed is replaced by each entry's and SEAL expands it on load."""

    def __init__(self, public: PublicCKKS, template: bytes):
        n, primes = public.preset.poly_modulus_degree, public.n_primes
        if len(template) != ciphertext_raw_bytes(n, primes, seeded=True):
            raise ValueError("the template must be an uncompressed seeded ciphertext")
        self.public = public
        self._template = bytearray(template)
        self._poly_bytes = 8 * n * primes
        # the template with its first polynomial (a seeded ciphertext's only one) zeroed:
        # it loads as (0, a) for the seed put in (``build``)
        self._zeroed = bytearray(template)
        start = CIPHERTEXT_META.size + SEAL_HEADER.size + 8  # after the data array's count
        self._zeroed[start : start + self._poly_bytes] = bytes(self._poly_bytes)

    def build(
        self, d: Descriptor, seeds: Sequence[bytes], firsts: Sequence[seal.Plaintext]
    ) -> list[seal.Ciphertext]:
        """An aggregate as this opener decrypts it on TenSEAL's binding: per chunk, the
        ciphertext (C0, Σ k_i·a_i) with the server's summed first polynomial C0 and the
        second polynomial this opener expands from the entries' seeds itself, each a_i
        multiplied by what the server multiplied its upload by (:meth:`factors`: k_i, or 1
        on a client-weighted preset). The template's first polynomial is zeroed, so the
        loaded (0, a_i) add up to (0, Σ k_i·a_i), and SEAL's ``add_plain`` puts C0 in."""
        self._check_chunks(d, len(firsts))
        factors = self.factors(d)
        sums = self._native_sums(d, seeds, factors)
        plain = None if sums is not None else self._factor_plaintexts(factors)
        out = []
        for j, first in enumerate(firsts):
            if sums is None:
                total = self._expanded(self._zeroed, seeds, j, plain)
            else:
                total = self._with_second(sums[j])
            total.scale = first.scale
            self.public.evaluator.add_plain_inplace(total, first)
            out.append(total)
        return out

    def expanded(
        self,
        d: Descriptor,
        seeds: Sequence[bytes],
        first: np.ndarray,
        scale: float,
        ready: np.ndarray | None = None,
    ) -> ExpandedAggregate:
        """:meth:`build` on the native path (the caller chose it: ``native.module()``): the
        server's checked C0 (``checked_first_sums``) with the Σ k_i·a_i expanded here (or
        ``ready``, expanded ahead from exactly these seeds and factors), left for
        ``SecretKeyHolder`` to open in one native call."""
        self._check_chunks(d, len(first))
        sums = ready if ready is not None else self._native_sums(d, seeds, self.factors(d))
        if sums is None:
            raise ConfigError(f"{native.ENV}: the native extension is off or not built")
        return ExpandedAggregate(first, sums, scale)

    def factors(self, d: Descriptor) -> list[int]:
        """What each entry's a_i is multiplied by in the aggregate's second polynomial."""
        return server_multipliers(
            self.public.preset.weighted_by_clients, (k for _, k, _ in d.entries)
        )

    def _factor_plaintexts(self, factors: Sequence[int]) -> list[seal.Plaintext] | None:
        """Each integer factor as SEAL's constant plaintext (k / 2^wb at scale 2^wb: k
        exactly, what the server multiplied by), or None where every factor is 1."""
        if all(k == 1 for k in factors):
            return None
        wscale = 2.0**self.public.preset.weight_bits
        by_k: dict[int, seal.Plaintext] = {}
        for k in factors:
            if k not in by_k:
                by_k[k] = seal.Plaintext()
                self.public.encoder.encode(
                    k / wscale, self.public.context.first_parms_id(), wscale, by_k[k]
                )
        return [by_k[k] for k in factors]

    def _check_chunks(self, d: Descriptor, chunks: int) -> None:
        """An aggregate of the descriptor's chunk count, or ReleaseRefused."""
        if chunks != d.chunks:
            raise ReleaseRefused(f"{d.name}: {chunks} chunks for {d.chunks}")

    def _expanded(
        self,
        template: bytearray,
        seeds: Sequence[bytes],
        j: int,
        factors: Sequence[seal.Plaintext] | None = None,
    ) -> seal.Ciphertext:
        """Σ_i (factor_i ·) the ciphertext ``template`` becomes with chunk j's seed of entry
        i, which SEAL expands as it loads it."""
        total = None
        for i, seed_bytes in enumerate(seeds):
            blob = template.copy()
            blob[-SEED_INFO_BYTES:] = seed_bytes[j * SEED_INFO_BYTES : (j + 1) * SEED_INFO_BYTES]
            a = self.public.load_trusted(uncompressed_blob(bytes(blob)))
            if factors is not None:
                self.public.evaluator.multiply_plain_inplace(a, factors[i])
            if total is None:
                total = a
            else:
                self.public.evaluator.add_inplace(total, a)
        if total is None:
            raise ReleaseRefused("a release lists no upload")
        return total

    def _native_sums(
        self, d: Descriptor, seeds: Sequence[bytes], factors: Sequence[int] = ()
    ) -> np.ndarray | None:
        """Per chunk, Σ k_i·a_i (each ``factors`` k_i, or 1) expanded from the seeds by the
        native extension (``native.py``): SEAL's own sampling and arithmetic mod q, bit for
        bit what loading each upload and multiplying it by the constant k_i gives; None on
        the TenSEAL path."""
        if native.public_module() is None:
            return None
        if not seeds:
            raise ReleaseRefused("a release lists no upload")
        preset = self.public.preset
        expander = native.seed_expander(preset.poly_modulus_degree, tuple(preset.coeff_bits))
        try:
            return expander.sum(
                seeds=list(seeds),
                chunks=d.chunks,
                factors=list(factors),
                threads=native.threads(),
            )
        except ValueError as exc:
            raise ReleaseRefused(f"{d.name}: the listed seeds do not expand ({exc})") from None

    def _with_second(self, second: np.ndarray) -> seal.Ciphertext:
        """The ciphertext (0, ``second``) at the fresh level: the template's metadata, then
        both polynomials."""
        polys = bytes(self._poly_bytes) + second.astype("<u8", copy=False).tobytes()
        raw = (
            bytes(self._template[: CIPHERTEXT_META.size])
            + seal_header(SEAL_HEADER.size + COUNT.size + len(polys))
            + COUNT.pack(len(polys) // 8)
            + polys
        )
        return self.public.load_trusted(uncompressed_blob(raw))
