"""RoLePRO's two-phase protocol (FeTS 2022, §3.3): FedAvg first, then a judicious aggregator.

Rounds ``0 .. switch_round−1`` aggregate with FedAvg; later rounds with ``then`` (CostWAgg,
RegAgg, TrimmedMean, TopKRegCost, Auto-FedRL, ...). Each phase's learning rates are schedules
of the run: ``--client-lr 5e-4@0,5e-5@3 --server-lr-schedule 0.003@0,0.002@3`` reproduces the
paper's "rounds 1–3 FedAvg, then RegAgg with reduced rates".

Composition by delegation: every hook of a round goes to that round's protocol, so the second
phase behaves exactly as it does alone (its upload checks, its agent, its validation phase).
Hooks that are not tied to a round (the seed, the pre-stage, a client's validation loss
before round 0) go to both. The capabilities are the union of the two: what either phase
reveals, needs or refuses. Of the pieces (``secagg.protocols.pieces``) it composes those a
second phase can bring whole, the pre-stage and the validation feedback, and refuses a
second phase with any other when it is built (ADMM's fixed server step would replace the
first phase's optimizer too; the Cox model's and XGBoost's releases of other lengths were
never provisioned for the first phase; DEC's initial model and Ensemble's scores have no
first phase to follow).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from secagg.errors import ConfigError
from secagg.protocols.base import (
    Allowed,
    ClientHalf,
    ComposedClientHalf,
    PlannedSum,
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.pieces import PreStage, ValidationFeedback, pieces_of
from secagg.protocols.registry import (
    Example,
    make_protocol,
    protocol_spec,
    register_protocol,
)
from secagg.wire import Field


def _parts(
    then: str, switch_round: Any, then_options: dict[str, Any]
) -> tuple[type[Protocol], dict[str, Any]]:
    if (
        then in ("rolepro", "fedavg")
        or not isinstance(switch_round, int)
        or isinstance(switch_round, bool)
        or switch_round < 0
    ):
        raise ConfigError(
            f"two-phase needs a judicious second aggregator and a switch "
            f"round >= 0 (got then={then!r}, switch_round={switch_round!r})"
        )
    return protocol_spec(then).protocol, then_options


#: the pieces a second phase may bring: each works from either phase as it does alone
COMPOSED_PIECES: tuple[type, ...] = (PreStage, ValidationFeedback)


class TwoPhase(Protocol):
    name = "rolepro"

    def __init__(self, then: str = "regagg", switch_round: int = 3, **then_options: Any):
        _parts(then, switch_round, then_options)
        self.first: Protocol = FedAvg()
        self.then = make_protocol(then, **then_options)
        refused = [k.__name__ for k in pieces_of(self.then) if k not in COMPOSED_PIECES]
        if refused:
            raise ConfigError(
                f"two-phase cannot run {then!r} as its second phase: it brings "
                f"{', '.join(refused)}, which a phase after FedAvg cannot have (a second "
                f"phase may bring {', '.join(k.__name__ for k in COMPOSED_PIECES)}); run "
                f"{then!r} alone"
            )
        self.switch_round = switch_round
        self.capabilities = self.first.capabilities.union(self.then.capabilities)

    def piece[P](self, kind: type[P]) -> P | None:
        # the first phase is FedAvg, which has no piece: the second phase's are the run's
        return self.then.piece(kind) if kind in COMPOSED_PIECES else None

    @classmethod
    def check_run(cls, run: Any) -> None:
        """The second phase's own checks (the first phase, FedAvg, has none)."""
        then = run.protocol_options.get("then", "regagg")
        _parts(then, run.protocol_options.get("switch_round", 3), {})[0].check_run(run)

    @classmethod
    def make_client(
        cls, then: str = "regagg", switch_round: int = 3, **then_options: Any
    ) -> ClientHalf:
        then_cls, options = _parts(then, switch_round, then_options)
        return ComposedClientHalf([FedAvg.make_client(), then_cls.make_client(**options)])

    def current(self, ctx: RoundAPI) -> Protocol:
        return self.first if ctx.round < self.switch_round else self.then

    # ---- not tied to a round: both parts ------------------------------------------------
    def seed(self, seed: int) -> None:
        self.first.seed(seed)
        self.then.seed(seed)

    def round_log(self) -> dict[str, float]:
        return {**self.first.round_log(), **self.then.round_log()}

    # ---- one round: that round's protocol ------------------------------------------------
    def begin_round(self, ctx: RoundAPI) -> float | None:
        return self.current(ctx).begin_round(ctx)

    def varied_settings(self) -> dict[str, Allowed]:
        """What either phase varies (a client admits both phases' values)."""
        return {**self.first.varied_settings(), **self.then.varied_settings()}

    def train_settings(
        self, ctx: RoundAPI, client: str, settings: dict[str, Any]
    ) -> dict[str, Any]:
        return self.current(ctx).train_settings(ctx, client, settings)

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        return self.current(ctx).train_fields(ctx, client)

    def train_reply(self, ctx: RoundAPI) -> dict[str, str]:
        return self.current(ctx).train_reply(ctx)

    def planned_weights(self, ctx: RoundAPI, n_samples: Mapping[str, float]):
        return self.current(ctx).planned_weights(ctx, n_samples)

    def finish_sum(self, ctx: RoundAPI, total: PlannedSum) -> Any:
        return self.current(ctx).finish_sum(ctx, total)

    def check_upload(self, ctx: RoundAPI, client: str, upload: Upload) -> None:
        self.current(ctx).check_upload(ctx, client, upload)

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        return self.current(ctx).aggregate(ctx, uploads)


register_protocol(
    "rolepro",
    TwoPhase,
    summary="FedAvg, then a judicious aggregator (then=..., switch_round=...)",
    example=Example(precise=True),  # RegAgg, its default second phase
    _builtin=True,
)
