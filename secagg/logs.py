"""Where secagg's log lines go: one ``secagg`` logger, configured by the entry points.

Library modules log through ``logging.getLogger(__name__)``, under the ``secagg`` logger,
which has only a ``NullHandler`` (``secagg/__init__.py``): a program that imports secagg
decides what it shows. secagg's own entry points, which render output for a person or
write a node's log, call :func:`to_stderr` once: the command line (``secagg``), the
SuperNode's guard and its warm executor, and Flower's ServerApp and ClientApp
(``secagg.flower.apps``). Their lines read as before: the message only, on stderr.
``secagg.run(progress=True)`` asks for progress on stderr: :func:`ensure_stderr`.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

#: the logger every secagg module's logger is a child of
ROOT = "secagg"


class StderrHandler(logging.StreamHandler[TextIO]):
    """A handler that writes to ``sys.stderr`` as it is when a record is written, not as
    it was when the handler was made: Flower replaces or wraps a ServerApp's and a
    ClientApp's stderr to ship it to its log, and pytest's ``capsys`` replaces it too."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:  # StreamHandler.__init__ sets it
        pass


def to_stderr(level: int = logging.INFO, *, prefix: str = "") -> logging.Handler:
    """Show secagg's records at ``level`` and above on stderr, one line each: ``prefix``
    and the message (a traceback after it where the record has one). Called again, it
    replaces the handler it added before (level and prefix are the last call's). The
    ``secagg`` logger stops propagating to the root logger."""
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if isinstance(h, StderrHandler)]:
        logger.removeHandler(old)
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    handler.setLevel(level)
    logger.addHandler(handler)
    # the entry point owns this process's output: each line once, as above, and not again
    # through a handler on the root logger (opacus, imported with the clients, sets one up
    # with logging.basicConfig: a dated copy of every line)
    logger.propagate = False
    logger.setLevel(min(level, logger.level) if logger.level else level)
    return handler


def stderr_level() -> int | None:
    """The level of the stderr handler :func:`to_stderr` added, None where there is none:
    what a spawned worker process (``secagg.simulation.workers``) sets up in turn."""
    for handler in logging.getLogger(ROOT).handlers:
        if isinstance(handler, StderrHandler):
            return handler.level
    return None


def ensure_stderr(level: int = logging.INFO) -> None:
    """Make secagg's records at ``level`` show on stderr, for what was asked for there
    (``secagg.run(progress=True)``): :func:`to_stderr` unless an entry point did so already
    (then only the ``secagg`` logger's level lowered to ``level`` where it was above). A
    program that routes secagg's records itself (through its root logger) passes a callable
    as ``progress`` instead, e.g. ``logging.getLogger("secagg.progress").info``."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        to_stderr(level)
    elif not logger.isEnabledFor(level):
        logger.setLevel(level)
