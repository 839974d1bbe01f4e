"""Server-weighted sums formed natively: SEAL's arithmetic on first polynomials only.

On a server-weighted preset (``compact``, ``wide``) the server forms Σ_i k_i·ct_i with
k_i = round(w_i · 2^weight_bits). SEAL's path loads each upload (its loader checks the
layout and expands the second polynomial a_i from the upload's seed), multiplies it by the
constant plaintext k_i and adds. In the NTT domain a constant is itself in every slot, so
that is, coefficient-wise, per prime q:

    C0 = Σ_i k_i · c0_i  mod q,        C1 = Σ_i k_i · a_i  mod q.

A decryptor never uses the server's C1: it expands Σ k_i·a_i from the signed seeds and
weights itself (``release.SecondPolynomials``), as it does on the client-weighted preset.
So the server forms C0 only, and sends it as a plaintext (``first_polys.plaintext_blobs``):
it reads each upload's c0 and seeds out of SEAL's layout after the same checks as the
client-weighted reader (:func:`first_polys.first_polynomials`), never expands a seed, and
forms the weighted sum with SEAL's ``multiply_poly_scalar_coeffmod`` and
``add_poly_coeffmod`` (``SeedExpander.combine``, ``native/seal_native.cpp``). C0 is bit for
bit the first polynomial of SEAL's own sum (``tests/security/test_native_server_sums.py``).
Nothing here holds or takes a key.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from secagg.ckks import native
from secagg.ckks.public import PublicCKKS
from secagg.errors import ConfigError


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


def weighted_firsts(expander, firsts: Sequence[np.ndarray], ks: Sequence[int]) -> np.ndarray:
    """Σ_i k_i · firsts_i mod each prime (SEAL's multiply by a constant and add), each a
    (chunks, primes·N) uint64 array of first polynomials."""
    return expander.combine(list(firsts), [int(k) for k in ks], native.threads())
