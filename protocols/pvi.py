"""Partitioned variational inference (GenoMed4All D6.2 §4.3.1, Eq. 4.23–4.30; Bui et al.'s
PVI, synchronous) for Bayesian logistic regression, and a small Bayesian MLP, with
mean-field Gaussian posteriors.

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
so E_q[log σ(y a)] is a 1-D integral, computed by quadrature to about 1e-12
(:func:`expected_log_sigmoid`: Gauss–Hermite for narrow activations, a closed form plus
Gauss–Legendre panels for wide ones, where 32-point Gauss–Hermite was off by ~1e-3) instead of
Monte Carlo, with analytic gradients: the local ELBO is deterministic and SciPy's L-BFGS
solves it to tolerance, so the fixed point can be compared with the centralised optimum to
many digits. The report's own example (VIRTUAL on MNIST) is a Bayesian MLP with Monte Carlo
gradients: ``bayes-mlp-*`` tasks run that way (:func:`fit_gaussian_mlp`: reparameterised
draws and Adam, a fixed stream per client and round), where no fixed point is exact and the
posterior is not unique (hidden units permute), so it is compared by its predictive. Uploads
are divided by ``scale`` (values stay inside CKKS's headroom:
precisions reach the hundreds) and the server step multiplies back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, ProtocolStateError
from secagg.options import Flag
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    Protocol,
    RoundAPI,
    Upload,
    VectorStateHalf,
)
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

#: E[f(a)] for a ~ N(m, s²) with s ≤ _NARROW: Gauss–Hermite in z = (a − m)/s, exact to
#: ~1e-14 there (log σ varies on a scale of 1 in a, at most s in z)
_NARROW = 1.0
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(64)  # ∫ f(z) φ(z) dz ≈ Σ w f(z) / √2π
#: wider activations: Gauss–Legendre on unit panels of a ∈ [−40, 40], split at the kink 0
#: (beyond |a| = 40, log(1 + e^{−|a|}) < 5e-18)
_LEG_X, _LEG_W = np.polynomial.legendre.leggauss(12)
_PANEL_NODES = np.concatenate([k + (_LEG_X + 1) / 2 for k in range(-40, 40)])
_PANEL_WEIGHTS = np.tile(_LEG_W / 2, 80)


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


def expected_log_sigmoid(m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, ...]:
    """(E log σ(a), ∂/∂m, ∂/∂s) for a ~ N(m, s²), elementwise, to about 1e-12.

    Gauss–Hermite quadrature alone is not enough for wide activations: log σ bends on a
    scale of 1 in a, so in z = (a − m)/s it bends on a scale of 1/s, and 32 nodes were off by
    ~1e-3 at s ≈ 5–20 (2e-1 at s = 40). For s > 1, log σ(a) = min(a, 0) − log(1 + e^{−|a|}):
    the first term's expectation is closed-form, m Φ(−m/s) − s φ(m/s), and the second is
    bounded, decays as e^{−|a|} and bends only at 0, so Gauss–Legendre panels of width 1
    across [−40, 40], split at 0, integrate it against the normal density, which varies on
    the scale s > 1 there. For s ≤ 1, 64-node Gauss–Hermite is exact to ~1e-14."""
    from scipy.special import log_ndtr, ndtr

    m, s = np.asarray(m, dtype=np.float64), np.asarray(s, dtype=np.float64)
    value, d_m, d_s = np.empty_like(m), np.empty_like(m), np.empty_like(m)
    narrow = s <= _NARROW
    if narrow.any():
        mn, sn = m[narrow], s[narrow]
        weights = _WEIGHTS / np.sqrt(2.0 * np.pi)
        a = mn[:, None] + sn[:, None] * _NODES[None, :]
        slope = 1.0 / (1.0 + np.exp(a))  # ∂ log σ(a) / ∂a = σ(−a)
        value[narrow] = -np.logaddexp(0.0, -a) @ weights
        d_m[narrow], d_s[narrow] = slope @ weights, (slope * _NODES[None, :]) @ weights
    wide = ~narrow
    if wide.any():
        mw, sw = m[wide], s[wide]
        ratio = mw / sw
        density_at_0 = np.exp(-0.5 * ratio**2) / np.sqrt(2.0 * np.pi)  # φ(m/s)
        below = np.exp(log_ndtr(-ratio))  # Φ(−m/s)
        linear = mw * below - sw * density_at_0  # E min(a, 0)
        a = _PANEL_NODES[None, :]
        z = (a - mw[:, None]) / sw[:, None]
        normal = np.exp(-0.5 * z**2) / (np.sqrt(2.0 * np.pi) * sw[:, None])
        bend = np.log1p(np.exp(-np.abs(a))) * normal * _PANEL_WEIGHTS[None, :]
        value[wide] = linear - bend.sum(1)
        # ∂N/∂m = N z / s, ∂N/∂s = N (z² − 1) / s
        d_m[wide] = ndtr(-ratio) - (bend * z).sum(1) / sw
        d_s[wide] = -density_at_0 - (bend * (z**2 - 1.0)).sum(1) / sw
    return value, d_m, d_s


def local_elbo(
    u: np.ndarray, y: np.ndarray, mean: np.ndarray, log_std: np.ndarray, prior: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """(ELBO, ∂/∂mean, ∂/∂log_std) of E_q[Σ log σ(y wᵀu)] + E_q[log prior] + H(q), with the
    prior in natural parameters (possibly improper: a cavity) and constants dropped.

    Under q = N(mean, diag σ²) the activation a = wᵀu is N(m, s²) with m = meanᵀu and
    s² = Σ σ² u², so y a is N(y m, s²) and the expectation is one-dimensional
    (:func:`expected_log_sigmoid`)."""
    var = np.exp(2.0 * log_std)
    m, s = u @ mean, np.sqrt((u**2) @ var)
    values, d_ym, d_s = expected_log_sigmoid(y * m, s)
    loglik = float(values.sum())
    d_m = y * d_ym
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


def mlp_loglik(
    theta: np.ndarray, v: np.ndarray, y: np.ndarray, hidden: int
) -> tuple[np.ndarray, np.ndarray]:
    """Σ_n log σ(y_n f_θ(v_n)) and its gradient, for each row of ``theta`` (samples × d): the
    MLP f = w2ᵀ tanh(W1 v + b1) + b2, parameters in torch's order (W1 row-major, b1, w2, b2)."""
    p = v.shape[1]
    w1 = theta[:, : p * hidden].reshape(-1, hidden, p)
    b1 = theta[:, p * hidden : p * hidden + hidden]
    w2 = theta[:, p * hidden + hidden : p * hidden + 2 * hidden]
    b2 = theta[:, -1]
    h = np.tanh(np.einsum("np,shp->snh", v, w1) + b1[:, None, :])
    f = np.einsum("snh,sh->sn", h, w2) + b2[:, None]
    loglik = _log_sigmoid(y[None, :] * f).sum(1)
    slope = y[None, :] / (1.0 + np.exp(y[None, :] * f))
    back = slope[:, :, None] * w2[:, None, :] * (1.0 - h**2)
    grad = np.concatenate(
        [
            np.einsum("snh,np->shp", back, v).reshape(len(theta), -1),
            back.sum(1),
            np.einsum("sn,snh->sh", slope, h),
            slope.sum(1, keepdims=True),
        ],
        axis=1,
    )
    return loglik, grad


