"""Tasks: data, model, loss and metric. Only clients and the experiment driver import these.

``TASKS`` is the registry (CLI choices included); :func:`register_task` adds a task defined
anywhere. A task's callables must be importable by reference (module-level functions or
classes) so that worker processes can rebuild it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from secagg.clients.tasks import digits, tcga_brca
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData
from secagg.errors import ConfigError


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    load: Callable[[], FederatedData]
    make_model: Callable[[], torch.nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    metric: Callable[[np.ndarray, np.ndarray], float]  # (targets, model outputs) -> score
    metric_name: str


TASKS = {
    "tcga-brca": Task(
        "tcga-brca",
        "Fed-TCGA-BRCA (FLamby split: 6 regions, 866 train / 222 test)",
        lambda: tcga_brca.load("flamby"),
        tcga_brca.make_model,
        tcga_brca.cox_loss,
        tcga_brca.c_index,
        "c_index",
    ),
    "tcga-brca-idash": Task(
        "tcga-brca-idash",
        "iDASH 2024 Track 2 variant (900 patients, training-set evaluation)",
        lambda: tcga_brca.load("idash2024"),
        tcga_brca.make_model,
        tcga_brca.cox_loss,
        tcga_brca.c_index,
        "c_index",
    ),
    **{
        f"digits-{split}": Task(
            f"digits-{split}",
            f"scikit-learn digits, split {split} (see clients/tasks/digits.py)",
            partial(digits.load, split),
            digits.make_model,
            digits.cross_entropy,
            digits.accuracy,
            "accuracy",
        )
        for split in digits.SPLITS
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


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]


__all__ = [
    "ClientData",
    "FederatedData",
    "TASKS",
    "Task",
    "custom_tasks",
    "get_task",
    "register_task",
]
