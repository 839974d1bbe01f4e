"""Partitioned variational inference (GenoMed4All D6.2 §4.3.1, Eq. 4.23–4.30; Bui et al.'s
PVI, synchronous) for Bayesian logistic regression with a mean-field Gaussian posterior.

The posterior is approximated by q(w) ∝ p(w) ∏_i t_i(w) (Eq. 4.23), every factor a
mean-field Gaussian in natural parameters λ = (μ/σ², 1/σ²) per weight, so that

    λ_q = λ_0 + Σ_i λ_i                         (products of factors add natural parameters)

Client i, holding its factor λ_i and given λ_q:

1. cavity λ_{−i} = λ_q − λ_i (Eq. 4.25; it may be improper, which the local ELBO tolerates:
   only E_q[log cavity] up to a constant enters);
2. maximises its local ELBO (Eq. 4.27) over q = N(m, diag s²) starting from q:
       F_i(q) = E_q[ Σ_{n∈i} log σ(y_n wᵀu_n) ] − KL(q ‖ cavity);
3. its new factor is λ_i' = λ_i + δ (λ_{q*} − λ_q) with damping δ, and it uploads
   Δλ_i = λ_i' − λ_i (Eq. 4.30's "q̃_i"). δ = 1 is the report's update; synchronous and
   undamped it oscillates on breast cancer (4 clients), so the default is δ = 0.5, which
   converges linearly (about ×0.9 per round, measured);

the server adds the protected sum: λ_q ← λ_q + Σ_i Δλ_i (step 4). Its fixed point is an
optimum of the global ELBO (Eq. 4.26–4.29), which ``fit_gaussian`` finds centrally from the
pooled data and the prior alone: the reference.

Deviations chosen: under mean-field q the activation a = wᵀu is Gaussian, N(mᵀu, Σ s²u²),
so E_q[log σ(y a)] is a 1-D integral, computed by 32-point Gauss–Hermite quadrature instead of
Monte Carlo, with analytic gradients: the local ELBO is deterministic and SciPy's L-BFGS
solves it to tolerance, so the fixed point can be compared with the centralised optimum to
many digits. The report's own example
(VIRTUAL on MNIST) is a Bayesian MLP with Monte Carlo gradients; this module covers the
logistic model only. Uploads are divided by ``scale`` (values stay inside CKKS's headroom:
precisions reach the hundreds) and the server step multiplies back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, ProtocolStateError
from secagg.options import Option
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    Protocol,
    RoundAPI,
    Upload,
    VectorStateHalf,
)
from secagg.protocols.registry import register_protocol
from secagg.wire import Envelope, Field

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(32)  # ∫ f(z) φ(z) dz ≈ Σ w f(z) / √2π


# ---- the math -------------------------------------------------------------------------------
def to_natural(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """(μ, σ²) → λ = [μ/σ², 1/σ²] (one vector: the first half, then the second)."""
    return np.concatenate([mean / var, 1.0 / var])


def to_moments(natural: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """λ → (μ, σ²); the precisions must be positive."""
    eta, precision = np.split(np.asarray(natural, dtype=np.float64), 2)
    if not np.all(precision > 0):
        raise ProtocolStateError(
            f"a Gaussian needs positive precisions; the smallest is {precision.min():.3g} "
            "(damp the updates: --pvi-damping below 1)"
        )
    return eta / precision, 1.0 / precision


def _log_sigmoid(t: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -t)


def local_elbo(
    u: np.ndarray, y: np.ndarray, mean: np.ndarray, log_std: np.ndarray, prior: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """(ELBO, ∂/∂mean, ∂/∂log_std) of E_q[Σ log σ(y wᵀu)] + E_q[log prior] + H(q), with the
    prior in natural parameters (possibly improper: a cavity) and constants dropped.

    Under q = N(mean, diag σ²) the activation a = wᵀu is N(m, s²) with m = meanᵀu and
    s² = Σ σ² u², so the expectation is 32-point Gauss–Hermite quadrature in one dimension and
    its derivatives are the quadrature of ∂ log σ(y a) = y σ(−y a) (times z for ∂/∂s)."""
    var = np.exp(2.0 * log_std)
    m, s = u @ mean, np.sqrt((u**2) @ var)
    weights = _WEIGHTS / np.sqrt(2.0 * np.pi)
    a = m[:, None] + s[:, None] * _NODES[None, :]
    loglik = float((_log_sigmoid(y[:, None] * a) @ weights).sum())
    slope = y[:, None] / (1.0 + np.exp(y[:, None] * a))  # ∂ log σ(y a) / ∂a = y σ(−y a)
    d_m, d_s = slope @ weights, (slope * _NODES[None, :]) @ weights
    eta, precision = np.split(prior, 2)
    elbo = loglik + float((eta * mean - 0.5 * precision * (mean**2 + var)).sum() + log_std.sum())
    d_mean = u.T @ d_m + eta - precision * mean
    d_var = (u**2).T @ (d_s / (2.0 * s)) - 0.5 * precision
    return elbo, d_mean, 2.0 * var * d_var + 1.0


def fit_gaussian(
    u: np.ndarray,
    y: np.ndarray,
    prior: np.ndarray,
    start: np.ndarray,
    *,
    max_iter: int = 1000,
) -> np.ndarray:
    """argmax_q of the ELBO of (u, y) under ``prior`` (natural parameters), from ``start``
    (natural parameters); returns q's natural parameters (L-BFGS, SciPy)."""
    from scipy.optimize import minimize

    mean0, var0 = to_moments(start)
    d = mean0.size

    def negative(theta: np.ndarray) -> tuple[float, np.ndarray]:
        elbo, d_mean, d_log_std = local_elbo(u, y, theta[:d], theta[d:], prior)
        return -elbo, -np.concatenate([d_mean, d_log_std])

    theta0 = np.concatenate([mean0, 0.5 * np.log(var0)])
    result = minimize(
        negative,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": 1e-10, "ftol": 1e-15},
    )
    return to_natural(result.x[:d], np.exp(2.0 * result.x[d:]))


