"""The deep generative decoder, DGD (GenoMed4All D6.2 §9.2–9.5; Schuster & Krogh,
arXiv:2110.06672), federated, with missing values.

A sample x ∈ R^D has a representation z ∈ R^L of its own; a decoder f_θ maps z to the
feature space, and a Gaussian mixture is the distribution over representations:

    p(x | z)   = Π_{d observed} N(x_d | f_θ(z)_d, 1/β_out)
    p(z)       = Σ_k π_k N(z | μ_k, diag(1/β_k)),        π = softmax(w)

Everything is MAP-estimated together (§9.2): the decoder, the mixture and every z_n maximise

    Σ_n [log p(x_n^obs | z_n) + log p(z_n)] + log p(μ) + log p(w) + log p(log β)

with the report's priors: a "soft-ball" prior over the component means (about uniform in a
ball of radius r, its edge softened by a sigmoid of sharpness a),
log p(μ_k) = log Γ(1 + L/2) − L log r − (L/2) log π − log(1 + exp(a (‖μ_k‖/r − 1))); a
Dirichlet(α) prior over the mixture coefficients π; and a Gaussian prior on log(1/σ²) = log β.
Only observed entries enter the likelihood (§9.3): nothing is filled in before training. To
impute, a sample's representation is fitted to its observed entries with θ fixed, and the
decoder's output f_θ(ẑ) is the most probable value of the missing ones.

Federated (§9.5): the shared vector is [decoder | β_out | mixture]; the representations are
each client's own state and never leave it. A round: client i, holding the global θ and its
z's, runs Adam on its local MAP objective (its samples only) for a few steps, updating θ and
its z's jointly, keeps the z's and uploads Δθ = θ_new − θ; the server forms the protected
FedAvg sum Σ_i (n_i / Σn) Δθ_i (weights planned from the sample counts: it streams).

Deviations chosen (the report gives no equations; these follow the paper where it is clear):

- Parametrisation: weights as logits w (π = softmax(w)), precisions as log β: any average of
  these is again a valid mixture, which averaging probabilities or variances would not
  guarantee. The Dirichlet density is applied to π = softmax(w) without the Jacobian of the
  logit map (MAP in the logits).
- The likelihood is Gaussian with one learned precision β_out for every feature (the report
  names none). A per-feature precision would
  diverge on features that never vary (three digits pixels are always 0); one shared value
  cannot. β_out gets the same kind of Gaussian prior on its logarithm.
- The decoder is one hidden layer of tanh units (smooth, so its gradients check against
  finite differences); analytic gradients in NumPy, so the protocol imports no torch.
- The prior over θ enters each local objective once, normalised per sample like the data:
  client i minimises (1/n_i)(Σ_{n∈i} loss_n − log p(θ)); federated, the prior so counts
  K times as much as centralised (1/N). The priors are weak (Dirichlet α = 2, broad
  Gaussians), so this should matter little; it was not measured separately.
- Representations start as draws from the current mixture (a stream per seed and client) and
  Adam's moments restart every round (only θ and z are state, not the optimizer).
- A new sample's representation is fitted from the component means that explain its
  observed entries best (``starts`` of them; Adam with θ fixed) and the end of lowest loss is
  kept. The report warns that this fit can end in a local maximum; tests/test_dgd.py shows
  one that a single start falls into. The tasks choose the starts by measurement
  (``secagg.clients.tasks.dgd.FIT``).
- Plaintext and CKKS runs agree to CKKS's error in the first rounds, but the Adam-trained
  trajectory amplifies any rounding (float32 against float64 uploads on plain diverge alike):
  after 20 rounds parameters differ by ~0.1 while the imputation error agrees to about its
  spread over seeds (benchmarks/results/dgd.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import lgamma, log, pi
from typing import Annotated

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, StateError
from secagg.options import Flag
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    RoundAPI,
    VectorStateHalf,
)
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

#: the model every dgd task builds (the protocol's defaults): representation size, hidden
#: units of the decoder, mixture components
LATENT, HIDDEN, COMPONENTS = 8, 64, 10
#: representation fits of new samples (imputation): Adam steps, rate, starts
FIT_STEPS, FIT_LR, FIT_STARTS = 100, 0.05, 1


@dataclass(frozen=True)
class Layout:
    """Where each part sits in the shared vector (torch's order for the task's module):
    hidden W1 (H×L), b1 (H), output W2 (D×H), b2 (D), log β_out (1), means (K×L),
    log-precisions (K×L), logits (K)."""

    latent: int
    hidden: int
    features: int
    components: int

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        L, H, D, K = self.latent, self.hidden, self.features, self.components
        return {
            "w1": (H, L),
            "b1": (H,),
            "w2": (D, H),
            "b2": (D,),
            "log_beta_out": (1,),
            "means": (K, L),
            "log_precisions": (K, L),
            "logits": (K,),
        }

    @property
    def size(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def unpack(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.size,):
            raise ConfigError(
                f"a DGD of latent {self.latent}, hidden {self.hidden}, {self.features} features "
                f"and {self.components} components has {self.size} parameters, got a vector of "
                f"shape {theta.shape} (set --dgd-latent/--dgd-hidden/--dgd-components to the "
                "task's model)"
            )
        parts, pos = {}, 0
        for name, shape in self.shapes.items():
            k = int(np.prod(shape))
            parts[name] = theta[pos : pos + k].reshape(shape)
            pos += k
        return parts

    def pack(self, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(parts[name]).ravel() for name in self.shapes])


@dataclass(frozen=True)
class Priors:
    """The report's priors: soft ball over the means (radius, sharpness), Dirichlet(α) over
    the mixture weights, Gaussian over each log-precision (the components' and β_out's)."""

    radius: float = 3.0
    sharpness: float = 10.0
    alpha: float = 2.0
    log_precision_mean: float = 2 * log(1 / 0.5)  # components of sd about 0.5
    log_precision_sd: float = 1.0
    log_beta_out_mean: float = 2 * log(1 / 0.25)  # residuals of sd about 0.25
    log_beta_out_sd: float = 2.0


# ---- the priors ---------------------------------------------------------------------------
def softball_log_prior(
    means: np.ndarray, radius: float, sharpness: float
) -> tuple[float, np.ndarray]:
    """Σ_k log p(μ_k) of the soft ball and its gradient: log of a uniform density on the
    ball of ``radius`` (its normaliser), less log(1 + exp(a (‖μ‖/r − 1))) which softens the
    edge (so the density is normalised only approximately; MAP needs no constant)."""
    K, L = means.shape
    log_volume = L * log(radius) + 0.5 * L * log(pi) - lgamma(1 + 0.5 * L)
    norm = np.sqrt((means**2).sum(1))
    t = sharpness * (norm / radius - 1.0)
    value = float(-K * log_volume - np.logaddexp(0.0, t).sum())
    slope = sharpness / radius / (1.0 + np.exp(-t))  # d/d‖μ‖ of log(1 + e^t)
    direction = np.divide(means, norm[:, None], out=np.zeros_like(means), where=norm[:, None] > 0)
    return value, -slope[:, None] * direction


def dirichlet_log_prior(logits: np.ndarray, alpha: float) -> tuple[float, np.ndarray]:
    """log Dir(softmax(w) | α) and its gradient in w: (α − 1)(1 − K π_j)."""
    K = logits.size
    log_weights = logits - np.logaddexp.reduce(logits)
    value = lgamma(K * alpha) - K * lgamma(alpha) + (alpha - 1.0) * float(log_weights.sum())
    return value, (alpha - 1.0) * (1.0 - K * np.exp(log_weights))


def gaussian_log_prior(x: np.ndarray, mean: float, sd: float) -> tuple[float, np.ndarray]:
    """Σ log N(x | mean, sd²) and its gradient."""
    r = (np.asarray(x) - mean) / sd
    return float((-0.5 * r**2 - log(sd) - 0.5 * log(2 * pi)).sum()), -r / sd


def parameter_log_prior(parts: Mapping[str, np.ndarray], priors: Priors) -> tuple[float, dict]:
    """log p(θ) of the mixture and β_out (the decoder's weights have a flat prior) and its
    gradient per part."""
    ball, d_means = softball_log_prior(parts["means"], priors.radius, priors.sharpness)
    dirichlet, d_logits = dirichlet_log_prior(parts["logits"], priors.alpha)
    spread, d_log_prec = gaussian_log_prior(
        parts["log_precisions"], priors.log_precision_mean, priors.log_precision_sd
    )
    noise, d_log_beta = gaussian_log_prior(
        parts["log_beta_out"], priors.log_beta_out_mean, priors.log_beta_out_sd
    )
    grads = {
        "means": d_means,
        "logits": d_logits,
        "log_precisions": d_log_prec,
        "log_beta_out": d_log_beta,
    }
    return ball + dirichlet + spread + noise, grads


# ---- the mixture --------------------------------------------------------------------------
def mixture_log_density(
    z: np.ndarray, means: np.ndarray, log_precisions: np.ndarray, logits: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """log p(z_n) = log Σ_k π_k N(z_n | μ_k, diag(1/β_k)) for each row of ``z`` (n × L), and
    the gradients of Σ_n log p(z_n): in z (per row), μ, log β and w. With responsibilities
    ρ_nk: ∂z_n = −Σ_k ρ_nk β_k (z_n − μ_k), ∂μ_k = Σ_n ρ_nk β_k (z_n − μ_k),
    ∂log β_kl = Σ_n ρ_nk (1 − β_kl (z_nl − μ_kl)²)/2, ∂w_k = Σ_n (ρ_nk − π_k)."""
    precision = np.exp(log_precisions)  # K × L
    diff = z[:, None, :] - means[None, :, :]  # n × K × L
    log_weights = logits - np.logaddexp.reduce(logits)
    log_components = (
        0.5 * log_precisions.sum(1)[None, :]
        - 0.5 * z.shape[1] * log(2 * pi)
        - 0.5 * (precision[None] * diff**2).sum(2)
    )
    joint = log_weights[None, :] + log_components  # n × K
    log_density = np.logaddexp.reduce(joint, axis=1)
    resp = np.exp(joint - log_density[:, None])
    weighted = resp[:, :, None] * precision[None] * diff  # ρ β (z − μ)
    grads = {
        "z": -weighted.sum(1),
        "means": weighted.sum(0),
        "log_precisions": 0.5 * (resp[:, :, None] * (1.0 - precision[None] * diff**2)).sum(0),
        "logits": resp.sum(0) - z.shape[0] * np.exp(log_weights),
    }
    return log_density, grads


# ---- the decoder and the objective ---------------------------------------------------------
def decode(parts: Mapping[str, np.ndarray], z: np.ndarray) -> np.ndarray:
    """f_θ(z) = W2 tanh(W1 z + b1) + b2, one row per representation."""
    return np.tanh(z @ parts["w1"].T + parts["b1"]) @ parts["w2"].T + parts["b2"]


def split_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dgd task's features [values (missing as 0) | observed (1) or missing (0)] → (values,
    observed as a boolean mask)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] % 2:
        raise ConfigError(
            f"DGD features are [values | observed mask], an even number of columns; got shape "
            f"{x.shape} (use a dgd-* task)"
        )
    values, mask = np.split(x, 2, axis=1)
    if not np.all((mask == 0) | (mask == 1)):
        raise ConfigError("the DGD observed mask (the features' second half) must be 0 or 1")
    return values, mask.astype(bool)


def check_data(values: np.ndarray, observed: np.ndarray, layout: Layout) -> None:
    if values.shape != observed.shape or values.ndim != 2:
        raise ConfigError(
            f"values {values.shape} and observed mask {observed.shape} must be one n × D shape"
        )
    if values.shape[1] != layout.features:
        raise ConfigError(f"the model decodes {layout.features} features, data has {values.shape}")


def sample_losses(
    parts: Mapping[str, np.ndarray], z: np.ndarray, values: np.ndarray, observed: np.ndarray
) -> np.ndarray:
    """−log p(x_n^obs | z_n) − log p(z_n) for each sample (observed entries only)."""
    log_beta = float(parts["log_beta_out"][0])
    r = np.where(observed, values - decode(parts, z), 0.0)
    nll = 0.5 * np.exp(log_beta) * (r**2).sum(1) - 0.5 * observed.sum(1) * (log_beta - log(2 * pi))
    log_pz, _ = mixture_log_density(z, parts["means"], parts["log_precisions"], parts["logits"])
    return nll - log_pz


def negative_log_posterior(
    theta: np.ndarray,
    z: np.ndarray,
    values: np.ndarray,
    observed: np.ndarray,
    layout: Layout,
    priors: Priors,
) -> tuple[float, np.ndarray, np.ndarray]:
    """(F, ∂F/∂θ, ∂F/∂z) of F = Σ_n [−log p(x_n^obs | z_n) − log p(z_n)] − log p(θ)."""
    parts = layout.unpack(theta)
    beta = float(np.exp(parts["log_beta_out"][0]))
    hidden = np.tanh(z @ parts["w1"].T + parts["b1"])
    r = np.where(observed, values - (hidden @ parts["w2"].T + parts["b2"]), 0.0)
    n_obs = float(observed.sum())
    nll = 0.5 * beta * float((r**2).sum()) - 0.5 * n_obs * (np.log(beta) - log(2 * pi))
    d_out = -beta * r  # ∂nll/∂f
    d_pre = (d_out @ parts["w2"]) * (1.0 - hidden**2)
    log_pz, mix = mixture_log_density(z, parts["means"], parts["log_precisions"], parts["logits"])
    log_prior, prior = parameter_log_prior(parts, priors)
    grads = {
        "w1": d_pre.T @ z,
        "b1": d_pre.sum(0),
        "w2": d_out.T @ hidden,
        "b2": d_out.sum(0),
        "log_beta_out": np.array([0.5 * beta * float((r**2).sum()) - 0.5 * n_obs])
        - prior["log_beta_out"],
        "means": -mix["means"] - prior["means"],
        "log_precisions": -mix["log_precisions"] - prior["log_precisions"],
        "logits": -mix["logits"] - prior["logits"],
    }
    value = nll - float(log_pz.sum()) - log_prior
    return value, layout.pack(grads), d_pre @ parts["w1"] - mix["z"]


def representation_gradient(
    parts: Mapping[str, np.ndarray], z: np.ndarray, values: np.ndarray, observed: np.ndarray
) -> np.ndarray:
    """∂F/∂z alone (θ fixed: a new sample's fit), without the work of θ's gradient."""
    beta = float(np.exp(parts["log_beta_out"][0]))
    hidden = np.tanh(z @ parts["w1"].T + parts["b1"])
    r = np.where(observed, values - (hidden @ parts["w2"].T + parts["b2"]), 0.0)
    d_pre = ((-beta * r) @ parts["w2"]) * (1.0 - hidden**2)
    precision = np.exp(parts["log_precisions"])
    diff = z[:, None, :] - parts["means"][None, :, :]
    logits = parts["logits"]
    joint = (logits - np.logaddexp.reduce(logits))[None, :] + (
        0.5 * parts["log_precisions"].sum(1)[None, :] - 0.5 * (precision[None] * diff**2).sum(2)
    )
    resp = np.exp(joint - np.logaddexp.reduce(joint, axis=1)[:, None])
    return d_pre @ parts["w1"] + (resp[:, :, None] * precision[None] * diff).sum(1)


# ---- optimisation ---------------------------------------------------------------------------
def adam(
    x: np.ndarray, grad: np.ndarray, moments: tuple[np.ndarray, np.ndarray], lr: float, t: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """One Adam step (β = 0.9, 0.999) of minimisation; ``t`` counts from 1."""
    first = 0.9 * moments[0] + 0.1 * grad
    second = 0.999 * moments[1] + 0.001 * grad**2
    step = lr * (first / (1 - 0.9**t)) / (np.sqrt(second / (1 - 0.999**t)) + 1e-8)
    return x - step, (first, second)


def sample_representations(
    theta: np.ndarray, n: int, layout: Layout, rng: np.random.Generator
) -> np.ndarray:
    """n draws from the model's mixture (the representations' starting point)."""
    parts = layout.unpack(theta)
    logits = parts["logits"]
    weights = np.exp(logits - np.logaddexp.reduce(logits))
    k = rng.choice(layout.components, size=n, p=weights / weights.sum())
    sd = np.exp(-0.5 * parts["log_precisions"][k])
    return parts["means"][k] + sd * rng.standard_normal((n, layout.latent))


def local_fit(
    theta: np.ndarray,
    z: np.ndarray,
    values: np.ndarray,
    observed: np.ndarray,
    layout: Layout,
    priors: Priors,
    *,
    steps: int,
    lr: float,
    representation_lr: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` of Adam on (1/n) F(θ, z) over these samples, θ and z together, from fresh
    moments; returns the new (θ, z)."""
    check_data(values, observed, layout)
    if z.shape != (len(values), layout.latent):
        raise ConfigError(f"{len(values)} samples need {layout.latent}-dim representations")
    n = float(len(values))
    theta, z = np.array(theta, dtype=np.float64), np.array(z, dtype=np.float64)
    m_theta = (np.zeros_like(theta), np.zeros_like(theta))
    m_z = (np.zeros_like(z), np.zeros_like(z))
    for t in range(1, steps + 1):
        _, d_theta, d_z = negative_log_posterior(theta, z, values, observed, layout, priors)
        theta, m_theta = adam(theta, d_theta / n, m_theta, lr, t)
        z, m_z = adam(z, d_z, m_z, representation_lr, t)
    return theta, z


def fit_representations(
    theta: np.ndarray,
    values: np.ndarray,
    observed: np.ndarray,
    layout: Layout,
    *,
    steps: int = FIT_STEPS,
    lr: float = FIT_LR,
    starts: int = FIT_STARTS,
) -> np.ndarray:
    """The most probable representation of each sample given its observed entries, θ fixed:
    ``steps`` of Adam from each of the ``starts`` component means that explain the sample
    best, keeping the end of lowest loss (the fit can stop in a local optimum: more starts,
    fewer of those, at a cost of ``starts`` fits)."""
    check_data(values, observed, layout)
    if not 1 <= starts <= layout.components:
        raise ConfigError(f"starts must be 1..{layout.components} (the components), got {starts}")
    parts = layout.unpack(theta)
    n = len(values)
    at_means = np.stack(
        [sample_losses(parts, np.repeat(m[None], n, 0), values, observed) for m in parts["means"]],
        axis=1,
    )
    ranked = np.argsort(at_means, axis=1, kind="stable")
    best, best_loss = np.zeros((n, layout.latent)), np.full(n, np.inf)
    for s in range(starts):
        z = parts["means"][ranked[:, s]].copy()
        moments = (np.zeros_like(z), np.zeros_like(z))
        for t in range(1, steps + 1):
            d_z = representation_gradient(parts, z, values, observed)
            z, moments = adam(z, d_z, moments, lr, t)
        loss = sample_losses(parts, z, values, observed)
        better = loss < best_loss
        best[better], best_loss[better] = z[better], loss[better]
    return best


def impute(
    theta: np.ndarray,
    values: np.ndarray,
    observed: np.ndarray,
    layout: Layout,
    *,
    steps: int = FIT_STEPS,
    lr: float = FIT_LR,
    starts: int = FIT_STARTS,
) -> np.ndarray:
    """The samples with every missing entry replaced by f_θ(ẑ), ẑ fitted to the observed."""
    z = fit_representations(theta, values, observed, layout, steps=steps, lr=lr, starts=starts)
    return np.where(observed, values, decode(layout.unpack(theta), z))


# ---- the protocol ---------------------------------------------------------------------------
class DGDClient(VectorStateHalf):
    """Client i's representations (n_i × L, flattened: its own state, never uploaded) and its
    local MAP fit."""

    vectors = ("representations",)
    representations: np.ndarray | None

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        settings = request.config("dgd")
        values, observed = split_features(client.features())
        layout = Layout(
            int(settings["latent"]),
            int(settings["hidden"]),
            values.shape[1],
            int(settings["components"]),
        )
        theta = client.model
        layout.unpack(theta)  # a typed error if the model is not this layout's
        if self.representations is None:
            rng = np.random.default_rng([int(settings["seed"]), *client.id.encode()])
            z = sample_representations(theta, len(values), layout, rng)
        else:
            if self.representations.size != len(values) * layout.latent:
                raise StateError(
                    f"{client.id} holds {self.representations.size} representation values, "
                    f"its {len(values)} samples need {len(values) * layout.latent}"
                )
            z = self.representations.reshape(len(values), layout.latent)
        new, z = local_fit(
            theta,
            z,
            values,
            observed,
            layout,
            Priors(),
            steps=int(settings["steps"]),
            lr=float(settings["lr"]),
            representation_lr=float(settings["representation_lr"]),
        )
        self.representations = z.ravel()
        return new - theta


class DGD(FedAvg):
    name = "dgd"
    # FedAvg's weights n_i / Σn, known before the uploads: the server folds them as they come
    capabilities = Capabilities(streams=True)
    client = DGDClient

    def __init__(
        self,
        *,
        latent: Annotated[
            int, Flag("dgd-latent", "representation size (the task fixes it)")
        ] = LATENT,
        hidden: Annotated[
            int, Flag("dgd-hidden", "decoder hidden units (the task fixes it)")
        ] = HIDDEN,
        components: Annotated[
            int, Flag("dgd-components", "mixture components (task's)")
        ] = COMPONENTS,
        steps: Annotated[int, Flag("dgd-steps", "local Adam steps per round (full batch)")] = 50,
        lr: Annotated[float, Flag("dgd-lr", "Adam's rate for the decoder and the mixture")] = 0.01,
        representation_lr: Annotated[
            float, Flag("dgd-representation-lr", "Adam's rate for the z's")
        ] = 0.05,
    ):
        """``latent``, ``hidden``, ``components``: the task's model (its defaults are the
        dgd tasks'); ``steps``: local full-batch Adam steps a round; ``lr`` and
        ``representation_lr``: Adam's rates for θ and for the representations."""
        if min(latent, hidden, components, steps) < 1:
            raise ConfigError("dgd needs latent, hidden, components and steps >= 1")
        if not (lr > 0 and representation_lr > 0):
            raise ConfigError("dgd needs lr > 0 and representation_lr > 0")
        self.latent, self.hidden, self.components = latent, hidden, components
        self.steps, self.lr, self.representation_lr = steps, lr, representation_lr
        self._seed = 0

    def seed(self, seed: int) -> None:
        self._seed = int(seed)  # the clients draw their first representations from it

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        return {"dgd": wire.config({**self.option_values(), "seed": self._seed})}


register_protocol(
    "dgd",
    DGD,
    summary="deep generative decoder: decoder and mixture averaged, representations stay on "
    "the clients; imputes missing values (GenoMed4All D6.2 9)",
    # [values | mask] tables
    example=Example(settings={"task": "dgd-breast-cancer-label"}),
    tasks=("dgd-*",),
    _builtin=True,
)
