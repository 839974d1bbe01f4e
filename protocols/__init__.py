"""The aggregation algorithms, one module each, plus the server optimizers.

``PROTOCOLS`` maps a CLI name to (protocol factory, default server optimizer settings). The
FedOpt family shares FedAvg's weighting and differs only in the optimizer.
"""

from __future__ import annotations

from typing import Any, Callable

from secagg.protocols.autofedrl import AutoFedRL
from secagg.protocols.base import Protocol, Upload
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.feddisco import FedDisco
from secagg.protocols.larc import LARC
from secagg.protocols.rolepro import (CostWAgg, RegAgg, RegCostAgg, RegMedAgg, RoundCWAgg, SimAgg,
                               TopKRegCost, TrimmedMean)
from secagg.protocols.twophase import TwoPhase
from secagg.errors import ConfigError

# name -> (protocol class, default server optimizer config)
PROTOCOLS: dict[str, tuple[Callable[..., Protocol], dict[str, Any]]] = {
    "fedavg": (FedAvg, {"name": "sgd", "lr": 1.0}),
    "fedavgm": (FedAvg, {"name": "momentum", "lr": 0.1, "beta": 0.9}),
    "fedadam": (FedAvg, {"name": "adam", "lr": 0.1, "beta1": 0.9, "beta2": 0.999, "tau": 1e-8}),
    "fedyogi": (FedAvg, {"name": "yogi", "lr": 0.1, "beta1": 0.9, "beta2": 0.999, "tau": 1e-8}),
    "fedadagrad": (FedAvg, {"name": "adagrad", "lr": 1.0, "beta1": 0.9, "beta2": 0.999,
                            "tau": 1e-8}),
    "larc": (LARC, {"name": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "tau": 1e-3}),
    # RoLePRO's judicious aggregators; pick OptAlgo B/C with --server-opt momentum/adam
    **{cls.name: (cls, {"name": "sgd", "lr": 1.0}) for cls in (
        CostWAgg, RoundCWAgg, RegCostAgg, TopKRegCost, RegAgg, SimAgg, RegMedAgg, TrimmedMean)},
    # β-VAE discrepancy weights; the run first trains the VAE with FedAvg (vae_rounds)
    "feddisco": (FedDisco, {"name": "sgd", "lr": 1.0}),
    # FedAvg then a judicious aggregator: --protocol-option then=regagg switch_round=3
    "rolepro": (TwoPhase, {"name": "sgd", "lr": 1.0}),
    # online RL search of client lr, local steps, aggregation weights and server lr (SGD);
    # clients need validation samples (--validation-split)
    "autofedrl": (AutoFedRL, {"name": "sgd", "lr": 1.0}),
}


def make_protocol(name: str, **options: Any) -> Protocol:
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    factory, _ = PROTOCOLS[name]
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for protocol {name!r}: {exc}") from None


def default_server_optimizer(name: str) -> dict[str, Any]:
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    return dict(PROTOCOLS[name][1])


__all__ = ["PROTOCOLS", "Protocol", "Upload", "default_server_optimizer", "make_protocol"]
