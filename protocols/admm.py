"""Distributed (global consensus) ADMM, GenoMed4All D6.2 §3.4: the math, in pure functions.

The report's problems (Eq. 3.4–3.7) over x = [w, b] and inputs u = [v, 1] (the bias is
regularised too), N samples in all:

    ridge     (1/N) Σ (xᵀu − y)²                + (λ/2) ‖x‖²
    lasso     (1/N) Σ (xᵀu − y)²                + λ ‖x‖₁
    logistic  (1/N) Σ ln(1 + exp(−y xᵀu))       + (λ/2) ‖x‖²      (y ∈ {−1, +1})
    svm       (1/N) Σ max(1 − y xᵀu, 0)          + (λ/2) ‖x‖²

split over N_b clients as Σ_i g_i(x_i) + h(z) subject to x_i = z, where g_i is client i's
share of the loss (its own samples, still divided by the global N, so that Σ g_i is the
centralised loss). Scaled ADMM (Eq. 3.32):

    x_i ← argmin g_i(x_i) + (ρ/2) ‖x_i − z + w_i‖²               (on client i)
    z   ← argmin h(z) + (N_b ρ/2) ‖z − mean_i (x_i + w_i)‖²       (needs Σ_i (x_i + w_i) only)
    w_i ← w_i + x_i − z                                            (on client i)

with h's minimiser  z = ρ Σ(x_i + w_i) / (λ + N_b ρ)  for the L2 problems (Eq. 3.40) and
z = Soft(Σ(x_i + w_i) / N_b, λ / (N_b ρ))  for the lasso (Eq. 3.23–3.24, distributed).

Deviations chosen, each a correction:
- Eq. 3.23's x-update reads (2/N AᵀA + ρI)⁻¹(2/N Aᵀb − ρ(z − w)); setting the gradient of
  (1/N)‖Ax − b‖² + (ρ/2)‖x − z + w‖² to zero gives **+** ρ(z − w), used here.
- The logistic x-update is not given in closed form by the report: a fixed number of
  gradient steps from the client's previous x_i, as Algorithm 2 does for the SVM with
  subgradient steps (Eq. 3.37–3.38).

How it runs through the engine (``--protocol admm``), on every backend:

- the global model W is z (a linear model ``nn.Linear(d, 1)``, so W = [w, b]); z⁰ is the
  task's initial model, w_i⁰ = 0 and x_i⁰ = z⁰;
- in the training phase client i receives z^k, first finishes the previous iteration with
  w_i ← w_i + x_i − z^k, then solves its x-update and uploads the pseudo-gradient
  x_i + w_i − z^k, protected. Its primal residual ‖x_i − z^k‖² of the iterate it received is
  a declared client scalar (scalar DP noises it when asked);
- the server weighs the uploads 1/N_b (planned, so they stream) and the engine reveals
  G = mean_i(x_i + w_i) − z^k. The z-update is the run's server step (:class:`ConsensusStep`,
  fixed by the protocol): z^{k+1} = prox(z^k + G), Eq. 3.40 or the soft threshold. It reads
  only the revealed mean and z, so a server-blind run works too: the clients open G and apply
  the same step to their copy of z;
- g_i needs the global N (the loss is divided by all samples): the server sends Σ n_i from
  the enrolment, which clients learn and the server already knows.

Deviation in the engine: a client that misses a round keeps its x_i and w_i, and the mean is
over the clients present (the planned weights renormalise), with N_b fixed at the number of
clients: ADMM with partial participation, not the report's synchronous algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import numpy as np

from secagg import wire
from secagg.errors import ClientInputError, ConfigError, ProtocolStateError, StateError
from secagg.options import Flag
from secagg.protocols.base import Capabilities, ClientAPI, ClientHalf, Protocol, RoundAPI, Upload
from secagg.protocols.optimizers import ServerOptimizer, register_optimizer
from secagg.protocols.pieces import Convergence, FixedServerStep
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

PROBLEMS = ("ridge", "lasso", "logistic", "svm")


def _check(problem: str) -> None:
    if problem not in PROBLEMS:
        raise ConfigError(f"unknown ADMM problem {problem!r}; choose from {PROBLEMS}")


def soft_threshold(a: np.ndarray, kappa: float) -> np.ndarray:
    """Soft(a, κ) = (a − κ)₊ − (−a − κ)₊  (Eq. 3.24)."""
    return np.maximum(a - kappa, 0.0) - np.maximum(-a - kappa, 0.0)


def objective(problem: str, u: np.ndarray, y: np.ndarray, x: np.ndarray, lam: float) -> float:
    """The centralised objective (Eq. 3.4–3.7) at x, over all N samples."""
    _check(problem)
    margin = u @ x
    if problem in ("ridge", "lasso"):
        loss = float(np.mean((margin - y) ** 2))
    elif problem == "logistic":
        loss = float(np.mean(np.logaddexp(0.0, -y * margin)))
    else:
        loss = float(np.mean(np.maximum(1.0 - y * margin, 0.0)))
    penalty = lam * float(np.abs(x).sum()) if problem == "lasso" else lam / 2 * float(x @ x)
    return loss + penalty


def local_gradient(problem: str, u: np.ndarray, y: np.ndarray, x: np.ndarray, n_total: int):
    """The gradient (the SVM: the subgradient of Eq. 3.37) of client i's g_i at x."""
    margin = u @ x
    if problem in ("ridge", "lasso"):
        return 2.0 / n_total * u.T @ (margin - y)
    if problem == "logistic":
        return -(u.T @ (y / (1.0 + np.exp(y * margin)))) / n_total
    return -(u.T @ (y * (y * margin < 1.0))) / n_total


