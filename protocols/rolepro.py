"""RoLePRO's aggregators (FeTS 2022, "Robust Learning Protocol", §3.2–3.3).

All formulas act on client parameters w_c = W + G_c. Every client starts the round from the
same W and every weighting below sums to 1, so the same formulas on pseudo-gradients G_c give
ŵ − W; that is what the functions here compute.

- CostWAgg (Eq. 3):  ŵ = Σ_c (α ν_c + (1−α) r_c / Σr) w_c, ν_c = n_c / N, with the cost ratio
  r_c = l_c(w^c_{t−1}) / l_c(w^c_t) of the client's loss after training last round and this
  round (α = 0.5). RoundCWAgg uses r_c = l_c(w_{t−1}) / l_c(w^c_t), the loss of the global
  model before and after this round's local training (α = 0.1).
- RegCostAgg (Eq. 5): ŵ = Σ r_c ν_c w_c / Σ r_c ν_c.
- RegAgg (Eq. 4): per coordinate, u_c ∝ 1/|w_c − mean|_τ and ŵ = Σ u_c ν_c w_c / Σ u_c ν_c;
  SimAgg uses the additive u_c + ν_c (u normalised to sum to 1); |x|_τ = |x| + τ, τ = 1e-5.
  RegMedAgg uses the coordinate-wise median instead of the mean.
- TrimmedMean (20 %): per coordinate, drop the 20 % of clients farthest from the median and
  average the rest without weights (our reading of "trimmed by discounting the ones that are
  too far from the median").
- TopKRegCost (20 %): score s_c = ν_c · r_c (CostWAgg's ratio), drop the 20 % lowest scores,
  average the rest without weights; the selection is common to all coordinates.

Losses are each client's training loss on its own data (FeTS used local validation sets;
Fed-TCGA-BRCA clients hold no separate one). Clients report only the ratio r_c.

Encrypted execution: scalar-weight aggregators are one weighted sum. RegAgg and SimAgg take
two phases: the server sends the encrypted mean back, each client decrypts it and uploads
Enc(τ ν_c G_c / |G_c − mean|_τ) and Enc(τ ν_c / |G_c − mean|_τ) (the factor τ keeps every
value ≤ 1 for CKKS's headroom and cancels), and the server reveals only the two sums
A and B: the per-client normaliser cancels, ŵ − W = A / B. SimAgg also needs the FedAvg sum.
Precision: the τ scaling makes the entries of A and B small (τ ν / |G − mean|, ~1e-5 for
typical updates), so the flooded reveal's ~1e-10 absolute noise costs ~1e-5 relative on ŵ.
RegMedAgg and TrimmedMean are not sums: on an encrypted backend they need clients to send
their updates in plaintext, which the run must allow explicitly (and the audit then says so).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import ClientInputError, ConfigError
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    ClientHalf,
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.fedavg import sample_size_weights
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

TAU = 1e-5

# ---- pure arithmetic -------------------------------------------------------------------------


def cost_weights(nu: np.ndarray, r: np.ndarray, alpha: float) -> np.ndarray:
    """CostWAgg / RoundCWAgg: α ν + (1 − α) r / Σr."""
    return alpha * nu + (1 - alpha) * r / r.sum()


def regcost_weights(nu: np.ndarray, r: np.ndarray) -> np.ndarray:
    """RegCostAgg: r ν / Σ r ν."""
    return r * nu / np.sum(r * nu)


def top_k_keep(scores: np.ndarray, drop_fraction: float) -> np.ndarray:
    """Indices of the clients kept after dropping the lowest-scoring fraction (stable)."""
    n_drop = int(math.floor(drop_fraction * scores.size))
    order = np.argsort(-scores, kind="stable")
    return np.sort(order[: scores.size - n_drop])


def regagg_terms(
    g: np.ndarray, centre: np.ndarray, nu: float, tau: float = TAU
) -> tuple[np.ndarray, np.ndarray]:
    """One client's scaled RegAgg summands: (τ ν g / |g − centre|_τ, τ ν / |g − centre|_τ)."""
    inv = tau / (np.abs(g - centre) + tau)  # in (0, 1]
    return nu * inv * g, nu * inv


