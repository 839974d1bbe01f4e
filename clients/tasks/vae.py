"""A small β-VAE for the FedDisco-style discrepancy weights (poster, "adapting aggregation
weights from a β-VAE's latent discrepancy").

The forward pass returns one tensor ``[reconstruction | μ | log σ²]`` so that the generic
local trainer and evaluator can handle it; :func:`vae_loss` splits it again.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from secagg.clients.tasks import Task
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.errors import ConfigError

LATENT = 4
BETA = 0.1  # β < 1: with β = 1 and client SGD the encoder collapses onto the prior


class BetaVAE(nn.Module):
    def __init__(self, n_in: int = 64, hidden: int = 32, latent: int = LATENT):
        super().__init__()
        self.n_in, self.latent = n_in, latent
        self.encoder = nn.Sequential(
            nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, 2 * latent)
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, n_in), nn.Sigmoid()
        )

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latent means μ(x): the encodings whose spread FedDisco compares with N(0, 1)."""
        return self.encoder(x)[:, : self.latent]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return torch.cat([self.decoder(z), mu, logvar], dim=1)


def vae_loss(output: torch.Tensor, target: torch.Tensor, beta: float = BETA) -> torch.Tensor:
    """Reconstruction (squared error, summed over pixels) + β · KL(q(z|x) ‖ N(0, I))."""
    n_in = target.shape[1]
    recon, mu, logvar = output[:, :n_in], *output[:, n_in:].chunk(2, dim=1)
    rec = ((recon - target) ** 2).sum(dim=1).mean()
    kl = (-0.5 * (1 + logvar - mu**2 - logvar.exp()).sum(dim=1)).mean()
    return rec + beta * kl


def reconstruction_score(target, output) -> float:
    """Negative mean squared reconstruction error (higher is better), for progress output."""
    target, output = np.asarray(target), np.asarray(output)
    return -float(np.mean((output[:, : target.shape[1]] - target) ** 2))


def autoencoding(data: FederatedData) -> FederatedData:
    """The same partition with every sample as its own target."""
    same = [ClientData(p.x, p.x) for p in data.train]
    test = data.pooled_test
    return FederatedData(
        f"{data.name}/vae", same, None, None if test is None else ClientData(test.x, test.x)
    )


# ---- FedDisco's pre-stage (``secagg.protocols.feddisco.FedDisco.pre_stage_task``) ----------
def beta_vae_stage(config: Any, data: FederatedData) -> Task:
    """FedDisco's pre-stage task: the β-VAE on the same clients' samples."""
    n_in = data.train[0].x.shape[1]
    return Task(
        "beta-vae",
        "β-VAE on the task's samples",
        lambda: autoencoding(data),
        lambda: BetaVAE(n_in),
        partial(vae_loss, beta=config.vae_beta),
        reconstruction_score,
        "-MSE",
    )


def check_unit_features(config: Any, data: FederatedData) -> None:
    """The β-VAE's decoder ends in a sigmoid: it reconstructs features in [0, 1] only."""
    x = torch.cat([part.x for part in data.train])
    low, high = float(x.min()), float(x.max())
    if low < 0 or high > 1:
        raise ConfigError(
            f"{config.protocol} pre-trains a beta-VAE whose decoder reconstructs features in "
            f"[0, 1] (a sigmoid output), but task {config.task}'s features span "
            f"[{low:.3g}, {high:.3g}]; use a task with features in [0, 1] (e.g. digits-niid2)"
        )