def x_update(
    problem: str,
    u: np.ndarray,
    y: np.ndarray,
    n_total: int,
    z: np.ndarray,
    w: np.ndarray,
    rho: float,
    *,
    x: np.ndarray | None = None,
    steps: int = 20,
    lr: float = 0.1,
) -> np.ndarray:
    """Client i's x_i: exact for the squared loss (corrected Eq. 3.23), else ``steps``
    (sub)gradient steps of size ``lr`` on g_i + (ρ/2)‖x − z + w‖² from ``x`` (Eq. 3.38)."""
    _check(problem)
    if problem in ("ridge", "lasso"):
        gram = 2.0 / n_total * u.T @ u + rho * np.eye(u.shape[1])
        return np.linalg.solve(gram, 2.0 / n_total * u.T @ y + rho * (z - w))
    x = np.array(z if x is None else x, dtype=np.float64, copy=True)
    for _ in range(steps):
        x -= lr * (local_gradient(problem, u, y, x, n_total) + rho * (x - z + w))
    return x


def z_update(problem: str, sum_xw: np.ndarray, n_blocks: int, rho: float, lam: float):
    """The global z from Σ_i (x_i + w_i), the one sum the server needs (Eq. 3.40; the
    lasso's soft threshold)."""
    _check(problem)
    if problem == "lasso":
        return soft_threshold(sum_xw / n_blocks, lam / (n_blocks * rho))
    return rho * sum_xw / (lam + n_blocks * rho)


