"""Federated DEC, deep embedded clustering (GenoMed4All D6.2 §7.3–7.4; Xie et al., 2016).

The math only, as pure functions (the protocol that runs them through the engine is the next
step of issue 18). With z_i = f_θ(x_i) the encoder's embedding and μ_j the k centroids:

- Eq. 7.5, the Student-t soft assignment (α = 1, as the report and DEC fix it):
  q_ij = (1 + ‖z_i − μ_j‖²/α)^(−(α+1)/2) / Σ_j' (1 + ‖z_i − μ_j'‖²/α)^(−(α+1)/2);
- Eq. 7.7, the target: p_ij = (q_ij² / f_j) / Σ_j' (q_ij'² / f_j'), f_j = Σ_i q_ij;
- Eq. 7.6, the loss: L = KL(P ‖ Q) = Σ_i Σ_j p_ij log(p_ij / q_ij), P held fixed;
- Eq. 7.8–7.9, its gradients:
  ∂L/∂z_i = (α+1)/α · Σ_j (1 + ‖z_i − μ_j‖²/α)^(−1) (p_ij − q_ij)(z_i − μ_j),
  ∂L/∂μ_j = −(α+1)/α · Σ_i (1 + ‖z_i − μ_j‖²/α)^(−1) (p_ij − q_ij)(z_i − μ_j).

Deviations, chosen:

- Eq. 7.5 as printed has ‖z_i + μ_j‖ and a positive exponent, and Eq. 7.7 writes
  f_j = Σ_j q_ij: typesetting slips. These functions follow DEC's paper (a distance, a
  negative exponent, f_j summed over the points), which the gradients 7.8–7.9 also assume.
- Centroid initialisation: the report has each client run k-means and send its centroids to
  the server, which picks k of them farthest-first. Those centroids are per-client statistics
  in plaintext. Here the initialisation is federated Lloyd's k-means instead: each client
  assigns its embedded points to the current centroids and uploads, per cluster, the sum of
  its points and their count (:func:`kmeans_sums`); the server adds them (a protected sum on
  an encrypted backend) and the new centroids are the ratios (:func:`kmeans_centroids`): the
  same step as k-means on the pooled embedding, and only the sums are revealed.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

ALPHA = 1.0


def soft_assignment(z: np.ndarray, mu: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Eq. 7.5: Q, shape (points, clusters), each row a distribution."""
    kernel = _kernel(z, mu, alpha) ** ((alpha + 1.0) / 2.0)
    return kernel / kernel.sum(axis=1, keepdims=True)


def target_distribution(q: np.ndarray) -> np.ndarray:
    """Eq. 7.7: P, sharper than Q and normalised by the soft cluster frequencies f_j."""
    weighted = q**2 / q.sum(axis=0)
    return weighted / weighted.sum(axis=1, keepdims=True)


def kl_loss(p: np.ndarray, q: np.ndarray) -> float:
    """Eq. 7.6: KL(P ‖ Q), summed over points and clusters (0 · log 0 = 0)."""
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def kl_gradients(
    z: np.ndarray, mu: np.ndarray, p: np.ndarray, alpha: float = ALPHA
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 7.8–7.9: (∂L/∂z, ∂L/∂μ) at fixed P."""
    q = soft_assignment(z, mu, alpha)
    coeff = (alpha + 1.0) / alpha * _kernel(z, mu, alpha) * (p - q)  # (points, clusters)
    diff = z[:, None, :] - mu[None, :, :]  # (points, clusters, dims)
    grad_z = np.einsum("ij,ijd->id", coeff, diff)
    grad_mu = -np.einsum("ij,ijd->jd", coeff, diff)
    return grad_z, grad_mu


def kmeans_sums(z: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One client's share of a Lloyd step: per cluster, the sum of its points nearest that
    centroid (k, dims) and their count (k,)."""
    nearest = np.argmin(((z[:, None, :] - mu[None, :, :]) ** 2).sum(axis=2), axis=1)
    k = mu.shape[0]
    sums = np.zeros_like(mu, dtype=np.float64)
    np.add.at(sums, nearest, z)
    return sums, np.bincount(nearest, minlength=k).astype(np.float64)


def kmeans_centroids(sums: np.ndarray, counts: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The Lloyd update from the summed shares; a cluster no point chose keeps its centroid."""
    out = previous.astype(np.float64).copy()
    filled = counts > 0.5  # counts arrive as (possibly noisy) sums: at least one point
    out[filled] = sums[filled] / counts[filled, None]
    return out


def clustering_accuracy(labels: np.ndarray, clusters: np.ndarray) -> float:
    """DEC's unsupervised accuracy: the share of points whose cluster, under the one-to-one
    map of clusters to labels that agrees most (the Hungarian algorithm), is their label."""
    labels, clusters = np.asarray(labels), np.asarray(clusters)
    label_ids, label_of = np.unique(labels, return_inverse=True)
    cluster_ids, cluster_of = np.unique(clusters, return_inverse=True)
    counts = np.zeros((len(cluster_ids), len(label_ids)))
    np.add.at(counts, (cluster_of, label_of), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / len(labels))


def _kernel(z: np.ndarray, mu: np.ndarray, alpha: float) -> np.ndarray:
    """(1 + ‖z_i − μ_j‖²/α)^(−1), shape (points, clusters)."""
    squared = ((z[:, None, :] - mu[None, :, :]) ** 2).sum(axis=2)
    return 1.0 / (1.0 + squared / alpha)
