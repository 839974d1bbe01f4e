"""FedAvg (McMahan et al. 2017) and, with a server optimizer, FedOpt (Reddi et al. 2021).

    G_global = Σ_i (n_i / Σ_j n_j) · G_i,     W ← W + ServerOpt(G_global)

FedAvg is this with server SGD at lr 1; FedAdam / FedYogi / FedAdagrad / momentum only change
the optimizer, which the round engine applies.
"""

from __future__ import annotations

from typing import Any, Mapping

from secagg.protocols.base import Capabilities, Protocol, RoundAPI, Upload


def sample_size_weights(n_samples: Mapping[str, float]) -> dict[str, float]:
    total = float(sum(n_samples.values()))
    if total <= 0:
        raise ValueError("sample-size weights need a positive total number of samples")
    return {c: float(n) / total for c, n in n_samples.items()}


class FedAvg(Protocol):
    name = "fedavg"
    # n_i / Σn is known before the uploads: the server folds them as they come
    capabilities = Capabilities(streams=True)

    def planned_weights(self, rnd: RoundAPI, n_samples: Mapping[str, float]
                        ) -> dict[str, float]:
        return sample_size_weights(n_samples)

    def aggregate(self, rnd: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = self.planned_weights(rnd, {c: u.n_samples for c, u in uploads.items()})
        return rnd.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)
