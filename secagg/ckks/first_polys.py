"""Sums on the server as first polynomials only, on every preset.

A seeded upload is (c0_i, seed_i), and its second polynomial a_i is what SEAL expands from the
seed when it loads the upload. The server never needs the a_i: a decryptor forms Σ k_i·a_i
from the signed seeds and weights itself (``release.py``). So the server

- reads each upload's c0 out of SEAL's serialised layout, after the same checks as a SEAL
  load (sizes, layout, a seeded ciphertext of this preset's fresh level and scale, every
  coefficient below its prime and a seed of a PRNG SEAL expands, which SEAL's own load checks
  too), without expanding the seed (:func:`first_polynomials`);
- on the client-weighted preset (``lean``) adds the c0's modulo each prime
  (:class:`FirstPolynomialSum`): the coefficient-wise addition SEAL's ``Evaluator.add``
  performs on the first polynomials, checked bit for bit against SEAL's in
  ``tests/security/test_client_weights.py``; on a server-weighted preset multiplies each by
  its integer weight first (``server_sums``);
- sends the sum as a SEAL plaintext at the fresh level in NTT form (:func:`plaintext_blobs`:
  8 bytes per value and prime instead of a whole ciphertext's 16). The decryptor loads it
  (:func:`load_first_sums`), forms (0, Σ k_i·a_i) from the seeds with SEAL and adds the
  plaintext with SEAL's ``add_plain``: the second polynomial it decrypts with is its own,
  never the server's.

Nothing here holds or takes a key. What the server can still choose is C0, which shifts the
decryption by C0 − Σ c0_i, an offset the server knows (``release.py``): it learns the flooded
honest sum and nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as seal

from secagg.ckks.packing import PACKED_BYTES, packs, unpack_words
from secagg.ckks.public import (
    CIPHERTEXT_DATA,
    CIPHERTEXT_META,
    COMPR_NONE,
    COMPR_PACKED,
    COUNT,
    PACKED_HEAD,
    PLAINTEXT_META,
    SEAL_HEADER,
    SEAL_LOAD_ERRORS,
    SEED_INFO_BYTES,
    PublicCKKS,
    check_ciphertext_layout,
    check_header,
    ciphertext_raw_bytes,
    from_bytes,
    parms_id_bytes,
    raw_body,
    read_header,
    seal_header,
)
from secagg.errors import MalformedCiphertext, WrongContext

PLAIN_META, _COUNT = PLAINTEXT_META, COUNT
#: the PRNG types SEAL expands a seed with (``seal::prng_type``: blake2xb, shake256); its
#: loader refuses any other, as the native expansion does
SEAL_PRNG_TYPES = frozenset({1, 2})
#: where a plaintext's coefficients start in its raw bytes (a ciphertext's: CIPHERTEXT_DATA)
_PT_DATA = PLAIN_META.size + SEAL_HEADER.size + _COUNT.size


class FreshLevel:
    """What first polynomials are checked against: the preset's fresh level (where every
    upload is, and every sum: the server weights by constants, which needs no rescale)."""

    def __init__(self, public: PublicCKKS):
        self.public = public
        self.n, self.primes = public.preset.poly_modulus_degree, public.n_primes
        self.parms_id = parms_id_bytes(public.context.first_parms_id())
        moduli = [m.value() for m in public.context.first_context_data().parms().coeff_modulus()]
        #: each coefficient's prime, in SEAL's order (prime by prime, N coefficients each)
        self.moduli = np.repeat(np.asarray(moduli, dtype=np.uint64), self.n)
        self._upload: tuple[bytes, bytes, bool] | None = None

    def upload_frame(self) -> tuple[bytes, bytes, bool]:
        """The bytes every upload of this level shares, as this build's clients write it
        (packed where the primes allow, :func:`~secagg.ckks.public.upload_chunks`, else
        uncompressed): all that comes before its first polynomial's coefficients (SEAL's
        header for its exact length, the packing head, this level's metadata and scale, the
        data array's header and count), the header before its seed, and whether the
        coefficients travel packed. An upload whose bytes differ there is read by
        :func:`first_polynomials`' field-by-field checks instead."""
        if self._upload is None:
            count = self.coefficients
            packed = packs(self.public.preset.coeff_bits)
            seed_header = seal_header(SEAL_HEADER.size + SEED_INFO_BYTES)
            body = ciphertext_raw_bytes(self.n, self.primes, seeded=True)
            data = SEAL_HEADER.size + _COUNT.size + 8 * count
            # parms_id, NTT form, size 2, degree, primes, scale, correction factor 1
            meta = (self.parms_id, 1, 2, self.n, self.primes, self.public.scale, 1)
            raw_head = CIPHERTEXT_META.pack(*meta) + seal_header(data) + _COUNT.pack(count)
            if packed:
                length = SEAL_HEADER.size + PACKED_HEAD.size + body - 2 * count
                head = seal_header(length, COMPR_PACKED) + PACKED_HEAD.pack(len(raw_head), count)
            else:
                head = seal_header(SEAL_HEADER.size + body)
            self._upload = head + raw_head, seed_header, packed
        return self._upload

    @property
    def coefficients(self) -> int:
        return self.n * self.primes

    def check_range(self, coefficients: np.ndarray, what: str) -> None:
        if (coefficients >= self.moduli).any():
            raise MalformedCiphertext(f"{what} has a coefficient outside its modulus")


