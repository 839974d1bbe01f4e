"""Coefficients below 2^48 in 6 bytes each: how ``compact``'s uploads travel.

A CKKS coefficient modulo a prime of b bits is uniformly random below it, so SEAL's zstd can
only take the 64 − b zero bits at the top of each 64-bit word, and takes them slowly: on
``compact`` (primes of 47 and 46 bits) an upload went from 16.1 to 13.7 bytes a value at
about 17 ms a client and 11 ms a server per 1e6 values (``benchmarks/upload_profile``).
Writing each coefficient in 48 bits takes all 16 of those bits on the
top, 16.1 → 12.1 bytes a value, with a few shifts over whole arrays.

The layout, for a vector of ``count`` coefficients (count a multiple of 4) cut into quarters
a, b, c, d: three words a quarter long, x = a | b << 48, y = b >> 16 | c << 32 and
z = c >> 32 | d << 16, little-endian. Quarters rather than neighbouring coefficients, so that
every step is one shift over a contiguous array. Nothing here is cryptographic: the packed
words carry exactly the ciphertext's coefficients, and a reader checks each one below its
prime after unpacking, as for any upload.
"""

from __future__ import annotations

import numpy as np

#: bits a packed coefficient takes
PACKED_BITS = 48
#: bytes a packed coefficient takes
PACKED_BYTES = PACKED_BITS // 8
_MASK = np.uint64((1 << PACKED_BITS) - 1)
_16, _32, _48 = np.uint64(16), np.uint64(32), np.uint64(48)


def packs(coeff_bits: tuple[int, ...]) -> bool:
    """Whether a preset's uploads travel packed: every data prime (the last of
    ``coeff_bits`` is SEAL's special prime, which never travels) below 2^48."""
    return max(coeff_bits[:-1]) <= PACKED_BITS


def pack_words(words: np.ndarray) -> np.ndarray:
    """(rows, count) uint64 coefficients, each below 2^48 (ValueError otherwise: packing would
    cut them) → (rows, 3·count/4) uint64 words."""
    rows, count = words.shape
    if count % 4:
        raise ValueError(f"{count} coefficients a row: packing takes a multiple of 4")
    if words.size and int(words.max()) >> PACKED_BITS:
        raise ValueError("a coefficient of 2^48 or more cannot be packed in 48 bits")
    q = count // 4
    a, b, c, d = (words[:, k * q : (k + 1) * q] for k in range(4))
    out = np.empty((rows, 3 * q), dtype=np.uint64)
    x, y, z = out[:, :q], out[:, q : 2 * q], out[:, 2 * q :]
    np.left_shift(b, _48, out=x)
    x |= a
    np.left_shift(c, _32, out=y)
    y |= b >> _16
    np.left_shift(d, _16, out=z)
    z |= c >> _32
    return out


def unpack_words(packed: np.ndarray) -> np.ndarray:
    """:func:`pack_words` undone: (rows, 3·q) uint64 words → (rows, 4·q) coefficients, each
    below 2^48."""
    rows, width = packed.shape
    if width % 3:
        raise ValueError(f"{width} packed words a row: a multiple of 3 unpacks")
    q = width // 3
    x, y, z = packed[:, :q], packed[:, q : 2 * q], packed[:, 2 * q :]
    out = np.empty((rows, 4 * q), dtype=np.uint64)
    a, b, c, d = (out[:, k * q : (k + 1) * q] for k in range(4))
    np.bitwise_and(x, _MASK, out=a)
    np.left_shift(y, _16, out=b)
    b &= _MASK
    b |= x >> _48
    np.left_shift(z, _32, out=c)
    c &= _MASK
    c |= y >> _32
    np.right_shift(z, _16, out=d)
    return out