def w_update(w: np.ndarray, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    return w + x - z


def residuals(
    xs: Sequence[np.ndarray], z: np.ndarray, z_before: np.ndarray, rho: float
) -> tuple[float, float]:
    """Primal ‖(x_i − z)_i‖ and dual ρ √N_b ‖z − z_before‖ residuals (the stopping rule's
    scalars; each client can report its own ‖x_i − z‖² as a declared scalar)."""
    primal = float(np.sqrt(sum(float((x - z) @ (x - z)) for x in xs)))
    return primal, dual_residual(z, z_before, rho, len(xs))


# ---- the engine's side ----------------------------------------------------------------------
class ConsensusStep(ServerOptimizer):
    """ADMM's z-update as the server step: the revealed G is mean_i(x_i + w_i) − z, so z + G
    is the mean the z-update needs and the update is z^{k+1} − z (L2 penalty: Eq. 3.40)."""

    name = "admm_l2"
    problem = "ridge"  # the z-update of every L2-penalised problem is ridge's

    def __init__(self, dim: int, lam: float = 0.05, rho: float = 0.1, n_blocks: float = 1):
        if not (lam >= 0 and rho > 0 and n_blocks >= 1):
            raise ConfigError(f"{self.name}: need lam >= 0, rho > 0, n_blocks >= 1")
        super().__init__(dim, lam=lam, rho=rho, n_blocks=n_blocks)

    def _update(self, g, state, params):
        if params is None:
            raise ProtocolStateError(f"{self.name} steps from the model z, which it was not given")
        z = np.asarray(params, dtype=np.float64)
        h, n_blocks = self.hyper, int(self.hyper["n_blocks"])
        return z_update(self.problem, n_blocks * (z + g), n_blocks, h["rho"], h["lam"]) - z, state


class ConsensusStepL1(ConsensusStep):
    """The lasso's z-update: the soft threshold of the mean at λ / (N_b ρ)."""

    name = "admm_l1"
    problem = "lasso"


register_optimizer(ConsensusStep)
register_optimizer(ConsensusStepL1)


def local_problem(client: ClientAPI, problem: str, d: int) -> tuple[np.ndarray, np.ndarray]:
    """A client's (u, y) with u = [v, 1]; refuses data the problem cannot take."""
    v, y = client.features(), client.labels()
    if v.ndim != 2 or v.shape[1] + 1 != d or y.shape != (len(v),):
        raise ConfigError(
            f"admm fits linear models x = [w, b]; {client.id}'s data has features "
            f"{v.shape} and targets {y.shape} for a model of {d} parameters "
            "(use a diabetes-* or breast-cancer-* task)"
        )
    if problem in ("logistic", "svm") and not np.all(np.abs(y) == 1.0):
        raise ConfigError(
            f"admm's {problem} needs labels in {{-1, +1}} ({client.id} holds others): "
            "use a breast-cancer-* task"
        )
    return np.hstack([v, np.ones((len(v), 1))]), y


class ADMMClient(ClientHalf):
    """Client i's x- and w-updates; it keeps x_i and w_i between rounds."""

    def __init__(self):
        self.x: np.ndarray | None = None
        self.w: np.ndarray | None = None
        self.residual = 0.0  # ‖x_i − z‖² of the iterate last received (x_i⁰ = z⁰: 0)

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        cfg = request.config("admm")
        problem, n_total = str(cfg["problem"]), int(cfg["n_total"])
        _check(problem)
        z = client.model
        u, y = local_problem(client, problem, z.size)
        if n_total < len(y):
            raise ProtocolStateError(
                f"{client.id} holds {len(y)} samples but the server says {n_total} in all"
            )
        if self.x is None or self.w is None:
            w, self.residual = np.zeros_like(z), 0.0
        else:  # finish the previous iteration with the z it produced
            w, self.residual = w_update(self.w, self.x, z), float((self.x - z) @ (self.x - z))
        x = x_update(
            problem,
            u,
            y,
            n_total,
            z,
            w,
            float(cfg["rho"]),
            x=self.x,
            steps=int(cfg["steps"]),
            lr=float(cfg["lr"]),
        )
        self.x, self.w = x, w
        return x + w - z

    def train_reply(self, client: ClientAPI, request: Envelope) -> dict[str, Field]:
        return {"primal_residual_sq": client.report(self.residual)}

    def state_dict(self) -> dict[str, Any]:
        if self.x is None or self.w is None:
            return {"residual": self.residual}
        return {"x": self.x.copy(), "w": self.w.copy(), "residual": self.residual}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) not in ({"residual"}, {"x", "w", "residual"}):
            raise StateError(f"an ADMM client state holds x, w and residual, got {sorted(state)}")
        x, w = state.get("x"), state.get("w")
        if x is not None and (w is None or np.shape(x) != np.shape(w) or np.ndim(x) != 1):
            raise StateError("the ADMM client state's x and w are not vectors of one size")
        self.x = None if x is None else np.asarray(x, dtype=np.float64).copy()
        self.w = None if w is None else np.asarray(w, dtype=np.float64).copy()
        self.residual = float(state["residual"])


