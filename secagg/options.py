"""A setting that a pluggable part (a backend, a protocol) declares for itself.

The CLI builds its option groups from these (``--<flag>``), and configs name them by ``key``,
so neither the engine nor the CLI lists a backend's or a protocol's settings by hand.
"""

from __future__ import annotations

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
