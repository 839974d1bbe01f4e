"""Server optimizers against their formulas (FLamby semantics: update added, no bias correction)."""

import numpy as np
import pytest

from secagg.errors import ConfigError
from secagg.protocols.optimizers import (
    SGD,
    Adagrad,
    Adam,
    Momentum,
    StepSchedule,
    Yogi,
    make_optimizer,
)

G1 = np.array([0.5, -2.0, 0.0])
G2 = np.array([-1.0, 1.0, 3.0])


def test_sgd_scales_by_lr():
    np.testing.assert_allclose(SGD(3, lr=0.5).step(G1), 0.5 * G1)


def test_momentum_accumulates_without_dampening():
    opt = Momentum(3, lr=0.1, beta=0.9)
    np.testing.assert_allclose(opt.step(G1), 0.1 * G1)
    np.testing.assert_allclose(opt.step(G2), 0.1 * (0.9 * G1 + G2))


def test_adam_two_steps_match_formula():
    lr, b1, b2, tau = 0.1, 0.9, 0.999, 1e-3
    opt = Adam(3, lr=lr, beta1=b1, beta2=b2, tau=tau)
    m1, v1 = (1 - b1) * G1, (1 - b2) * G1**2
    np.testing.assert_allclose(opt.step(G1), lr * m1 / (np.sqrt(v1) + tau))
    m2, v2 = b1 * m1 + (1 - b1) * G2, b2 * v1 + (1 - b2) * G2**2
    np.testing.assert_allclose(opt.step(G2), lr * m2 / (np.sqrt(v2) + tau))


def test_yogi_second_moment_uses_sign_rule():
    b2, tau = 0.999, 1e-8
    opt = Yogi(3, lr=1.0, beta1=0.0, beta2=b2, tau=tau)
    opt.step(G1)
    v1 = 0 - (1 - b2) * G1**2 * np.sign(0 - G1**2)  # from v0 = 0: v1 = (1-b2) g^2
    np.testing.assert_allclose(opt.state["v"], v1)
    opt.step(G2)
    v2 = v1 - (1 - b2) * G2**2 * np.sign(v1 - G2**2)
    np.testing.assert_allclose(opt.state["v"], v2)


def test_adagrad_sums_squares():
    opt = Adagrad(3, lr=1.0, beta1=0.9, tau=1e-8)
    opt.step(G1)
    opt.step(G2)
    np.testing.assert_allclose(opt.state["v"], G1**2 + G2**2)


def test_peek_does_not_advance_state():
    opt = Adam(3, lr=0.1, tau=1e-3)
    opt.step(G1)
    before = opt.state_dict()
    peeked = opt.peek(G2)
    for k in before:
        np.testing.assert_array_equal(opt.state[k], before[k])
    np.testing.assert_allclose(opt.step(G2), peeked)


def test_rebuild_from_config_and_state_gives_identical_updates():
    opt = Yogi(3, lr=0.2, tau=1e-4)
    opt.step(G1)
    copy = make_optimizer(opt.config, opt.state_dict())
    np.testing.assert_allclose(copy.step(G2), opt.step(G2))


def test_bad_optimizer_configs_are_config_errors():
    with pytest.raises(ConfigError, match="unknown server optimizer"):
        make_optimizer({"name": "rmsprop", "dim": 3})
    with pytest.raises(ConfigError, match="bad settings"):
        make_optimizer({"name": "sgd", "dim": 3, "beta": 0.9})
    with pytest.raises(ConfigError, match="state needs"):
        make_optimizer({"name": "adam", "dim": 3}, {"m": np.zeros(3)})


def test_wrong_gradient_shape_is_refused():
    with pytest.raises(ValueError, match="shape"):
        SGD(3).step(np.zeros(4))


def test_step_schedule_optalgo_a():
    sched = StepSchedule.parse("5e-5@0,5e-6@7")
    assert [sched.at(r) for r in (0, 6, 7, 12)] == [5e-5, 5e-5, 5e-6, 5e-6]
    assert StepSchedule.parse("0.1").at(99) == 0.1


@pytest.mark.parametrize("text", ["fast", "0.1@3", "0.1@0,0.2@0", "-1", "0.1@0,0.05@x"])
def test_bad_schedules_are_config_errors(text):
    with pytest.raises(ConfigError):
        StepSchedule.parse(text)
