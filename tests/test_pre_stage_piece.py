"""A protocol brings its own pre-stage: task, schedule, layout and check all come from its
``PreStage`` piece, so a protocol defined outside secagg (here, in this test module) runs a
federated pre-stage with no edit of the run's definition (``secagg.runspec``)."""

from typing import Any

import numpy as np
import pytest
import torch

import secagg
from secagg.clients.tasks import Task
from secagg.clients.tasks.vae import autoencoding, reconstruction_score
from secagg.errors import ConfigError
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.pieces import PreStage
from secagg.protocols.registry import register_protocol

SEEN: dict[str, Any] = {}


def toy_stage_task(config, data) -> Task:
    """A linear autoencoder of the task's features, on the run's clients."""
    n_in = int(data.train[0].x.shape[1])
    SEEN["task_built"] = SEEN.get("task_built", 0) + 1
    return Task(
        "toy-stage",
        "linear autoencoder (a test's pre-stage)",
        lambda: autoencoding(data),
        lambda: torch.nn.Linear(n_in, n_in),
        lambda out, target: ((out - target) ** 2).sum(dim=1).mean(),
        reconstruction_score,
        "-MSE",
    )


def toy_stage_check(config, data) -> None:
    SEEN["checked"] = config.task
    if config.protocol_options.get("refuse"):
        raise ConfigError("the toy pre-stage refuses this data")


class ToyStaged(FedAvg, PreStage):
    """FedAvg after a 2-round pre-stage of its own, whose model it keeps."""

    name = "toy-staged"
    pretrain = "toy"
    pre_stage_task = toy_stage_task
    pre_stage_check = toy_stage_check

    def __init__(self, refuse: bool = False):
        super().__init__()
        self.refuse = refuse

    def pre_stage_schedule(self, config) -> tuple[int, float]:
        return 2, 0.01

    def pre_stage_layout(self, data) -> dict[str, Any]:
        return {"n_in": int(data.train[0].x.shape[1])}

    def use_pretrained(self, params, layout) -> None:
        SEEN["pretrained"] = (np.asarray(params).size, dict(layout))


@pytest.fixture
def toy_protocol():
    from secagg.protocols import PROTOCOLS

    before = dict(PROTOCOLS)
    register_protocol("toy-staged", ToyStaged)
    SEEN.clear()
    yield
    PROTOCOLS.clear()
    PROTOCOLS.update(before)


SETTINGS = dict(
    task="tcga-brca", protocol="toy-staged", backend="plain", rounds=1, seeds=[1], local_steps=1
)


@pytest.mark.usefixtures("toy_protocol")
def test_a_protocols_own_pre_stage_runs_before_round_0():
    result = secagg.run(**SETTINGS)
    n_in = 39  # TCGA-BRCA's features
    assert SEEN["checked"] == "tcga-brca"
    assert SEEN["pretrained"] == (n_in * n_in + n_in, {"n_in": n_in})
    runs = [r for r in result.audit.records if r.get("run") == "1-toy"]
    assert {r["round"] for r in runs} == {0, 1, 2}  # setup and the stage's 2 rounds
    assert list(result.metrics["round"]) == [0, 1]  # the main run's rows only


@pytest.mark.usefixtures("toy_protocol")
def test_a_protocols_own_pre_stage_check_refuses_before_training():
    with pytest.raises(ConfigError, match="the toy pre-stage refuses this data"):
        secagg.run(**SETTINGS, protocol_options={"refuse": True})
    assert "pretrained" not in SEEN
