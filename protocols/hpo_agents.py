"""Auto-FedRL's online hyperparameter agents (Guo et al., MICCAI 2022, §3.2, Eq. 6–10).

An agent keeps a distribution P(h | ψ) over a normalised hyperparameter vector h ∈ [−1, 1]^D,
draws h^q for round q and, once the round's reward r^q is known, updates ψ by REINFORCE with
a windowed baseline (Eq. 8–9): it ascends Σ_{τ=q−Z}^{q} (r^τ − r̂^q) log P(h^τ | ψ), r̂^q the
mean reward of the window, with Adam (γ_h = 1e-2). (Eq. 8 writes "ψ − γ_h ∇": the descent
step on the negated objective.) The window's log-probabilities are evaluated at the current
ψ, so only the window's actions and rewards are kept between rounds. Gradients are written
out (Gaussian log-densities, a one-hidden-layer MLP): the server side needs no torch.

Agents, as small classes with ``sample`` / ``step`` (like Opacus' accountants):

- :class:`ContinuousAgent` — Auto-FedRL(CS): h ~ N(μ, diag σ²), ψ = (μ, log σ);
- :class:`DiscreteAgent` — Auto-FedRL(DS): a discrete Gaussian over a grid of ``points``
  values per dimension; every grid point's probability is computed, so memory and time
  grow as points^D (the paper's Table 2 point);
- :class:`MLPAgent` — Auto-FedRL(MLP): ψ^q = ψ^{q−1} + s·tanh(MLP(ψ^{q−1})); the MLP's
  weights learn. The bounded increment (s = 0.02, one hundredth of the range per unit, as in
  the authors' NVFlare port) keeps the iterated map from running away.

After each step μ is kept in [−1, 1] (a mean outside the range would only ever yield clipped
samples) and σ in [0.02, 2] (a vanishing σ makes log P explode and ends exploration): a
projection the paper does not mention; the authors' port clamps μ the same way.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from secagg.errors import ConfigError


MU_BOUND = 1.0
LOG_SIGMA_BOUNDS = (math.log(0.02), math.log(2.0))


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
        if not lr > 0:
            raise ConfigError(f"the agent's learning rate must be positive, got {lr}")
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
        np.clip(self.mu, -MU_BOUND, MU_BOUND, out=self.mu)
        np.clip(self.log_sigma, *LOG_SIGMA_BOUNDS, out=self.log_sigma)

    @property
    def state(self) -> dict[str, list[float]]:
        """The current distribution's mean and standard deviation (for logs and plots)."""
        return {"mu": self.mu.tolist(), "sigma": np.exp(self.log_sigma).tolist()}


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
    """Auto-FedRL(MLP): ψ^q = clip(ψ^{q−1} + s·tanh(W2·tanh(W1·ψ^{q−1} + b1) + b2)), with
    ψ = (μ, log σ); the MLP's weights (W1, b1, W2, b2) learn. W2 starts at zero, so the agent
    starts as the identity map (it behaves like CS with a frozen ψ until it has learned)."""

    def __init__(self, dim: int, hidden: int = 16, lr: float = 1e-2, window: int = 5,
                 init_sigma: float = 0.3, max_step: float = 0.02, seed: int = 0):
        super().__init__(dim, lr, window, init_sigma, seed)
        if not max_step > 0:
            raise ConfigError(f"max_step must be positive, got {max_step}")
        self.max_step = max_step
        self.psi = np.concatenate([self.mu, self.log_sigma])
        self.w1 = self.rng.normal(0, 1 / math.sqrt(2 * dim), (hidden, 2 * dim))
        self.b1 = np.zeros(hidden)
        self.w2 = np.zeros((2 * dim, hidden))
        self.b2 = np.zeros(2 * dim)
        self.optimizer = Adam([p.shape for p in self._params()], lr)
        self._lows = np.concatenate([np.full(dim, -MU_BOUND), np.full(dim, LOG_SIGMA_BOUNDS[0])])
        self._highs = np.concatenate([np.full(dim, MU_BOUND), np.full(dim, LOG_SIGMA_BOUNDS[1])])

    def _params(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def _forward(self):
        a = np.tanh(self.w1 @ self.psi + self.b1)
        t = np.tanh(self.w2 @ a + self.b2)
        raw = self.psi + self.max_step * t
        out = np.clip(raw, self._lows, self._highs)
        free = (raw == out).astype(np.float64)  # clipped outputs pass no gradient
        return out[:self.dim], out[self.dim:], (a, t, free)

    def _grads(self, h):
        mu, log_sigma, (a, t, free) = self._forward()
        g_out = np.concatenate(gaussian_log_prob_grads(h, mu, log_sigma)) * free
        g_z = g_out * self.max_step * (1 - t * t)
        g_pre = (self.w2.T @ g_z) * (1 - a * a)
        return [np.outer(g_pre, self.psi), g_pre, np.outer(g_z, a), g_z]

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
        self.mu, self.log_sigma = mu.copy(), log_sigma.copy()
