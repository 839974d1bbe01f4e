"""FedDisco-style discrepancy weights from a β-VAE (poster, Algorithm 1 and Equation 1).

Each client encodes its samples with the federated β-VAE's encoder and reports

    d_k = (1 / L) Σ_l W1(encodings of latent dimension l, N(0, 1)),

the mean 1-D Wasserstein distance of its latent codes to the prior. The server weights the
classifier's updates with

    p_k = ReLU(n_k − α d_k + b) / Σ_m ReLU(n_m − α d_m + b),

n_k the relative dataset size. d_k is computed once (client data do not change) and is a
declared plaintext scalar; the weighted sum itself runs on any backend.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from scipy.special import ndtri

from secagg.protocols.base import Protocol, RoundAPI, Upload
from secagg import wire
from secagg.errors import ConfigError


def wasserstein_to_standard_normal(samples: np.ndarray) -> float:
    """W1 between the empirical distribution of ``samples`` and N(0, 1).

    W1 = ∫ |F⁻¹(u) − Φ⁻¹(u)| du; on the empirical quantile steps [(i−1)/m, i/m] we use the
    normal quantile at the midpoint, which converges to the integral as m grows.
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    m = x.size
    return float(np.mean(np.abs(x - ndtri((np.arange(1, m + 1) - 0.5) / m))))


def discrepancy(encodings: np.ndarray) -> float:
    """d_k: the mean over latent dimensions of W1(encodings[:, l], N(0, 1))."""
    return float(np.mean([wasserstein_to_standard_normal(col) for col in encodings.T]))


def disco_weights(n_rel: np.ndarray, d: np.ndarray, alpha: float, b: float) -> np.ndarray:
    w = np.maximum(np.asarray(n_rel) - alpha * np.asarray(d) + b, 0.0)
    if not w.sum() > 0:
        raise ConfigError(f"every FedDisco weight is zero (alpha={alpha}, b={b}, d={d}); "
                          "lower alpha or raise b")
    return w / w.sum()


class FedDisco(Protocol):
    client_dp_compatible = False  # its β-VAE pretraining is not accounted
    name = "feddisco"
    reveals = ("discrepancy", "global_update")

    def __init__(self, alpha: float = 0.5, b: float = 0.1):
        if alpha < 0:
            raise ConfigError(f"FedDisco needs alpha >= 0, got {alpha}")
        self.alpha, self.b = alpha, b
        self.d: dict[str, float] = {}

    def describe(self):
        return {"name": self.name, "alpha": self.alpha, "b": self.b}

    def aggregate(self, rnd: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        missing = [c for c in uploads if c not in self.d]
        if missing:  # first round (or a newcomer): ask for the discrepancy once
            replies = rnd.ask("discrepancy", {c: {} for c in missing},
                              expect={"discrepancy": wire.SCALAR})
            self.d.update({c: env.scalar("discrepancy") for c, env in replies.items()})
        clients = [c for c in uploads if c in self.d]
        n = np.array([uploads[c].n_samples for c in clients])
        p = disco_weights(n / n.sum(), np.array([self.d[c] for c in clients]), self.alpha,
                          self.b)
        return rnd.weighted_sum({c: uploads[c].handle for c in clients}, dict(zip(clients, p)))
