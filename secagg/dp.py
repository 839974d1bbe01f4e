"""Differential privacy arithmetic shared by clients and server (numpy only, no torch).

Client-level DP (DP-FedAvg, McMahan et al. 2018) with distributed noise. Every client clips
its pseudo-gradient to L2 norm C and adds Gaussian noise N(0, (σ_c C)² I) before it protects
(encrypts) the vector, so no party ever sees an un-noised update. The server reveals a
weighted sum Σ_i w_i (Δ_i + ν_i); its noise has standard deviation σ_c C ‖w‖₂ per coordinate,
while one client changes the sum by at most C · max_i w_i. The revealed aggregate is therefore
a Gaussian mechanism with the *realised* noise multiplier

    z = σ_c ‖w‖₂ / max_i w_i,

which is what the accountant is fed, round by round. With K equal weights z = σ_c √K, so a
target multiplier z* is met by σ_c = z* / √K_expected.

Several sums released in one round from the *same* noised uploads (LARC's Ĝ and its global
update) share their noise, so they are one Gaussian mechanism, not independent ones: with
the releases' weights as the rows of W, the outputs are W x with noise covariance
(σ_c C)² W Wᵀ, and client j moves their mean by W[:, j] ⊗ Δ. The joint multiplier for j is

    z_j = σ_c / √(W[:, j]ᵀ (W Wᵀ)⁺ W[:, j]),

the worst client's is the round's (:func:`joint_noise_multiplier`). For one release it is
the formula above; for LARC's weights (1/3, 1, …, 1) then (1, …, 1) the difference of the
two sums is client 0's noised upload itself, and z_0 = σ_c (per-release figures said 2.3 σ_c
and 2.4 σ_c). Where the server sees each noised upload (plain, or plaintext updates allowed)
every upload is a mechanism of multiplier σ_c, and sums add nothing.

Assumptions (README, "Differential privacy"): clients are honest and add their noise;
weights are fixed before the reveal (weights chosen after upload from other clients' reports
are used as realised, but their own dependence on data is not accounted: they are revealed
scalars, see below); fewer surviving clients or uneven weights mean less noise, and the
realised z says so.

Revealed scalars (ΔL, validation losses, loss ratios, discrepancies) are not covered by the
update's DP. :func:`privatize_scalar` clips one to [low, high] and adds N(0, (σ_s (high−low))²):
a Gaussian mechanism with multiplier σ_s per release, accounted separately.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from secagg.errors import ConfigError

#: Rényi orders for every RDP → (ε, δ) conversion: Opacus' defaults (1.1 … 63) plus finer
#: orders near 1, which give the tighter bound when the noise is small and ε large
RDP_ORDERS = (
    [1 + x / 100 for x in range(1, 10)]
    + [1 + x / 10.0 for x in range(1, 100)]
    + list(range(12, 64))
    + [80, 128, 256]
)


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings: clip norm C, target noise multiplier z*, expected clients."""

    clip: float
    noise_multiplier: float
    expected_clients: int

    def __post_init__(self):
        if not self.clip > 0:
            raise ConfigError(f"client DP needs a clip norm > 0, got {self.clip}")
        if not self.noise_multiplier >= 0:
            raise ConfigError(
                f"client DP needs a noise multiplier >= 0, got {self.noise_multiplier}"
            )
        if self.expected_clients < 1:
            raise ConfigError(f"expected_clients must be >= 1, got {self.expected_clients}")

    @property
    def client_sigma(self) -> float:
        """σ_c: each client's noise std in units of C."""
        return self.noise_multiplier / math.sqrt(self.expected_clients)

    def config(self) -> dict[str, float]:
        return {"clip": self.clip, "sigma": self.client_sigma}


def clip_l2(update: np.ndarray, clip: float) -> np.ndarray:
    """Scale ``update`` down to L2 norm ``clip`` if it is longer."""
    norm = float(np.linalg.norm(update))
    return update if norm <= clip else update * (clip / norm)


def noised_update(
    update: np.ndarray, clip: float, sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """Clip to ``clip`` and add N(0, (sigma·clip)²) per coordinate."""
    clipped = clip_l2(np.asarray(update, dtype=np.float64), clip)
    return clipped + rng.normal(0.0, sigma * clip, clipped.shape)


def realised_noise_multiplier(weights: Mapping[str, float], client_sigma: float) -> float:
    """z = σ_c ‖w‖₂ / max |w_i| for the revealed sum Σ w_i (Δ_i + ν_i)."""
    w = np.abs(np.array(list(weights.values()), dtype=np.float64))
    if w.size == 0 or not w.max() > 0:
        raise ValueError("a weighted sum needs at least one nonzero weight")
    return float(client_sigma * np.linalg.norm(w) / w.max())


def joint_noise_multiplier(releases: list[Mapping[str, float]], client_sigma: float) -> float:
    """The worst client's z for sums released together from the same noised uploads."""
    clients = sorted({c for weights in releases for c in weights})
    w = np.array([[float(r.get(c, 0.0)) for c in clients] for r in releases])
    if w.size == 0 or not np.abs(w).max() > 0:
        raise ValueError("a release needs at least one nonzero weight")
    gram = np.linalg.pinv(w @ w.T, hermitian=True)
    exposure = np.einsum("ij,ik,kj->j", w, gram, w)  # W[:, j]ᵀ (W Wᵀ)⁺ W[:, j] per client
    return float(client_sigma / math.sqrt(float(exposure.max())))


@dataclass(frozen=True)
class ScalarDP:
    """Bounds and noise multiplier for revealed scalars."""

    low: float
    high: float
    noise_multiplier: float

    def __post_init__(self):
        if not self.low < self.high:
            raise ConfigError(f"scalar DP needs low < high, got [{self.low}, {self.high}]")
        if not self.noise_multiplier > 0:
            raise ConfigError(
                f"scalar DP needs a noise multiplier > 0, got {self.noise_multiplier}"
            )

    def config(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high, "sigma": self.noise_multiplier}


def privatize_scalar(
    value: float, low: float, high: float, sigma: float, rng: np.random.Generator
) -> float:
    """Clip to [low, high], add N(0, (sigma·(high−low))²)."""
    return float(np.clip(value, low, high) + rng.normal(0.0, sigma * (high - low)))
