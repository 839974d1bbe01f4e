"""The experimenter's evaluation of a global model: the task's metrics on the sets it holds
(the pooled test set, each client's test set, the pooled training set).

It scores what it holds and nothing else. A simulation's experimenter holds every set of
the task (no party of the protocol does); a deployment's coordinator holds only its own test
set (``held_by_coordinator``: no ``train_*`` columns, no per-client ones). Only the driver
and a deployment's experimenter import this module.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from secagg.clients.tasks import ClientData, FederatedData, Task
from secagg.clients.training import EVAL_BATCH, model_outputs, set_flat_params
from secagg.errors import ConfigError


def evaluate(
    task: Task,
    data: FederatedData,
    params: np.ndarray,
    predictions: np.ndarray | None = None,
    *,
    device: torch.device | None = None,
    batch_size: int = EVAL_BATCH,
) -> dict[str, float]:
    """Metric of the global model on the sets ``data`` holds: the pooled training set
    (``train_pooled``, ``train_loss``) where it holds every client's
    (``FederatedData.holds_training_data``), the pooled test set, each client's test set;
    the task's extra ``metrics`` on the pooled sets (``test_<name>``, ``train_<name>``).
    Scores undefined on a set count as NaN; a set not held has no columns (none at all where
    nothing is held).

    ``predictions``: the protocol's own outputs for the pooled test set (Ensemble), which
    has no global model: only the pooled test set is scored.

    Keyword-only:

    - ``device``: where the model runs (None: the CPU); scores come back to the CPU;
    - ``batch_size``: samples per forward pass; a set's outputs are concatenated before it
      is scored, so a set of up to ``batch_size`` samples is scored in one pass."""
    if predictions is not None:
        if data.pooled_test is None:
            raise ConfigError(f"{task.name} has no pooled test set to score predictions on")
        n_test = len(data.pooled_test)
        scores = torch.as_tensor(predictions, dtype=torch.float32).reshape(n_test, -1)
        truth = data.pooled_test.y
        scored = {
            "test_pooled": _score(task.metric, truth, scores),
            "test_loss": float(task.loss(scores, truth)),
        }
        scored.update(_extra(task, "test", truth, scores))
        return with_metric_name(task, scored)
    model = task.make_model()
    if device is not None:
        model = model.to(device)
    set_flat_params(model, params)
    model.eval()

    def outputs(part: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
        return model_outputs(model, part, device=device, batch_size=batch_size)

    out: dict[str, float] = {}
    if data.train and data.holds_training_data:  # a coordinator holds no site's data
        train_out, train_y = outputs(ClientData.concat(data.train))
        out["train_pooled"] = _score(task.metric, train_y, train_out)
        out["train_loss"] = float(task.loss(train_out, train_y))
        out.update(_extra(task, "train", train_y, train_out))
    if data.pooled_test is not None:
        test_out, test_y = outputs(data.pooled_test)
        out["test_pooled"] = _score(task.metric, test_y, test_out)
        out["test_loss"] = float(task.loss(test_out, test_y))
        out.update(_extra(task, "test", test_y, test_out))
    if data.test is not None:
        # the clients' own test sets: pooled, they replace a pooled test set's scores
        per_client = []
        for part in data.test:
            part_out, part_y = outputs(part)
            per_client.append(_score(task.metric, part_y, part_out))
        test_out, test_y = outputs(ClientData.concat(data.test))
        out["test_loss"] = float(task.loss(test_out, test_y))
        out["test_pooled"] = _score(task.metric, test_y, test_out)
        out.update(_extra(task, "test", test_y, test_out))
        out["test_client_avg"] = float(np.nanmean(per_client))
        out.update({f"test_client_{k}": v for k, v in enumerate(per_client)})
    return with_metric_name(task, out)


#: column names the pooled scores' aliases must not take
_RESERVED = {"pooled", "loss", "client_avg"}


def with_metric_name(task: Task, scores: dict[str, float]) -> dict[str, float]:
    """``scores`` with each pooled score of the task's metric also under the metric's own
    name (``test_auc`` beside ``test_pooled`` for a metric named ``auc``): the task's names
    hold in every output. Not where an extra metric or a column already has that name."""
    name = task.metric_name
    if name in task.metrics or name in _RESERVED or name.startswith("client_"):
        return scores
    out = dict(scores)
    for prefix in ("train", "test"):
        if f"{prefix}_pooled" in out:
            out.setdefault(f"{prefix}_{name}", out[f"{prefix}_pooled"])
    return out


def _score(
    metric: Callable[[np.ndarray, np.ndarray], float], truth: torch.Tensor, out: torch.Tensor
) -> float:
    try:
        return metric(truth.numpy(), out.numpy())
    except ZeroDivisionError:  # lifelines: no admissible pairs in a tiny client set
        return float("nan")


def _extra(task: Task, prefix: str, truth: torch.Tensor, out: torch.Tensor) -> dict[str, float]:
    """The task's extra metrics on one pooled set, as ``<prefix>_<name>`` columns."""
    return {f"{prefix}_{name}": _score(fn, truth, out) for name, fn in task.metrics.items()}
