"""Fed-TCGA-BRCA survival task, faithful to FLamby (``flamby/datasets/fed_tcga_brca``).

- 6 regional clients from the ``fold2`` column (866 train / 222 test), 39 features, event E,
  time T; the target tensor is (E, T) as in FLamby.
- model ``nn.Linear(39, 1)`` giving a risk score;
- loss: FLamby's mini-batch Cox partial likelihood (sort by T descending, mean over the batch);
- metric: concordance index, ``lifelines.utils.concordance_index(T, -risk, E)``.

The iDASH 2024 Track 2 variant (900 patients, all in training, evaluated on the training set)
loads with ``variant="idash2024"``; :func:`random_client_splits` builds the LARC paper's
second protocol (a 5:1 train/test split inside every client).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from lifelines.utils import concordance_index
from torch import nn

from secagg.errors import ConfigError

DATA_DIR = Path(__file__).parent / "data" / "fed_tcga_brca"
N_CLIENTS = 6
N_FEATURES = 39
REGIONS = ("Northeast", "South", "West", "Midwest", "Europe", "Canada")
VARIANTS = {"flamby": DATA_DIR, "idash2024": DATA_DIR / "idash2024_variant"}


@dataclass
class ClientData:
    """One client's samples: features x (n × 39) and target y = (E, T) (n × 2), float32."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    @staticmethod
    def concat(parts: list[ClientData]) -> ClientData:
        return ClientData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


@dataclass
class FederatedData:
    name: str
    train: list[ClientData]
    test: list[ClientData] | None  # per-client held-out sets; None if there are none
    pooled_test: ClientData | None = None  # a held-out set no client owns (image tasks)

    @property
    def n_clients(self) -> int:
        return len(self.train)


def _to_client_data(frame: pd.DataFrame) -> ClientData:
    # FLamby: columns 1..39 are features, 40..41 are (E, T)
    x = torch.tensor(frame.iloc[:, 1:40].to_numpy(dtype=np.float32))
    y = torch.tensor(frame.iloc[:, 40:42].to_numpy(dtype=np.float32))
    return ClientData(x, y)


def load(variant: str = "flamby") -> FederatedData:
    """Load the six clients' train (and, for FLamby's split, test) sets."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown TCGA-BRCA variant {variant!r}; choose from {list(VARIANTS)}")
    folder = VARIANTS[variant]
    data = pd.read_csv(folder / "brca.csv")
    split = pd.read_csv(folder / "train_test_split.csv")
    if list(data.columns[-2:]) != ["E", "T"] or data.shape[1] != 42:
        raise ConfigError(f"{folder / 'brca.csv'} does not have FLamby's 42 columns")

    def part(key: str) -> ClientData | None:
        pids = split.loc[split["fold2"] == key, "pid"]
        rows = data[data["pid"].isin(pids)]
        return _to_client_data(rows) if len(rows) else None

    train = [part(f"train_{k}") for k in range(N_CLIENTS)]
    test = [part(f"test_{k}") for k in range(N_CLIENTS)]
    empty = [k for k, t in enumerate(train) if t is None]
    if empty:
        raise ConfigError(
            f"{folder / 'train_test_split.csv'} gives no training samples to clients {empty}"
        )
    tests = [t for t in test if t is not None]
    return FederatedData(
        name=f"tcga-brca[{variant}]",
        train=[t for t in train if t is not None],
        test=tests if len(tests) == len(test) else None,
    )


def random_client_splits(
    data: FederatedData, seed: int, test_fraction: float = 1 / 6
) -> FederatedData:
    """Split every client's training samples at random into train/test (5:1 by default)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for part in data.train:
        order = rng.permutation(len(part))
        n_test = max(1, int(round(len(part) * test_fraction)))
        te, tr = order[:n_test], order[n_test:]
        train.append(ClientData(part.x[tr], part.y[tr]))
        test.append(ClientData(part.x[te], part.y[te]))
    return FederatedData(f"{data.name}/split{seed}", train, test)


def make_model() -> nn.Module:
    return nn.Linear(N_FEATURES, 1)


def cox_loss(scores: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """FLamby's BaselineLoss: Breslow-free mini-batch Cox partial likelihood, mean over the batch.

    Samples are sorted by time, descending (stable, as Python's ``sorted`` is), so the
    cumulative sum of exp(score) at position j is the risk set of sample j.
    """
    scores = scores.reshape(-1)
    order = torch.argsort(-truth[:, 1], stable=True)
    s, events = scores[order], truth[order, 0]
    s = s - s.max()
    return (-(s - torch.log(torch.cumsum(torch.exp(s), 0))) * events).mean()


def c_index(truth: np.ndarray | torch.Tensor, risk: np.ndarray | torch.Tensor) -> float:
    """Harrell's concordance index as FLamby computes it (higher risk = earlier event)."""
    truth = np.asarray(truth, dtype=np.float64)
    risk = np.asarray(risk, dtype=np.float64).reshape(-1)
    return float(concordance_index(truth[:, 1], -risk, truth[:, 0]))
