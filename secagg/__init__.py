"""secagg: federated aggregation with CKKS-encrypted client updates and optional DP.

One import namespace: ``secagg`` itself is the privacy layer (wire format, backends, key
wrapping, flooding, DP arithmetic); the algorithms are ``secagg.protocols``, the client runtime
``secagg.clients``, the round engine ``secagg.server``, a run's definition ``secagg.runspec``
(configuration, settings, provisioning), the in-process experiment driver and CLI
``secagg.simulation``, and the Flower deployment ``secagg.flower``.

The experiment API is available at the top (loaded on first use, so that the server's
processes, which import ``secagg.server``, never load torch or the data libraries):

- ``secagg.ExperimentConfig``: every setting of a run;
- ``secagg.run(config=None, *, out=None, transport=None, progress=False, **settings)``:
  run it, get DataFrames and the written files back (``secagg.RunResult``); ``on_round=``
  gets a ``secagg.RoundRecord`` after every round, ``trackers=`` writes TensorBoard/MLflow;
- ``secagg.register_task(name, task)`` with ``secagg.Task``; ``secagg.register_protocol(name,
  cls, ...)`` with ``secagg.Protocol`` and ``secagg.Capabilities``;
  ``secagg.register_backend(spec)`` with ``secagg.BackendSpec``.

Every module logs through ``logging.getLogger(__name__)``, under the ``secagg`` logger, which
has a ``NullHandler`` only: what is shown is the program's choice (``secagg.logs``; secagg's
own command line and Flower processes show it on stderr).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

_LAZY = {
    "ExperimentConfig": "secagg.runspec.config",
    "load_model": "secagg.simulation.outputs",
    "run": "secagg.simulation.api",
    "RunResult": "secagg.simulation.api",
    "RoundRecord": "secagg.simulation.trackers",
    "register_task": "secagg.clients.tasks",
    "Task": "secagg.clients.tasks",
    "ClientData": "secagg.clients.tasks",
    "FederatedData": "secagg.clients.tasks",
    "register_protocol": "secagg.protocols",
    "Protocol": "secagg.protocols",
    "Capabilities": "secagg.protocols",
    "ClientHalf": "secagg.protocols",
    "register_backend": "secagg.backends",
    "BackendSpec": "secagg.backends",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'secagg' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
