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
"""

from __future__ import annotations

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
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.optimizers import optimizer_fields
from secagg.protocols.registry import register_protocol
from secagg.wire import Envelope, Field

LOSS_CHECKS = ("full", "weights_only")


def larc_weights(
    delta_loss: np.ndarray, q: float = 19.0, b: float = 0.5, normalize: bool = False
) -> np.ndarray:
    """α = (softmax(−q·ΔL) / max + b) / (1 + b), optionally rescaled to sum to 1."""
    z = -q * np.asarray(delta_loss, dtype=np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    alpha = (p / p.max() + b) / (1.0 + b)
    return alpha / alpha.sum() if normalize else alpha


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
    )
    client = LARCClient

    def __init__(
        self,
        q: Annotated[float, Flag("larc-q", "softmax temperature q (paper: 19)")] = 19.0,
        b: Annotated[float, Flag("larc-b", "base weight b (paper: 0.5)")] = 0.5,
        normalize: Annotated[
            bool,
            Flag("larc-normalize", "rescale alpha to sum to 1 (the paper and its code do not)"),
        ] = False,
        loss_check: Annotated[
            str,
            Flag(
                "larc-loss-check",
                "'weights_only' drops the bias in the client loss, as the team's code does "
                "(no effect on the Cox loss)",
                choices=LOSS_CHECKS,
            ),
        ] = "full",
    ):
        if loss_check not in LOSS_CHECKS:
            raise ConfigError(f"loss_check must be one of {LOSS_CHECKS}, got {loss_check!r}")
        if b < 0 or q < 0:
            raise ConfigError(f"LARC needs q >= 0 and b >= 0 (got q={q}, b={b})")
        self.q, self.b, self.normalize, self.loss_check = q, b, normalize, loss_check
        self.alpha_prev: dict[str, float] = {}  # α^{t-1}; absent means α^{-1} = 1

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        handles = {c: u.handle for c, u in uploads.items()}
        planned = {c: self.alpha_prev.get(c, 1.0) for c in uploads}
        total = ctx.weighted_sum(handles, planned)
        alpha_prev = ctx.weights_of(total)  # as summed: each client checks its own
        g_hat = ctx.as_fields(total, "g_hat")
        probe = {**g_hat, "loss_check": wire.config({"mode": self.loss_check})}
        if ctx.server_optimizer is not None:  # server-blind runs: clients hold the optimizer
            probe.update(optimizer_fields(ctx.server_optimizer))
        replies = ctx.ask(
            "larc_probe",
            {c: {**probe, "alpha": wire.scalar(alpha_prev[c])} for c in uploads},
            expect={"delta_loss": wire.SCALAR},
        )
        answered = list(replies)
        alpha = larc_weights(
            np.array([replies[c].scalar("delta_loss") for c in answered]),
            self.q,
            self.b,
            self.normalize,
        )
        self.alpha_prev.update(zip(answered, alpha.tolist()))
        return ctx.weighted_sum(
            {c: handles[c] for c in answered}, dict(zip(answered, alpha.tolist()))
        )


register_protocol(
    "larc",
    LARC,
    default_optimizer={"name": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "tau": 1e-3},
    summary="Delta-L softmax weights (iDASH 2024 Track 2)",
    _builtin=True,
)