class ADMM(Protocol, FixedServerStep, Convergence):
    name = "admm"
    capabilities = Capabilities(
        reveals=("global_update", "primal_residual_sq"),
        client_scalars=("primal_residual_sq",),
        streams=True,  # weights 1/N_b, known before the uploads
        precise_sums=True,  # z converges to x* to 1e-8 on compact; lean's noise is ~1e-4
    )
    client = ADMMClient

    def __init__(
        self,
        problem: Annotated[
            str, Flag("admm-problem", "the objective (Eq. 3.4-3.7)", choices=PROBLEMS)
        ] = "ridge",
        lam: Annotated[float, Flag("admm-lambda", "regularisation weight lambda")] = 0.05,
        rho: Annotated[float, Flag("admm-rho", "ADMM penalty rho")] = 0.1,
        local_steps: Annotated[
            int,
            Flag(
                "admm-local-steps",
                "(sub)gradient steps of the logistic/SVM x-update (ridge/lasso: exact)",
            ),
        ] = 30,
        local_lr: Annotated[float, Flag("admm-local-lr", "step size of those steps")] = 0.2,
        tol: Annotated[
            float,
            Flag(
                "admm-tol",
                "stop once the primal and dual residuals are both below it (0: every round)",
            ),
        ] = 0.0,
    ):
        _check(problem)
        if not (lam >= 0 and rho > 0 and local_steps >= 1 and local_lr > 0 and tol >= 0):
            raise ConfigError(
                "admm needs lam >= 0, rho > 0, local_steps >= 1, local_lr > 0 and tol >= 0"
            )
        self.problem, self.lam, self.rho = problem, lam, rho
        self.local_steps, self.local_lr, self.tol = local_steps, local_lr, tol
        self.n_blocks = 0
        self.n_total: int | None = None  # Σ n_i from the enrolment
        self._z_before: np.ndarray | None = None
        self._residuals: dict[str, float] = {}
        self._dual = float("nan")

    def server_step(self, n_clients: int | None) -> dict[str, Any]:
        step = ConsensusStepL1 if self.problem == "lasso" else ConsensusStep
        config = {"name": step.name, "lam": self.lam, "rho": self.rho}
        if n_clients is not None:
            self.n_blocks = n_clients
            config["n_blocks"] = n_clients
        return config

    def begin_round(self, ctx: RoundAPI) -> None:
        self._residuals = {}
        z = ctx.model  # None in server-blind runs: the server cannot form the dual residual
        if z is not None and self._z_before is not None:
            blocks = self.n_blocks or len(ctx.active)
            self._dual = dual_residual(z, self._z_before, self.rho, blocks)
        self._z_before = None if z is None else z.copy()
        return None

    def planned_weights(self, ctx: RoundAPI, n_samples: Mapping[str, float]) -> dict[str, float]:
        if self.n_total is None:
            self.n_total = int(sum(n_samples.values()))
        return {c: 1.0 / len(n_samples) for c in n_samples}

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        if self.n_total is None:
            raise ConfigError(
                "admm needs the clients' sample counts before its first round (the "
                "enrolment): run it with streaming on"
            )
        settings = {
            "problem": self.problem,
            "rho": self.rho,
            "n_total": self.n_total,
            "steps": self.local_steps,
            "lr": self.local_lr,
        }
        return {"admm": wire.config(settings)}

    def train_reply(self, ctx: RoundAPI) -> dict[str, str]:
        return {"primal_residual_sq": wire.SCALAR}

    def check_upload(self, ctx: RoundAPI, client: str, upload: Upload) -> None:
        value = upload.extra["primal_residual_sq"]
        if not np.isfinite(value):
            raise ClientInputError(f"{client} reports a primal residual of {value}")
        self._residuals[client] = value  # noised under scalar DP: may be negative

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = self.planned_weights(ctx, {c: u.n_samples for c, u in uploads.items()})
        return ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)

    def round_log(self) -> dict[str, float]:
        """The residuals of the iterate this round started from (Boyd et al. §3.3)."""
        primal = float(np.sqrt(max(sum(self._residuals.values()), 0.0)))
        return {"admm_primal_residual": primal, "admm_dual_residual": self._dual}

    def finished(self) -> str | None:
        log = self.round_log()
        primal, dual = log["admm_primal_residual"], log["admm_dual_residual"]
        if self.tol > 0 and self._residuals and np.isfinite(dual):
            if primal <= self.tol and dual <= self.tol:
                return f"ADMM residuals primal {primal:.2e}, dual {dual:.2e} <= tol {self.tol:g}"
        return None


def dual_residual(z: np.ndarray, z_before: np.ndarray, rho: float, n_blocks: int) -> float:
    """ρ √N_b ‖z − z_before‖."""
    return float(rho * np.sqrt(n_blocks) * np.linalg.norm(z - z_before))


register_protocol(
    "admm",
    ADMM,
    summary="consensus ADMM for ridge/lasso/logistic/SVM (GenoMed4All D6.2 §3.4)",
    # linear models on tables
    example=Example(settings={"task": "diabetes-label"}),
    tasks=("diabetes-*", "breast-cancer-*"),
    _builtin=True,
)
