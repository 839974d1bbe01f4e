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


#: the federation: site k is client_k (each site's file is opened only where it is used, so
#: a node that holds only its own file runs the same task)
N_SITES = 4


def load() -> FederatedData:
    folder = sites_folder()
    train = [ClientData.lazy(partial(CsvSite, folder / f"site_{k}.csv")) for k in range(N_SITES)]
    # the experimenter's test set, read only where the model is evaluated (a Flower node
    # with only its own site never opens it)
    test = ClientData.lazy(partial(CsvSite, folder / "test.csv"))
    return FederatedData("sites", train, None, pooled_test=test)


def sources() -> dict[str, Path]:
    """Where the data comes from: each run records the folder's files and their SHA-256."""
    return {"sites": sites_folder()}


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
        sources=sources,
    ),
)
