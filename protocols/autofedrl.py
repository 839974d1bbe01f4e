"""Auto-FedRL's online hyperparameter agents (Guo et al., MICCAI 2022, §3.2, Eq. 4–10).

The agent keeps a distribution P(h | ψ) over a normalised hyperparameter vector h (client
learning rate, local iterations, server learning rate, per-client aggregation weights), draws
h^q for round q, and after the round receives the reward

    r^q = (L_h^q − L_h^{q+1}) / L_h^q,   L_h^q = mean_k L_val_k^q      (Eq. 4–5)

and updates ψ by REINFORCE with a windowed baseline (Eq. 8–9): the policy-gradient objective is
Σ_{τ=q−Z}^{q} (r^τ − r̂^q) log P(h^τ | ψ) with r̂^q the mean reward of the window; Adam
(γ_h = 1e-2) ascends it. (Eq. 8 writes "ψ − γ_h ∇": the descent step on the negated
objective.) The log-probabilities of the window's actions are evaluated at the current ψ, so
nothing but the window's actions and rewards is kept between rounds. Gradients are written
out (Gaussian log-densities, a one-hidden-layer MLP), so the server side needs no torch.

Agents, as small classes with ``sample`` / ``step`` (like Opacus' accountants):

- :class:`ContinuousAgent` — Auto-FedRL(CS): h ~ N(μ, diag σ²), ψ = (μ, log σ);
- :class:`DiscreteAgent` — Auto-FedRL(DS): a discrete Gaussian over a normalised grid, the
  probabilities of every grid point computed (its memory grows with the grid: the paper's
  Table 2 point);
- :class:`MLPAgent` — Auto-FedRL(MLP): ψ^q = MLP(ψ^{q−1}), the MLP's weights trained instead.
  Not validated yet: on a 1-D toy reward the iterated map converges for some seeds and drifts
  for others (the CS and DS agents converge; tests/test_autofedrl_agents.py).

This module is the agents' arithmetic; wiring them into a protocol is still to come.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from secagg.errors import ConfigError


def relative_loss_reduction(previous: float, current: float) -> float:
    """Eq. 5: the reward of a round."""
    if not previous > 0:
        raise ValueError(f"the previous mean validation loss must be positive, got {previous}")
    return (previous - current) / previous


@dataclass(frozen=True)
class SearchSpace:
    """Maps a normalised vector in [−1, 1]^D to hyperparameters (log scale where asked)."""

    names: tuple[str, ...]
    lows: tuple[float, ...]
    highs: tuple[float, ...]
    log_scale: tuple[bool, ...]
    integer: tuple[bool, ...]

    def __post_init__(self):
        sizes = {len(self.names), len(self.lows), len(self.highs), len(self.log_scale),
                 len(self.integer)}
        if len(sizes) != 1:
            raise ConfigError("every search-space field needs one entry per hyperparameter")
        if any(not lo < hi for lo, hi in zip(self.lows, self.highs)):
            raise ConfigError("each hyperparameter range needs low < high")
        if any(lg and lo <= 0 for lg, lo in zip(self.log_scale, self.lows)):
            raise ConfigError("log-scale ranges must be positive")

    @property
    def dim(self) -> int:
        return len(self.names)

    def values(self, h: np.ndarray) -> dict[str, float]:
        h = np.clip(np.asarray(h, dtype=np.float64), -1.0, 1.0)
        out = {}
        for i, name in enumerate(self.names):
            lo, hi = self.lows[i], self.highs[i]
            if self.log_scale[i]:
                v = math.exp(math.log(lo) + (h[i] + 1) / 2 * (math.log(hi) - math.log(lo)))
            else:
                v = lo + (h[i] + 1) / 2 * (hi - lo)
            out[name] = float(round(v)) if self.integer[i] else v
        return out


class Adam:
    """Adam (Kingma & Ba) ascending an objective, for the agents' few parameters."""

    def __init__(self, shapes: list[tuple[int, ...]], lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8):
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0
        self.m = [np.zeros(s) for s in shapes]
        self.v = [np.zeros(s) for s in shapes]

    def ascend(self, params: list[np.ndarray], grads: list[np.ndarray]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p += self.lr * (m / (1 - b1 ** self.t)) / (np.sqrt(v / (1 - b2 ** self.t)) + self.eps)


def gaussian_log_prob(h: np.ndarray, mu: np.ndarray, log_sigma: np.ndarray) -> float:
    z = (h - mu) / np.exp(log_sigma)
    return float(np.sum(-0.5 * z * z - log_sigma - 0.5 * math.log(2 * math.pi)))


def gaussian_log_prob_grads(h, mu, log_sigma) -> tuple[np.ndarray, np.ndarray]:
    """∂/∂μ and ∂/∂log σ of log N(h | μ, σ²) (diagonal)."""
    sigma2 = np.exp(2 * log_sigma)
    return (h - mu) / sigma2, (h - mu) ** 2 / sigma2 - 1.0


class _Agent:
    """Shared windowed REINFORCE: subclasses give log-probability gradients."""

    def __init__(self, dim: int, lr: float, window: int, seed: int):
        if window < 0 or dim < 1:
            raise ConfigError(f"need dim >= 1 and window >= 0, got {dim}, {window}")
        self.dim, self.window, self.lr = dim, window, lr
        self.rng = np.random.default_rng(seed)
        self.history: list[tuple[np.ndarray, float]] = []
        self._last: np.ndarray | None = None

    def sample(self) -> np.ndarray:
        raise NotImplementedError

    def _grads(self, h: np.ndarray) -> list[np.ndarray]:
        """Gradients of log P(h | ψ) with respect to the trainable parameters."""
        raise NotImplementedError

    def _params(self) -> list[np.ndarray]:
        raise NotImplementedError

    def step(self, reward: float) -> None:
        """Eq. 8–9: ascend Σ_window (r − r̂) log P(h | ψ) for the last sampled h."""
        if self._last is None:
            raise ConfigError("step() needs a sample() first")
        self.history.append((self._last, float(reward)))
        self._last = None
        recent = self.history[-(self.window + 1):]
        baseline = sum(r for _, r in recent) / len(recent)
        total = [np.zeros_like(p) for p in self._params()]
        for h, r in recent:
            for acc, g in zip(total, self._grads(h)):
                acc += (r - baseline) * g
        self.optimizer.ascend(self._params(), total)
        self._after_step()

    def _after_step(self) -> None:
        pass


class ContinuousAgent(_Agent):
    """Auto-FedRL(CS): a diagonal Gaussian over the normalised search space."""

    def __init__(self, dim: int, lr: float = 1e-2, window: int = 5, init_sigma: float = 0.3,
                 seed: int = 0):
        super().__init__(dim, lr, window, seed)
        self.mu = np.zeros(dim)
        self.log_sigma = np.full(dim, math.log(init_sigma))
        self.optimizer = Adam([(dim,), (dim,)], lr)

    def _params(self):
        return [self.mu, self.log_sigma]

    def _grads(self, h):
        return list(gaussian_log_prob_grads(h, self.mu, self.log_sigma))

    def log_prob(self, h: np.ndarray) -> float:
        return gaussian_log_prob(h, self.mu, self.log_sigma)

    def sample(self) -> np.ndarray:
        self._last = self.mu + np.exp(self.log_sigma) * self.rng.standard_normal(self.dim)
        return self._last.copy()


class DiscreteAgent(_Agent):
    """Auto-FedRL(DS): a discrete Gaussian on a grid of ``points`` values per dimension.

    Every grid point's probability is computed, so memory and time grow as points^D.
    """

    def __init__(self, dim: int, points: int = 5, lr: float = 1e-2, window: int = 5,
                 init_sigma: float = 0.5, seed: int = 0):
        super().__init__(dim, lr, window, seed)
        axis = np.linspace(-1.0, 1.0, points)
        self.grid = np.array(list(itertools.product(axis, repeat=dim)))
        self.mu = np.zeros(dim)
        self.log_sigma = np.full(dim, math.log(init_sigma))
        self.optimizer = Adam([(dim,), (dim,)], lr)

    def _params(self):
        return [self.mu, self.log_sigma]

    def probabilities(self) -> np.ndarray:
        z = (self.grid - self.mu) / np.exp(self.log_sigma)
        logits = np.sum(-0.5 * z * z, axis=1)  # the σ normaliser cancels over the grid
        p = np.exp(logits - logits.max())
        return p / p.sum()

    def log_prob(self, h: np.ndarray) -> float:
        return float(np.log(self.probabilities()[self._index(h)]))

    def _index(self, h: np.ndarray) -> int:
        return int(np.argmin(np.abs(self.grid - h).sum(axis=1)))

    def _grads(self, h):
        p = self.probabilities()
        sigma2 = np.exp(2 * self.log_sigma)
        d_mu = (self.grid - self.mu) / sigma2          # ∂ logit_j / ∂μ
        d_ls = (self.grid - self.mu) ** 2 / sigma2      # ∂ logit_j / ∂log σ
        i = self._index(h)
        return [d_mu[i] - p @ d_mu, d_ls[i] - p @ d_ls]

    def sample(self) -> np.ndarray:
        self._last = self.grid[self.rng.choice(len(self.grid), p=self.probabilities())].copy()
        return self._last.copy()


class MLPAgent(ContinuousAgent):
    """Auto-FedRL(MLP): ψ^q = ψ^{q−1} + MLP(ψ^{q−1}), ψ = (μ, log σ); the MLP's weights
    learn (one tanh hidden layer, output initialised to zero: it starts as the identity)."""

    def __init__(self, dim: int, hidden: int = 16, lr: float = 1e-2, window: int = 5,
                 init_sigma: float = 0.3, seed: int = 0):
        super().__init__(dim, lr, window, init_sigma, seed)
        self.psi = np.concatenate([self.mu, self.log_sigma])
        self.w1 = self.rng.normal(0, 1 / math.sqrt(2 * dim), (hidden, 2 * dim))
        self.b1 = np.zeros(hidden)
        self.w2 = np.zeros((2 * dim, hidden))
        self.b2 = np.zeros(2 * dim)
        self.optimizer = Adam([p.shape for p in self._params()], lr)

    def _params(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def _forward(self):
        a = np.tanh(self.w1 @ self.psi + self.b1)
        out = self.psi + self.w2 @ a + self.b2
        return out[:self.dim], out[self.dim:], a

    def _grads(self, h):
        mu, log_sigma, a = self._forward()
        g_out = np.concatenate(gaussian_log_prob_grads(h, mu, log_sigma))
        g_pre = (self.w2.T @ g_out) * (1 - a * a)
        return [np.outer(g_pre, self.psi), g_pre, np.outer(g_out, a), g_out]

    def log_prob(self, h: np.ndarray) -> float:
        mu, log_sigma, _ = self._forward()
        return gaussian_log_prob(h, mu, log_sigma)

    def sample(self) -> np.ndarray:
        mu, log_sigma, _ = self._forward()
        self._last = mu + np.exp(log_sigma) * self.rng.standard_normal(self.dim)
        return self._last.copy()

    def _after_step(self) -> None:
        mu, log_sigma, _ = self._forward()  # the new ψ is the next round's input
        self.psi = np.concatenate([mu, log_sigma])
