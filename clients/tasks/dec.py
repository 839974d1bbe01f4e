"""Clustering tasks for federated DEC (``secagg.protocols.dec``; GenoMed4All D6.2 §7.3–7.4).

The data are the bundled sets already split over clients (labels are used only to score the
clusters): digits (8×8, 10 classes, the ``niid1`` split: 10 clients, Dirichlet(0.5) label
proportions) and breast cancer (30 standardised features, 2 classes, 4 clients, ``iid`` or
``label`` split). ``only``: one client's data alone (per-client DEC), or -1 for every
client's pooled on one client (centralised DEC).

The model is DEC's: the encoder f_θ and the centroids μ as one module whose output is the
soft assignment Q (Eq. 7.5), so the engine's evaluation scores its clusters; the flat
parameters are [encoder | centroids], the layout of ``secagg.protocols.dec.layout``. The
pre-stage model is the stacked denoising autoencoder (Eq. 7.1–7.4): dropout on the input and
on the hidden layers while training, the encoder's layers first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from secagg.clients.tasks import TASKS, Task, digits, get_task, tabular
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.errors import ConfigError
from secagg.protocols.dec import clustering_accuracy, data_layout, layout

DATASETS = {"digits": ("niid1",), "breast-cancer": ("iid", "label")}
#: features and clusters (label values) of each set; a test checks them against the data
SHAPES = {"digits": (64, 10), "breast-cancer": (30, 2)}
#: dropout of the denoising autoencoder's input and hidden layers (Eq. 7.1, 7.3; DEC: 0.2)
DROPOUT = 0.2


def load(dataset: str, split: str, only: int | None = None) -> FederatedData:
    if split not in DATASETS.get(dataset, ()):
        raise ConfigError(f"no DEC split {dataset}/{split}; choose from {DATASETS}")
    data = digits.load(split) if dataset == "digits" else tabular.load(dataset, split)
    if only is None:
        return data
    if only == -1:
        parts = [ClientData.concat(data.train)]
    elif 0 <= only < data.n_clients:
        parts = [data.train[only]]
    else:
        raise ConfigError(f"{data.name} has clients 0..{data.n_clients - 1}, not {only}")
    return FederatedData(data.name, parts, None, data.pooled_test)


def _linear_stack(sizes: list[int], dropout: float) -> list[nn.Module]:
    out: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if dropout > 0:
            out.append(nn.Dropout(dropout))
        out.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            out.append(nn.ReLU())
    return out


class ClusteringLayer(nn.Module):
    """The centroids μ as weights; outputs the soft assignment Q (Eq. 7.5, α = 1)."""

    def __init__(self, k: int, dims: int):
        super().__init__()
        self.centroids = nn.Parameter(torch.zeros(k, dims))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        kernel = 1.0 / (1.0 + torch.cdist(z, self.centroids) ** 2)
        return kernel / kernel.sum(dim=1, keepdim=True)


class DECModel(nn.Module):
    """f_θ (ReLU hidden layers, linear embedding), then the clustering layer: outputs Q.

    Both are submodules so that the flat parameters are [encoder | centroids] (a module's
    own parameters would come before its submodules')."""

    def __init__(self, n_in: int, k: int):
        super().__init__()
        sizes = layout(n_in, k)["sizes"]
        self.encoder = nn.Sequential(*_linear_stack(sizes, 0.0))
        self.clustering = ClusteringLayer(k, sizes[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.clustering(self.encoder(x))


class DenoisingAutoencoder(nn.Module):
    """The stacked denoising autoencoder of Step 1: the DEC encoder, then its mirror."""

    def __init__(self, n_in: int, k: int, dropout: float = DROPOUT):
        super().__init__()
        sizes = layout(n_in, k)["sizes"]
        self.encoder = nn.Sequential(*_linear_stack(sizes, dropout))
        self.decoder = nn.Sequential(*_linear_stack(sizes[::-1], dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def make_model(dataset: str) -> nn.Module:
    return DECModel(*SHAPES[dataset])


def make_autoencoder(n_in: int, k: int) -> nn.Module:
    return DenoisingAutoencoder(n_in, k)


def kl_to_target(q: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """KL(P ‖ Q) per point with P the target of Q itself (Eq. 7.6–7.7); labels unused."""
    weighted = q**2 / q.sum(dim=0)
    p = weighted / weighted.sum(dim=1, keepdim=True)
    return (p * (torch.log(p + 1e-12) - torch.log(q + 1e-12))).sum(dim=1).mean()


def cluster_accuracy(labels, q) -> float:
    """DEC's unsupervised accuracy of the hard assignments argmax_j q_ij."""
    return clustering_accuracy(np.asarray(labels).ravel(), np.asarray(q).argmax(axis=1))


def reconstruction_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """‖x − y‖² per sample, averaged (the pre-stage's loss)."""
    return ((out - target) ** 2).sum(dim=1).mean()


# ---- DEC's pre-stage (``secagg.protocols.dec.DEC.pre_stage_task``) -------------------------
def autoencoder_stage(config: Any, data: FederatedData) -> Task:
    """DEC's pre-stage task: the stacked denoising autoencoder on the same clients' samples."""
    from secagg.clients.tasks.vae import autoencoding, reconstruction_score

    shape = data_layout(data)
    return Task(
        "autoencoder",
        "stacked denoising autoencoder on the task's samples (DEC's step 1)",
        lambda: autoencoding(data),
        lambda: make_autoencoder(shape["sizes"][0], shape["k"]),
        reconstruction_error,
        reconstruction_score,
        "-MSE",
        optimizer=torch.optim.Adam,
    )


def check_dec_task(config: Any, data: FederatedData) -> None:
    """DEC's model is its encoder and k centroids for this data: a dec-* task's."""
    from secagg.clients.training import flat_params

    shape = data_layout(data)
    expected = shape["n_encoder"] + shape["k"] * shape["sizes"][-1]
    n_params = flat_params(get_task(config.task).make_model()).size
    if n_params != expected:
        dec_tasks = ", ".join(name for name in TASKS if name.startswith("dec-"))
        raise ConfigError(
            f"{config.protocol} clusters with DEC's encoder and centroids ({expected} values "
            f"for this data), but task {config.task}'s model has {n_params}; use a DEC task "
            f"({dec_tasks})"
        )
