"""The threshold backend's ring R_p = Z_p[X]/(X^N + 1), through secagg's native extension.

N is a power of two (4096 in use) and p a prime ≡ 1 mod 2N of at most 60 bits (SEAL's
limit), so that SEAL's negacyclic NTT multiplies in R_p. A polynomial is a numpy uint64 vector
of N coefficients in [0, p); a vector of polynomials is a (blocks, N) array.

What the backend builds on it (key-additive RLWE masking with one-time keys, the keys' sum
recovered from Shamir shares):

- ``key()``: a fresh ternary polynomial k (SEAL's ``sample_poly_ternary``, fresh CSPRNG);
- ``public(seed, blocks)``: the public polynomials a_b, each expanded uniformly mod p from a
  Blake2xb PRNG seeded with blake2b-512(seed || b), in the NTT domain by definition;
- ``mask(k, seed, m)``: b_b = a_b·k + e_b + m_b, e_b SEAL's centred binomial noise (σ = 3.2,
  |e| ≤ 21); masks add up: Σ w_i·b_i = a·(Σ w_i·k_i) + Σ w_i·e_i + Σ w_i·m_i;
- ``unmask(total, key_sum, seed)``: total − a·key_sum, centred into (−p/2, p/2];
- ``combine(polys, weights)``: Σ w_i·polys_i mod p (the server's weighted sum, the holders'
  share combinations);
- ``shares(secret, t, xs)``: Shamir shares of every coefficient (threshold t), and here
  ``lagrange``, ``reconstruct`` and ``consistent`` over them;
- ``ntt``, ``intt``, ``multiply``: SEAL's NTT and the product in R_p it gives (the tests hold
  it to a schoolbook product; a_b above is ``intt(public(seed, blocks)[b])``);
- ``to_bytes`` / ``from_bytes``: 4 bytes a coefficient when p < 2^32, else 8, little-endian.

Nothing here is cryptography of our own: the NTT, the samplers, the PRNGs, the seed
derivation and the arithmetic mod p are Microsoft SEAL's calls, batched in
``native/seal_native.cpp`` (threads: ``SECAGG_NATIVE_THREADS``, as the CKKS native path).
The threshold backend needs that extension: there is no pure-Python path.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any, SupportsIndex

import numpy as np

from secagg.ckks import native
from secagg.errors import ConfigError, MalformedCiphertext

_BUILD_HINT = native.INSTALL_HINT
#: the coefficients each thread of ``combine`` gets at least. A sum is memory-bound and cheap:
#: below this, starting a thread saves less than it costs, and on a busy machine the started
#: thread waits for a core (one upload folded into a running sum at 1e5 values took 1.7 ms on
#: two threads beside two busy worker processes, 0.34 ms on one: ``many_clients``)
COMBINE_PER_THREAD = 1 << 20


@functools.cache
def _extension() -> ModuleType:
    """secagg's native extension's public half, with its ring (the ring takes no key: a
    threshold server and its clients load only this half for it)."""
    try:
        extension = importlib.import_module("secagg.ckks._seal_public")
    except ImportError as exc:
        raise ConfigError(
            f"the threshold backend needs secagg's native extension, which is missing ({exc}): "
            f"{_BUILD_HINT}"
        ) from None
    if not hasattr(extension, "Ring"):
        raise ConfigError(f"the native extension predates the threshold ring: {_BUILD_HINT}")
    return extension


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, not {value!r}")
    return int(value)


def ntt_prime(bits: int, n: int) -> int:
    """The largest prime of ``bits`` bits that is 1 mod 2n (SEAL's ``CoeffModulus::Create``)."""
    bits, n = _int(bits, "bits"), _int(n, "n")
    if not 2 <= bits <= 60 or n < 2 or n & (n - 1):
        raise ValueError(f"ntt_prime needs 2 <= bits <= 60 and n a power of two: {bits}, {n}")
    return int(_extension().ntt_prime(bits=bits, n=n))


class Ring:
    """R_p = Z_p[X]/(X^n + 1); see the module's docstring. Use :func:`ring` to share one."""

    def __init__(self, n: int, p: int) -> None:
        n, p = _int(n, "n"), _int(p, "p")
        if not 0 < p < 1 << 61:
            raise ValueError(f"p must be a prime of at most 60 bits, not {p}")
        if not 0 < n <= 1 << 20:
            raise ValueError(f"n must be a power of two in [1024, 32768], not {n}")
        self._ring = _extension().Ring(n=n, prime=p)
        self._n, self._p, self._bits = int(self._ring.n), int(self._ring.p), int(self._ring.bits)
        self._width = 4 if self._p < 1 << 32 else 8

    def __repr__(self) -> str:
        return f"Ring(n={self._n}, p={self._p})"

    @property
    def n(self) -> int:
        return self._n

    @property
    def p(self) -> int:
        return self._p

    @property
    def bits(self) -> int:
        return self._bits

    @property
    def coefficient_bytes(self) -> int:
        """Bytes per coefficient in :meth:`to_bytes`: 4 when p < 2^32, else 8."""
        return self._width

    # --- SEAL's calls ---------------------------------------------------------------------

    def key(self) -> np.ndarray:
        """A fresh ternary polynomial (coefficients 0, 1, p − 1), shape (n,)."""
        return self._ring.key()

    def public(self, seed: bytes, blocks: int) -> np.ndarray:
        """The public polynomials a_0 … a_{blocks−1} of ``seed`` (32 bytes), (blocks, n)."""
        return self._ring.public(
            seed=_seed(seed), blocks=_count(blocks, "blocks"), threads=native.threads()
        )

    def mask(self, key: np.ndarray, seed: bytes, messages: np.ndarray) -> np.ndarray:
        """b_b = a_b·key + e_b + messages_b mod p, (blocks, n) uint64; ``messages`` int64
        (blocks, n) with every |m| < p/2."""
        return self._ring.mask(
            key=key, seed=_seed(seed), messages=messages, threads=native.threads()
        )

    def unmask(self, total: np.ndarray, key_sum: np.ndarray, seed: bytes) -> np.ndarray:
        """total_b − a_b·key_sum mod p, centred into (−p/2, p/2], (blocks, n) int64."""
        return self._ring.unmask(
            total=total, key_sum=key_sum, seed=_seed(seed), threads=native.threads()
        )

    def combine(
        self, polys: np.ndarray | Sequence[np.ndarray], weights: Sequence[SupportsIndex]
    ) -> np.ndarray:
        """Σ_i weights[i]·polys[i] mod p, shape (k,): ``polys`` is an (m, k) array, or m
        arrays of k values each (summed in place, without stacking them first); weights are
        integers of any size and sign."""
        if isinstance(polys, (list, tuple)):
            polys = [np.asarray(x).reshape(-1) for x in polys]
            work = len(polys) * (polys[0].size if polys else 0)
        else:
            work = int(np.asarray(polys).size)
        threads = max(1, min(native.threads(), work // COMBINE_PER_THREAD))
        return self._ring.combine(polys=polys, weights=list(weights), threads=threads)

    def shares(self, secret: np.ndarray, t: int, xs: Sequence[int]) -> np.ndarray:
        """Shamir shares of each coefficient of ``secret`` (n,) at the points ``xs`` (nonzero,
        distinct, below p): any t of them reconstruct it, fewer say nothing. (len(xs), n)."""
        return self._ring.shares(
            secret=secret, t=_count(t, "t"), xs=list(xs), threads=native.threads()
        )

    def ntt(self, polys: np.ndarray) -> np.ndarray:
        """SEAL's negacyclic NTT of each row of an (n,) or (rows, n) array."""
        return self._ring.ntt(polys=polys, threads=native.threads())

    def intt(self, polys: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`ntt` (``intt(public(seed, b))``: the a_b in coefficient form)."""
        return self._ring.intt(polys=polys, threads=native.threads())

    def multiply(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """x·y in R_p, both (n,) in coefficient form (through the NTT)."""
        return self._ring.multiply(x=x, y=y)

    # --- Shamir, on top ---------------------------------------------------------------------

    def lagrange(self, xs: Sequence[int], at: int = 0) -> list[int]:
        """The Lagrange coefficients λ_i with f(at) = Σ λ_i·f(xs[i]) mod p for every f of
        degree < len(xs)."""
        p = self._p
        points = [_int(x, "each x") for x in xs]
        if not points:
            raise ValueError("lagrange needs at least one point")
        if any(not 0 <= x < p for x in points):
            raise ValueError("each x must be in [0, p)")
        if len(set(points)) != len(points):
            raise ValueError("the xs must be distinct")
        at = _int(at, "at") % p
        coefficients = []
        for i, xi in enumerate(points):
            numerator, denominator = 1, 1
            for j, xj in enumerate(points):
                if j != i:
                    numerator = numerator * (at - xj) % p
                    denominator = denominator * (xi - xj) % p
            coefficients.append(numerator * pow(denominator, -1, p) % p)
        return coefficients

    def reconstruct(self, shares: np.ndarray, xs: Sequence[int]) -> np.ndarray:
        """The polynomial whose shares (m, n) these are at ``xs``, given m ≥ t of them."""
        shares = self._rows(shares, "shares")
        if len(shares) != len(xs):
            raise ValueError(f"{len(shares)} shares but {len(xs)} points")
        return self.combine(shares, self.lagrange(xs))

    def consistent(self, shares: np.ndarray, xs: Sequence[int], t: int) -> bool:
        """Whether the m ≥ t shares (m, n) lie on one polynomial of degree < t at every
        coefficient: each share past the first t must equal the first t's interpolation at
        its x."""
        shares = self._rows(shares, "shares")
        t = _count(t, "t")
        if len(shares) != len(xs):
            raise ValueError(f"{len(shares)} shares but {len(xs)} points")
        if not 1 <= t <= len(xs):
            raise ValueError(f"need 1 <= t <= {len(xs)} shares, not t = {t}")
        base, points = shares[:t], list(xs[:t])
        self.lagrange(xs)  # all the points valid and distinct
        for share, x in zip(shares[t:], xs[t:], strict=True):
            if not np.array_equal(self.combine(base, self.lagrange(points, at=x)), share):
                return False
        return True

    # --- bytes ----------------------------------------------------------------------------

    def to_bytes(self, poly: np.ndarray) -> bytes:
        """Coefficients little-endian, 4 bytes each when p < 2^32, else 8 (any shape, row by
        row)."""
        values = np.asarray(poly)
        if values.dtype.kind not in "ui":
            raise ValueError(f"a polynomial is an integer array, not {values.dtype}")
        if values.size and (int(values.min()) < 0 or int(values.max()) >= self._p):
            raise ValueError("a coefficient is not in [0, p)")
        return np.ascontiguousarray(values, dtype=f"<u{self._width}").tobytes()

    def from_bytes(self, blob: bytes, rows: int) -> np.ndarray:
        """``rows`` polynomials from :meth:`to_bytes`'s bytes, (rows, n) uint64; refuses a
        wrong length or a coefficient ≥ p with :class:`MalformedCiphertext`."""
        rows = _count(rows, "rows")
        expected = rows * self._n * self._width
        if len(blob) != expected:
            raise MalformedCiphertext(
                f"{rows} polynomials of {self._n} coefficients are {expected} bytes, "
                f"not {len(blob)}"
            )
        values = np.frombuffer(blob, dtype=f"<u{self._width}").astype(np.uint64)
        if values.size and int(values.max()) >= self._p:
            raise MalformedCiphertext("a coefficient is not below p")
        return values.reshape(rows, self._n)

    def _rows(self, polys: np.ndarray, what: str) -> np.ndarray:
        polys = np.asarray(polys)
        if polys.ndim != 2 or polys.shape[1] != self._n:
            raise ValueError(f"{what} must have shape (m, {self._n}), not {polys.shape}")
        return polys


@functools.cache  # lru_cache(maxsize=None)
def ring(n: int, p: int) -> Ring:
    """The :class:`Ring` for (n, p), made once per process (its NTT tables: milliseconds)."""
    return Ring(n, p)


def _seed(seed: bytes) -> bytes:
    if not isinstance(seed, (bytes, bytearray, memoryview)):
        raise ValueError(f"a seed is 32 bytes, not {type(seed).__name__}")
    seed = bytes(seed)
    if len(seed) != 32:
        raise ValueError(f"a seed is 32 bytes, not {len(seed)}")
    return seed


def _count(value: Any, what: str) -> int:
    value = _int(value, what)
    if value < 0:
        raise ValueError(f"{what} must be non-negative, not {value}")
    return value
