"""Local training: FLamby's persistent batch stream and the pseudo-gradient."""

import numpy as np
import pytest
import torch

from secagg.clients.tasks import tcga_brca
from secagg.clients.training import BatchStream, LocalTrainer, flat_params, set_flat_params


def test_batch_stream_covers_each_epoch_once_with_a_short_last_batch():
    stream = BatchStream(20, 8, np.random.default_rng(0))
    epoch = [stream.next() for _ in range(3)]
    assert [len(b) for b in epoch] == [8, 8, 4]
    assert sorted(np.concatenate(epoch).tolist()) == list(range(20))


def test_batch_stream_position_persists_between_rounds():
    a = BatchStream(20, 8, np.random.default_rng(1))
    b = BatchStream(20, 8, np.random.default_rng(1))
    first_round = [a.next() for _ in range(2)]  # round 1 takes two steps
    second_round = [a.next() for _ in range(2)]  # round 2 continues the same epoch
    reference = [b.next() for _ in range(4)]
    for x, y in zip(first_round + second_round, reference):
        np.testing.assert_array_equal(x, y)
    assert len(second_round[0]) == 4  # the short end of epoch 1, not a fresh epoch


def test_pseudo_gradient_is_new_minus_old_and_deterministic():
    data = tcga_brca.load("flamby").train[5]
    torch.manual_seed(0)
    w0 = flat_params(tcga_brca.make_model())
    runs = []
    for _ in range(2):
        trainer = LocalTrainer(tcga_brca.make_model(), data, tcga_brca.cox_loss, 8, seed=11)
        g = trainer.train(w0, lr=0.1, steps=10)
        np.testing.assert_allclose(flat_params(trainer.model), w0.astype(np.float32) + g, atol=1e-6)
        runs.append(g)
    np.testing.assert_array_equal(runs[0], runs[1])
    assert np.linalg.norm(runs[0]) > 0


def test_set_flat_params_rejects_wrong_size():
    with pytest.raises(ValueError, match="40 parameters"):
        set_flat_params(tcga_brca.make_model(), np.zeros(41))
