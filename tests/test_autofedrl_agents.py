"""Auto-FedRL agents: log-probability gradients against finite differences, the windowed
baseline, and learning on a toy problem whose best hyperparameter is known."""

import numpy as np
import pytest

from secagg.errors import ConfigError
from secagg.protocols.autofedrl import relative_loss_reduction
from secagg.protocols.hpo_agents import ContinuousAgent, DiscreteAgent, MLPAgent, SearchSpace


def finite_difference(agent, h, eps=1e-6):
    grads = []
    for p in agent._params():
        g = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + eps
            up = agent.log_prob(h)
            p[idx] = old - eps
            down = agent.log_prob(h)
            p[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize(
    "make", [lambda: ContinuousAgent(3, seed=1), lambda: DiscreteAgent(2, points=4, seed=1)]
)
def test_log_prob_gradients_match_finite_differences(make):
    agent = make()
    rng = np.random.default_rng(0)
    for p in agent._params():  # move off the symmetric start
        p += rng.normal(0, 0.1, p.shape)
    h = agent.sample()
    for analytic, numeric in zip(agent._grads(h), finite_difference(agent, h)):
        np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-6)


def _mlp_after(params, k, dim=2, hidden=4, max_step=0.3):
    """An MLP agent with the given weights, its map applied k times from ψ^0."""
    agent = MLPAgent(dim, hidden=hidden, seed=1, max_step=max_step)
    for p, value in zip(agent._params(), params):
        p[...] = value
    agent.psi = np.concatenate([np.zeros(dim), np.full(dim, np.log(0.3))])
    agent.jacobian[...] = 0.0
    for _ in range(k):
        agent._advance()
    return agent


def test_mlp_gradient_follows_psi_through_every_round():
    """RTRL: the carried Jacobian equals finite differences of the whole k-round chain."""
    rng = np.random.default_rng(0)
    params = [rng.normal(0, 0.5, p.shape) for p in MLPAgent(2, hidden=4, seed=1)._params()]
    agent = _mlp_after(params, k=4)
    h = agent.sample()
    analytic = agent._grads(h)
    eps = 1e-6
    for i, p in enumerate(params):
        numeric = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            up = [q.copy() for q in params]
            down = [q.copy() for q in params]
            up[i][idx] += eps
            down[i][idx] -= eps
            numeric[idx] = (_mlp_after(up, 4).log_prob(h) - _mlp_after(down, 4).log_prob(h)) / (
                2 * eps
            )
        np.testing.assert_allclose(analytic[i], numeric, rtol=1e-4, atol=1e-7)


def test_discrete_probabilities_cover_the_grid():
    agent = DiscreteAgent(3, points=5)
    assert agent.grid.shape == (125, 3)
    assert agent.probabilities().sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ContinuousAgent(1, lr=0.05, window=3, seed=2),
        lambda: DiscreteAgent(1, points=9, lr=0.05, window=3, seed=2),
    ],
)
def test_agents_move_towards_the_rewarding_region(make):
    agent = make()
    best = 0.6
    for _ in range(300):
        h = agent.sample()
        agent.step(-abs(float(h[0]) - best))  # reward peaks at h = 0.6
    draws = [agent.sample()[0] for _ in range(200)]
    agent._last = None
    assert abs(np.mean(draws) - best) < 0.25


def test_reward_and_search_space():
    assert relative_loss_reduction(2.0, 1.5) == 0.25
    with pytest.raises(ValueError):
        relative_loss_reduction(0.0, 1.0)
    space = SearchSpace(
        ("client_lr", "local_iters"), (1e-3, 10), (1e-1, 50), (True, False), (False, True)
    )
    v = space.values(np.array([0.0, 1.0]))
    assert v["client_lr"] == pytest.approx(1e-2) and v["local_iters"] == 50.0
    assert space.values(np.array([-5.0, -5.0])) == {
        "client_lr": pytest.approx(1e-3),
        "local_iters": 10.0,
    }
    with pytest.raises(ConfigError):
        SearchSpace(("a",), (1.0,), (0.5,), (False,), (False,))
    with pytest.raises(ConfigError, match="sample"):
        ContinuousAgent(1).step(0.1)


def test_mlp_agent_starts_as_the_identity_map_and_moves_at_most_max_step():
    # whether the MLP agent learns is measured, not asserted: on the toy reward of
    # test_agents_move_towards_the_rewarding_region its mean oscillates (README, Auto-FedRL)
    agent = MLPAgent(2, hidden=4, init_sigma=0.3, max_step=0.02)
    np.testing.assert_allclose(agent.mu, 0.0)
    np.testing.assert_allclose(np.exp(agent.log_sigma), 0.3)
    for _ in range(5):
        before = agent.psi.copy()
        agent.sample()
        agent.step(1.0)
        assert np.max(np.abs(agent.psi - before)) <= 0.02 + 1e-12


def test_cs_agent_keeps_its_distribution_in_bounds():
    agent = ContinuousAgent(2, lr=0.5, seed=0)
    for _ in range(50):
        h = agent.sample()
        agent.step(float(h.sum()))  # pushes μ up without limit
    assert np.all(agent.mu <= 1.0) and np.all(np.exp(agent.log_sigma) <= 2.0 + 1e-9)