def fit_gaussian_mlp(
    v: np.ndarray,
    y: np.ndarray,
    prior: np.ndarray,
    start: np.ndarray,
    *,
    hidden: int,
    steps: int,
    samples: int,
    lr: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """A mean-field Gaussian posterior over an MLP's weights: Adam ascent of the ELBO's
    reparameterised Monte Carlo estimate (θ = μ + σ ε, ``samples`` draws a step, as the
    report's VIRTUAL example does), from ``start``; returns its natural parameters."""
    mean, var = to_moments(start)
    log_std = 0.5 * np.log(var)
    eta, precision = np.split(prior, 2)
    params = np.concatenate([mean, log_std])
    first, second = np.zeros_like(params), np.zeros_like(params)
    d = mean.size
    for t in range(1, steps + 1):
        mean, log_std = params[:d], params[d:]
        std = np.exp(log_std)
        noise = rng.standard_normal((samples, d))
        _, grad = mlp_loglik(mean + std * noise, v, y, hidden)
        d_mean = grad.mean(0) + eta - precision * mean
        d_log_std = (grad * noise).mean(0) * std - precision * std**2 + 1.0
        g = np.concatenate([d_mean, d_log_std])
        first = 0.9 * first + 0.1 * g
        second = 0.999 * second + 0.001 * g**2
        step = lr * (first / (1 - 0.9**t)) / (np.sqrt(second / (1 - 0.999**t)) + 1e-8)
        params = params + step
    return to_natural(params[:d], np.exp(2.0 * params[d:]))


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
        p, hidden = v.shape[1], int(settings["hidden"])
        sizes = {2 * (p + 1): "logistic", 2 * (p * hidden + 2 * hidden + 1): "mlp"}
        if global_natural.size not in sizes or not np.all(np.abs(y) == 1):
            raise ConfigError(
                f"pvi fits a Bayesian logistic regression or MLP (labels -1/+1, natural "
                f"parameters of every weight): {client.id} holds features {v.shape} for a "
                f"model of {global_natural.size} values (use a bayes-*breast-cancer-* task)"
            )
        damping = float(settings["damping"])
        if sizes[global_natural.size] == "logistic":
            u = np.hstack([v, np.ones((len(v), 1))])
            delta = pvi_update(u, y, global_natural, factor, damping)
        else:  # Monte Carlo: a stream of its own per client and round (reproducible)
            rng = np.random.default_rng([int(settings["round"]), *client.id.encode()])
            fitted = fit_gaussian_mlp(
                v,
                y,
                global_natural - factor,
                global_natural,
                hidden=hidden,
                steps=int(settings["steps"]),
                samples=int(settings["samples"]),
                lr=float(settings["lr"]),
                rng=rng,
            )
            delta = damping * (fitted - global_natural)
        self.factor = factor + delta
        return delta / float(settings["scale"])


class PVI(Protocol):
    name = "pvi"
    # the sum of every change (weights 1): not a planned mean, so the uploads are buffered
    capabilities = Capabilities()
    client = PVIClient

    def __init__(
        self,
        damping: Annotated[
            float,
            Flag("pvi-damping", "damping of the factor updates (1: none, which oscillates here)"),
        ] = 0.5,
        scale: Annotated[
            float,
            Flag(
                "pvi-scale",
                "uploads are the change of natural parameters / scale (CKKS headroom); the server "
                "step multiplies back",
            ),
        ] = 100.0,
        hidden: Annotated[
            int, Flag("pvi-hidden", "Bayesian MLP: hidden units (the task fixes it)")
        ] = 8,
        steps: Annotated[int, Flag("pvi-steps", "Bayesian MLP: Adam steps per local fit")] = 200,
        samples: Annotated[
            int, Flag("pvi-samples", "Bayesian MLP: Monte Carlo draws per step")
        ] = 8,
        lr: Annotated[float, Flag("pvi-lr", "Bayesian MLP: Adam's rate")] = 0.01,
    ):
        if not (0 < damping <= 1 and scale > 0):
            raise ConfigError("pvi needs 0 < damping <= 1 and scale > 0")
        if not (hidden >= 1 and steps >= 1 and samples >= 1 and lr > 0):
            raise ConfigError("pvi needs hidden, steps and samples >= 1 and lr > 0")
        self.damping, self.scale = damping, scale
        self.hidden, self.steps, self.samples, self.lr = hidden, steps, samples, lr

    def begin_round(self, ctx: RoundAPI) -> float:
        return self.scale  # the server step: λ_q ← λ_q + scale · Σ_i (Δλ_i / scale)

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        return {"pvi": wire.config({**self.option_values(), "round": ctx.round})}

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = dict.fromkeys(uploads, 1.0)
        return ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)


register_protocol(
    "pvi",
    PVI,
    summary="synchronous partitioned variational inference, Bayesian logistic regression "
    "(GenoMed4All D6.2 4.3)",
    # logistic regression
    example=Example(settings={"task": "bayes-breast-cancer-label"}),
    tasks=("bayes-*",),
    _builtin=True,
)
