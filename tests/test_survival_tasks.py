"""The survival tasks of GenoMed4All D6.2 §8.3: the four centre scenarios are what they say,
and DeepCox's local training carries the report's decaying rate and first-layer penalty."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secagg.clients.tasks import deepcox_task, survival
from secagg.clients.training import DecayOnIncrease, LocalTrainer
from secagg.errors import ConfigError, StateError


@pytest.mark.parametrize("dataset", ["gbsg2", "tcga"])
def test_the_scenarios_split_the_same_training_patients_as_the_report_describes(dataset):
    sizes = {}
    for scenario in survival.SCENARIOS:
        centres, (x_test, _) = survival.split(dataset, scenario, 3)
        sizes[scenario] = [len(y) for _, y in centres]
        n = sum(sizes[scenario])
        assert len(centres) == 8 and len(x_test) == (n + len(x_test)) // 4
        if scenario == "times":  # non-overlapping bands of observed time
            bands = [(y[:, 1].min(), y[:, 1].max()) for _, y in centres]
            assert all(a[1] <= b[0] for a, b in zip(bands, bands[1:]))
        if scenario == "feature":
            x_all = np.vstack([x for x, _ in centres])
            y_all = np.vstack([y for _, y in centres])
            j = survival.most_predictive(x_all, y_all)
            bands = [(x[:, j].min(), x[:, j].max()) for x, _ in centres]
            assert all(a[1] <= b[0] for a, b in zip(bands, bands[1:]))
    assert max(sizes["balanced"]) - min(sizes["balanced"]) <= 1
    hub = sizes["hub"]
    assert abs(hub[0] / sum(hub) - 0.4) < 0.01 and max(hub[1:]) - min(hub[1:]) <= 1
    assert len({sum(s) for s in sizes.values()}) == 1  # the same training patients


def test_features_are_scaled_to_the_training_range_and_folds_hold_a_centre_out():
    centres, _ = survival.split("gbsg2", "balanced", 0)
    x = np.vstack([c[0] for c in centres])
    assert x.min() == 0.0 and x.max() == 1.0
    fold = deepcox_task("gbsg2", "hub", 0, None, 0).load()
    assert fold.n_clients == 7
    hub = survival.split("gbsg2", "hub", 0)[0][0]
    assert len(fold.pooled_test) == len(hub[1])
    with pytest.raises(ConfigError, match="unknown survival scenario"):
        survival.split("gbsg2", "skewed", 0)


def test_the_rate_decays_only_when_the_epoch_loss_rises_and_never_below_the_floor():
    rule = DecayOnIncrease(floor=0.01)
    assert rule.rate(0.1) == 0.1
    for losses in ([3.0, 3.0], [2.0, 2.0], [2.5, 2.5], [4.0]):  # epochs 1, 2, 3, 4
        for loss in losses:
            rule.observe(loss)
        rule.end_epoch()
    # epoch 2 fell (no decay); epoch 3 rose: lr / sqrt(3); epoch 4 rose: / sqrt(4), floored
    assert rule.lr == pytest.approx(max(0.1 / np.sqrt(3) / 2, 0.01))
    restored = DecayOnIncrease(floor=0.01)
    restored.load_state_dict(rule.state_dict())
    assert restored.state_dict() == rule.state_dict()
    with pytest.raises(StateError):
        restored.load_state_dict({"lr": 0.1})


def test_the_first_layer_penalty_enters_every_local_step():
    data = deepcox_task("gbsg2", "balanced").load().train[0]
    torch.manual_seed(0)
    start = torch.nn.utils.parameters_to_vector(survival.make_model("gbsg2").parameters())
    updates = []
    for penalty in (None, lambda m: 10.0 * next(m.parameters()).abs().sum()):
        trainer = LocalTrainer(
            survival.make_model("gbsg2"), data, lambda o, y: o.sum() * 0, 16, 0, penalty=penalty
        )
        updates.append(trainer.train(start.detach().double().numpy(), lr=0.1, steps=3))
    assert not np.any(updates[0])  # a zero loss moves nothing
    first_layer = next(survival.make_model("gbsg2").parameters()).numel()
    assert np.all(np.abs(updates[1][:first_layer]) > 0) and not np.any(updates[1][first_layer:])
