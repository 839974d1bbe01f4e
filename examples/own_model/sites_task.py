"""A researcher's own task, outside secagg: a torch MLP on one CSV file per site.

Each site's samples are a torch ``Dataset`` read from its own CSV when that site's client
is first used (``ClientData.lazy``): a client, in a worker process or on its own node,
opens only its own file. The task reports two metrics: accuracy (its primary metric) and
the ROC AUC (``metrics={"auc": ...}``).

    secagg run --import examples/own_model/sites_task.py --task sites-mlp ...

The data folder is ``sites/`` beside this file, or the folder ``SITES_DIR`` names.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from secagg import ClientData, FederatedData, Task, register_task


def sites_folder() -> Path:
    return Path(os.environ.get("SITES_DIR", Path(__file__).parent / "sites"))


class CsvSite(torch.utils.data.Dataset):
    """One site's CSV: feature columns, then ``label`` (0/1)."""

    def __init__(self, path: str | Path):
        frame = pd.read_csv(path)
        self.x = torch.tensor(frame.drop(columns="label").to_numpy(np.float32))
        self.y = torch.tensor(frame[["label"]].to_numpy(np.float32))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def load() -> FederatedData:
    folder = sites_folder()
    paths = sorted(folder.glob("site_*.csv"))
    if not paths:
        raise FileNotFoundError(f"no site_*.csv in {folder}: run make_sites.py first")
    train = [ClientData.lazy(partial(CsvSite, path)) for path in paths]
    test = ClientData.from_dataset(CsvSite(folder / "test.csv"))
    return FederatedData("sites", train, None, pooled_test=test)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1))


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def accuracy(labels: np.ndarray, logits: np.ndarray) -> float:
    return float(((logits.reshape(-1) > 0) == (labels.reshape(-1) > 0.5)).mean())


def auc(labels: np.ndarray, logits: np.ndarray) -> float:
    return float(roc_auc_score(labels.reshape(-1), logits.reshape(-1)))


register_task(
    "sites-mlp",
    Task(
        "sites-mlp",
        "an MLP 30-16-1 on one CSV per site (breast cancer, 4 sites)",
        load,
        make_model,
        loss,
        accuracy,
        "accuracy",
        metrics={"auc": auc},
    ),
)
