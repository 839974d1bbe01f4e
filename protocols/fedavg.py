"""FedAvg (McMahan et al. 2017) and, with a server optimizer, FedOpt (Reddi et al. 2021).

    G_global = Σ_i (n_i / Σ_j n_j) · G_i,     W ← W + ServerOpt(G_global)

FedAvg is this with server SGD at lr 1; FedAdam / FedYogi / FedAdagrad / momentum only change
the optimizer, which the round engine applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from secagg.protocols.base import Capabilities, Protocol, RoundAPI, Upload
from secagg.protocols.registry import register_protocol


def sample_size_weights(n_samples: Mapping[str, float]) -> dict[str, float]:
    total = float(sum(n_samples.values()))
    if total <= 0:
        raise ValueError("sample-size weights need a positive total number of samples")
    return {c: float(n) / total for c, n in n_samples.items()}


class FedAvg(Protocol):
    name = "fedavg"
    # n_i / Σn is known before the uploads: the server folds them as they come, and the
    # round is that sum, revealed and stepped, so it can move a part of the model at a time
    capabilities = Capabilities(streams=True, moves_in_parts=True)

    def planned_weights(self, ctx: RoundAPI, n_samples: Mapping[str, float]) -> dict[str, float]:
        return sample_size_weights(n_samples)

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = self.planned_weights(ctx, {c: u.n_samples for c, u in uploads.items()})
        return ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)


_ADAPTIVE = {"beta1": 0.9, "beta2": 0.999, "tau": 1e-8}
for _name, _optimizer, _summary in (
    ("fedavg", {"name": "sgd", "lr": 1.0}, "n_i / sum n, server SGD lr 1"),
    (
        "fedavgm",
        {"name": "momentum", "lr": 0.1, "beta": 0.9},
        "FedAvg weights, server momentum (RoLePRO OptAlgo B)",
    ),
    (
        "fedadam",
        {"name": "adam", "lr": 0.1, **_ADAPTIVE},
        "FedAvg weights, server Adam (FLamby's FedOpt)",
    ),
    ("fedyogi", {"name": "yogi", "lr": 0.1, **_ADAPTIVE}, "FedAvg weights, server Yogi"),
    ("fedadagrad", {"name": "adagrad", "lr": 1.0, **_ADAPTIVE}, "FedAvg weights, server Adagrad"),
):
    register_protocol(_name, FedAvg, default_optimizer=_optimizer, summary=_summary, _builtin=True)
