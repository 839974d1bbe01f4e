"""scikit-learn's bundled digits (8×8, 10 classes, 1,797 images) as a federated image task.

It stands in for MNIST, which cannot be downloaded here. Splits (fixed partition seed 0;
20 % of every class held out as the pooled test set):

- ``niid1``: 10 clients, label proportions per client from Dirichlet(0.5) — FedDisco's NIID-1;
- ``niid2``: 6 clients, five each holding two classes and one holding all ten — FedDisco's
  NIID-2 (our reading of the poster's Fig. 3);
- ``dir8``: 8 clients, Dirichlet(0.5) — the Auto-FedRL split.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.errors import ConfigError

SPLITS = ("niid1", "niid2", "dir8")


def _dirichlet_parts(
    labels: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        shares = rng.dirichlet(np.full(n_clients, alpha))
        cuts = (np.cumsum(shares)[:-1] * idx.size).astype(int)
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k] += chunk.tolist()
    return [np.array(sorted(p), dtype=int) for p in parts]


def _two_class_parts(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Five clients with two classes each (0–1, 2–3, ...), one client with a slice of all."""
    uniform: list[int] = []
    biased: list[list[int]] = [[] for _ in range(5)]
    for cls in range(10):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_uniform = idx.size // 6
        uniform += idx[:n_uniform].tolist()
        biased[cls // 2] += idx[n_uniform:].tolist()
    return [np.array(sorted(p), dtype=int) for p in biased + [uniform]]


def load(split: str = "niid1", seed: int = 0) -> FederatedData:
    if split not in SPLITS:
        raise ConfigError(f"unknown digits split {split!r}; choose from {SPLITS}")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test_idx = np.concatenate(
        [rng.permutation(np.flatnonzero(y == c))[: (y == c).sum() // 5] for c in range(10)]
    )
    train_idx = np.setdiff1d(np.arange(y.size), test_idx)
    xt, yt = x[train_idx], y[train_idx]
    if split == "niid2":
        parts = _two_class_parts(yt, rng)
    else:
        parts = _dirichlet_parts(yt, 10 if split == "niid1" else 8, 0.5, rng)
    parts = [p for p in parts if p.size > 0]
    test = ClientData(torch.from_numpy(x[test_idx]), torch.from_numpy(y[test_idx]))
    return FederatedData(
        name=f"digits[{split}]",
        train=[ClientData(torch.from_numpy(xt[p]), torch.from_numpy(yt[p])) for p in parts],
        test=None,
        pooled_test=test,
    )


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, labels)


def accuracy(labels, logits) -> float:
    return float(np.mean(np.asarray(logits).argmax(axis=1) == np.asarray(labels)))
