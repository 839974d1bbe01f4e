"""Survival data on 8 artificial centres and the DeepCox network (GenoMed4All D6.2 §8.3).

The report's MDS cohort is not public; its design is applied to two sets that are here:
Fed-TCGA-BRCA pooled (FLamby's 1,088 patients, 39 features) and lifelines' bundled GBSG2
(686 patients; hormonal therapy and menopause as 0/1, tumour grade I–III as 0–2, and the
five numeric covariates). Per split seed s (the report repeats 20 train/test splits):

- a random 75 % / 25 % train / blind-test split;
- features min-max scaled to [0, 1] with the training set's ranges (the report scales all
  values into [0, 1]; test values may fall slightly outside);
- the training patients spread over 8 centres by scenario:

  ``balanced``  IID, equal sizes;
  ``hub``       IID, one hub centre with 40 % of the patients, the rest equal;
  ``times``     sorted by observed time, cut into 8 equal contiguous bands (non-overlapping
                survival times, the report's hard thresholds);
  ``feature``   sorted by the most predictive feature, 8 equal contiguous bands. The report
                ranks features by the network's importance on the training set; here by the
                univariate concordance |C − ½| on the training set (no network needed
                before the split exists): GBSG2 → positive nodes, TCGA-BRCA → see
                :func:`most_predictive`.

The target is (E, T), as for Fed-TCGA-BRCA, so the Cox loss and the concordance index of
``secagg.clients.tasks.tcga_brca`` apply unchanged.

DeepCox (§8.3.1): a feed-forward network with hidden layers of 8 and 4 units. The report does
not name the activation or the optimizer: tanh (with ReLU the 4-unit layer died at
initialisation on GBSG2 and the network stayed constant) and Adam (its floor rate 0.001 is
Adam's customary rate; plain SGD at 0.001 barely moves). Its L1 and L2 penalties on the first
layer's weights are :func:`first_layer_penalty` (the task's ``penalty``), and the decaying
rate is ``secagg.clients.training.DecayOnIncrease`` (the task's ``schedule``).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
import torch
from lifelines.utils import concordance_index
from torch import nn

from secagg.clients.tasks.tcga_brca import VARIANTS, ClientData, FederatedData
from secagg.errors import ConfigError

DATASETS = ("tcga", "gbsg2")
SCENARIOS = ("balanced", "hub", "times", "feature")
N_CENTRES = 8
HUB_SHARE = 0.4
#: the penalty weights on the first layer (the report selects them by cross-validation
#: without giving values; these are the defaults a run can change)
L1, L2 = 1e-4, 1e-3


@cache
def pooled(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, target (E, T)) of every patient, float64, features unscaled."""
    x: np.ndarray
    y: np.ndarray
    if dataset == "tcga":
        frame = pd.read_csv(VARIANTS["flamby"] / "brca.csv")
        x = frame.iloc[:, 1:40].to_numpy(dtype=np.float64)
        y = frame[["E", "T"]].to_numpy(dtype=np.float64)
    elif dataset == "gbsg2":
        from lifelines.datasets import load_gbsg2

        frame = load_gbsg2()
        x = np.column_stack(
            [
                (frame["horTh"] == "yes").to_numpy(dtype=np.float64),
                (frame["menostat"] == "Post").to_numpy(dtype=np.float64),
                frame["tgrade"].map({"I": 0.0, "II": 1.0, "III": 2.0}).to_numpy(),
                frame[["age", "tsize", "pnodes", "progrec", "estrec"]].to_numpy(np.float64),
            ]
        )
        y = np.column_stack([frame["cens"], frame["time"]]).astype(np.float64)
    else:
        raise ConfigError(f"unknown survival dataset {dataset!r}; choose from {DATASETS}")
    return x, y


def most_predictive(x: np.ndarray, y: np.ndarray) -> int:
    """The feature whose univariate concordance is farthest from ½ (ties: the first)."""
    scores = []
    for j in range(x.shape[1]):
        if np.ptp(x[:, j]) == 0:
            scores.append(0.0)
            continue
        scores.append(abs(concordance_index(y[:, 1], -x[:, j], y[:, 0]) - 0.5))
    return int(np.argmax(scores))


