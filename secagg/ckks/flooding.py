"""Noise flooding of opened CKKS aggregates (IND-CPA-D; Li & Micciancio, EUROCRYPT 2021).

A CKKS decryption returns Δ·m + e, and e together with the ciphertext gives linear equations
in the secret key. Before a client releases anything it decrypted, it adds Gaussian noise
large enough that e is hidden (how well, and in which sense: below).

Formula (the flooding bound restated in Li, Micciancio, Schultz & Sorrell, CRYPTO 2022,
§6.2):  σ = E · 2^{s/2} · sqrt(64·t), where

- s is the security in bits (default 30), in the sense below;
- t is the number of decryptions the key may release over the whole run (every client's
  reveal and open budgets: the key is shared);
- E bounds the Euclidean norm of the *whole* error vector a release exposes: every
  coefficient of every chunk (M = chunks · N of them), not one coefficient.

E is computed by the decryptor from the sum it accepted (``release.py`` checks that it is
Σ k_i·upload_i over signed uploads, so its error is Σ k_i e_i with e_i each upload's fresh
encryption noise). SEAL 4.1 as built here draws e_i from a centred binomial distribution:
each coefficient is a sum of 21 differences of two fair bits, so |e| ≤ 21 and the variance is
21/2. A difference of two fair bits has E[exp(λX)] = cosh²(λ/2) ≤ exp(λ²/4): it is
sub-Gaussian with variance proxy 1/2, so each coefficient of Σ k_i e_i is sub-Gaussian with
v = 10.5·Σ k_i². The sum of squares of M such coefficients obeys Laurent–Massart's χ² bound,
P(‖e‖² ≥ v·(M + 2·sqrt(M·x) + 2x)) ≤ exp(−x); with x = (s + 1)·ln 2 the bound fails with
probability at most 2^-(s+1) per release, which adds to the distances below. Always also
‖e‖ ≤ 21·Σ|k_i|·sqrt(M) (every coefficient at its maximum). E is the smaller of the two.
(SEAL's clipped normal, σ 3.2 cut at 19.2, satisfies both bounds too.)

Before issue 12, E was 19.2·n·2^wb, a bound on one coefficient for the worst weights, set
before any weight was known. Measured against the real error of six clients' sums on the
compact preset (``benchmarks/flooding_bound.py``), it gave 30.9 bits for FedAvg weights but
26.3 for LARC-like α, 28.3 for one-hot-ish and 25.7 for all weights 1, against the 30
claimed; the bound here gives 30.2 for every weighting (``tests/security/
test_flooding_bound.py`` checks realised ≤ E and that E is tight to about 7%).

What the s bits are, and what they are not. With every release's error at its bound E, the
t releases' errors shift the flooded values by sqrt(t)·E = σ·2^{-s/2}/8 together (in σ:
δ = 2^{-s/2}/8, whatever t), so the Kullback–Leibler divergence between the releases and
the same releases without their errors is δ²/2 = 2^-(s+7) (the Rényi divergence of order a
is a·δ²/2, both in nats). That is s bits in the Micciancio–Walter sense (Micciancio &
Walter, "On the bit security of cryptographic primitives", EUROCRYPT 2018), the one Li,
Micciancio, Schultz & Sorrell size flooding by: for a *search* problem such as recovering
the key, distributions whose divergence is 2^-s (a relative precision of 2^{-s/2}) keep s
bits of security, where an argument by statistical distance needs a distance of 2^-s
(``kl_bound``). It is not a statistical distance of 2^-s: the two sets of releases are
erf(δ/(2·sqrt(2))) apart, 2^-19.3 at s = 30 (Pinsker from the KL: 2^-19), so a
distinguisher (a decision problem: telling whether a released value holds a given error)
has an advantage up to 2^-19 (``statistical_distance``; 2^-(s/2+4) in general). So:
30 bits against key recovery in the Micciancio–Walter sense, 2^-19 in plain statistical
distance; a statistical distance of 2^-30 would take s = 52, σ 2^11 times larger
(``tests/security/test_flooding_bound.py``).

The noise is added to the ciphertext before decryption (an encoded plaintext of Gaussian
slot values): the canonical embedding is √N times a unitary map, so i.i.d. noise of σ on
each real slot component is noise of σ·scale/sqrt(N/2) on each coefficient. It is drawn
from a ChaCha20 keystream keyed from the operating system's CSPRNG (``csprng_normal``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

#: SEAL's encryption noise here: a centred binomial, sum of 21 differences of fair bits
NOISE_MAX = 21
NOISE_VARIANCE_PROXY = 21 / 2


def error_bound(weights: Sequence[int], coefficients: int, security_bits: int = 30) -> float:
    """E: a bound on ‖Σ k_i e_i‖₂ over ``coefficients`` coefficients (chunks · N) that
    holds except with probability 2^-(security_bits + 1) (module docstring)."""
    ks = np.abs(np.asarray(weights, dtype=np.float64))
    m = float(coefficients)
    x = (security_bits + 1) * math.log(2.0)
    tail = math.sqrt(NOISE_VARIANCE_PROXY * float(ks @ ks) * (m + 2 * math.sqrt(m * x) + 2 * x))
    return min(tail, NOISE_MAX * float(ks.sum()) * math.sqrt(m))


def realised_security_bits(assumed: float, actual: float, security_bits: int = 30) -> float:
    """The security bits (Micciancio–Walter's sense, module docstring) a flooding sized for
    error ``assumed`` gives an error of norm ``actual``: σ ∝ E·2^{s/2}, so
    s' = s + 2·log2(assumed / actual)."""
    return security_bits + 2 * math.log2(assumed / actual)


def kl_bound(security_bits: int = 30) -> float:
    """The Kullback–Leibler divergence (nats) between all t releases of a key and the same
    releases without their decryption errors, each error at its bound E: 2^-(s+7). What
    ``security_bits`` means: s bits against key recovery in the Micciancio–Walter sense."""
    return 2.0 ** -(security_bits + 7)


def statistical_distance(security_bits: int = 30) -> float:
    """The plain statistical distance between the same two sets of releases (each error at
    its bound E): two normals 2^{-s/2}/8 σ apart, erf(δ/(2·sqrt(2))) ≈ 2^-(s/2+4.3): 2^-19.3
    at s = 30, not 2^-30. It bounds a distinguisher's advantage (a decision problem)."""
    shift = 2.0 ** (-security_bits / 2) / 8
    return math.erf(shift / (2 * math.sqrt(2)))


def flooding_sigma(error: float, decryptions: int, security_bits: int = 30) -> float:
    """σ per coefficient such that t releases keep ``security_bits`` of security against key
    recovery in the Micciancio–Walter sense (KL ≤ 2^-(s+7); the statistical distance is
    :func:`statistical_distance`, 2^-19 at s = 30)."""
    if decryptions < 1:
        raise ValueError("the decryption budget must be at least 1")
    return error * 2.0 ** (security_bits / 2) * math.sqrt(64 * decryptions)


def slot_sigma(coeff_sigma: float, poly_modulus_degree: int, scale: float) -> float:
    """The same noise seen on each real component of a decoded slot."""
    return coeff_sigma * math.sqrt(poly_modulus_degree / 2) / scale


def csprng_normal(size: int) -> np.ndarray:
    """Standard normal samples from a CSPRNG: Box–Muller on 53-bit uniforms, both of its
    outputs (r·cos θ and r·sin θ are independent), the uniforms from a ChaCha20 keystream
    (``cryptography``'s) under a fresh key and nonce from os.urandom, as the kernel's own
    getrandom draws from ChaCha20: a million samples in about 25 ms here, where reading them
    all from os.urandom took 50–75 ms of a decryptor's reveal."""
    pairs = (size + 1) // 2
    stream = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None).encryptor()
    raw = np.frombuffer(stream.update(bytes(16 * pairs)), dtype=np.uint64).reshape(2, pairs)
    u1 = ((raw[0] >> np.uint64(11)).astype(np.float64) + 1.0) / 2.0**53  # in (0, 1]
    u2 = (raw[1] >> np.uint64(11)).astype(np.float64) / 2.0**53
    radius, angle = np.sqrt(-2.0 * np.log(u1)), 2.0 * np.pi * u2
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:size]