def regagg(
    gs: np.ndarray, nu: np.ndarray, tau: float = TAU, centre: np.ndarray | None = None
) -> np.ndarray:
    """One-shot RegAgg on stacked updates gs (clients × params); centre defaults to the mean."""
    centre = gs.mean(axis=0) if centre is None else centre
    u = 1.0 / (np.abs(gs - centre) + tau)
    return np.sum(u * nu[:, None] * gs, axis=0) / np.sum(u * nu[:, None], axis=0)


def simagg(gs: np.ndarray, nu: np.ndarray, tau: float = TAU) -> np.ndarray:
    """One-shot SimAgg: weights (u_c + ν_c) / 2 with u normalised per coordinate."""
    inv = 1.0 / (np.abs(gs - gs.mean(axis=0)) + tau)
    u = inv / inv.sum(axis=0)
    return np.sum((u + nu[:, None]) * gs, axis=0) / 2.0


def trimmed_mean(gs: np.ndarray, drop_fraction: float = 0.2) -> np.ndarray:
    """Per coordinate, drop the clients farthest from the median; average the rest."""
    n_keep = gs.shape[0] - int(math.floor(drop_fraction * gs.shape[0]))
    distance = np.abs(gs - np.median(gs, axis=0))
    keep = np.argsort(distance, axis=0, kind="stable")[:n_keep]
    return np.take_along_axis(gs, keep, axis=0).mean(axis=0)


# ---- protocols ---------------------------------------------------------------------------------


def _checked_fraction(drop_fraction: float) -> float:
    if not 0 <= drop_fraction < 1:
        raise ConfigError(f"drop_fraction must lie in [0, 1), got {drop_fraction}")
    return drop_fraction


def _checked_tau(tau: float) -> float:
    if not tau > 0:
        raise ConfigError(f"tau must be positive, got {tau}")
    return tau


def _ordered(uploads: Mapping[str, Upload]) -> tuple[list[str], np.ndarray]:
    clients = list(uploads)
    nu = sample_size_weights({c: uploads[c].n_samples for c in clients})
    return clients, np.array([nu[c] for c in clients])


class LossRatioClient(ClientHalf):
    """r_c on the client's own training data, reported with its upload when asked:
    "round" = l(w_{t-1}) / l(w^c_t); "cost" = l(w^c_{t-1}) / l(w^c_t), which falls back to
    "round" in the client's first round."""

    def __init__(self):
        self.last_trained_loss: float | None = None  # l(w^c_{t-1})

    def train_reply(self, client: ClientAPI, request: Envelope) -> dict[str, Field]:
        if "loss_ratio" not in request.fields:
            return {}
        after = client.loss_at(client.model + client.update)
        before = client.loss_at(client.model)
        if (
            request.config("loss_ratio").get("kind") == "cost"
            and self.last_trained_loss is not None
        ):
            before = self.last_trained_loss
        self.last_trained_loss = after
        return {"loss_ratio": client.report(before / after)}

    def state_dict(self) -> dict[str, Any]:
        return {"last_trained_loss": self.last_trained_loss}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_trained_loss = state.get("last_trained_loss")


