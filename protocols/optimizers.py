"""Server optimizers applied to the aggregated pseudo-gradient.

Conventions follow FLamby (``flamby/strategies/fed_opt.py``): the pseudo-gradient is
``g = new − old`` (a descent direction already), the optimizer turns it into an *update* that
is **added** to the global model, Adam/Yogi/Adagrad have no bias correction, ``tau`` is added
to ``sqrt(v)``, and all moments start at zero.

Each optimizer is a small object with

- ``step(g, params)``: advance the state and return the update (the server does this once per
  round); ``params`` is the model the update is added to, which only a proximal step reads
  (ADMM's z-update, ``secagg.protocols.admm``);
- ``peek(g, params)``: the update ``step`` would return, without touching the state (LARC's
  clients evaluate candidate updates with the server optimizer's *current* state);
- ``config`` / ``state_dict()`` / :func:`make_optimizer`: enough to rebuild an identical copy
  elsewhere (a client replica), with nothing but plain floats and arrays.

RoLePRO's names: OptAlgo A is server SGD with lr 1 plus a step schedule of the *client* learning
rate (see :class:`StepSchedule`), OptAlgo B is :class:`Momentum`, OptAlgo C is :class:`Adam`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError
from secagg.wire import Envelope, Field


class ServerOptimizer:
    name = "abstract"

    def __init__(self, dim: int, **hyper: float):
        self.dim = dim
        self.hyper = hyper
        self.state = {k: np.zeros(dim) for k in self.state_names}

    state_names: tuple[str, ...] = ()

    # subclasses implement the pure update rule
    def _rule(self, g: np.ndarray, state: dict[str, np.ndarray]):
        """Return (update, new_state) without mutating ``state``."""
        raise NotImplementedError

    def _update(self, g: np.ndarray, state: dict[str, np.ndarray], params: np.ndarray | None):
        """The one hook a step that reads the model overrides (a proximal step)."""
        return self._rule(g, state)

    def step(self, g: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
        update, self.state = self._update(self._check(g), self.state, params)
        return update

    def step_part(self, g: np.ndarray, params: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
        """:meth:`step` on the coordinates [lo, hi) only (a round in parts: every rule here
        is elementwise, so the parts' steps make the whole step): ``g`` and ``params`` are
        that slice's, and only that slice of the state moves."""
        g = np.asarray(g, dtype=np.float64)
        if not 0 <= lo < hi <= self.dim or g.shape != (hi - lo,):
            raise ValueError(f"a part [{lo}, {hi}) of shape {g.shape} in a model of {self.dim}")
        part = {k: v[lo:hi] for k, v in self.state.items()}
        update, moved = self._update(g, part, params)
        for k, v in moved.items():
            self.state[k][lo:hi] = v
        return update

    def peek(self, g: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
        update, _ = self._update(self._check(g), self.state, params)
        return update

    @property
    def config(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, **self.hyper}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if set(state) != set(self.state_names):
            raise ConfigError(f"{self.name} state needs {self.state_names}, got {sorted(state)}")
        self.state = {k: np.asarray(state[k], dtype=np.float64).reshape(self.dim) for k in state}

    def _check(self, g: np.ndarray) -> np.ndarray:
        g = np.asarray(g, dtype=np.float64)
        if g.shape != (self.dim,):
            raise ValueError(f"pseudo-gradient has shape {g.shape}, expected ({self.dim},)")
        return g


class SGD(ServerOptimizer):
    """update = lr · g. FedAvg is SGD with lr 1."""

    name = "sgd"

    def __init__(self, dim: int, lr: float = 1.0):
        super().__init__(dim, lr=lr)

    def _rule(self, g, state):
        return self.hyper["lr"] * g, state


class Momentum(ServerOptimizer):
    """RoLePRO OptAlgo B: m ← β·m + g; update = lr · m."""

    name = "momentum"
    state_names = ("m",)

    def __init__(self, dim: int, lr: float = 0.1, beta: float = 0.9):
        super().__init__(dim, lr=lr, beta=beta)

    def _rule(self, g, state):
        m = self.hyper["beta"] * state["m"] + g
        return self.hyper["lr"] * m, {"m": m}


class _Adaptive(ServerOptimizer):
    state_names = ("m", "v")

    def __init__(
        self, dim: int, lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.999, tau: float = 1e-8
    ):
        super().__init__(dim, lr=lr, beta1=beta1, beta2=beta2, tau=tau)

    def _second_moment(self, v: np.ndarray, g2: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _rule(self, g, state):
        h = self.hyper
        m = h["beta1"] * state["m"] + (1 - h["beta1"]) * g
        v = self._second_moment(state["v"], g * g)
        return h["lr"] * m / (np.sqrt(v) + h["tau"]), {"m": m, "v": v}


class Adam(_Adaptive):
    """FedAdam (Reddi et al. 2021, FLamby): v ← β2·v + (1−β2)·g²."""

    name = "adam"

    def _second_moment(self, v, g2):
        return self.hyper["beta2"] * v + (1 - self.hyper["beta2"]) * g2


class Yogi(_Adaptive):
    """FedYogi: v ← v − (1−β2)·g²·sign(v − g²)."""

    name = "yogi"

    def _second_moment(self, v, g2):
        return v - (1 - self.hyper["beta2"]) * g2 * np.sign(v - g2)


class Adagrad(_Adaptive):
    """FedAdagrad: v ← v + g²."""

    name = "adagrad"

    def _second_moment(self, v, g2):
        return v + g2


OPTIMIZERS: dict[str, type[ServerOptimizer]] = {
    c.name: c for c in (SGD, Momentum, Adam, Yogi, Adagrad)
}


def register_optimizer(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
    """Make ``cls`` available by its ``name`` (configs, client replicas); a decorator."""
    if cls.name in OPTIMIZERS and OPTIMIZERS[cls.name] is not cls:
        raise ConfigError(f"server optimizer {cls.name!r} is already registered")
    OPTIMIZERS[cls.name] = cls
    return cls


def make_optimizer(
    config: dict[str, Any], state: dict[str, np.ndarray] | None = None
) -> ServerOptimizer:
    """Build an optimizer from ``opt.config`` (and optionally ``opt.state_dict()``)."""
    config = dict(config)
    name = config.pop("name", None)
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown server optimizer {name!r}; choose from {sorted(OPTIMIZERS)}")
    try:
        opt = OPTIMIZERS[name](**config)
    except TypeError as exc:
        raise ConfigError(f"bad settings for server optimizer {name!r}: {exc}") from None
    if state is not None:
        opt.load_state_dict(state)
    return opt


@dataclass(frozen=True)
class StepSchedule:
    """A piecewise-constant client learning rate: ``lrs[k]`` from round ``starts[k]`` on.

    RoLePRO's OptAlgo A is server SGD (lr 1) with the client rate 5e-5 for rounds 0–6 and
    5e-6 afterwards: ``StepSchedule(starts=(0, 7), lrs=(5e-5, 5e-6))``.
    """

    starts: tuple[int, ...] = (0,)
    lrs: tuple[float, ...] = field(default=(0.1,))

    def __post_init__(self):
        if len(self.starts) != len(self.lrs) or not self.starts or self.starts[0] != 0:
            raise ConfigError(
                "a learning-rate schedule needs one rate per start, the first at round 0"
            )
        if list(self.starts) != sorted(set(self.starts)):
            raise ConfigError(f"schedule starts must increase strictly, got {self.starts}")
        if any(not (lr > 0) for lr in self.lrs):
            raise ConfigError(f"learning rates must be positive, got {self.lrs}")

    def at(self, round_number: int) -> float:
        lr = self.lrs[0]
        for start, value in zip(self.starts, self.lrs):
            if round_number >= start:
                lr = value
        return lr

    @classmethod
    def parse(cls, text: str, what: str = "learning-rate") -> StepSchedule:
        """Parse ``"0.1"`` or ``"5e-5@0,5e-6@7"`` (rate@first-round, comma separated);
        ``what`` names the schedule in errors ("client-lr", "server-lr")."""
        starts, lrs = [], []
        try:
            for item in str(text).split(","):
                lr, _, start = item.strip().partition("@")
                lrs.append(float(lr))
                starts.append(int(start) if start else 0)
        except ValueError:
            raise ConfigError(
                f"cannot read {what} schedule {text!r}; write e.g. 0.1 or 5e-5@0,5e-6@7"
            ) from None
        try:
            return cls(tuple(starts), tuple(lrs))
        except ConfigError as exc:
            raise ConfigError(f"{what} schedule {text!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- shipping an optimizer to clients (LARC's probe phase) ------------------------------
def optimizer_fields(opt: ServerOptimizer, prefix: str = "server_opt") -> dict[str, Field]:
    """The optimizer's settings and current state as wire fields.

    Its state is a function of past *global* updates, which the server already revealed, so
    sending it in plaintext discloses nothing new; the audit still lists it.
    """
    fields = {prefix: wire.config(opt.config)}
    for key, value in opt.state.items():
        fields[f"{prefix}.{key}"] = wire.vector(value)
    return fields


def optimizer_from_envelope(
    env: Envelope, prefix: str = "server_opt", config: dict[str, Any] | None = None
) -> ServerOptimizer:
    """The optimizer an envelope carries; ``config``: its config, already read (and checked)."""
    cfg = env.config(prefix) if config is None else config
    opt = make_optimizer(cfg)
    opt.load_state_dict({k: env.vector(f"{prefix}.{k}", opt.dim) for k in opt.state_names})
    return opt
