"""The protocol registry: every part of secagg reads it (engine, clients, CLI choices).

A name maps to the protocol class (the server half, whose ``client`` attribute is its client
half) and the server optimizer a run uses unless told otherwise. Each protocol module
registers its own names at its end, so adding a protocol is one module (and its test);
:func:`register_protocol` also takes protocols defined outside secagg.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from secagg.errors import ConfigError
from secagg.options import Option
from secagg.protocols.base import ClientHalf, Protocol


@dataclass(frozen=True)
class ProtocolSpec:
    """A registry entry: the protocol (server half, with its client half attached), the
    server optimizer a run uses unless told otherwise, and one line for ``--help``."""

    protocol: type[Protocol]
    default_optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 1.0})
    summary: str = ""
    builtin: bool = False

    @property
    def options(self) -> tuple[Option, ...]:
        """Settings with a CLI flag of their own, from the constructor's signature (any
        constructor argument also works as ``--protocol-option key=value``)."""
        return self.protocol.options


PROTOCOLS: dict[str, ProtocolSpec] = {}


def register_protocol(
    name: str,
    protocol: type[Protocol],
    *,
    default_optimizer: dict[str, Any] | None = None,
    summary: str = "",
    replace: bool = False,
    _builtin: bool = False,
) -> None:
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
    PROTOCOLS[name] = ProtocolSpec(
        protocol,
        dict(default_optimizer or {"name": "sgd", "lr": 1.0}),
        summary,
        _builtin,
    )


def load_protocol_entry_points() -> None:
    """Register the protocols installed packages declare (entry point group
    ``secagg.protocols``: a Protocol class); once per process."""
    from secagg.plugins import PROTOCOL_GROUP, new_entry_points

    for point in new_entry_points(PROTOCOL_GROUP):
        if point.name not in PROTOCOLS:
            register_protocol(point.name, point.load())


def protocol_spec(name: str) -> ProtocolSpec:
    if name not in PROTOCOLS:  # an installed package's protocol (entry point)?
        load_protocol_entry_points()
    if name not in PROTOCOLS:
        raise ConfigError(
            f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)} (a protocol of "
            "your own: name its module with --import MODULE, or imports = [...] in a config)"
        )
    return PROTOCOLS[name]


def protocol_settings(name: str) -> dict[str, Any] | None:
    """The settings ``name``'s constructor takes, with their defaults (None: it takes
    arbitrary keywords)."""
    init = protocol_spec(name).protocol.__init__
    if init is object.__init__:
        return {}
    params = inspect.signature(init).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {
        p.name: p.default
        for p in params
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _check_settings(name: str, options: dict[str, Any]) -> None:
    known = protocol_settings(name)
    unknown = sorted(set(options) - set(known)) if known is not None else []
    if known is not None and unknown:
        listed = ", ".join(f"{k} (default {v!r})" for k, v in known.items()) or "none"
        raise ConfigError(
            f"protocol {name!r} has no setting {', '.join(map(repr, unknown))}; "
            f"its settings: {listed}"
        )


def make_protocol(name: str, **options: Any) -> Protocol:
    """The server half of ``name`` with these options."""
    cls = protocol_spec(name).protocol
    _check_settings(name, options)
    try:
        return cls(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for protocol {name!r}: {exc}") from None


def make_client_half(name: str, **options: Any) -> ClientHalf:
    """The client half of ``name`` for a run with these protocol options."""
    cls = protocol_spec(name).protocol
    _check_settings(name, options)
    try:
        return cls.make_client(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for protocol {name!r}: {exc}") from None


def default_server_optimizer(name: str) -> dict[str, Any]:
    return dict(protocol_spec(name).default_optimizer)


def custom_protocols() -> dict[str, ProtocolSpec]:
    """Protocols registered from outside secagg (worker processes register them again)."""
    return {k: v for k, v in PROTOCOLS.items() if not v.builtin}
