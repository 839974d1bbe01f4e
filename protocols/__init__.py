"""The aggregation algorithms, one module each (both halves), plus the server optimizers.

Importing the package imports every module in it, and each protocol module registers its
names in ``secagg.protocols.registry`` (``PROTOCOLS``): a new protocol is a new module.
:func:`register_protocol` adds a protocol defined anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil

from secagg.protocols.base import Capabilities, ClientAPI, ClientHalf, Protocol, RoundAPI, Upload
from secagg.protocols.registry import (
    PROTOCOLS,
    ProtocolSpec,
    custom_protocols,
    default_server_optimizer,
    make_client_half,
    make_protocol,
    protocol_spec,
    register_protocol,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Capabilities",
    "ClientAPI",
    "ClientHalf",
    "PROTOCOLS",
    "Protocol",
    "ProtocolSpec",
    "RoundAPI",
    "Upload",
    "custom_protocols",
    "default_server_optimizer",
    "make_client_half",
    "make_protocol",
    "protocol_spec",
    "register_protocol",
]