def centre_order(x: np.ndarray, y: np.ndarray, scenario: str, rng) -> list[np.ndarray]:
    """The training rows of each of the 8 centres."""
    n = len(y)
    if scenario == "balanced":
        return np.array_split(rng.permutation(n), N_CENTRES)
    if scenario == "hub":
        order = rng.permutation(n)
        hub = int(round(HUB_SHARE * n))
        return [order[:hub], *np.array_split(order[hub:], N_CENTRES - 1)]
    if scenario == "times":
        return np.array_split(np.argsort(y[:, 1], kind="stable"), N_CENTRES)
    if scenario == "feature":
        j = most_predictive(x, y)
        return np.array_split(np.argsort(x[:, j], kind="stable"), N_CENTRES)
    raise ConfigError(f"unknown survival scenario {scenario!r}; choose from {SCENARIOS}")


def split(
    dataset: str, scenario: str, seed: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """(the 8 centres' (x, y), the blind test set's (x, y)) for split seed ``seed``."""
    x, y = pooled(dataset)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_test = len(y) // 4
    return centres_and_test(x, y, order[n_test:], order[:n_test], scenario, rng)


def centres_and_test(
    x: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    scenario: str,
    rng: np.random.Generator,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """The ``train`` patients over the 8 centres of ``scenario`` and the ``test`` patients,
    features scaled to [0, 1] by the training patients' range."""
    low, high = x[train].min(0), x[train].max(0)
    x = (x - low) / np.where(high > low, high - low, 1.0)
    parts = centre_order(x[train], y[train], scenario, rng)
    return [(x[train][p], y[train][p]) for p in parts], (x[test], y[test])


def _data(x: np.ndarray, y: np.ndarray) -> ClientData:
    as_tensor = torch.from_numpy
    return ClientData(as_tensor(x.astype(np.float32)), as_tensor(y.astype(np.float32)))


def load(
    dataset: str,
    scenario: str,
    seed: int = 0,
    only: int | None = None,
    holdout: int | None = None,
) -> FederatedData:
    """The federation of a split; ``only``: centre k alone (an isolated-centre run), -1: all
    training patients in one centre (the centralised bound). ``holdout``: centre k leaves
    the training and is the test set instead (a fold of centre-based cross-validation,
    §8.2.5; ``only`` then counts the remaining centres)."""
    centres, test = split(dataset, scenario, seed)
    return federated(centres, test, f"{dataset}[{scenario}, split {seed}]", only, holdout)


def federated(
    centres: list[tuple[np.ndarray, np.ndarray]],
    test: tuple[np.ndarray, np.ndarray],
    name: str,
    only: int | None = None,
    holdout: int | None = None,
) -> FederatedData:
    """The centres' ``(x, y)`` as clients and ``test`` as the pooled test set (``only`` and
    ``holdout`` as :func:`load`'s)."""
    x_test, y_test = test
    if holdout is not None:
        x_test, y_test = centres[holdout]
        centres = centres[:holdout] + centres[holdout + 1 :]
        name += f"/without centre {holdout}"
    parts = [_data(x, y) for x, y in centres]
    if only == -1:
        parts, name = [ClientData.concat(parts)], f"{name}/pooled"
    elif only is not None:
        parts, name = [parts[only]], f"{name}/centre {only}"
    return FederatedData(name=name, train=parts, test=None, pooled_test=_data(x_test, y_test))


def make_model(dataset: str) -> nn.Module:
    n_features = pooled(dataset)[0].shape[1]
    return nn.Sequential(
        nn.Linear(n_features, 8), nn.Tanh(), nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1)
    )


def make_linear_model(dataset: str) -> nn.Module:
    """The Cox model's linear predictor xᵀβ (no bias: the partial likelihood ignores it)."""
    return nn.Linear(pooled(dataset)[0].shape[1], 1, bias=False)


def first_layer_penalty(model: nn.Module, l1: float = L1, l2: float = L2) -> torch.Tensor:
    """λ₁‖W₁‖₁ + λ₂‖W₁‖² on the first layer's weights (§8.3.1)."""
    weight = next(model.parameters())
    return l1 * weight.abs().sum() + l2 * (weight**2).sum()
