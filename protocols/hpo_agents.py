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
        sizes = {
            len(self.names),
            len(self.lows),
            len(self.highs),
            len(self.log_scale),
            len(self.integer),
        }
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

    def __init__(
        self, shapes: list[tuple[int, ...]], lr: float, betas=(0.9, 0.999), eps: float = 1e-8
    ):
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
            p += self.lr * (m / (1 - b1**self.t)) / (np.sqrt(v / (1 - b2**self.t)) + self.eps)


def gaussian_log_prob(h: np.ndarray, mu: np.ndarray, log_sigma: np.ndarray) -> float:
    z = (h - mu) / np.exp(log_sigma)
    return float(np.sum(-0.5 * z * z - log_sigma - 0.5 * math.log(2 * math.pi)))


def gaussian_log_prob_grads(h, mu, log_sigma) -> tuple[np.ndarray, np.ndarray]:
    """∂/∂μ and ∂/∂log σ of log N(h | μ, σ²) (diagonal)."""
    sigma2 = np.exp(2 * log_sigma)
    return (h - mu) / sigma2, (h - mu) ** 2 / sigma2 - 1.0


class _Agent:
    """Shared windowed REINFORCE: subclasses give log-probability gradients."""

    #: the distribution's parameters ψ = (μ, log σ), and the Adam ascending the trainable
    #: parameters (ψ itself, or an MLP's weights): every subclass sets them in ``__init__``
    mu: np.ndarray
    log_sigma: np.ndarray
    optimizer: Adam

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
        recent = self.history[-(self.window + 1) :]
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

    def __init__(
        self, dim: int, lr: float = 1e-2, window: int = 5, init_sigma: float = 0.3, seed: int = 0
    ):
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

    def __init__(
        self,
        dim: int,
        points: int = 5,
        lr: float = 1e-2,
        window: int = 5,
        init_sigma: float = 0.5,
        seed: int = 0,
    ):
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
        d_mu = (self.grid - self.mu) / sigma2  # ∂ logit_j / ∂μ
        d_ls = (self.grid - self.mu) ** 2 / sigma2  # ∂ logit_j / ∂log σ
        i = self._index(h)
        return [d_mu[i] - p @ d_mu, d_ls[i] - p @ d_ls]

    def sample(self) -> np.ndarray:
        self._last = self.grid[self.rng.choice(len(self.grid), p=self.probabilities())].copy()
        return self._last.copy()


class MLPAgent(ContinuousAgent):
    """Auto-FedRL(MLP): ψ^q = ψ^{q−1} + s·tanh(W2·tanh(W1·ψ^{q−1} + b1) + b2), ψ = (μ, log σ).

    The MLP's weights θ = (W1, b1, W2, b2) learn. ψ^q depends on θ through every earlier
    application of the map, and the policy gradient has to see that (the authors' port keeps
    the whole autograd graph across rounds for it); here the Jacobian J^q = dψ^q/dθ is carried
    forward exactly (real-time recurrent learning: J^q = J^{q−1} + s·diag(1 − t²)·dz/dθ), so
    ∇_θ log P(h | ψ^q) = (∂ log P / ∂ψ)ᵀ J^q. W2 starts at zero: the agent starts as the
    identity map. ψ is not clipped (a clip would cut the gradient at the bound); the tanh
    bounds each round's change by s.
    """

    def __init__(
        self,
        dim: int,
        hidden: int = 16,
        lr: float = 1e-2,
        window: int = 5,
        init_sigma: float = 0.3,
        max_step: float = 0.02,
        seed: int = 0,
    ):
        super().__init__(dim, lr, window, init_sigma, seed)
        if not max_step > 0:
            raise ConfigError(f"max_step must be positive, got {max_step}")
        self.max_step, self.hidden = max_step, hidden
        n = 2 * dim
        self.w1 = self.rng.normal(0, 1 / math.sqrt(n), (hidden, n))
        self.b1 = np.zeros(hidden)
        self.w2 = np.zeros((n, hidden))
        self.b2 = np.zeros(n)
        self.optimizer = Adam([p.shape for p in self._params()], lr)
        self.psi = np.concatenate([self.mu, self.log_sigma])
        self.jacobian = np.zeros((n, sum(p.size for p in self._params())))
        self._advance()

    def _params(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def _advance(self) -> None:
        """ψ ← ψ + s·tanh(z), and J ← J + s·diag(1 − t²)·dz/dθ (total derivative)."""
        n, hid = self.psi.size, self.hidden
        a = np.tanh(self.w1 @ self.psi + self.b1)
        t = np.tanh(self.w2 @ a + self.b2)
        du = self.w1 @ self.jacobian  # du/dθ through ψ, plus u's own parameters:
        du[:, : hid * n] += np.kron(np.eye(hid), self.psi)  # ∂u/∂W1
        du[:, hid * n : hid * n + hid] += np.eye(hid)  # ∂u/∂b1
        dz = self.w2 @ ((1 - a * a)[:, None] * du)
        off = hid * n + hid
        dz[:, off : off + n * hid] += np.kron(np.eye(n), a)  # ∂z/∂W2
        dz[:, off + n * hid :] += np.eye(n)  # ∂z/∂b2
        self.jacobian = self.jacobian + self.max_step * (1 - t * t)[:, None] * dz
        self.psi = self.psi + self.max_step * t
        self.mu, self.log_sigma = self.psi[: self.dim].copy(), self.psi[self.dim :].copy()

    def _grads(self, h):
        g_psi = np.concatenate(gaussian_log_prob_grads(h, self.mu, self.log_sigma))
        flat = g_psi @ self.jacobian
        out, pos = [], 0
        for p in self._params():
            out.append(flat[pos : pos + p.size].reshape(p.shape))
            pos += p.size
        return out

    def _after_step(self) -> None:
        self._advance()  # the next round's ψ from this one, with the updated MLP
