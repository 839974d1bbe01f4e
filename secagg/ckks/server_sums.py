"""Server-weighted sums formed natively: SEAL's arithmetic, without SEAL's loader.

On a server-weighted preset (``compact``, ``wide``) the server forms Σ_i k_i·ct_i with
k_i = round(w_i · 2^weight_bits). SEAL's path loads each upload (its loader checks the
layout and expands the second polynomial a_i from the upload's seed), multiplies it by the
constant plaintext k_i and adds. In the NTT domain a constant is itself in every slot, so
that is, coefficient-wise, per prime q:

    C0 = Σ_i k_i · c0_i  mod q,        C1 = Σ_i k_i · a_i  mod q.

Where the native extension is built, the server computes exactly this with SEAL's own calls
(``native/seal_native.cpp``): it reads each upload's c0 and seeds out of SEAL's layout after
the same checks as the client-weighted reader (:func:`first_polys.first_polynomials`),
expands a_i with SEAL's sampler as the upload arrives (``SeedExpander.sum``, off the critical
path of a round whose weights come after the uploads), forms the weighted sums with SEAL's
``multiply_poly_scalar_coeffmod`` and ``add_poly_coeffmod`` (``SeedExpander.combine``), and
saves the result in SEAL's ciphertext layout (:func:`public.ciphertext_blobs`). The bytes
are the ones SEAL's own sum saves, which ``tests/security/test_native_server_sums.py``
checks bit for bit; a decryptor checks C1 against its own expansion either way
(``release.SecondPolynomials``). Nothing here holds or takes a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from secagg.ckks import native
from secagg.ckks.first_polys import FreshLevel, first_polynomials
from secagg.ckks.public import PublicCKKS
from secagg.errors import ConfigError, MalformedCiphertext


@dataclass
class Polynomials:
    """A ciphertext vector as arrays: per chunk its first and second polynomials, each
    (chunks, primes·N) uint64 at the fresh level, NTT form."""

    first: np.ndarray
    second: np.ndarray

    @property
    def chunks(self) -> int:
        return int(self.first.shape[0])


def expander_for(public: PublicCKKS):
    """The native seed expander of ``public``'s parameters (the extension's public half: a
    server loads no class that takes a key), or None on TenSEAL's binding."""
    if native.public_module() is None:
        return None
    preset = public.preset
    return native.seed_expander(preset.poly_modulus_degree, tuple(preset.coeff_bits))


def required_expander(public: PublicCKKS):
    """:func:`expander_for`, for uploads already read natively: ConfigError if the native
    path was turned off since (``SECAGG_NATIVE``), rather than a sum on another path."""
    expander = expander_for(public)
    if expander is None:
        raise ConfigError(
            f"{native.ENV}: these uploads were read on the native path, which is now off; "
            "keep one path for a whole round"
        )
    return expander


def read_upload(
    level: FreshLevel, expander, parts: Sequence[bytes | memoryview], n_values: int
) -> tuple[Polynomials, bytes]:
    """A client's upload as SEAL's load gives it (checked as the client-weighted reader
    checks it, its second polynomials expanded from its seeds), and its seeds."""
    first, seeds = first_polynomials(level, parts, n_values)
    try:
        second = expander.sum(
            seeds=[seeds], chunks=first.shape[0], factors=[], threads=native.threads()
        )
    except ValueError as exc:  # a seed SEAL's loader would refuse (an unknown PRNG type)
        raise MalformedCiphertext(f"the upload's seeds do not expand ({exc})") from None
    return Polynomials(first, second), seeds


def weighted(expander, vectors: Sequence[Polynomials], ks: Sequence[int]) -> Polynomials:
    """Σ_i k_i · vectors_i, both polynomials, mod each prime (SEAL's multiply by a
    constant and add)."""
    threads = native.threads()
    factors = [int(k) for k in ks]
    return Polynomials(
        expander.combine([v.first for v in vectors], factors, threads),
        expander.combine([v.second for v in vectors], factors, threads),
    )