class RegAggClient(ClientHalf):
    """RegAgg/SimAgg's second phase: the scaled terms of A and B, protected."""

    phases = {"regagg_terms": "terms"}

    @staticmethod
    def terms(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        centre = client.open(env, "centre")
        # ν_c is the server's weight of this client's terms in the sums (in their release
        # descriptor, where the clients' policy checks it), not a request field: a server
        # that sent the others ν = 0 would have A/B be this client's update alone
        numerator, denominator = regagg_terms(client.update, centre, 1.0, env.scalar("tau"))
        return {"numerator": client.protect(numerator), "denominator": client.protect(denominator)}


class _LossRatio(Protocol):
    """Aggregators whose clients report a loss ratio with their upload."""

    ratio = "cost"  # "cost": l(w^c_{t-1}) / l(w^c_t); "round": l(w_{t-1}) / l(w^c_t)
    capabilities = Capabilities(
        reveals=("loss_ratio", "global_update"),
        client_scalars=("loss_ratio",),
        weights_vary=True,  # from the loss ratios, every round
    )
    client = LossRatioClient

    def train_fields(self, ctx: RoundAPI, client: str):
        return {"loss_ratio": wire.config({"kind": self.ratio})}

    def train_reply(self, ctx: RoundAPI) -> dict[str, str]:
        return {"loss_ratio": wire.SCALAR}

    def check_upload(self, ctx: RoundAPI, client: str, upload: Upload) -> None:
        if not upload.extra["loss_ratio"] > 0:
            raise ClientInputError(
                f"{client} reports a loss ratio of "
                f"{upload.extra['loss_ratio']}; ratios of losses are > 0"
            )

    @staticmethod
    def ratios(uploads: Mapping[str, Upload], clients: list[str]) -> np.ndarray:
        return np.array([uploads[c].extra["loss_ratio"] for c in clients])


class CostWAgg(_LossRatio):
    name = "costwagg"

    def __init__(self, alpha: float = 0.5):
        if not 0 <= alpha <= 1:
            raise ConfigError(f"CostWAgg needs 0 <= alpha <= 1, got {alpha}")
        self.alpha = alpha

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        clients, nu = _ordered(uploads)
        w = cost_weights(nu, self.ratios(uploads, clients), self.alpha)
        return ctx.weighted_sum({c: uploads[c].handle for c in clients}, dict(zip(clients, w)))


class RoundCWAgg(CostWAgg):
    name = "roundcwagg"
    ratio = "round"

    def __init__(self, alpha: float = 0.1):
        super().__init__(alpha)


class RegCostAgg(_LossRatio):
    name = "regcostagg"

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        clients, nu = _ordered(uploads)
        w = regcost_weights(nu, self.ratios(uploads, clients))
        return ctx.weighted_sum({c: uploads[c].handle for c in clients}, dict(zip(clients, w)))


class TopKRegCost(_LossRatio):
    name = "topkregcost"
    capabilities = dataclasses.replace(_LossRatio.capabilities, selects_contributors=True)

    def __init__(self, drop_fraction: float = 0.2):
        self.drop_fraction = _checked_fraction(drop_fraction)

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        clients, nu = _ordered(uploads)
        keep = [
            clients[i] for i in top_k_keep(nu * self.ratios(uploads, clients), self.drop_fraction)
        ]
        return ctx.weighted_sum(
            {c: uploads[c].handle for c in keep}, {c: 1.0 / len(keep) for c in keep}
        )


class RegAgg(Protocol):
    """Two phases on every backend: mean back to clients, then the sums A and B."""

    name = "regagg"
    # ŵ = A / B is formed in plaintext by the server; it is not one weighted sum of the
    # noised uploads, so no client-level DP
    capabilities = Capabilities(
        reveals=("regagg_numerator", "regagg_denominator"),
        reveals_per_round=2,
        opens_per_round=1,  # the centre
        server_computes_update=True,
        client_dp_compatible=False,
    )
    client = RegAggClient

    def __init__(self, tau: float = TAU):
        self.tau = _checked_tau(tau)

    def _ratio(
        self, ctx: RoundAPI, uploads: Mapping[str, Upload], nu: Mapping[str, float]
    ) -> tuple[np.ndarray, list[str]]:
        """A / B with A = Σ τ ν_c G_c / |G_c − mean|_τ, B = Σ τ ν_c / |G_c − mean|_τ."""
        clients = list(uploads)
        handles = {c: uploads[c].handle for c in clients}
        mean = ctx.as_fields(
            ctx.weighted_sum(handles, {c: 1.0 / len(clients) for c in clients}), "centre"
        )
        replies = ctx.ask(
            "regagg_terms",
            dict.fromkeys(clients, {**mean, "tau": wire.scalar(self.tau)}),
            expect={"numerator": ctx.upload_kind, "denominator": ctx.upload_kind},
        )
        weights = {c: nu[c] for c in replies}
        a = ctx.reveal(
            ctx.weighted_sum(ctx.load(replies, "numerator"), weights), "regagg_numerator"
        )
        b = ctx.reveal(
            ctx.weighted_sum(ctx.load(replies, "denominator"), weights), "regagg_denominator"
        )
        return a / b, [c for c in clients if c in replies]

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        nu = sample_size_weights({c: u.n_samples for c, u in uploads.items()})
        ratio, _ = self._ratio(ctx, uploads, nu)
        return ctx.plaintext(ratio)


class SimAgg(RegAgg):
    """ŵ − W = ½ Σ u_c G_c + ½ Σ ν_c G_c, with Σ u_c G_c = A / B computed without ν."""

    name = "simagg"
    capabilities = Capabilities(
        reveals=("regagg_numerator", "regagg_denominator", "fedavg_sum"),
        reveals_per_round=3,
        opens_per_round=1,  # the centre
        server_computes_update=True,
        client_dp_compatible=False,
    )

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        ratio, answered = self._ratio(ctx, uploads, {c: 1.0 for c in uploads})
        nu = sample_size_weights({c: uploads[c].n_samples for c in answered})
        fedavg = ctx.reveal(
            ctx.weighted_sum({c: uploads[c].handle for c in answered}, nu), "fedavg_sum"
        )
        return ctx.plaintext((ratio + fedavg) / 2.0)


class _Individual(Protocol):
    """Aggregators that need every client's update itself (not expressible as sums)."""

    capabilities = Capabilities(
        reveals=("pseudo_gradient",),
        needs_individual_updates=True,
        server_computes_update=True,
        client_dp_compatible=False,
    )

    def combine(self, gs: np.ndarray, nu: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        updates = ctx.individual_updates(uploads)
        clients = list(updates)
        nu = sample_size_weights({c: uploads[c].n_samples for c in clients})
        return ctx.plaintext(
            self.combine(
                np.stack([updates[c] for c in clients]), np.array([nu[c] for c in clients])
            )
        )


class RegMedAgg(_Individual):
    name = "regmedagg"

    def __init__(self, tau: float = TAU):
        self.tau = _checked_tau(tau)

    def combine(self, gs: np.ndarray, nu: np.ndarray) -> np.ndarray:
        return regagg(gs, nu, self.tau, centre=np.median(gs, axis=0))


class TrimmedMean(_Individual):
    name = "trimmedmean"

    def __init__(self, drop_fraction: float = 0.2):
        self.drop_fraction = _checked_fraction(drop_fraction)

    def combine(self, gs: np.ndarray, nu: np.ndarray) -> np.ndarray:
        return trimmed_mean(gs, self.drop_fraction)


#: (class, what it weighs by, whether parity with plain needs the precise preset: RegAgg's
#: and SimAgg's sums hold τ-scaled terms of ~1e-5, which compact's flooding would move)
_AGGREGATORS = (
    (CostWAgg, "alpha nu + (1 - alpha) r / sum r, loss ratios of the run (Eq. 3)", False),
    (RoundCWAgg, "CostWAgg with this round's loss ratios (Eq. 3)", False),
    (RegCostAgg, "r nu / sum r nu (Eq. 5)", False),
    (TopKRegCost, "unweighted mean of the best 80 % by nu r", False),
    (RegAgg, "per coordinate 1 / |G - mean|, multiplicative (Eq. 4)", True),
    (SimAgg, "per coordinate 1 / |G - mean|, additive with FedAvg (Eq. 4)", True),
    (RegMedAgg, "median-centred RegAgg: every update in plaintext", False),
    (TrimmedMean, "per-coordinate 20 % trimmed mean: every update in plaintext", False),
)
#: a protocol that picks its contributors every round runs encrypted with per-round
#: participation, which needs client-level DP (here nominal: clip 1, noise 0.01; seeded, so
#: that the example's runs on plain and encrypted draw the same noise and compare)
_SELECTING = {
    "backend_options": {"participation": "per-round"},
    "client_dp": {"clip": 1.0, "noise": 0.01},
    "dp_noise": "seeded",
}
for _cls, _weights, _precise in _AGGREGATORS:
    register_protocol(
        _cls.name,
        _cls,
        summary=f"RoLePRO judicious aggregator (FeTS 2022): {_weights}",
        example=Example(
            _SELECTING if _cls.capabilities.selects_contributors else {}, precise=_precise
        ),
        _builtin=True,
    )
