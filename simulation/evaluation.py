"""The experimenter's evaluation of a global model: the task's metrics on the pooled test
set, each client's test set and the pooled training set.

The experimenter holds these sets; no party of the protocol does. Only the driver imports
this module.
"""

from __future__ import annotations

import numpy as np
import torch

from secagg.clients.tasks import ClientData, FederatedData, Task
from secagg.clients.training import set_flat_params
from secagg.errors import ConfigError


def evaluate(
    task: Task, data: FederatedData, params: np.ndarray, predictions: np.ndarray | None = None
) -> dict[str, float]:
    """Metric of the global model on the pooled test set, each client's test set, and the
    pooled training set. Client sets where the metric is undefined count as NaN.

    ``predictions``: the protocol's own outputs for the pooled test set (Ensemble), which
    has no global model: only the pooled test set is scored."""
    if predictions is not None:
        if data.pooled_test is None:
            raise ConfigError(f"{task.name} has no pooled test set to score predictions on")
        n_test = len(data.pooled_test)
        scores = torch.as_tensor(predictions, dtype=torch.float32).reshape(n_test, -1)
        return {
            "test_pooled": task.metric(data.pooled_test.y.numpy(), scores.numpy()),
            "test_loss": float(task.loss(scores, data.pooled_test.y)),
        }
    model = task.make_model()
    set_flat_params(model, params)
    model.eval()

    def score(part: ClientData) -> float:
        with torch.no_grad():
            pred = model(part.x).numpy()
        try:
            return task.metric(part.y.numpy(), pred)
        except ZeroDivisionError:  # lifelines: no admissible pairs in a tiny client set
            return float("nan")

    out = {"train_pooled": score(ClientData.concat(data.train))}
    with torch.no_grad():
        out["train_loss"] = float(
            task.loss(model(ClientData.concat(data.train).x), ClientData.concat(data.train).y)
        )
    if data.pooled_test is not None:
        out["test_pooled"] = score(data.pooled_test)
        with torch.no_grad():
            out["test_loss"] = float(task.loss(model(data.pooled_test.x), data.pooled_test.y))
    if data.test is not None:
        pooled_test = ClientData.concat(data.test)
        with torch.no_grad():
            out["test_loss"] = float(task.loss(model(pooled_test.x), pooled_test.y))
        per_client = [score(p) for p in data.test]
        out["test_pooled"] = score(ClientData.concat(data.test))
        out["test_client_avg"] = float(np.nanmean(per_client))
        out.update({f"test_client_{k}": v for k, v in enumerate(per_client)})
    return out
