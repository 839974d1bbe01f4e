"""Bayesian logistic regression on breast cancer, for partitioned variational inference
(GenoMed4All D6.2 §4.3; ``protocols/pvi.py``).

The "model" the federation holds is the posterior q(w) = N(μ, diag σ²) over x = [w, b], as
natural parameters λ = (μ/σ², 1/σ²): :class:`GaussianLogistic` keeps them as its two
parameter vectors, starting at the prior N(0, 1/prior_precision). Its output is the
predictive logit under q by the probit approximation (MacKay 1992):

    p(y = 1 | u) ≈ σ(κ · μᵀu),   κ = (1 + π vᵀ/8)^(−1/2),   v = Σ_j σ_j² u_j²

so the task's metric is the predictive accuracy and its loss the predictive negative
log-likelihood. Data and splits are ``secagg.clients.tasks.tabular``'s breast-cancer ones.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from secagg.clients.tasks.tabular import load as load_tabular

PRIOR_PRECISION = 1.0


class GaussianLogistic(nn.Module):
    def __init__(self, n_features: int, prior_precision: float = PRIOR_PRECISION):
        super().__init__()
        d = n_features + 1
        self.eta = nn.Parameter(torch.zeros(d))  # μ/σ²
        self.precision = nn.Parameter(torch.full((d,), float(prior_precision)))  # 1/σ²

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        u = torch.cat([v, torch.ones(len(v), 1, dtype=v.dtype)], dim=1)
        precision = self.precision.clamp_min(1e-12)
        mean, var = self.eta / precision, 1.0 / precision
        kappa = torch.rsqrt(1.0 + math.pi * ((u**2) @ var) / 8.0)
        return (kappa * (u @ mean)).reshape(-1, 1)


def load(split: str = "iid"):
    return load_tabular("breast-cancer", split)


def make_model() -> nn.Module:
    return GaussianLogistic(30)


class GaussianMLP(nn.Module):
    """A mean-field Gaussian posterior over the weights of ``Linear(p, hidden) → tanh →
    Linear(hidden, 1)`` (torch's parameter order), as natural parameters; its output is the
    predictive log-odds, the Monte Carlo average of σ(f_θ(v)) over ``draws`` weight samples
    from a fixed stream (the same predictive every time it is evaluated)."""

    def __init__(self, n_features: int, hidden: int = 8, prior_precision: float = 1.0):
        super().__init__()
        self.n_features, self.hidden = n_features, hidden
        d = n_features * hidden + 2 * hidden + 1
        self.eta = nn.Parameter(torch.zeros(d))
        self.precision = nn.Parameter(torch.full((d,), float(prior_precision)))

    def forward(self, v: torch.Tensor, draws: int = 64) -> torch.Tensor:
        p, h = self.n_features, self.hidden
        precision = self.precision.clamp_min(1e-12).double()
        mean, std = self.eta.double() / precision, precision.rsqrt()
        noise = torch.randn(draws, mean.numel(), generator=torch.Generator().manual_seed(0))
        theta = mean + std * noise.double()
        w1 = theta[:, : p * h].reshape(draws, h, p)
        b1, w2, b2 = theta[:, p * h : p * h + h], theta[:, p * h + h : -1], theta[:, -1]
        hidden = torch.tanh(torch.einsum("np,shp->snh", v.double(), w1) + b1[:, None, :])
        prob = torch.sigmoid(torch.einsum("snh,sh->sn", hidden, w2) + b2[:, None]).mean(0)
        prob = prob.clamp(1e-12, 1 - 1e-12)
        return torch.log(prob / (1 - prob)).to(v.dtype).reshape(-1, 1)


def make_mlp() -> nn.Module:
    return GaussianMLP(30)
