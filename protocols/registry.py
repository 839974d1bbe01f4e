"""The protocol registry: every part of secagg reads it (engine, clients, CLI choices).

A name maps to the protocol class (the server half, whose ``client`` attribute is its client
half) and the server optimizer a run uses unless told otherwise. Each protocol module
registers its own names at its end, so adding a protocol is one module (and its test);
:func:`register_protocol` also takes protocols defined outside secagg.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from secagg.errors import ConfigError
from secagg.options import Option
from secagg.protocols.base import ClientHalf, Protocol


@dataclass(frozen=True)
class Example:
    """A short run of the protocol on its own kind of task, registered with it: what the
    generic tests (the audit on each encrypted backend, parity with plain) and
    ``benchmarks.protocol_parity`` run, so that a new protocol touches its own module and its
    test only.

    ``settings``: the run's settings beyond two rounds of 3 local steps (``ExperimentConfig``
    fields: its task, batch size, protocol options, ...); ``precise``: parity with plain is
    checked on the ``wide`` preset, where ``compact``'s flooding would show (RegAgg's
    τ-scaled sums, the Cox model's Newton step, XGBoost's near-tied splits); ``amplified``:
    the clients train with Adam from the revealed model, which amplifies a backend's noise;
    ``client_vectors``: plaintext vectors each client sends that are not sums, ``"round"``
    (every round) or ``"once"`` (SAVAE's pseudo-points, the Cox model's event times).
    """

    settings: Mapping[str, Any] = field(default_factory=dict)
    precise: bool = False
    amplified: bool = False
    client_vectors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProtocolSpec:
    """A registry entry: the protocol (server half, with its client half attached), the
    server optimizer a run uses unless told otherwise, and one line for ``--help``."""

    protocol: type[Protocol]
    default_optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 1.0})
    summary: str = ""
    builtin: bool = False
    example: Example = Example()
    #: the tasks whose model and data the protocol can train, as patterns of task names
    #: (``fnmatch``: ``"coxph-*"``); empty: any task. A run on another task is refused at
    #: configuration (:func:`check_task`), not aborted in its first round
    tasks: tuple[str, ...] = ()

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
    example: Example | None = None,
    tasks: tuple[str, ...] = (),
    replace: bool = False,
    _builtin: bool = False,
) -> None:
    """Make ``protocol`` available as ``name`` (CLI ``--protocol``, configs, workers).

    ``default_optimizer`` is the server optimizer's configuration (``{"name": "adam",
    "lr": 0.01, ...}``; default SGD with lr 1); ``example``: its short run for the generic
    tests (:class:`Example`; default: two rounds of the default task); ``tasks``: the task
    names (patterns, ``"coxph-*"``) whose model and data it can train, where it cannot train
    any (a run on another task is refused at configuration; your own task serves it under a
    name that matches). A name already taken is refused unless ``replace``.
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
        example if example is not None else Example(),
        tuple(tasks),
    )


def serves(name: str, task: str) -> bool:
    """Whether protocol ``name`` can train task ``task`` (its ``tasks`` patterns)."""
    from fnmatch import fnmatchcase

    patterns = protocol_spec(name).tasks
    return not patterns or any(fnmatchcase(task, p) for p in patterns)


def check_task(name: str, task: str, registered: list[str]) -> None:
    """ConfigError where protocol ``name`` cannot train ``task``, naming the registered
    tasks that it can."""
    if serves(name, task):
        return
    fits = [t for t in registered if serves(name, t)]
    shown = ", ".join(fits[:6]) + (f" and {len(fits) - 6} more" if len(fits) > 6 else "")
    spec = protocol_spec(name)
    example = spec.example.settings.get("task")
    suggest = example if example in fits else fits[0] if fits else None
    raise ConfigError(
        f"protocol {name!r} cannot train task {task!r}: it needs a "
        f"{' or '.join(spec.tasks)} task "
        + (f"({shown}); pass e.g. --task {suggest}" if fits else "(none is registered)")
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
