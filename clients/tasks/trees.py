"""Gradient-boosted trees as a federated task (GenoMed4All D6.2 §10.2; ``protocols/xgboost.py``).

Data: breast cancer (labels 0/1, tabular splits over 4 clients), every feature replaced by its
bin index under shared bin edges: the ``BINS``-quantiles of the pooled training set. The
edges are public and fixed before training, like the standardisation of the tabular tasks
(a federation would form them from a quantile sketch first). The same binned data trained
centrally by xgboost's ``hist`` method gives the same candidate splits: the reference.

The model is a fixed-size array, ``MAX_TREES`` slots of one depth-``DEPTH`` tree each, so the
engine can hold it as W: per tree, for every internal node in heap order its split feature
(1-based; 0 means no split, every sample goes left) and its threshold bin (a sample goes left
when its bin is ≤ the threshold), then the 2^depth leaf values. :class:`TreeEnsemble`
evaluates it; empty slots add 0 to the margin. The output is the margin (log-odds).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from secagg.clients.tasks.tabular import pooled, split_order
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.protocols.xgboost import ensemble_margin, slot_width

__all__ = ["ensemble_margin", "slot_width"]  # the model's arithmetic lives with the protocol

BINS, DEPTH, MAX_TREES, N_CLIENTS = 16, 3, 50, 4


def bin_edges(v: np.ndarray, bins: int = BINS) -> list[np.ndarray]:
    """Interior quantile edges per feature (at most ``bins`` − 1, duplicates removed)."""
    qs = np.linspace(0, 1, bins + 1)[1:-1]
    return [np.unique(np.quantile(v[:, j], qs)) for j in range(v.shape[1])]


def binned(v: np.ndarray, edges: list[np.ndarray]) -> np.ndarray:
    """Bin indices 0 … len(edges) per feature (a value equal to an edge goes right)."""
    return np.column_stack([np.searchsorted(e, v[:, j], side="right") for j, e in enumerate(edges)])


def binned_pooled() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train bins, train labels 0/1, test bins, test labels 0/1)."""
    v, y, v_test, y_test = pooled("breast-cancer")
    edges = bin_edges(v)
    return binned(v, edges), (y > 0).astype(np.float64), binned(v_test, edges), (y_test > 0) * 1.0


def load(split: str = "iid") -> FederatedData:
    x, y, x_test, y_test = binned_pooled()
    v, signed, _, _ = pooled("breast-cancer")
    parts = np.array_split(split_order(v, signed, split), N_CLIENTS)

    def data(rows: np.ndarray, labels: np.ndarray) -> ClientData:
        return ClientData(
            torch.from_numpy(rows.astype(np.float32)), torch.from_numpy(labels.astype(np.float32))
        )

    return FederatedData(
        name=f"breast-cancer-binned[{split}]",
        train=[data(x[p], y[p]) for p in parts],
        test=None,
        pooled_test=data(x_test, y_test),
    )


class TreeEnsemble(nn.Module):
    def __init__(self, n_slots: int = MAX_TREES, depth: int = DEPTH):
        super().__init__()
        self.depth = depth
        self.trees = nn.Parameter(torch.zeros(n_slots * slot_width(depth)), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margin = ensemble_margin(self.trees.detach().numpy(), x.numpy(), self.depth)
        return torch.from_numpy(margin).to(torch.float32).reshape(-1, 1)


def make_model() -> nn.Module:
    return TreeEnsemble()


def log_loss(margin: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logistic loss on the margin with labels 0/1."""
    return nn.functional.binary_cross_entropy_with_logits(margin.reshape(-1), y)


def accuracy(y, margin) -> float:
    return float(np.mean((np.asarray(margin).reshape(-1) > 0) == (np.asarray(y) > 0.5)))