def first_polynomials(
    level: FreshLevel, parts: Sequence[bytes | memoryview], n_values: int
) -> tuple[np.ndarray, bytes]:
    """A client's upload as the server of a client-weighted sum needs it: each chunk's first
    polynomial (a (chunks, primes·N) uint64 array) and the seeds in chunk order."""
    level.public.check_chunks(parts, n_values)
    framed = _framed_uploads(level, parts)
    if framed is not None:
        return framed
    n, primes, public = level.n, level.primes, level.public
    seeded = ciphertext_raw_bytes(n, primes, seeded=True)
    out = np.empty((len(parts), level.coefficients), dtype=np.uint64)
    seeds = []
    for i, data in enumerate(parts):
        what = f"ciphertext {i}"
        # checked_blob's checks, without the SEAL blob it would rebuild: SEAL never loads it
        raw = raw_body(data, public.max_raw_bytes, what)
        check_ciphertext_layout(raw, n, primes, what)
        if len(raw) != seeded:
            raise MalformedCiphertext(
                f"{what} is not seeded: an upload's second polynomial travels as a seed, "
                "which is what lets a decryptor check the sums it is asked to open"
            )
        parms, ntt, _, _, _, scale, correction = CIPHERTEXT_META.unpack_from(raw)
        if parms != level.parms_id:
            raise WrongContext(f"{what} is not at this preset's fresh level")
        if not ntt or correction != 1:
            raise MalformedCiphertext(f"{what} is not a CKKS ciphertext in NTT form")
        if scale != public.scale:
            raise WrongContext(
                f"{what} has scale 2^{np.log2(scale):.1f}, preset {public.preset.name} uses "
                f"2^{public.preset.scale_bits}"
            )
        c0 = np.frombuffer(raw, dtype="<u8", count=level.coefficients, offset=CIPHERTEXT_DATA)
        level.check_range(c0, what)
        out[i] = c0
        seed = bytes(raw[-SEED_INFO_BYTES:])
        if seed[0] not in SEAL_PRNG_TYPES:  # SEAL's loader could not expand it, nor can a
            # decryptor: refused here, where the upload's sender is known
            raise MalformedCiphertext(f"{what}'s seed does not expand (PRNG type {seed[0]})")
        seeds.append(seed)
    return out, b"".join(seeds)


def _framed_uploads(
    level: FreshLevel, parts: Sequence[bytes | memoryview]
) -> tuple[np.ndarray, bytes] | None:
    """:func:`first_polynomials` for an upload written as this build's clients write it
    (every chunk in :meth:`FreshLevel.upload_frame`), in a few array
    operations instead of a SEAL header and layout parse a chunk; None where any chunk
    differs, to be read (and refused, naming what is wrong) field by field. It accepts
    nothing those checks refuse: the frame fixes every size, the level, the scale, the NTT
    form and the correction factor; the coefficients are checked below their primes and the
    seeds' PRNG types, as there."""
    prefix, seed_header, packed = level.upload_frame()
    read = _framed(level, parts, prefix, len(seed_header) + SEED_INFO_BYTES, packed)
    if read is None:
        return None
    first, tails = read
    at = len(seed_header)
    if any(t[:at] != seed_header or t[at] not in SEAL_PRNG_TYPES for t in tails):
        return None
    return first, b"".join(t[at:] for t in tails)


