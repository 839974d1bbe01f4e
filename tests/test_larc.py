"""LARC arithmetic against hand-computed cases, and its client-side ΔL."""

import math

import numpy as np
import pytest
import torch

from secagg.clients.tasks import tcga_brca
from secagg.clients.training import LocalTrainer
from secagg.errors import ConfigError
from secagg.protocols.larc import LARC, delta_loss, larc_weights
from secagg.protocols.optimizers import SGD, Adam


def test_equal_delta_losses_give_weight_one():
    np.testing.assert_allclose(larc_weights(np.zeros(6)), np.ones(6))


def test_weights_hand_computed():
    # q=1, ΔL=[0, ln 2]: softmax(−ΔL) ∝ [1, 1/2] -> p/max p = [1, 1/2]
    # α = ([1, 1/2] + b) / (1 + b) with b = 0.5 -> [1, 2/3]
    alpha = larc_weights(np.array([0.0, math.log(2)]), q=1.0, b=0.5)
    np.testing.assert_allclose(alpha, [1.0, 2 / 3])
    np.testing.assert_allclose(
        larc_weights(np.array([0.0, math.log(2)]), q=1.0, b=0.5, normalize=True), [0.6, 0.4]
    )


def test_weights_floor_is_b_over_1_plus_b():
    alpha = larc_weights(np.array([0.0, 10.0]), q=19, b=0.5)
    assert alpha[0] == 1.0 and alpha[1] == pytest.approx(0.5 / 1.5)


def test_larger_delta_loss_gets_smaller_weight():
    alpha = larc_weights(np.array([0.01, -0.02, 0.03]), q=19, b=0.5)
    assert alpha[1] > alpha[0] > alpha[2]


def test_delta_loss_hand_computed_with_sgd_and_quadratic_loss():
    # L(w) = ||w||², U = SGD lr 1 (update = g); w = [1, 0], g_i = [1, 1], Ĝ = [3, 1], α = 0.5
    loss = lambda w: float(np.sum(w**2))
    w, g_i, g_hat = np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([3.0, 1.0])
    # L1 = L([1.5, 0.5]) = 2.5 ; L2 = L(w + Ĝ − 0.5 g_i) = L([3.5, 0.5]) = 12.5
    assert delta_loss(loss, w, g_i, g_hat, 0.5, SGD(2).peek) == pytest.approx(2.5 - 12.5)


def test_delta_loss_uses_optimizer_state_without_advancing_it():
    opt = Adam(2, lr=0.1, tau=1e-3)
    opt.step(np.array([1.0, -1.0]))
    state = opt.state_dict()
    loss = lambda w: float(np.sum(w))
    w, g = np.zeros(2), np.array([0.2, 0.1])
    expected = loss(w + opt.peek(0.5 * g)) - loss(w + opt.peek(np.ones(2) - 0.5 * g))
    assert delta_loss(loss, w, g, np.ones(2), 0.5, opt.peek) == pytest.approx(expected)
    np.testing.assert_array_equal(opt.state["m"], state["m"])


def test_dropping_the_bias_does_not_change_the_cox_loss():
    """Why the team's 'weights only' loss check is harmless on this task."""
    torch.manual_seed(0)
    data = tcga_brca.load("flamby").train[0]
    trainer = LocalTrainer(tcga_brca.make_model(), data, tcga_brca.cox_loss, 8, seed=0)
    w = np.random.default_rng(0).normal(size=40)
    w[-1] = 3.0  # a large bias
    assert trainer.loss_at(w, drop_bias=True) == pytest.approx(trainer.loss_at(w), rel=1e-6)


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="loss_check"):
        LARC(loss_check="bias_only")
    with pytest.raises(ConfigError, match="b >= 0"):
        LARC(b=-1)
