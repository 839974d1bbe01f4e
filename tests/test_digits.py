"""The digits image task: label-skewed splits, accuracy, and a short encrypted run."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from secagg.clients.tasks import digits
from secagg.errors import ConfigError
from secagg.simulation.experiment import ExperimentConfig, run_experiment


def labels(part):
    return set(part.y.tolist())


def test_niid2_has_five_two_class_clients_and_one_uniform():
    data = digits.load("niid2")
    assert len(data.train) == 6
    assert [sorted(labels(p)) for p in data.train[:5]] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert labels(data.train[5]) == set(range(10))
    total = sum(len(p) for p in data.train) + len(data.pooled_test)
    assert total == 1797


def test_dirichlet_splits_are_fixed_and_skewed():
    a, b = digits.load("niid1"), digits.load("niid1")
    assert len(a.train) == 10 and torch.equal(a.train[3].y, b.train[3].y)
    shares = [np.bincount(p.y.numpy(), minlength=10) / len(p) for p in a.train if len(p) > 20]
    assert max(s.max() for s in shares) > 0.3  # some client is dominated by one class
    assert len(digits.load("dir8").train) == 8


def test_accuracy_and_unknown_split():
    assert digits.accuracy([0, 1, 1], np.array([[1, 0], [0, 1], [1, 0]])) == pytest.approx(2 / 3)
    with pytest.raises(ConfigError, match="unknown digits split"):
        digits.load("iid")


def test_encrypted_fedavg_learns_digits_in_local_epochs():
    cfg = ExperimentConfig(
        task="digits-niid2",
        protocol="fedavg",
        backend="ckks",
        rounds=3,
        seeds=[0],
        local_epochs=2,
        batch_size=64,
        client_lr="0.5",
    )
    result = run_experiment(cfg)
    final = result.metrics[result.metrics["round"] == 3].iloc[0]
    assert final["test_pooled"] > 0.5  # from ~0.1 at random initialisation
    plain = run_experiment(replace(cfg, backend="plain"))
    # fedavg's default preset is lean, whose flooded sums are ~1e-4 off (measured 2.8e-4)
    assert cfg.resolved_backend_options()["preset"] == "lean"
    assert np.max(np.abs(plain.final_params[0] - result.final_params[0])) < 2e-3
