"""SAVAE: the survival-analysis VAE of GenoMed4All D6.2 §6.4, on a good node and a bad node.

The model (§6.4.4, Fig. 6.8–6.9): a latent z with prior p(z), an encoder q_φ(z|x) that sees
the covariates only, and two conditionally independent decoders, p_θ1(x|z) for the
covariates (independent per feature) and p_θ2(t|z) for the time to event, a Weibull
(Eq. 6.10) with shape α(z) and scale λ(z):

    log f(t) = log α − log λ + (α − 1)(log t − log λ) − (t/λ)^α        (an event, d = 1)
    log S(t) = −(t/λ)^α                                                  (censored, d = 0)

so the right-censored likelihood of (t, d) is d·log f(t) + (1 − d)·log S(t). The loss is the
negative of the weighted ELBO of Eq. 6.14 with L = 1 reparameterised draw z = μ + σ·ε:

    −L̂ = KL(q_φ(z|x) ‖ p(z)) − w·log p_θ2(t, d | z) − Σ_m log p_θ1m(x_m | z)

with the closed-form KL against p(z) = N(0, I). With the joint prior (§6.5.1) p(z) is the
product over the nodes of each node's pseudo-point mixture (Eq. 6.23–6.24),

    p_λ(z) = (1/𝒵) Π_m (1/K) Σ_k q_φ(z | α_m^(k)),

again a Gaussian mixture (K^M components; :func:`product_of_mixtures`), or, as the
mixture of experts the report names as the alternative, (1/M) Σ_m p_λm(z)
(:func:`pooled_prior`); the KL is then the one-draw estimate log q_φ(z|x) − log p_λ(z) (no
closed form). The node's own pseudo-inputs
α are trained with the model; the other nodes' are fixed (``protocols/savae_prior.py``
carries them between nodes).

The forward pass returns one tensor per patient, ``[log α, log λ, KL, log p(x|z)]``, so the
generic trainer and evaluator handle it; the target stays (E, T) as for every survival task.
The metric is the concordance index of the predicted median time λ (ln 2)^{1/α}: reused from
``secagg.clients.tasks.tcga_brca.c_index``, which ranks *risk* (higher = earlier event), so
the risk passed is −log(median time).

The two-node setting (§6.6.1: an isolated good node is the upper bound, an isolated bad node
the lower one): ``secagg.clients.tasks.survival.split`` of a split seed (75 % train / 25 %
blind test, features min-max scaled by the training ranges), its training patients in random
order, the first ``BAD_SHARE`` of them the bad node and the rest the good node; the blind
test set halves into the good node's and the bad node's test sets (``test_client_0``,
``test_client_1``; ``test_pooled`` is both).

Deviations chosen (the report is silent): every covariate is Gaussian given z, its mean and
standard deviation from the decoder, the deviation floored at 0.05 (features lie in [0, 1];
the floor keeps a binary feature's likelihood from diverging); the encoder's log-variances
are bounded to ±6 (6·tanh(v/6)); the Weibull's log-shape is bounded to ±2 (2·tanh(a/2))
and its log-scale free; times are divided by the training set's
mean observed time (the c-index is scale-free) after flooring at 1 day (TCGA-BRCA has 13
patients at T = 0, whose event density is degenerate); latent 4, hidden layers of 32 (ReLU),
w = ``TIME_WEIGHT`` = 20 (on GBSG2's split 0, w = 5 gave the isolated good node a pooled
c-index of 0.62 against 0.69 with 20; not tuned further); local optimiser Adam. The report's
bad node also has missing features; here it only has few patients. Scaling uses the pooled
training ranges (both nodes), as the 8-centre survival tasks do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from secagg.clients.tasks import survival
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData, c_index
from secagg.errors import ConfigError

LATENT = 4
HIDDEN = 32
#: w of Eq. 6.14: the time term's weight against the covariates' reconstruction
TIME_WEIGHT = 20.0
#: the bad node's share of the training patients (the good node has the rest)
BAD_SHARE = 0.1
#: the floor of every covariate's standard deviation given z
MIN_STD = 0.05
#: the bound of q_φ(z|x)'s log-variances (±): a product prior of near-degenerate components
#: overflows otherwise
MAX_LOG_VAR = 6.0
#: pseudo-inputs per node for the joint prior (K of Eq. 6.24)
N_PSEUDO = 8
#: how the nodes' pseudo-point mixtures combine: the report's product of experts (Eq. 6.23)
#: or the mixture of experts it names as the alternative
COMBINES = ("product", "mixture")
#: the two-node setting of §6.6: node 0 is the good node, node 1 the bad one
NODES = ("good", "bad")
_LOG_2PI = math.log(2 * math.pi)


# ---- the math -------------------------------------------------------------------------------
def weibull_log_likelihood(
    time: torch.Tensor, event: torch.Tensor, log_shape: torch.Tensor, log_scale: torch.Tensor
) -> torch.Tensor:
    """Per patient, d·log f(t) + (1 − d)·log S(t) of a Weibull(α = e^log_shape,
    λ = e^log_scale) (Eq. 6.10), right-censored; times must be positive."""
    shape = torch.exp(log_shape)
    log_ratio = torch.log(time) - log_scale  # log(t/λ)
    cumulative = torch.exp(shape * log_ratio)  # (t/λ)^α, the cumulative hazard
    log_hazard = log_shape - log_scale + (shape - 1) * log_ratio
    return event * log_hazard - cumulative


def weibull_median_log(log_shape: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """log of the Weibull median λ (ln 2)^{1/α}."""
    return log_scale + math.log(math.log(2.0)) * torch.exp(-log_shape)


def gaussian_kl(mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """Per row, KL(N(mean, diag e^log_var) ‖ N(0, I)) in closed form."""
    return 0.5 * (log_var.exp() + mean**2 - 1.0 - log_var).sum(dim=1)


def gaussian_log_density(
    x: torch.Tensor, mean: torch.Tensor, log_var: torch.Tensor
) -> torch.Tensor:
    """Per row, log N(x; mean, diag e^log_var), summed over the columns."""
    return -0.5 * ((x - mean) ** 2 / log_var.exp() + log_var + _LOG_2PI).sum(dim=-1)


Mixture = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (log weights (K,), means, vars (K, L))


def product_of_mixtures(a: Mixture, b: Mixture) -> Mixture:
    """The normalised product of two diagonal Gaussian mixtures: a mixture of Ka·Kb
    components, N(z; m1, V1)·N(z; m2, V2) = N(m1; m2, V1 + V2)·N(z; m, V) with
    V = (V1⁻¹ + V2⁻¹)⁻¹ and m = V(V1⁻¹m1 + V2⁻¹m2); the overlaps N(m1; m2, V1 + V2) weigh
    the components, and normalising the weights divides by 𝒵 of Eq. 6.23."""
    (wa, ma, va), (wb, mb, vb) = a, b
    ma, va, mb, vb = ma[:, None], va[:, None], mb[None], vb[None]
    var = 1.0 / (1.0 / va + 1.0 / vb)
    mean = var * (ma / va + mb / vb)
    overlap = gaussian_log_density(ma, mb, torch.log(va + vb))
    log_w = (wa[:, None] + wb[None] + overlap).reshape(-1)
    latent = mean.shape[-1]
    return (
        log_w - torch.logsumexp(log_w, dim=0),
        mean.reshape(-1, latent),
        var.reshape(-1, latent),
    )


def mixture_log_density(z: torch.Tensor, mixture: Mixture) -> torch.Tensor:
    """Per row of z, log Σ_k π_k N(z; m_k, V_k)."""
    log_w, mean, var = mixture
    per_component = gaussian_log_density(z[:, None, :], mean[None], torch.log(var)[None])
    return torch.logsumexp(per_component + log_w[None], dim=1)


def pooled_prior(node_mixtures: Sequence[Mixture]) -> Mixture:
    """p_λ(z) = (1/M) Σ_m p_λm(z): the mixture of experts §6.5.1 names as the alternative
    (one mixture of every node's pseudo-inputs, Eq. 6.18 over their union)."""
    log_w = torch.cat([m[0] for m in node_mixtures]) - math.log(len(node_mixtures))
    return log_w, torch.cat([m[1] for m in node_mixtures]), torch.cat([m[2] for m in node_mixtures])


def joint_prior(node_mixtures: Sequence[Mixture]) -> Mixture:
    """p_λ(z) ∝ Π_m p_λm(z) (Eq. 6.23), normalised."""
    result = node_mixtures[0]
    for other in node_mixtures[1:]:
        result = product_of_mixtures(result, other)
    return result


def negative_elbo(
    output: torch.Tensor, target: torch.Tensor, time_weight: float = TIME_WEIGHT
) -> torch.Tensor:
    """The mean over patients of −L̂ (Eq. 6.14): KL − w·log p(t, d|z) − log p(x|z).
    ``output`` is the model's ``[log α, log λ, KL, log p(x|z)]``, ``target`` (E, T)."""
    if output.ndim != 2 or output.shape[1] != 4 or target.ndim != 2 or target.shape[1] < 2:
        raise ConfigError(
            f"the SAVAE loss takes the model's [log shape, log scale, KL, log p(x|z)] "
            f"(n × 4) and targets (E, T) (n × 2); got {tuple(output.shape)} and "
            f"{tuple(target.shape)}"
        )
    log_shape, log_scale, kl, reconstruction = output.unbind(dim=1)
    time_term = weibull_log_likelihood(target[:, 1], target[:, 0], log_shape, log_scale)
    return (kl - time_weight * time_term - reconstruction).mean()


def time_c_index(truth: np.ndarray, output: np.ndarray) -> float:
    """Concordance of the predicted median times with the observed (E, T)."""
    output = np.asarray(output, dtype=np.float64)
    if output.ndim != 2 or output.shape[1] != 4:
        raise ConfigError(f"SAVAE outputs are n × 4, got shape {output.shape}")
    log_median = weibull_median_log(torch.from_numpy(output[:, 0]), torch.from_numpy(output[:, 1]))
    return c_index(truth, -log_median.numpy())


# ---- the model ------------------------------------------------------------------------------
class PseudoInputs(nn.Module):
    """The joint prior's pseudo-inputs, ``points`` (nodes × K × features; block 0 is this
    node's own). A module of its own because torch lists a module's own parameters before
    its children's: as a child registered last, ``points`` ends the flat parameter vector,
    where ``protocols/savae_prior.pseudo_block`` rewrites it (a parameter of ``SAVAE`` itself
    would lead the vector, and the protocol would overwrite the time decoder instead)."""

    def __init__(self, n_nodes: int, n_pseudo: int, n_features: int):
        super().__init__()
        self.points = nn.Parameter(torch.rand(n_nodes, n_pseudo, n_features))


class SAVAE(nn.Module):
    """Encoder q_φ(z|x), covariate decoder p_θ1(x|z), Weibull time decoder p_θ2(t|z).

    ``n_pseudo`` > 0: the joint prior of ``n_nodes`` nodes' pseudo-inputs, ``prior``
    (:class:`PseudoInputs`, registered last so that they end the flat parameter vector):
    block 0 is this node's own (trained), the others are held fixed (detached)."""

    def __init__(
        self,
        n_features: int,
        *,
        latent: int = LATENT,
        hidden: int = HIDDEN,
        n_pseudo: int = 0,
        n_nodes: int = 1,
        combine: str = "product",
    ):
        super().__init__()
        if combine not in COMBINES:
            raise ConfigError(f"the nodes' priors combine as one of {COMBINES}, got {combine!r}")
        self.combine = combine
        if n_features < 1 or latent < 1 or hidden < 1 or n_pseudo < 0 or n_nodes < 1:
            raise ConfigError(
                "SAVAE needs n_features, latent, hidden, n_nodes >= 1 and n_pseudo >= 0"
            )
        if n_pseudo and combine == "product" and n_pseudo**n_nodes > 4096:
            raise ConfigError(
                f"the joint prior has n_pseudo^n_nodes = {n_pseudo**n_nodes} components; "
                "keep it at most 4096"
            )
        self.n_features, self.latent = n_features, latent
        self.encoder = nn.Sequential(
            nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 2 * latent)
        )
        self.feature_decoder = nn.Sequential(
            nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, 2 * n_features)
        )
        self.time_decoder = nn.Sequential(
            nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, 2)
        )
        self.prior = PseudoInputs(n_nodes, n_pseudo, n_features) if n_pseudo else None

    def posterior(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log variance) of q_φ(z|x)."""
        mean, raw = self.encoder(x).chunk(2, dim=1)
        return mean, MAX_LOG_VAR * torch.tanh(raw / MAX_LOG_VAR)

    def prior_mixture(self) -> Mixture:
        """The joint prior p_λ(z) from the pseudo-inputs (own block trained, others fixed)."""
        if self.prior is None:
            raise ConfigError("this SAVAE has the standard normal prior (n_pseudo = 0)")
        points = self.prior.points
        blocks = [points[0], *points[1:].detach()]
        mixtures = []
        for block in blocks:
            mean, log_var = self.posterior(block)
            uniform = torch.full((len(block),), -math.log(len(block)), dtype=mean.dtype)
            mixtures.append((uniform, mean, log_var.exp()))
        return joint_prior(mixtures) if self.combine == "product" else pooled_prior(mixtures)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ConfigError(f"SAVAE takes n × {self.n_features} covariates, got {tuple(x.shape)}")
        mean, log_var = self.posterior(x)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var) if self.training else mean
        if self.prior is None:
            kl = gaussian_kl(mean, log_var)
        else:  # one-draw estimate: no closed form against a mixture
            kl = gaussian_log_density(z, mean, log_var) - mixture_log_density(
                z, self.prior_mixture()
            )
        x_mean, x_raw = self.feature_decoder(z).chunk(2, dim=1)
        x_log_var = 2 * torch.log(MIN_STD + F.softplus(x_raw))
        reconstruction = gaussian_log_density(x, x_mean, x_log_var)
        shape_raw, log_scale = self.time_decoder(z).unbind(dim=1)
        log_shape = 2.0 * torch.tanh(shape_raw / 2.0)
        return torch.stack([log_shape, log_scale, kl, reconstruction], dim=1)


def make_model(dataset: str, n_pseudo: int = 0, combine: str = "product") -> SAVAE:
    n_features = survival.pooled(dataset)[0].shape[1]
    if n_pseudo:
        return SAVAE(n_features, n_pseudo=n_pseudo, n_nodes=len(NODES), combine=combine)
    return SAVAE(n_features)


# ---- the two-node data ----------------------------------------------------------------------
def two_nodes(
    dataset: str, seed: int, bad_share: float = BAD_SHARE
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """([good, bad] training (x, y), [good, bad] test (x, y)) of split seed ``seed``; y is
    (E, T) with T in units of the training set's mean observed time, floored at 1 day."""
    if not 0 < bad_share < 0.5:
        raise ConfigError(f"the bad node's share must lie in (0, 0.5), got {bad_share}")
    centres, (x_test, y_test) = survival.split(dataset, "balanced", seed)
    x = np.concatenate([c[0] for c in centres])  # a random order of the training patients
    y = np.concatenate([c[1] for c in centres])
    unit = float(y[:, 1].mean())

    def timed(target: np.ndarray) -> np.ndarray:
        out = target.copy()
        out[:, 1] = np.maximum(out[:, 1], 1.0) / unit
        return out

    n_bad = int(round(bad_share * len(y)))
    half = len(y_test) // 2
    train = [(x[n_bad:], timed(y[n_bad:])), (x[:n_bad], timed(y[:n_bad]))]
    test = [(x_test[:half], timed(y_test[:half])), (x_test[half:], timed(y_test[half:]))]
    return train, test


def _data(x: np.ndarray, y: np.ndarray) -> ClientData:
    return ClientData(
        torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))
    )


def load(dataset: str, seed: int = 0, only: int | None = None) -> FederatedData:
    """The good node (client 0) and the bad node (client 1) of split seed ``seed``; ``only``:
    that node alone (an isolated-node bound). Both nodes' test sets are kept either way."""
    if only is not None and only not in range(len(NODES)):
        raise ConfigError(f"only names a node: 0 (good) or 1 (bad), got {only!r}")
    train, test = two_nodes(dataset, seed)
    parts = [_data(x, y) for x, y in train]
    name = f"{dataset}[good/bad nodes, split {seed}]"
    if only is not None:
        parts, name = [parts[only]], f"{name}/{NODES[only]} node alone"
    return FederatedData(name=name, train=parts, test=[_data(x, y) for x, y in test])
