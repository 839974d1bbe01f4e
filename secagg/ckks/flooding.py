"""Noise flooding of revealed CKKS aggregates (IND-CPA-D; Li & Micciancio, EUROCRYPT 2021).

A CKKS decryption returns m + e, and e together with the ciphertext gives linear equations in
the secret key. Before a decryptor releases an aggregate to the server, it adds Gaussian noise
large enough that e is statistically hidden.

Formula (the "prior art" flooding bound restated in Li, Micciancio, Schultz & Sorrell,
CRYPTO 2022, §6.2):  log2 σ = log2 E + s/2 + log2(64·t)/2, where

- s is the statistical security in bits (default 30);
- t is the number of decryptions released under the key over the whole run;
- E bounds the decryption error, per polynomial coefficient. Our estimate: every upload is a
  fresh symmetric encryption whose error SEAL draws from a Gaussian of σ = 3.2 clipped at 6σ,
  so its coefficients are at most 19.2; the server multiplies upload i by an integer k_i with
  |k_i| ≤ 2^weight_bits and adds, so E = n_clients · 2^weight_bits · 19.2. This is a worst
  case the decryptor can compute without trusting the server's weights.

The noise is added to the decoded slot values. The canonical embedding is √N times a unitary
map, so i.i.d. Gaussian noise of σ per coefficient equals i.i.d. noise of σ·sqrt(N/2)/scale
on each real component of each slot. It is drawn from the operating system's CSPRNG.
"""

from __future__ import annotations

import math
import os

import numpy as np

SEAL_NOISE_MAX = 6 * 3.2  # SEAL's clipped-normal encryption noise: σ 3.2, cut at 6σ


def error_bound(n_clients: int, weight_bits: int) -> float:
    """E: worst-case per-coefficient decryption error of a weighted sum of fresh uploads."""
    return n_clients * 2.0**weight_bits * SEAL_NOISE_MAX


def flooding_sigma(error: float, decryptions: int, security_bits: int = 30) -> float:
    """σ per coefficient such that t releases keep `security_bits` of statistical security."""
    if decryptions < 1:
        raise ValueError("the decryption budget must be at least 1")
    return error * 2.0 ** (security_bits / 2) * math.sqrt(64 * decryptions)


def slot_sigma(coeff_sigma: float, poly_modulus_degree: int, scale: float) -> float:
    """The same noise seen on each real component of a decoded slot."""
    return coeff_sigma * math.sqrt(poly_modulus_degree / 2) / scale


def csprng_normal(size: int) -> np.ndarray:
    """Standard normal samples from os.urandom (Box–Muller on 53-bit uniforms)."""
    raw = np.frombuffer(os.urandom(16 * size), dtype=np.uint64).reshape(2, size)
    u1 = ((raw[0] >> np.uint64(11)).astype(np.float64) + 1.0) / 2.0**53  # in (0, 1]
    u2 = (raw[1] >> np.uint64(11)).astype(np.float64) / 2.0**53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
