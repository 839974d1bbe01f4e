"""Distributed (global consensus) ADMM, GenoMed4All D6.2 §3.4: the math, in pure functions.

The report's problems (Eq. 3.4–3.7) over x = [w, b] and inputs u = [v, 1] (the bias is
regularised too), N samples in all:

    ridge     (1/N) Σ (xᵀu − y)²                + (λ/2) ‖x‖²
    lasso     (1/N) Σ (xᵀu − y)²                + λ ‖x‖₁
    logistic  (1/N) Σ ln(1 + exp(−y xᵀu))       + (λ/2) ‖x‖²      (y ∈ {−1, +1})
    svm       (1/N) Σ max(1 − y xᵀu, 0)          + (λ/2) ‖x‖²

split over N_b clients as Σ_i g_i(x_i) + h(z) subject to x_i = z, where g_i is client i's
share of the loss (its own samples, still divided by the global N, so that Σ g_i is the
centralised loss). Scaled ADMM (Eq. 3.32):

    x_i ← argmin g_i(x_i) + (ρ/2) ‖x_i − z + w_i‖²               (on client i)
    z   ← argmin h(z) + (N_b ρ/2) ‖z − mean_i (x_i + w_i)‖²       (needs Σ_i (x_i + w_i) only)
    w_i ← w_i + x_i − z                                            (on client i)

with h's minimiser  z = ρ Σ(x_i + w_i) / (λ + N_b ρ)  for the L2 problems (Eq. 3.40) and
z = Soft(Σ(x_i + w_i) / N_b, λ / (N_b ρ))  for the lasso (Eq. 3.23–3.24, distributed).

Deviations chosen, each a correction:
- Eq. 3.23's x-update reads (2/N AᵀA + ρI)⁻¹(2/N Aᵀb − ρ(z − w)); setting the gradient of
  (1/N)‖Ax − b‖² + (ρ/2)‖x − z + w‖² to zero gives **+** ρ(z − w), used here.
- The logistic x-update is not given in closed form by the report: a fixed number of
  gradient steps from the client's previous x_i, as Algorithm 2 does for the SVM with
  subgradient steps (Eq. 3.37–3.38).

The protocol that runs this through the engine (clients upload x_i + w_i protected, the
server reveals the sum and sends z) is not wired yet; these functions are checked against
the centralised optimum of the same objective in ``tests/test_admm.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from secagg.errors import ConfigError

PROBLEMS = ("ridge", "lasso", "logistic", "svm")


def _check(problem: str) -> None:
    if problem not in PROBLEMS:
        raise ConfigError(f"unknown ADMM problem {problem!r}; choose from {PROBLEMS}")


def soft_threshold(a: np.ndarray, kappa: float) -> np.ndarray:
    """Soft(a, κ) = (a − κ)₊ − (−a − κ)₊  (Eq. 3.24)."""
    return np.maximum(a - kappa, 0.0) - np.maximum(-a - kappa, 0.0)


def objective(problem: str, u: np.ndarray, y: np.ndarray, x: np.ndarray, lam: float) -> float:
    """The centralised objective (Eq. 3.4–3.7) at x, over all N samples."""
    _check(problem)
    margin = u @ x
    if problem in ("ridge", "lasso"):
        loss = float(np.mean((margin - y) ** 2))
    elif problem == "logistic":
        loss = float(np.mean(np.logaddexp(0.0, -y * margin)))
    else:
        loss = float(np.mean(np.maximum(1.0 - y * margin, 0.0)))
    penalty = lam * float(np.abs(x).sum()) if problem == "lasso" else lam / 2 * float(x @ x)
    return loss + penalty


def local_gradient(problem: str, u: np.ndarray, y: np.ndarray, x: np.ndarray, n_total: int):
    """The gradient (the SVM: the subgradient of Eq. 3.37) of client i's g_i at x."""
    margin = u @ x
    if problem in ("ridge", "lasso"):
        return 2.0 / n_total * u.T @ (margin - y)
    if problem == "logistic":
        return -(u.T @ (y / (1.0 + np.exp(y * margin)))) / n_total
    return -(u.T @ (y * (y * margin < 1.0))) / n_total


def x_update(
    problem: str,
    u: np.ndarray,
    y: np.ndarray,
    n_total: int,
    z: np.ndarray,
    w: np.ndarray,
    rho: float,
    *,
    x: np.ndarray | None = None,
    steps: int = 20,
    lr: float = 0.1,
) -> np.ndarray:
    """Client i's x_i: exact for the squared loss (corrected Eq. 3.23), else ``steps``
    (sub)gradient steps of size ``lr`` on g_i + (ρ/2)‖x − z + w‖² from ``x`` (Eq. 3.38)."""
    _check(problem)
    if problem in ("ridge", "lasso"):
        gram = 2.0 / n_total * u.T @ u + rho * np.eye(u.shape[1])
        return np.linalg.solve(gram, 2.0 / n_total * u.T @ y + rho * (z - w))
    x = np.array(z if x is None else x, dtype=np.float64, copy=True)
    for _ in range(steps):
        x -= lr * (local_gradient(problem, u, y, x, n_total) + rho * (x - z + w))
    return x


def z_update(problem: str, sum_xw: np.ndarray, n_blocks: int, rho: float, lam: float):
    """The global z from Σ_i (x_i + w_i), the one sum the server needs (Eq. 3.40; the
    lasso's soft threshold)."""
    _check(problem)
    if problem == "lasso":
        return soft_threshold(sum_xw / n_blocks, lam / (n_blocks * rho))
    return rho * sum_xw / (lam + n_blocks * rho)


def w_update(w: np.ndarray, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    return w + x - z


def residuals(
    xs: Sequence[np.ndarray], z: np.ndarray, z_before: np.ndarray, rho: float
) -> tuple[float, float]:
    """Primal ‖(x_i − z)_i‖ and dual ρ √N_b ‖z − z_before‖ residuals (the stopping rule's
    scalars; each client can report its own ‖x_i − z‖² as a declared scalar)."""
    primal = float(np.sqrt(sum(float((x - z) @ (x - z)) for x in xs)))
    dual = float(rho * np.sqrt(len(xs)) * np.linalg.norm(z - z_before))
    return primal, dual