def prior_natural(d: int, precision: float) -> np.ndarray:
    return np.concatenate([np.zeros(d), np.full(d, precision)])


def pvi_update(
    u: np.ndarray,
    y: np.ndarray,
    global_natural: np.ndarray,
    factor: np.ndarray,
    damping: float = 1.0,
) -> np.ndarray:
    """Client i's Δλ_i: fit q against its cavity λ_q − λ_i, damped."""
    fitted = fit_gaussian(u, y, global_natural - factor, global_natural)
    return damping * (fitted - global_natural)


# ---- the protocol ---------------------------------------------------------------------------
class PVIClient(VectorStateHalf):
    """Client i's factor λ_i and its PVI update."""

    vectors = ("factor",)
    factor: np.ndarray | None

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        settings = request.config("pvi")
        global_natural = client.model
        factor = np.zeros_like(global_natural) if self.factor is None else self.factor
        v, y = client.features(), client.labels()
        if 2 * (v.shape[1] + 1) != global_natural.size or not np.all(np.abs(y) == 1):
            raise ConfigError(
                f"pvi fits a Bayesian logistic regression (labels -1/+1, natural parameters of "
                f"d + 1 weights): {client.id} holds features {v.shape} for a model of "
                f"{global_natural.size} values (use a bayes-breast-cancer-* task)"
            )
        u = np.hstack([v, np.ones((len(v), 1))])
        delta = pvi_update(u, y, global_natural, factor, float(settings["damping"]))
        self.factor = factor + delta
        return delta / float(settings["scale"])


class PVI(Protocol):
    name = "pvi"
    # the sum of every change (weights 1): not a planned mean, so the uploads are buffered
    capabilities = Capabilities()
    client = PVIClient
    options = (
        Option(
            "damping",
            "pvi-damping",
            float,
            0.5,
            "damping of the factor updates (1: none, which oscillates here)",
        ),
        Option(
            "scale",
            "pvi-scale",
            float,
            100.0,
            "uploads are the change of natural parameters / scale (CKKS headroom); the server "
            "step multiplies back",
        ),
    )

    def __init__(self, damping: float = 0.5, scale: float = 100.0):
        if not (0 < damping <= 1 and scale > 0):
            raise ConfigError("pvi needs 0 < damping <= 1 and scale > 0")
        self.damping, self.scale = damping, scale

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "damping": self.damping, "scale": self.scale}

    def begin_round(self, ctx: RoundAPI) -> float:
        return self.scale  # the server step: λ_q ← λ_q + scale · Σ_i (Δλ_i / scale)

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        return {"pvi": wire.config({"damping": self.damping, "scale": self.scale})}

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = dict.fromkeys(uploads, 1.0)
        return ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)


register_protocol(
    "pvi",
    PVI,
    summary="synchronous partitioned variational inference, Bayesian logistic regression "
    "(GenoMed4All D6.2 4.3)",
    options=PVI.options,
    _builtin=True,
)
