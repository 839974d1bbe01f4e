"""scikit-learn's bundled diabetes (regression) and breast-cancer (classification) sets as
federated tasks for the linear models of GenoMed4All D6.2 §3 (ridge, lasso, logistic, SVM).

The model is ``nn.Linear(d, 1)``: its parameters flatten to x = [w, b], and its output is xᵀu
with u = [v, 1], the report's notation. Targets: diabetes' disease progression standardised;
breast cancer's labels as y ∈ {−1, +1} (malignant = −1).

Held out: 20 % of the samples (fixed seed 0) as the pooled test set. Features (and the
regression target) are standardised with the training pool's statistics, which a federation
would form from per-client sums first; here they are fixed once and shared.

Splits over ``N_CLIENTS`` clients (every split keeps the same pooled training set, so the
centralised optimum is the same for all three):

- ``iid``: a random permutation in equal parts;
- ``label``: sorted by the target, in contiguous parts (label skew: each client sees a band
  of outcomes; for breast cancer two clients are nearly single-class);
- ``feature``: sorted by the most target-correlated feature (diabetes: BMI; breast cancer:
  worst concave points), in contiguous parts (covariate skew).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer, load_diabetes
from torch import nn

from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.errors import ConfigError

DATASETS = ("diabetes", "breast-cancer")
SPLITS = ("iid", "label", "feature")
N_CLIENTS = 4


def pooled(dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train features, train targets, test features, test targets), standardised, float64."""
    if dataset not in DATASETS:
        raise ConfigError(f"unknown tabular dataset {dataset!r}; choose from {DATASETS}")
    loader = load_diabetes if dataset == "diabetes" else load_breast_cancer
    v, y = loader(return_X_y=True)
    v, y = v.astype(np.float64), y.astype(np.float64)
    if dataset == "breast-cancer":
        y = 2.0 * y - 1.0
    test = np.random.default_rng(0).permutation(len(y))[: len(y) // 5]
    train = np.setdiff1d(np.arange(len(y)), test)
    mean, std = v[train].mean(0), v[train].std(0)
    v = (v - mean) / std
    if dataset == "diabetes":
        y = (y - y[train].mean()) / y[train].std()
    return v[train], y[train], v[test], y[test]


def split_order(v: np.ndarray, y: np.ndarray, split: str) -> np.ndarray:
    """The order in which the training samples are cut into equal contiguous parts."""
    if split == "iid":
        return np.random.default_rng(0).permutation(len(y))
    if split == "label":
        return np.argsort(y, kind="stable")
    if split == "feature":
        corr = [abs(np.corrcoef(v[:, j], y)[0, 1]) for j in range(v.shape[1])]
        return np.argsort(v[:, int(np.argmax(corr))], kind="stable")
    raise ConfigError(f"unknown tabular split {split!r}; choose from {SPLITS}")


def load(dataset: str, split: str = "iid", n_clients: int = N_CLIENTS) -> FederatedData:
    v, y, v_test, y_test = pooled(dataset)
    parts = np.array_split(split_order(v, y, split), n_clients)

    def data(rows_v: np.ndarray, rows_y: np.ndarray) -> ClientData:
        return ClientData(
            torch.from_numpy(rows_v.astype(np.float32)), torch.from_numpy(rows_y.astype(np.float32))
        )

    return FederatedData(
        name=f"{dataset}[{split}]",
        train=[data(v[p], y[p]) for p in parts],
        test=None,
        pooled_test=data(v_test, y_test),
    )


def make_model(dataset: str) -> nn.Module:
    return nn.Linear(10 if dataset == "diabetes" else 30, 1)


def squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(1/N) Σ (xᵀu − y)², the report's regression loss (Eq. 3.4)."""
    return ((out.reshape(-1) - y) ** 2).mean()


def logistic_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(1/N) Σ ln(1 + exp(−y xᵀu)) with y ∈ {−1, +1} (Eq. 3.6)."""
    return nn.functional.softplus(-y * out.reshape(-1)).mean()


def r2(y, out) -> float:
    y, out = np.asarray(y, dtype=np.float64), np.asarray(out, dtype=np.float64).reshape(-1)
    return float(1.0 - np.sum((y - out) ** 2) / np.sum((y - y.mean()) ** 2))


def sign_accuracy(y, out) -> float:
    out = np.asarray(out, dtype=np.float64).reshape(-1)
    return float(np.mean(np.where(out >= 0, 1.0, -1.0) == np.asarray(y)))
