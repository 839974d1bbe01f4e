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

import functools
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import torch
from lifelines.utils import concordance_index
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset, default_collate

from secagg.errors import ConfigError, DataNotHeld

DATA_DIR = Path(__file__).parent / "data" / "fed_tcga_brca"
N_CLIENTS = 6
N_FEATURES = 39
REGIONS = ("Northeast", "South", "West", "Midwest", "Europe", "Canada")
VARIANTS = {"flamby": DATA_DIR, "idash2024": DATA_DIR / "idash2024_variant"}


def data_sources(variant: str) -> dict[str, Path]:
    """The files a variant's ``load`` reads (``Task.sources``: each run records them)."""
    folder = VARIANTS[variant]
    return {name: folder / name for name in ("brca.csv", "train_test_split.csv")}


#: an index argument of :meth:`ClientData.batch` and :meth:`ClientData.subset`
Indices = torch.Tensor | np.ndarray | Sequence[int]


class ClientData:
    """One client's samples: features x and targets y (TCGA-BRCA: n × 39 and (E, T) n × 2,
    float32).

    Three ways to hold them, one interface for all (``len``, :meth:`batch`, :meth:`batches`,
    :meth:`subset`, :meth:`concat`, and the whole-matrix properties ``x`` and ``y``):

    - ``ClientData(x, y)``: whole tensors in memory (every built-in task);
    - :meth:`from_dataset`: a map-style torch ``Dataset`` whose items are ``(x, y)`` pairs,
      read item by item and collated as a ``DataLoader`` collates them, materialising
      nothing up front;
    - :meth:`lazy`: a zero-argument callable returning such a Dataset, called on first use,
      so that a client loads only its own partition.

    Training, DP-SGD and evaluation use only ``len``/``batch``/``batches``; ``x`` and ``y``
    materialise (and keep) the whole matrix for the protocols that need it (DEC, DGD, PVI).

    :meth:`not_held` stands for a part that is another party's (a site's data on a
    deployment's coordinator): it has no samples here, and any read raises
    :class:`~secagg.errors.DataNotHeld`.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self._x: torch.Tensor | None = x
        self._y: torch.Tensor | None = y
        self._dataset: Dataset | None = None
        self._load: Callable[[], Dataset] | None = None
        self._length: int | None = None

    # ---- the other two ways to build one --------------------------------------------------------
    @classmethod
    def from_dataset(cls, dataset: Dataset) -> ClientData:
        """Samples read from ``dataset`` (map-style: ``dataset[i] -> (x, y)``, ``len``)."""
        _check_dataset(dataset, "ClientData.from_dataset")
        data = cls.__new__(cls)
        data._x = data._y = None
        data._dataset, data._load, data._length = dataset, None, None
        return data

    @classmethod
    def lazy(cls, load: Callable[[], Dataset], *, length: int | None = None) -> ClientData:
        """Samples from the Dataset ``load()`` returns, called once, on first use.

        Keyword-only:

        - ``length``: the number of samples, if known without loading; then ``len`` and the
          hold-out and client splits do not load either (the splits stay lazy: each part
          calls ``load`` itself when first used).

        Picklable when ``load`` is (a module-level function, ``functools.partial`` of one, or
        a :class:`~secagg.clients.tasks.Ref`): a pickled copy drops what was loaded and loads
        again where it is used (a worker process)."""
        if not callable(load):
            raise ConfigError(
                f"ClientData.lazy takes a zero-argument callable returning a Dataset, got "
                f"{type(load).__name__}"
            )
        if length is not None and (
            not isinstance(length, int) or isinstance(length, bool) or length < 0
        ):
            raise ConfigError(f"ClientData.lazy: length must be a count, got {length!r}")
        data = cls.__new__(cls)
        data._x = data._y = None
        data._dataset, data._load, data._length = None, load, length
        return data

    @classmethod
    def not_held(cls, owner: str) -> ClientData:
        """A part that ``owner`` holds and this process does not (a deployment's coordinator
        and a site's data): ``held`` is False, and reading it (``len``, a batch, ``x``)
        raises :class:`~secagg.errors.DataNotHeld` naming ``owner``, before anything is
        opened. Its subsets are not held either."""
        return cls.lazy(_NotHeld(owner))

    # ---- what kind ------------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        """Whether this process holds these samples (False for :meth:`not_held`)."""
        return not isinstance(self._load, _NotHeld)

    @property
    def is_lazy(self) -> bool:
        """Declared by a loader (:meth:`lazy`) rather than held from the start: a part that
        another party's process would have to open (a site's file)."""
        return self._load is not None

    @property
    def is_tensor(self) -> bool:
        """Held as whole tensors from the start (``ClientData(x, y)``)."""
        return self._dataset is None and self._load is None

    @property
    def dataset(self) -> Dataset:
        """The samples as a map-style Dataset: the one given (loaded now if lazy), or a
        ``TensorDataset`` over the whole tensors."""
        if self.is_tensor:
            assert self._x is not None and self._y is not None
            return TensorDataset(self._x, self._y)
        return self._loaded()

    def _loaded(self) -> Dataset:
        if self._dataset is None:
            assert self._load is not None
            dataset = self._load()
            _check_dataset(dataset, f"the lazy client data's loader {self._load!r}")
            if self._length is not None and _size(dataset) != self._length:
                raise ConfigError(
                    f"the lazy client data was declared with {self._length} samples; its "
                    f"loader {self._load!r} returned {_size(dataset)}"
                )
            self._dataset = dataset
        return self._dataset

    # ---- the interface --------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._x is not None:
            return self._x.shape[0]
        if self._dataset is None and self._length is not None:
            return self._length
        return _size(self._loaded())

    def batch(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``indices`` as tensors (x, y), in that order."""
        idx = _index(indices)
        if self._x is not None and self._y is not None:  # whole tensors (given or kept)
            return self._x[idx], self._y[idx]
        if not len(idx):
            raise ValueError("ClientData.batch: no indices (an empty batch has no shape)")
        dataset = self._loaded()
        return _collate([dataset[i] for i in idx.tolist()])

    def batches(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """All samples in order, ``size`` at a time (the last batch may be short)."""
        if size < 1:
            raise ValueError(f"ClientData.batches: size must be >= 1, got {size}")
        n = len(self)
        for start in range(0, n, size):
            if self._x is not None and self._y is not None:
                yield self._x[start : start + size], self._y[start : start + size]
            else:
                yield self.batch(range(start, min(start + size, n)))

    def subset(self, indices: Indices) -> ClientData:
        """The samples at ``indices``, in that order, held the same way as these."""
        if not self.held:  # a part of what is not held is not held either
            return self
        idx = _index(indices)
        if self.is_tensor:
            assert self._x is not None and self._y is not None
            return ClientData(self._x[idx], self._y[idx])
        if self._load is not None:  # stay lazy: the part loads (and subsets) on first use
            order = idx.numpy().copy()
            return ClientData.lazy(
                functools.partial(_subset_of, self._load, order), length=len(order)
            )
        return ClientData.from_dataset(Subset(self._loaded(), idx.tolist()))

    @property
    def x(self) -> torch.Tensor:
        """All features as one tensor (materialised on first use, then kept)."""
        self._materialise()
        assert self._x is not None
        return self._x

    @property
    def y(self) -> torch.Tensor:
        """All targets as one tensor (materialised on first use, then kept)."""
        self._materialise()
        assert self._y is not None
        return self._y

    def _materialise(self) -> None:
        if self._x is None or self._y is None:
            n = len(self)
            if not n:
                raise ValueError("a client's data has no samples to make a matrix of")
            self._x, self._y = self.batch(range(n))

    @staticmethod
    def concat(parts: Sequence[ClientData]) -> ClientData:
        """The samples of ``parts`` one after the other: whole tensors if every part is held
        as tensors (exactly as before), a concatenated Dataset otherwise."""
        if all(p.is_tensor for p in parts):
            return ClientData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))
        return ClientData.from_dataset(ConcatDataset([p.dataset for p in parts]))

    # ---- pickling (worker processes) ------------------------------------------------------------
    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        if not self.is_tensor:  # what was materialised is recomputed where it is needed
            state["_x"] = state["_y"] = None
        if self._load is not None:  # the loader travels, not what it loaded
            state["_dataset"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        if self.is_tensor:
            assert self._x is not None and self._y is not None
            return f"ClientData(x={tuple(self._x.shape)}, y={tuple(self._y.shape)})"
        if self._load is not None:
            return f"ClientData.lazy({self._load!r}, length={self._length})"
        return f"ClientData.from_dataset({self._dataset!r})"


@dataclass(frozen=True)
class _NotHeld:
    """The loader of a part this process does not hold: it refuses, naming whose it is."""

    owner: str

    def __call__(self) -> Dataset:
        raise DataNotHeld(
            f"{self.owner}'s data is not held here: a deployment's coordinator holds only its "
            "own test set (the task's pooled_test), and each site's node only its own "
            "partition. What reads other clients' samples (a protocol's pre-stage at the "
            "server, a release length taken from every client's data, client_split) runs in "
            "simulation, or on a task whose load() holds every part in memory"
        )


def _index(indices: Indices) -> torch.Tensor:
    """Indices as an int64 tensor (a torch tensor or numpy array as given: indexing with it
    selects exactly what indexing with the original did)."""
    if isinstance(indices, torch.Tensor):
        return indices
    if isinstance(indices, np.ndarray):
        return torch.from_numpy(indices)
    return torch.as_tensor(list(indices), dtype=torch.int64)


def _size(dataset: Dataset) -> int:
    # torch's Dataset type has no __len__; a map-style one has (checked on entry)
    return len(cast(Sized, dataset))


def _collate(items: list[object]) -> tuple[torch.Tensor, torch.Tensor]:
    """Dataset items stacked as a DataLoader stacks them (``default_collate``)."""
    if not all(isinstance(item, (tuple, list)) and len(item) == 2 for item in items):
        raise ConfigError(
            "a client's Dataset must return (x, y) pairs from dataset[i], got "
            f"{type(items[0]).__name__}"
        )
    x, y = default_collate(items)
    return torch.as_tensor(x), torch.as_tensor(y)


def _check_dataset(dataset: object, where: str) -> None:
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ConfigError(
            f"{where} needs a map-style Dataset (dataset[i] -> (x, y) and len(dataset)), "
            f"got {type(dataset).__name__}: wrap an iterable one in a map-style Dataset"
        )


def _subset_of(load: Callable[[], Dataset], order: np.ndarray) -> Dataset:
    """The part of ``load()`` at ``order`` (a lazy split's loader: module-level, picklable)."""
    return Subset(load(), order.tolist())


@dataclass
class FederatedData:
    """A task's data: each client's training set (``train``, one ``ClientData`` per
    client), optionally each client's own test set (``test``) and a test set no client owns
    (``pooled_test``)."""

    name: str
    train: list[ClientData]
    test: list[ClientData] | None  # per-client held-out sets; None if there are none
    pooled_test: ClientData | None = None  # a held-out set no client owns (image tasks)

    @property
    def n_clients(self) -> int:
        return len(self.train)

    @property
    def holds_training_data(self) -> bool:
        """Whether this process holds every client's training set: a simulation's experimenter
        does, a deployment's coordinator does not (:func:`held_by_coordinator`)."""
        return all(part.held for part in self.train)


def held_by_coordinator(data: FederatedData, n_clients: int) -> FederatedData:
    """What a deployment's coordinator holds of the task's data ``data`` (as ``task.load()``
    declares it): its own test set (``pooled_test``) and nothing of the ``n_clients`` sites:
    their training parts are :meth:`ClientData.not_held` (``client_<k>``), and the clients'
    own test sets (``test``) are dropped, being site data too. Nothing of ``data`` is read:
    a site's part declared lazily is never opened (nor counted: ``n_clients`` comes from the
    deployment)."""
    return FederatedData(
        data.name,
        [ClientData.not_held(f"client_{k}") for k in range(n_clients)],
        None,
        pooled_test=data.pooled_test,
    )


def held_by_site(data: FederatedData, k: int) -> FederatedData:
    """What site ``k``'s node holds of the task's data ``data`` (as ``task.load()`` declares
    it): its own training part and its own test set. Another party's part declared lazily
    (:meth:`ClientData.lazy`: a file of its own) is :meth:`ClientData.not_held`, so nothing
    on the node can open it, nor count it; a part the task's ``load`` already holds in
    memory (a bundled task reads one public file for every client) stays, since nothing is
    opened to keep it and the release checks that read the federation's shape use it."""
    if not 0 <= k < data.n_clients:
        raise ConfigError(f"{data.name} has clients 0..{data.n_clients - 1}, not client {k}")

    def kept(part: ClientData, owner: str | None) -> ClientData:
        # owner None: the site's own part
        return part if owner is None or not part.is_lazy else ClientData.not_held(owner)

    def owner(j: int) -> str | None:
        return None if j == k else f"client_{j}"

    pooled = data.pooled_test
    return FederatedData(
        data.name,
        [kept(part, owner(j)) for j, part in enumerate(data.train)],
        None if data.test is None else [kept(part, owner(j)) for j, part in enumerate(data.test)],
        pooled_test=None if pooled is None else kept(pooled, "the coordinator"),
    )


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
        train.append(part.subset(tr))
        test.append(part.subset(te))
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
