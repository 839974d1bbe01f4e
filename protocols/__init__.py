"""The aggregation algorithms, one module each (both halves), plus the server optimizers.

``PROTOCOLS`` is the registry every part of secagg reads (the engine, the clients, the CLI's
choices): a name maps to the protocol class, whose ``client`` attribute is its client half,
and the run's default server optimizer. The FedOpt family shares FedAvg's class and differs
only in the optimizer. :func:`register_protocol` adds a protocol defined anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from secagg.errors import ConfigError
from secagg.options import Option
from secagg.protocols.autofedrl import AutoFedRL
from secagg.protocols.base import Capabilities, ClientAPI, ClientHalf, Protocol, RoundAPI, Upload
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.feddisco import FedDisco
from secagg.protocols.larc import LARC
from secagg.protocols.rolepro import (CostWAgg, RegAgg, RegCostAgg, RegMedAgg, RoundCWAgg,
                                      SimAgg, TopKRegCost, TrimmedMean)
from secagg.protocols.twophase import TwoPhase


@dataclass(frozen=True)
class ProtocolSpec:
    """A registry entry: the protocol (server half, with its client half attached), the
    server optimizer a run uses unless told otherwise, and one line for ``--help``."""

    protocol: type[Protocol]
    default_optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 1.0})
    summary: str = ""
    #: settings with a CLI flag of their own (any constructor argument also works as
    #: ``--protocol-option key=value``)
    options: tuple[Option, ...] = ()
    builtin: bool = False


PROTOCOLS: dict[str, ProtocolSpec] = {}


def register_protocol(name: str, protocol: type[Protocol], *,
                      default_optimizer: dict[str, Any] | None = None, summary: str = "",
                      options: tuple[Option, ...] = (), replace: bool = False,
                      _builtin: bool = False) -> None:
    """Make ``protocol`` available as ``name`` (CLI ``--protocol``, configs, workers).

    ``default_optimizer`` is the server optimizer's configuration (``{"name": "adam",
    "lr": 0.01, ...}``; default SGD with lr 1). A name already taken is refused unless
    ``replace``.
    """
    if not (isinstance(protocol, type) and issubclass(protocol, Protocol)):
        raise ConfigError(f"register_protocol({name!r}): {protocol!r} is not a Protocol class")
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"protocol names are letters, digits, - and _; got {name!r}")
    if name in PROTOCOLS and not replace:
        raise ConfigError(f"protocol {name!r} is already registered (pass replace=True)")
    PROTOCOLS[name] = ProtocolSpec(protocol, dict(default_optimizer or {"name": "sgd",
                                                                        "lr": 1.0}),
                                   summary, tuple(options), _builtin)


def protocol_spec(name: str) -> ProtocolSpec:
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def make_protocol(name: str, **options: Any) -> Protocol:
    """The server half of ``name`` with these options."""
    cls = protocol_spec(name).protocol
    try:
        return cls(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for protocol {name!r}: {exc}") from None


def make_client_half(name: str, **options: Any) -> ClientHalf:
    """The client half of ``name`` for a run with these protocol options."""
    cls = protocol_spec(name).protocol
    try:
        return cls.make_client(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for protocol {name!r}: {exc}") from None


def default_server_optimizer(name: str) -> dict[str, Any]:
    return dict(protocol_spec(name).default_optimizer)


def custom_protocols() -> dict[str, ProtocolSpec]:
    """Protocols registered from outside secagg (worker processes register them again)."""
    return {k: v for k, v in PROTOCOLS.items() if not v.builtin}


_ADAM = {"beta1": 0.9, "beta2": 0.999}
for _name, _cls, _opt, _summary in (
    ("fedavg", FedAvg, {"name": "sgd", "lr": 1.0}, "n_i / sum n, server SGD lr 1"),
    ("fedavgm", FedAvg, {"name": "momentum", "lr": 0.1, "beta": 0.9},
     "FedAvg weights, server momentum (RoLePRO OptAlgo B)"),
    ("fedadam", FedAvg, {"name": "adam", "lr": 0.1, **_ADAM, "tau": 1e-8},
     "FedAvg weights, server Adam (FLamby)"),
    ("fedyogi", FedAvg, {"name": "yogi", "lr": 0.1, **_ADAM, "tau": 1e-8},
     "FedAvg weights, server Yogi"),
    ("fedadagrad", FedAvg, {"name": "adagrad", "lr": 1.0, **_ADAM, "tau": 1e-8},
     "FedAvg weights, server Adagrad"),
    ("larc", LARC, {"name": "adam", "lr": 0.01, **_ADAM, "tau": 1e-3},
     "Delta-L softmax weights (iDASH 2024 Track 2)"),
    *((cls.name, cls, {"name": "sgd", "lr": 1.0}, "RoLePRO judicious aggregator")
      for cls in (CostWAgg, RoundCWAgg, RegCostAgg, TopKRegCost, RegAgg, SimAgg, RegMedAgg,
                  TrimmedMean)),
    ("feddisco", FedDisco, {"name": "sgd", "lr": 1.0},
     "beta-VAE discrepancy weights (pre-trains the VAE first)"),
    ("rolepro", TwoPhase, {"name": "sgd", "lr": 1.0},
     "FedAvg, then a judicious aggregator (then=..., switch_round=...)"),
    ("autofedrl", AutoFedRL, {"name": "sgd", "lr": 1.0},
     "online RL hyperparameter search (needs --validation-split)"),
):
    register_protocol(_name, _cls, default_optimizer=_opt, summary=_summary,
                      options=getattr(_cls, "options", ()), _builtin=True)


__all__ = ["Capabilities", "ClientAPI", "ClientHalf", "PROTOCOLS", "Protocol", "ProtocolSpec",
           "RoundAPI", "Upload", "custom_protocols", "default_server_optimizer",
           "make_client_half", "make_protocol", "protocol_spec", "register_protocol"]