def _framed(
    level: FreshLevel,
    parts: Sequence[bytes | memoryview],
    prefix: bytes,
    tail: int,
    packed: bool = False,
) -> tuple[np.ndarray, list[memoryview]] | None:
    """Chunks of ``prefix``, this level's coefficients (8 bytes each, or ``packed`` in 6) and
    ``tail`` bytes each: the coefficients as a (chunks, primes·N) array, each checked below
    its prime, and the tails; None where a chunk has another length or prefix, or a
    coefficient is too large."""
    count = level.coefficients
    width = (PACKED_BYTES if packed else 8) * count
    size = len(prefix) + width + tail
    words = np.empty((len(parts), width // 8), dtype="<u8")
    rows, tails = words.view(np.uint8), []
    for i, data in enumerate(parts):
        chunk = memoryview(data).cast("B")
        if chunk.nbytes != size or chunk[: len(prefix)] != prefix:
            return None
        rows[i] = np.frombuffer(chunk, np.uint8, width, len(prefix))
        tails.append(chunk[size - tail :])
    out = unpack_words(words) if packed else words
    if (out >= level.moduli).any():
        return None
    return out, tails


#: chunks reduced at a time when a sum is folded (32 chunks of 4,096 coefficients: 1 MB)
FOLD_ROWS = 32


class FirstPolynomialSum:
    """Σ_i c0_i modulo each prime, folded one upload at a time (both operands below the
    prime, so their sum fits 64 bits and one conditional subtraction reduces it).

    The first upload's array becomes the sum (a running sum takes its handles over), and the
    reduction works through a scratch of :data:`FOLD_ROWS` chunks, so the sum holds one
    upload's worth of memory and no model-sized temporary."""

    def __init__(self, level: FreshLevel):
        self.level = level
        self.total: np.ndarray | None = None
        self._less: np.ndarray | None = None  # scratch: a block of the sum less the prime

    def add(self, first: np.ndarray) -> None:
        if self.total is None:
            self.total = first if first.flags.writeable else first.copy()
            self._less = np.empty((min(FOLD_ROWS, len(first)), first.shape[1]), first.dtype)
            return
        if first.shape != self.total.shape:
            raise MalformedCiphertext(
                f"{first.shape[0]} chunks, the running sum has {self.total.shape[0]}"
            )
        assert self._less is not None
        for start in range(0, len(self.total), FOLD_ROWS):
            block = self.total[start : start + FOLD_ROWS]
            less = self._less[: len(block)]
            block += first[start : start + FOLD_ROWS]
            # t − q wraps around above t where t < q: the minimum is t mod q (a fifth of the
            # time of a masked subtraction, which builds a boolean array a fold)
            np.subtract(block, self.level.moduli, out=less)
            np.minimum(block, less, out=block)


def plaintext_chunks(level: FreshLevel, total: np.ndarray, scale: float) -> np.ndarray:
    """Each chunk's summed first polynomial as an uncompressed SEAL plaintext at the fresh
    level, in NTT form, at ``scale`` (what the decryptor adds to its own (0, Σ a_i)): one row
    of bytes a chunk, written into one buffer (no per-chunk copy, no joined copy after it)."""
    count = level.coefficients
    head = (
        PLAIN_META.pack(level.parms_id, count, scale)
        + seal_header(SEAL_HEADER.size + _COUNT.size + 8 * count)
        + _COUNT.pack(count)
    )
    prefix = seal_header(SEAL_HEADER.size + len(head) + 8 * count) + head
    values = np.ascontiguousarray(total, dtype="<u8")
    out = np.empty((len(values), len(prefix) + 8 * count), dtype=np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    out[:, len(prefix) :] = values.view(np.uint8).reshape(len(values), -1)
    return out


def plaintext_blobs(level: FreshLevel, total: np.ndarray, scale: float) -> list[memoryview]:
    """:func:`plaintext_chunks`, one view a chunk."""
    return [memoryview(row) for row in plaintext_chunks(level, total, scale)]


def checked_first_sums(
    level: FreshLevel, parts: Sequence[bytes | memoryview], n_values: int
) -> tuple[np.ndarray, float]:
    """A client-weighted aggregate from the server's bytes, checked (uncompressed, this
    build's header, the fresh level, N·primes coefficients each below its prime, one scale in
    [min_aggregate_scale, sum_scale] for all): its (chunks, primes·N) coefficients and scale."""
    level.public.check_chunks(parts, n_values)
    framed = _framed_sums(level, parts)
    if framed is not None:
        return framed
    public, count = level.public, level.coefficients
    size = SEAL_HEADER.size + _PT_DATA + 8 * count
    out = np.empty((len(parts), count), dtype=np.uint64)
    scales = set()
    for i, data in enumerate(parts):
        what = f"aggregate chunk {i}"
        if len(data) != size:
            raise MalformedCiphertext(f"{what} has {len(data)} bytes; a chunk here has {size}")
        check_header(read_header(data, 0, what), size, COMPR_NONE, what)
        raw = memoryview(data)[SEAL_HEADER.size :]
        parms, coeffs, scale = PLAIN_META.unpack_from(raw)
        check_header(
            read_header(raw, PLAIN_META.size, what),
            SEAL_HEADER.size + _COUNT.size + 8 * count,
            COMPR_NONE,
            f"{what}'s data",
        )
        (claimed,) = _COUNT.unpack_from(raw, PLAIN_META.size + SEAL_HEADER.size)
        if parms != level.parms_id:
            raise WrongContext(f"{what} is not at this preset's fresh level")
        if coeffs != count or claimed != count:
            raise MalformedCiphertext(f"{what} claims {coeffs} and {claimed} coefficients")
        if not public.min_aggregate_scale <= scale <= public.sum_scale:
            raise WrongContext(f"{what} has scale 2^{np.log2(scale):.1f}, outside its range")
        scales.add(scale)
        out[i] = np.frombuffer(raw, dtype="<u8", count=count, offset=_PT_DATA)
        level.check_range(out[i], what)
    if len(scales) > 1:
        raise WrongContext("the aggregate's chunks carry different scales")
    return out, scales.pop()


def _framed_sums(
    level: FreshLevel, parts: Sequence[bytes | memoryview]
) -> tuple[np.ndarray, float] | None:
    """:func:`checked_first_sums` for an aggregate written as :func:`plaintext_chunks`
    writes it, every chunk in the frame its first chunk's scale gives (that scale in its
    range), in a few array operations; None where anything differs, to be read and refused
    field by field."""
    count = level.coefficients
    first = memoryview(parts[0]).cast("B") if parts else None
    if first is None or first.nbytes < SEAL_HEADER.size + PLAIN_META.size:
        return None
    _, _, scale = PLAIN_META.unpack_from(first, SEAL_HEADER.size)
    public = level.public
    if not public.min_aggregate_scale <= scale <= public.sum_scale:
        return None
    prefix = bytes(plaintext_chunks(level, np.zeros((1, count), np.uint64), scale)[0, : -8 * count])
    read = _framed(level, parts, prefix, 0)
    return None if read is None else (read[0], scale)


def load_first_sums(
    level: FreshLevel, parts: Sequence[bytes | memoryview], n_values: int
) -> list[seal.Plaintext]:
    """A client-weighted aggregate from the server's bytes, checked
    (:func:`checked_first_sums`), then loaded by SEAL: one plaintext per chunk."""
    checked_first_sums(level, parts, n_values)
    out: list[seal.Plaintext] = []
    for i, data in enumerate(parts):
        try:
            out.append(from_bytes(seal.Plaintext(), level.public.context, data))
        except SEAL_LOAD_ERRORS as exc:
            raise MalformedCiphertext(f"aggregate chunk {i} does not load: {exc}") from None
    return out
