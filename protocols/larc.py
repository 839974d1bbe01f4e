"""LARC: ΔL-softmax dynamic weighting (LARC team, iDASH 2024 Track 2, Algorithm 1).

Round t, with α_i^{-1} = 1:

1. clients upload G_i (the engine's training phase);
2. the server forms Ĝ = Σ_i α_i^{t-1} G_i and sends it to every client with its α_i^{t-1};
3. client i returns  ΔL_i = L(W + Opt(α_i G_i), D_i) − L(W + Opt(Ĝ − α_i G_i), D_i),
   where Opt is the server optimizer's update with its *current* state (not advanced);
4. the server sets p = softmax(−q·ΔL), α_i = (p_i / max p + b) / (1 + b) and forms
   G_global = Σ_i α_i G_i; the engine reveals it and applies W ← W + Opt(G_global).

The paper's defaults are q = 19, b = 0.5. Two options cover where the team's published code
departs from a reader's expectation:

- ``normalize``: Algorithm 1 and the code never normalise α (Σα lies in [6b/(1+b), 6]); with
  ``normalize=True`` α is rescaled to sum to 1 like FedAvg's weights. Default: False (as
  published).
- ``loss_check``: the code evaluates the client loss without the model's bias term
  (``"weights_only"``); the paper's L(W, D) uses the whole model (``"full"``, the default).
  For the Cox partial likelihood the two agree exactly: a bias shifts every risk score by the
  same constant, which the partial likelihood ignores (tests/test_larc.py checks this).

``larc-lagged``, a variant offered beside the paper's (not in it): the global update is Ĝ
itself, G_global = Σ_i ᾱ_i^{t-1} G_i with ᾱ the weights of step 4 normalised to sum to 1,
and step 4's α_i^t weight the *next* round's uploads. Every weight is then known before the
uploads arrive, so the server folds each upload as it comes (it streams, on the FedAvg
family's client-weighted presets) instead of holding all of them until the probe has
answered, and it forms one sum a round instead of two. What changes: the α a round's probe
finds acts one round later; the weights sum to 1 over the round's clients (a planned sum
must fit the headroom: on ``lean`` the applied weights add up to at most 1), where the
paper's sum to between n·b/(1+b) and n for n clients; and a client that drops out is missing
from Ĝ, not renormalised away (the sum is taken as planned, so each client's listed weight
is its weight in Ĝ). Its accuracy beside the paper's is measured, not assumed
(``benchmarks.idash_larc``: 1.4 to 1.9 points of c-index below LARC on the iDASH task).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, ProtocolStateError
from secagg.options import Flag
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    ClientHalf,
    PlannedSum,
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.optimizers import optimizer_fields
from secagg.protocols.registry import register_protocol
from secagg.wire import Envelope, Field

LOSS_CHECKS = ("full", "weights_only")
#: the settings both LARCs take, each with its CLI flag
LarcQ = Annotated[float, Flag("larc-q", "softmax temperature q (paper: 19)")]
LarcB = Annotated[float, Flag("larc-b", "base weight b (paper: 0.5)")]
LarcLossCheck = Annotated[
    str,
    Flag(
        "larc-loss-check",
        "'weights_only' drops the bias in the client loss, as the team's code does "
        "(no effect on the Cox loss)",
        choices=LOSS_CHECKS,
    ),
]


def larc_weights(
    delta_loss: np.ndarray, q: float = 19.0, b: float = 0.5, normalize: bool = False
) -> np.ndarray:
    """α = (softmax(−q·ΔL) / max + b) / (1 + b), optionally rescaled to sum to 1."""
    z = -q * np.asarray(delta_loss, dtype=np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    alpha = (p / p.max() + b) / (1.0 + b)
    return alpha / alpha.sum() if normalize else alpha


def lagged_weights(alpha: Mapping[str, float]) -> dict[str, float]:
    """``larc-lagged``'s weights for a round: its clients' α^{t-1} rescaled to sum to 1."""
    total = float(sum(alpha.values()))
    if not total > 0:
        raise ProtocolStateError(f"LARC weights must have a positive sum (got {dict(alpha)})")
    return {c: float(a) / total for c, a in alpha.items()}


def delta_loss(
    loss_at: Callable[[np.ndarray], float],
    w: np.ndarray,
    g_i: np.ndarray,
    g_hat: np.ndarray,
    alpha_i: float,
    optimizer_update: Callable[[np.ndarray], np.ndarray],
) -> float:
    """Client side of the probe: ΔL_i = L(W + U(α_i G_i)) − L(W + U(Ĝ − α_i G_i))."""
    own = alpha_i * g_i
    return float(loss_at(w + optimizer_update(own)) - loss_at(w + optimizer_update(g_hat - own)))


class LARCClient(ClientHalf):
    """The probe on a client: open Ĝ, return ΔL_i for its own update."""

    phases = {"larc_probe": "probe"}

    @staticmethod
    def probe(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        # α_i must be the weight Ĝ's signed descriptor lists for this client's upload (a
        # server could otherwise probe the loss at any multiple of it); checked before opening
        alpha = env.scalar("alpha")
        client.check_own_weight(env, "g_hat", alpha)
        g_hat = client.open(env, "g_hat")
        # the optimizer comes from whoever holds it: the server (its config checked against
        # this client's provisioning; its state is not checked), or this client's own copy
        optimizer = client.server_optimizer_in(env)
        if optimizer is None:
            raise ProtocolStateError(f"{client.id} got a LARC probe without optimizer state")
        drop_bias = env.config("loss_check")["mode"] == "weights_only"
        dl = delta_loss(
            lambda w: client.loss_at(w, drop_bias=drop_bias),
            client.model,
            client.update,
            g_hat,
            alpha,
            optimizer.peek,
        )
        return {"delta_loss": client.report(dl)}


class LARC(Protocol):
    name = "larc"
    capabilities = Capabilities(
        reveals=("delta_loss", "alpha", "global_update"),
        client_scalars=("delta_loss",),
        opens_per_round=1,  # Ĝ
        weights_vary=True,  # α from the ΔL's, every round
    )
    client = LARCClient

    def __init__(
        self,
        q: LarcQ = 19.0,
        b: LarcB = 0.5,
        normalize: Annotated[
            bool,
            Flag("larc-normalize", "rescale alpha to sum to 1 (the paper and its code do not)"),
        ] = False,
        loss_check: LarcLossCheck = "full",
    ):
        if loss_check not in LOSS_CHECKS:
            raise ConfigError(f"loss_check must be one of {LOSS_CHECKS}, got {loss_check!r}")
        if b < 0 or q < 0:
            raise ConfigError(f"LARC needs q >= 0 and b >= 0 (got q={q}, b={b})")
        self.q, self.b, self.normalize, self.loss_check = q, b, normalize, loss_check
        self.alpha_prev: dict[str, float] = {}  # α^{t-1}; absent means α^{-1} = 1
        #: (the epoch a round started in, α^{t-1} then): a round that left the model where
        #: it was (skipped: nothing released) did not happen for α either
        self._start: tuple[int, dict[str, float]] | None = None

    def begin_round(self, ctx: RoundAPI) -> None:
        """α^{t-1} is the α of the last round that moved the model: after a skipped round the
        model is where it was, and so is α. (The clients' run ledger counts the uploads made
        from one model as one vector: a retried round with the α its skipped probe found
        would add a third weighting of them, which they refuse; with the α it started from,
        it weighs them as the skipped round's Ĝ did, which tells nothing new.)"""
        start = ctx.epoch
        if self._start is not None and self._start[0] == start:
            self.alpha_prev = dict(self._start[1])
        self._start = (start, dict(self.alpha_prev))
        return None

    def opened_weights(self, ctx: RoundAPI) -> dict[str, float] | None:
        """Ĝ's weights, α^{t-1}, are known before the uploads: the clients expand the
        probe's check while they train (a client that does not upload leaves it unused)."""
        return {c: self.alpha_prev.get(c, 1.0) for c in ctx.active}

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        handles = {c: u.handle for c, u in uploads.items()}
        planned = {c: self.alpha_prev.get(c, 1.0) for c in uploads}
        g_hat = ctx.weighted_sum(handles, planned)
        answered = self.probe(ctx, g_hat)
        return ctx.weighted_sum({c: handles[c] for c in answered}, answered)

    def probe(self, ctx: RoundAPI, g_hat: Any) -> dict[str, float]:
        """Steps 2–4: send Ĝ to its contributors, each with its own weight in it, and set
        α^t from the ΔL_i they return (kept as the next round's α^{t-1}); returns α^t of
        the clients that answered."""
        alpha_prev = ctx.weights_of(g_hat)  # as summed: each client checks its own
        probe = {
            **ctx.as_fields(g_hat, "g_hat"),
            "loss_check": wire.config({"mode": self.loss_check}),
        }
        if ctx.server_optimizer is not None:  # server-blind runs: clients hold the optimizer
            probe.update(optimizer_fields(ctx.server_optimizer))
        replies = ctx.ask(
            "larc_probe",
            {c: {**probe, "alpha": wire.scalar(alpha_prev[c])} for c in alpha_prev},
            expect={"delta_loss": wire.SCALAR},
        )
        answered = list(replies)
        alpha = larc_weights(
            np.array([replies[c].scalar("delta_loss") for c in answered]),
            self.q,
            self.b,
            self.normalize,
        )
        found = dict(zip(answered, alpha.tolist()))
        self.alpha_prev.update(found)
        return found


class LaggedLARC(LARC):
    """``larc-lagged``: the probe's sum Ĝ is the global update, and the α it finds weight the
    next round's uploads (the module's docstring says what that changes)."""

    name = "larc-lagged"
    capabilities = dataclasses.replace(LARC.capabilities, streams=True)

    def __init__(self, q: LarcQ = 19.0, b: LarcB = 0.5, loss_check: LarcLossCheck = "full"):
        # its weights always sum to 1 (a planned sum's headroom): no normalize option
        super().__init__(q, b, normalize=False, loss_check=loss_check)

    def opened_weights(self, ctx: RoundAPI) -> None:
        return None  # its open is of the planned sum (the engine's training fields)

    def planned_weights(self, ctx: RoundAPI, n_samples: Mapping[str, float]) -> dict[str, float]:
        """α^{t-1} normalised over this round's clients (1 for a client not yet probed)."""
        return lagged_weights({c: self.alpha_prev.get(c, 1.0) for c in n_samples})

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        # the sum the server folds when it streams (normalised over the uploads that came:
        # a buffered round plans its weights only then)
        planned = self.planned_weights(ctx, {c: u.n_samples for c, u in uploads.items()})
        g_hat = ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, planned)
        self.probe(ctx, g_hat)
        return g_hat

    def finish_sum(self, ctx: RoundAPI, total: PlannedSum) -> Any:
        # as planned, not renormalised: the weights each client applied or the sum lists are
        # then its weight in Ĝ, which it checks before the probe (a client that never
        # arrived is only missing from Ĝ, as it is from the paper's sums)
        g_hat = total.result(renormalise=False)
        self.probe(ctx, g_hat)
        return g_hat


#: the iDASH baseline's server Adam, which both LARCs default to
IDASH_ADAM = {"name": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "tau": 1e-3}
for _name, _protocol, _summary in (
    ("larc", LARC, "Delta-L softmax weights (iDASH 2024 Track 2)"),
    (
        "larc-lagged",
        LaggedLARC,
        "LARC with last round's Delta-L weights, fixed before the uploads (streams)",
    ),
):
    register_protocol(
        _name, _protocol, default_optimizer=dict(IDASH_ADAM), summary=_summary, _builtin=True
    )
