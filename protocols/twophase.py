"""RoLePRO's two-phase protocol (FeTS 2022, §3.3): FedAvg first, then a judicious aggregator.

Rounds ``0 .. switch_round−1`` aggregate with FedAvg; later rounds with ``then`` (CostWAgg,
RegAgg, TrimmedMean, TopKRegCost, ...). Each phase's learning rates are schedules of the run:
``--client-lr 5e-4@0,5e-5@3 --server-lr-schedule 0.003@0,0.002@3`` reproduces the paper's
"rounds 1–3 FedAvg, then RegAgg with reduced rates".
"""

from __future__ import annotations

from typing import Any, Mapping

from secagg.protocols.base import Protocol, RoundAPI, Upload
from secagg.protocols.fedavg import FedAvg
from secagg.errors import ConfigError


class TwoPhase(Protocol):
    name = "rolepro"

    def __init__(self, then: str = "regagg", switch_round: int = 3, **then_options: Any):
        from secagg.protocols import make_protocol  # the registry imports this module

        if then in ("rolepro", "fedavg") or not isinstance(switch_round, int) or switch_round < 0:
            raise ConfigError(f"two-phase needs a judicious second aggregator and a switch "
                              f"round >= 0 (got then={then!r}, switch_round={switch_round!r})")
        self.first = FedAvg()
        self.then = make_protocol(then, **then_options)
        self.switch_round = switch_round
        self.reveals = tuple(dict.fromkeys(self.first.reveals + self.then.reveals))
        self.reveals_per_round = max(self.first.reveals_per_round, self.then.reveals_per_round)
        self.server_computes_update = self.then.server_computes_update
        self.needs_individual_updates = self.then.needs_individual_updates
        self.client_dp_compatible = self.then.client_dp_compatible
        self.streams = self.first.streams or self.then.streams

    def describe(self):
        return {"name": self.name, "switch_round": self.switch_round,
                "then": self.then.describe()}

    def current(self, rnd: RoundAPI) -> Protocol:
        return self.first if rnd.round < self.switch_round else self.then

    def train_fields(self, rnd: RoundAPI, client: str):
        return self.current(rnd).train_fields(rnd, client)

    def train_reply(self, rnd: RoundAPI) -> dict[str, str]:
        return self.current(rnd).train_reply(rnd)

    def planned_weights(self, rnd: RoundAPI, n_samples: Mapping[str, float]):
        return self.current(rnd).planned_weights(rnd, n_samples)

    def aggregate(self, rnd: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        return self.current(rnd).aggregate(rnd, uploads)
