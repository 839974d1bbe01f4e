"""Tasks: data, model, loss and metric. Only clients and the experiment driver import these.

``TASKS`` is the registry (CLI choices included); :func:`register_task` adds a task defined
anywhere. A task's callables must be importable by reference (module-level functions or
classes) so that worker processes can rebuild it.

The built-in tasks name their callables by :class:`Ref` (module and attribute), so that
listing them (``secagg --help``, ``secagg presets``) does not import torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from secagg.errors import ConfigError

if TYPE_CHECKING:  # torch is imported only when a task is used
    import numpy as np
    import torch

    from secagg.clients.tasks.tcga_brca import ClientData, FederatedData


@dataclass(frozen=True)
class Ref:
    """A module-level callable named by reference, imported on first call (picklable)."""

    module: str
    name: str
    args: tuple[Any, ...] = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target = getattr(importlib.import_module(self.module), self.name)
        return target(*self.args, *args, **kwargs)


@dataclass(frozen=True)
class Task:
    """A learning task: its data (``load`` returns a ``FederatedData``), the model every
    client trains (``make_model``), the local loss and the metric (``metric(targets,
    outputs)``, reported as ``metric_name``); the fields from ``penalty`` on are optional.
    Register one with ``register_task``."""

    name: str
    description: str
    load: Callable[[], FederatedData]
    make_model: Callable[[], torch.nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    metric: Callable[[np.ndarray, np.ndarray], float]  # (targets, model outputs) -> score
    metric_name: str
    #: a term added to every local mini-batch loss, from the model (DeepCox's L1/L2)
    penalty: Callable[[torch.nn.Module], torch.Tensor] | None = None
    #: builds a client's local learning-rate rule (DeepCox's decay on a rising loss)
    schedule: Callable[[], Any] | None = None
    #: the local optimizer class, called as (parameters, lr=...); None: SGD (FLamby's)
    optimizer: Callable[..., Any] | None = None
    #: more scores by name, each called like ``metric``: every one is reported wherever the
    #: task's metric is (metrics.csv's ``test_<name>`` and ``train_<name>`` columns, the
    #: summary, ``secagg compare``, the figures and the trackers)
    metrics: Mapping[str, Callable[[np.ndarray, np.ndarray], float]] = field(default_factory=dict)
    #: where the task's data comes from: a callable returning ``{label: path}`` of the files
    #: or folders ``load`` reads (e.g. ``{"sites": folder}``). Each run records their path,
    #: size and SHA-256 (config.json's ``provenance.data``), and resuming a run whose data
    #: changed is refused; a rerun elsewhere can check it read the same data
    sources: Callable[[], Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        for name in self.metrics:
            if (
                not name.isidentifier()
                or name in RESERVED_METRIC_NAMES
                or name.startswith("client_")
            ):
                raise ConfigError(
                    f"task {self.name!r}: metric name {name!r} must be an identifier other "
                    f"than {', '.join(RESERVED_METRIC_NAMES)} or client_*"
                )


#: names an extra metric cannot take: they are metrics.csv's own columns after test_/train_
RESERVED_METRIC_NAMES = ("pooled", "loss", "metric")


_TCGA = "secagg.clients.tasks.tcga_brca"
_DIGITS = "secagg.clients.tasks.digits"
_TABULAR = "secagg.clients.tasks.tabular"
_SURVIVAL = "secagg.clients.tasks.survival"
_BAYES = "secagg.clients.tasks.bayes"
_TREES = "secagg.clients.tasks.trees"
_SAVAE = "secagg.clients.tasks.savae"
_DEC = "secagg.clients.tasks.dec"
_DGD = "secagg.clients.tasks.dgd"
#: the deep generative decoder's sets and splits (``secagg.clients.tasks.dgd.DATASETS``)
DGD_SPLITS = (
    ("digits", "dir8"),
    ("digits", "niid2"),
    ("breast-cancer", "iid"),
    ("breast-cancer", "label"),
)
#: the digits splits (``secagg.clients.tasks.digits.SPLITS``; a test keeps them equal)
DIGITS_SPLITS = ("niid1", "niid2", "dir8")
#: the survival sets and their centre scenarios (``secagg.clients.tasks.survival``)
SURVIVAL_DATASETS = ("tcga", "gbsg2")
SURVIVAL_SCENARIOS = ("balanced", "hub", "times", "feature")
#: the diabetes / breast-cancer splits (``secagg.clients.tasks.tabular.SPLITS``; kept equal)
TABULAR_SPLITS = ("iid", "label", "feature")
#: the DEC clustering sets (``secagg.clients.tasks.dec.DATASETS``; a test keeps them equal)
DEC_SPLITS = (("digits", "niid1"), ("breast-cancer", "iid"), ("breast-cancer", "label"))


def deepcox_task(
    dataset: str,
    scenario: str,
    seed: int = 0,
    only: int | None = None,
    holdout: int | None = None,
) -> Task:
    """DeepCox on a survival split (``only``: one centre, or -1 for all patients pooled;
    ``holdout``: a centre-based cross-validation fold, tested on that centre)."""
    where = "" if only is None else (" pooled" if only == -1 else f", centre {only} alone")
    where += "" if holdout is None else f", centre {holdout} held out"
    name = f"deepcox-{dataset}-{scenario}" + ("" if seed == 0 else f"-s{seed}")
    name += "" if only is None else ("-pooled" if only == -1 else f"-c{only}")
    return Task(
        name + ("" if holdout is None else f"-h{holdout}"),
        f"DeepCox 8-4 on {dataset}, 8 centres ({scenario}), split seed {seed}{where}",
        Ref(_SURVIVAL, "load", (dataset, scenario, seed, only, holdout)),
        Ref(_SURVIVAL, "make_model", (dataset,)),
        Ref(_TCGA, "cox_loss"),
        Ref(_TCGA, "c_index"),
        "c_index",
        penalty=Ref(_SURVIVAL, "first_layer_penalty"),
        schedule=Ref("secagg.clients.training", "DecayOnIncrease"),
        optimizer=Ref("torch.optim", "Adam"),
    )


def dec_task(dataset: str, split: str, only: int | None = None) -> Task:
    """DEC clustering on a split (``only``: one client alone, or -1 for all pooled on one)."""
    name = f"dec-{dataset}-{split}"
    name += "" if only is None else ("-pooled" if only == -1 else f"-c{only}")
    where = "" if only is None else (", pooled" if only == -1 else f", client {only} alone")
    return Task(
        name,
        f"deep embedded clustering of {dataset} ({split} split{where}); labels score clusters",
        Ref(_DEC, "load", (dataset, split, only)),
        Ref(_DEC, "make_model", (dataset,)),
        Ref(_DEC, "kl_to_target"),
        Ref(_DEC, "cluster_accuracy"),
        "cluster_accuracy",
    )


def savae_task(
    dataset: str, seed: int = 0, only: int | None = None, prior: str | None = None
) -> Task:
    """SAVAE (GenoMed4All D6.2 §6.4) on a good node and a bad node of split seed ``seed``
    (``only``: 0, the good node alone, or 1, the bad node alone; ``prior``: the joint
    pseudo-point prior of §6.5.1, the nodes' mixtures combined as a "product" (the report's)
    or a "mixture", for protocol savae_prior)."""
    name = {None: "savae", "product": "savae-prior", "mixture": "savae-moe"}[prior]
    name += f"-{dataset}" + ("" if seed == 0 else f"-s{seed}")
    name += "" if only is None else ("-good" if only == 0 else "-bad")
    where = "" if only is None else (", good node alone" if only == 0 else ", bad node alone")
    return Task(
        name,
        f"survival VAE, Weibull times, on {dataset}: good and bad node, split seed {seed}{where}"
        + (f", joint pseudo-point prior ({prior} of the nodes')" if prior else ""),
        Ref(_SAVAE, "load", (dataset, seed, only)),
        Ref(_SAVAE, "make_model", (dataset, 8 if prior else 0, prior or "product")),
        Ref(_SAVAE, "negative_elbo"),
        Ref(_SAVAE, "time_c_index"),
        "c_index",
        optimizer=Ref("torch.optim", "Adam"),
    )


def dgd_task(
    dataset: str, split: str, missing: float = 0.2, seed: int = 0, only: int | None = None
) -> Task:
    """The deep generative decoder imputing entries missing at random (share ``missing``,
    mask seed ``seed``; ``only``: one client alone, or -1 for all pooled on one)."""
    name = f"dgd-{dataset}-{split}" + ("" if missing == 0.2 else f"-m{round(missing * 100)}")
    name += ("" if seed == 0 else f"-s{seed}") + (
        "" if only is None else ("-pooled" if only == -1 else f"-c{only}")
    )
    where = "" if only is None else (", pooled" if only == -1 else f", client {only} alone")
    return Task(
        name,
        f"DGD imputation of {dataset} ({split} split{where}), {missing:.0%} of entries missing "
        f"at random, mask seed {seed}",
        Ref(_DGD, "load", (dataset, split, missing, seed, only)),
        Ref(_DGD, "make_model", (dataset,)),
        Ref(_DGD, "masked_squared_error"),
        Ref(_DGD, "negative_rmse"),
        "-RMSE",
    )


def coxph_task(
    dataset: str,
    scenario: str,
    seed: int = 0,
    only: int | None = None,
    holdout: int | None = None,
) -> Task:
    """The linear Cox model xᵀβ on a survival split (the exact federated Cox reference)."""
    deep = deepcox_task(dataset, scenario, seed, only, holdout)
    return Task(
        deep.name.replace("deepcox-", "coxph-", 1),
        deep.description.replace("DeepCox 8-4", "linear Cox model"),
        deep.load,
        Ref(_SURVIVAL, "make_linear_model", (dataset,)),
        deep.loss,
        deep.metric,
        deep.metric_name,
    )


TASKS = {
    "tcga-brca": Task(
        "tcga-brca",
        "Fed-TCGA-BRCA (FLamby split: 6 regions, 866 train / 222 test)",
        Ref(_TCGA, "load", ("flamby",)),
        Ref(_TCGA, "make_model"),
        Ref(_TCGA, "cox_loss"),
        Ref(_TCGA, "c_index"),
        "c_index",
        sources=Ref(_TCGA, "data_sources", ("flamby",)),
    ),
    "tcga-brca-idash": Task(
        "tcga-brca-idash",
        "iDASH 2024 Track 2 variant (900 patients, training-set evaluation)",
        Ref(_TCGA, "load", ("idash2024",)),
        Ref(_TCGA, "make_model"),
        Ref(_TCGA, "cox_loss"),
        Ref(_TCGA, "c_index"),
        "c_index",
    ),
    **{
        f"digits-{split}": Task(
            f"digits-{split}",
            f"scikit-learn digits, split {split} (see clients/tasks/digits.py)",
            Ref(_DIGITS, "load", (split,)),
            Ref(_DIGITS, "make_model"),
            Ref(_DIGITS, "cross_entropy"),
            Ref(_DIGITS, "accuracy"),
            "accuracy",
        )
        for split in DIGITS_SPLITS
    },
    # the linear models of GenoMed4All D6.2 §3 (ADMM): 4 clients, see clients/tasks/tabular.py
    **{
        f"diabetes-{split}": Task(
            f"diabetes-{split}",
            f"scikit-learn diabetes (regression, 10 features), 4 clients, {split} split",
            Ref(_TABULAR, "load", ("diabetes", split)),
            Ref(_TABULAR, "make_model", ("diabetes",)),
            Ref(_TABULAR, "squared_error"),
            Ref(_TABULAR, "r2"),
            "r2",
        )
        for split in TABULAR_SPLITS
    },
    **{
        f"breast-cancer-{split}": Task(
            f"breast-cancer-{split}",
            f"scikit-learn breast cancer (labels -1/+1, 30 features), 4 clients, {split} split",
            Ref(_TABULAR, "load", ("breast-cancer", split)),
            Ref(_TABULAR, "make_model", ("breast-cancer",)),
            Ref(_TABULAR, "logistic_loss"),
            Ref(_TABULAR, "sign_accuracy"),
            "accuracy",
        )
        for split in TABULAR_SPLITS
    },
    # a Gaussian posterior over logistic regression weights (protocol pvi)
    **{
        f"bayes-breast-cancer-{split}": Task(
            f"bayes-breast-cancer-{split}",
            f"Bayesian logistic regression (mean-field Gaussian q) on breast cancer, 4 clients, "
            f"{split} split",
            Ref(_BAYES, "load", (split,)),
            Ref(_BAYES, "make_model"),
            Ref(_TABULAR, "logistic_loss"),
            Ref(_TABULAR, "sign_accuracy"),
            "accuracy",
        )
        for split in TABULAR_SPLITS
    },
    # boosted trees over binned breast cancer (protocol xgboost)
    **{
        f"xgb-breast-cancer-{split}": Task(
            f"xgb-breast-cancer-{split}",
            f"gradient-boosted trees (depth 3, up to 50) on breast cancer in 16 quantile bins, "
            f"4 clients, {split} split",
            Ref(_TREES, "load", (split,)),
            Ref(_TREES, "make_model"),
            Ref(_TREES, "log_loss"),
            Ref(_TREES, "accuracy"),
            "accuracy",
        )
        for split in TABULAR_SPLITS
    },
    **{
        f"bayes-mlp-breast-cancer-{split}": Task(
            f"bayes-mlp-breast-cancer-{split}",
            f"Bayesian MLP 30-8-1 (mean-field Gaussian q) on breast cancer, 4 clients, "
            f"{split} split",
            Ref(_BAYES, "load", (split,)),
            Ref(_BAYES, "make_mlp"),
            Ref(_TABULAR, "logistic_loss"),
            Ref(_TABULAR, "sign_accuracy"),
            "accuracy",
        )
        for split in TABULAR_SPLITS
    },
    # deep embedded clustering (protocol dec): see clients/tasks/dec.py
    **{f"dec-{dataset}-{split}": dec_task(dataset, split) for dataset, split in DEC_SPLITS},
    # the linear Cox model on the same splits (protocol coxph: the exact federated Cox model)
    **{
        f"coxph-{dataset}-{scenario}": coxph_task(dataset, scenario)
        for dataset in SURVIVAL_DATASETS
        for scenario in SURVIVAL_SCENARIOS
    },
    # SAVAE on a good and a bad node (GenoMed4All D6.2 §6.4-6.6): see clients/tasks/savae.py
    **{
        task.name: task
        for dataset in SURVIVAL_DATASETS
        for task in (
            savae_task(dataset),
            savae_task(dataset, only=0),
            savae_task(dataset, only=1),
            savae_task(dataset, prior="product"),
            savae_task(dataset, prior="mixture"),
        )
    },
    # the deep generative decoder imputing missing values (protocol dgd): clients/tasks/dgd.py
    **{f"dgd-{dataset}-{split}": dgd_task(dataset, split) for dataset, split in DGD_SPLITS},
    # DeepCox on 8 artificial centres (GenoMed4All D6.2 §8.3): see clients/tasks/survival.py
    **{
        f"deepcox-{dataset}-{scenario}": deepcox_task(dataset, scenario)
        for dataset in SURVIVAL_DATASETS
        for scenario in SURVIVAL_SCENARIOS
    },
}


_BUILTIN = frozenset(TASKS)


def register_task(name: str, task: Task, *, replace: bool = False) -> None:
    """Make ``task`` available as ``name`` (CLI ``--task``, configs, worker processes)."""
    if not isinstance(task, Task):
        raise ConfigError(f"register_task({name!r}): expected a Task, got {type(task).__name__}")
    if name in _BUILTIN or (name in TASKS and not replace):
        raise ConfigError(
            f"task {name!r} is already registered"
            + ("" if name in _BUILTIN else " (pass replace=True)")
        )
    TASKS[name] = task


def custom_tasks() -> dict[str, Task]:
    """Tasks registered from outside secagg (worker processes register them again)."""
    return {k: v for k, v in TASKS.items() if k not in _BUILTIN}


def load_task_entry_points() -> None:
    """Register the tasks installed packages declare (entry point group ``secagg.tasks``:
    a Task, or a callable returning one); once per process."""
    from secagg.plugins import TASK_GROUP, new_entry_points

    for point in new_entry_points(TASK_GROUP):
        if point.name in TASKS:
            continue
        task = point.load()
        if not isinstance(task, Task) and callable(task):
            task = task()
        if not isinstance(task, Task):
            raise ConfigError(
                f"entry point {point.name!r} in {TASK_GROUP} ({point.value}) is not a Task "
                "or a callable returning one"
            )
        register_task(point.name, task)


def get_task(name: str) -> Task:
    if name not in TASKS:  # an installed package's task (entry point secagg.tasks)?
        load_task_entry_points()
    if name not in TASKS:
        raise ConfigError(
            f"unknown task {name!r}; choose from {', '.join(TASKS)} (a task of your own: "
            "name its module with --import MODULE, or imports = [...] in a config)"
        )
    return TASKS[name]


def __getattr__(name: str) -> Any:
    # the data containers live with the TCGA loader, which imports torch: load on first use
    if name in ("ClientData", "FederatedData"):
        from secagg.clients.tasks import tcga_brca

        return getattr(tcga_brca, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ClientData",
    "FederatedData",
    "Ref",
    "TASKS",
    "Task",
    "custom_tasks",
    "coxph_task",
    "dec_task",
    "deepcox_task",
    "dgd_task",
    "get_task",
    "load_task_entry_points",
    "register_task",
    "savae_task",
]
