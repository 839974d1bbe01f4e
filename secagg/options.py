"""A setting that a pluggable part (a backend, a protocol) declares for itself.

The CLI builds its option groups from these (``--<flag>``), and configs name them by ``key``,
so neither the engine nor the CLI lists a backend's or a protocol's settings by hand.

A protocol declares each setting once, in its constructor's signature: the parameter gives
the key, the type and the default, a :class:`Flag` in its annotation the command-line flag
and the help::

    def __init__(self, q: Annotated[float, Flag("larc-q", "softmax temperature q")] = 19.0):

:func:`options_of` reads them back as :class:`Option` records (a backend, built by factory
functions rather than a constructor, lists its :class:`Option` records itself).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """One setting: its key (in ``backend_options`` / ``protocol_options``), its CLI flag,
    type (``bool`` makes a switch), default, allowed choices and help text."""

    key: str
    flag: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Flag:
    """A constructor parameter's command-line flag (without ``--``) and help; ``choices``
    restricts its values. The parameter itself gives the key, the type and the default."""

    flag: str
    help: str
    choices: tuple[Any, ...] | None = None


def options_of(init: Callable[..., Any]) -> tuple[Option, ...]:
    """The :class:`Option` of every parameter of ``init`` whose annotation carries a
    :class:`Flag`, in signature order. A flagged parameter without a default, or whose
    default is not of its type, is a programming error (TypeError, at first use)."""
    hints = typing.get_type_hints(init, include_extras=True)
    found = []
    for name, parameter in inspect.signature(init).parameters.items():
        hint = hints.get(name)
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        kind, *extras = typing.get_args(hint)
        flag = next((e for e in extras if isinstance(e, Flag)), None)
        if flag is None:
            continue
        default = parameter.default
        if default is parameter.empty:
            raise TypeError(f"{init.__qualname__}: the flagged setting {name!r} needs a default")
        numeric = kind is float and type(default) is int
        if not (isinstance(default, kind) or numeric) or isinstance(default, bool) != (
            kind is bool
        ):
            raise TypeError(
                f"{init.__qualname__}: {name!r} defaults to {default!r}, not a {kind.__name__}"
            )
        found.append(Option(name, flag.flag, kind, default, flag.help, flag.choices))
    return tuple(found)
