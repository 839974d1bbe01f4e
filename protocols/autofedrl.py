"""Auto-FedRL: online RL hyperparameter search during one federated run (Guo et al., MICCAI
2022, Alg. 1, Fig. 3).

Round q:

1. the agent samples h^q ~ P(H | ψ^q): the client learning rate, the local iterations, one
   aggregation weight per client and the server learning rate (whichever are searched);
2. clients train from Θ^q with h^q's learning rate and iterations and upload their
   pseudo-gradients Δ_k (the engine's training phase);
3. the server forms Δ^q = Σ_k p_k Δ_k with p_k ∝ n_k · exp(aw_k) and steps SGD with h^q's
   server learning rate: Θ^{q+1} = Θ^q + γ_s Δ^q (Eq. 3);
4. clients report their validation loss of Θ^{q+1}; the reward is the relative reduction of
   the mean, r^q = (L^q − L^{q+1}) / L^q (Eq. 4–5), and the agent steps (Eq. 8–9).

The agents are in ``protocols.hpo_agents``. Aggregation weights: the paper leaves their
parametrisation open; the authors' NVFlare port turns the searched values aw_k ∈ [0.1, 1]
into softmax(aw)_k and its aggregator multiplies them by each contribution's size, which is
the p_k above. Search ranges default to the port's (client lr 5e-4–5e-2, server lr 0.5–1.5);
local iterations are local SGD steps, 2–40. The initial σ = 0.66 (in units where the range
spans [−1, 1]) is the port's initial precision 85; the window Z = 5 is its cutoff interval.

On an encrypted backend nothing changes for the updates (the weights are chosen before the
upload, so Δ^q is one weighted sum); the server additionally learns every client's
validation loss, declared as ``val_loss``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg.errors import ConfigError
from secagg.protocols.base import Allowed, Capabilities, Protocol, RoundAPI, Upload
from secagg.protocols.hpo_agents import ContinuousAgent, DiscreteAgent, MLPAgent, SearchSpace
from secagg.protocols.pieces import ValidationFeedback
from secagg.protocols.registry import Example, register_protocol

SEARCHABLE = ("client_lr", "local_steps", "aggregation_weights", "server_lr")
AGENTS = ("cs", "ds", "mlp")


def relative_loss_reduction(previous: float, current: float) -> float:
    """Eq. 5: r = (L^q − L^{q+1}) / L^q."""
    if not previous > 0:
        raise ValueError(f"the previous mean validation loss must be positive, got {previous}")
    return (previous - current) / previous


def searched_weights(n_samples: Mapping[str, float], aw: Mapping[str, float]) -> dict[str, float]:
    """p_k = n_k · exp(aw_k) / Σ_j n_j · exp(aw_j)  (sample sizes times softmax(aw))."""
    clients = list(n_samples)
    logits = np.array([np.log(n_samples[c]) + aw[c] for c in clients])
    p = np.exp(logits - logits.max())
    return dict(zip(clients, (p / p.sum()).tolist()))


def parse_range(text: Any, name: str) -> tuple[float, float]:
    """``"5e-4:5e-2"`` -> (5e-4, 5e-2)."""
    try:
        lo, hi = (float(v) for v in str(text).split(":"))
    except ValueError:
        raise ConfigError(f"{name} must be written low:high, got {text!r}") from None
    if not lo < hi:
        raise ConfigError(f"{name} needs low < high, got {text!r}")
    return lo, hi


class AutoFedRL(Protocol, ValidationFeedback):
    name = "autofedrl"
    # this round's weights are drawn before training, so the uploads stream
    capabilities = Capabilities(
        reveals=("val_loss", "global_update"),
        client_scalars=("val_loss",),
        streams=True,
        weights_vary=True,  # the agent searches the aggregation weights every round
    )

    def __init__(
        self,
        agent: str = "cs",
        search: str = "client_lr,local_steps,aggregation_weights,server_lr",
        agent_lr: float = 1e-2,
        window: int = 5,
        init_sigma: float = 0.66,
        grid_points: int = 3,
        client_lr_range: str = "5e-4:5e-2",
        local_steps_range: str = "2:40",
        aggregation_weight_range: str = "0.1:1",
        server_lr_range: str = "0.5:1.5",
    ):
        if agent not in AGENTS:
            raise ConfigError(f"agent must be one of {AGENTS}, got {agent!r}")
        self.searched = tuple(s.strip() for s in str(search).split(",") if s.strip())
        unknown = set(self.searched) - set(SEARCHABLE)
        if unknown or not self.searched:
            raise ConfigError(
                f"search takes a comma-separated subset of {SEARCHABLE}, got {search!r}"
            )
        if grid_points < 2:
            raise ConfigError(f"grid_points must be at least 2, got {grid_points}")
        if not 0 < init_sigma <= 2:
            raise ConfigError(f"init_sigma must lie in (0, 2], got {init_sigma}")
        self.agent_kind, self.agent_lr, self.window = agent, agent_lr, window
        self.init_sigma, self.grid_points = init_sigma, grid_points
        self.ranges = {
            "client_lr": parse_range(client_lr_range, "client_lr_range"),
            "local_steps": parse_range(local_steps_range, "local_steps_range"),
            "aggregation_weights": parse_range(
                aggregation_weight_range, "aggregation_weight_range"
            ),
            "server_lr": parse_range(server_lr_range, "server_lr_range"),
        }
        if (
            self.ranges["local_steps"][0] < 1
            or self.ranges["client_lr"][0] <= 0
            or self.ranges["server_lr"][0] <= 0
        ):
            raise ConfigError("learning rates must be positive and local steps at least 1")
        self._seed = 0
        self.agent: ContinuousAgent | DiscreteAgent | None = None
        self.space: SearchSpace | None = None
        self.clients: list[str] = []
        self.plan: dict[str, Any] = {}  # this round's hyperparameters
        self._awaiting_reward = False
        self._previous_loss: float | None = None
        self.search_seconds = 0.0  # the agent's own time (sampling and updates)
        self.trajectory: list[dict[str, Any]] = []  # per round: h^q, L^{q+1}, r^q

    def seed(self, seed: int) -> None:
        self._seed = seed

    # ---- the search space -----------------------------------------------------------------
    def _n_dims(self, n_clients: int) -> int:
        return sum(n_clients if k == "aggregation_weights" else 1 for k in self.searched)

    def _build(self, clients: list[str]) -> tuple[ContinuousAgent | DiscreteAgent, SearchSpace]:
        """Dimensions: [client_lr] [local_steps] [aw_k for each client] [server_lr]."""
        self.clients = sorted(clients)
        names, lows, highs, logs, ints = [], [], [], [], []
        for key in SEARCHABLE:
            if key not in self.searched:
                continue
            lo, hi = self.ranges[key]
            dims = [f"aw_{c}" for c in self.clients] if key == "aggregation_weights" else [key]
            for name in dims:
                names.append(name)
                lows.append(lo)
                highs.append(hi)
                logs.append(False)  # linear, like the authors' port
                ints.append(key == "local_steps")
        space = SearchSpace(tuple(names), tuple(lows), tuple(highs), tuple(logs), tuple(ints))
        lr, window, seed = self.agent_lr, self.window, self._seed
        agent: ContinuousAgent | DiscreteAgent
        if self.agent_kind == "ds":
            agent = DiscreteAgent(
                space.dim,
                points=self.grid_points,
                init_sigma=self.init_sigma,
                lr=lr,
                window=window,
                seed=seed,
            )
        elif self.agent_kind == "mlp":
            agent = MLPAgent(space.dim, init_sigma=self.init_sigma, lr=lr, window=window, seed=seed)
        else:
            agent = ContinuousAgent(
                space.dim, init_sigma=self.init_sigma, lr=lr, window=window, seed=seed
            )
        self.space, self.agent = space, agent
        return agent, space

    # ---- the round ----------------------------------------------------------------------
    def begin_round(self, ctx: RoundAPI) -> float | None:
        agent, space = self.agent, self.space
        if agent is None or space is None:  # both are built together, on the first round
            agent, space = self._build(list(ctx.active))
        start = time.perf_counter()
        h = agent.sample()
        self.search_seconds += time.perf_counter() - start
        self.plan = space.values(h)
        self._awaiting_reward = True
        return self.plan.get("server_lr")

    def train_settings(
        self, ctx: RoundAPI, client: str, settings: dict[str, Any]
    ) -> dict[str, Any]:
        if "client_lr" in self.plan:
            settings["lr"] = self.plan["client_lr"]
        if "local_steps" in self.plan:
            settings.pop("epochs", None)
            settings["steps"] = int(self.plan["local_steps"])
        return settings

    def varied_settings(self) -> dict[str, Allowed]:
        """The searched client lr and local steps, within their ranges."""
        names = {"client_lr": "lr", "local_steps": "steps"}
        return {
            names[key]: Allowed(low=self.ranges[key][0], high=self.ranges[key][1])
            for key in names
            if key in self.searched
        }

    def planned_weights(self, ctx: RoundAPI, n_samples: Mapping[str, float]) -> dict[str, float]:
        """n_k·exp(aw_k) / Σ with this round's aw drawn in ``begin_round``: known before the
        uploads, so the server can fold them as they arrive."""
        if "aggregation_weights" in self.searched:
            # a client unknown at round 0 gets the middle of the range
            mid = sum(self.ranges["aggregation_weights"]) / 2
            aw = {c: self.plan.get(f"aw_{c}", mid) for c in n_samples}
        else:
            aw = {c: 0.0 for c in n_samples}
        return searched_weights(n_samples, aw)

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = self.planned_weights(ctx, {c: u.n_samples for c, u in uploads.items()})
        return ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)

    def round_log(self) -> dict[str, float]:
        last = self.trajectory[-1] if self.trajectory else {}
        return {
            **{k: v for k, v in last.items() if k != "round"},
            "agent_seconds": self.search_seconds,
        }

    def observe_validation(self, ctx: RoundAPI, losses: Mapping[str, float]) -> None:
        mean_loss = float(np.mean(list(losses.values())))
        if self._awaiting_reward and self._previous_loss is not None:
            assert self.agent is not None  # begin_round built it before awaiting a reward
            # with scalar DP the reported losses are noised and the mean can be <= 0
            reward = (
                relative_loss_reduction(self._previous_loss, mean_loss)
                if self._previous_loss > 0
                else 0.0
            )
            start = time.perf_counter()
            self.agent.step(reward)
            self.search_seconds += time.perf_counter() - start
            self.trajectory.append(
                {"round": ctx.round, **self.plan, "val_loss": mean_loss, "reward": reward}
            )
            self._awaiting_reward = False
        self._previous_loss = mean_loss


register_protocol(
    "autofedrl",
    AutoFedRL,
    summary="online RL hyperparameter search (needs --validation-split)",
    example=Example(
        # the agent's reward needs the clients' validation losses; they train with Adam
        settings={"task": "digits-dir8", "batch_size": 32, "validation_split": 0.2},
        amplified=True,
    ),
    _builtin=True,
)
