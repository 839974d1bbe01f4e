"""A guarded SuperNode that dies is noticed sooner, and one that is restarted comes back.

Flower 1.42's SuperNode tells the SuperLink it beats every 30 s, and the SuperLink counts it
online until two beats are missed. So for a minute after a node dies, every request to it
waits for the ServerApp's timeout, and a node restarted within that minute is refused:
the SuperLink still holds its previous session as online, and Flower exits with code 305
("Failed to activate SuperNode"), which an operator then has to notice and retry.

- :func:`shorten_heartbeats`: a guarded node beats every 10 s (Flower's minimum interval),
  so it is marked offline 20 s after it dies. The price is one small request per node every
  4 s or so.
- :func:`supervise`: ``secagg flower node`` runs the guarded SuperNode as a child and starts
  it again, a few seconds later, while it exits because its activation was refused
  (:func:`exit_when_refused` gives that exit a status of its own), for up to
  :data:`RESTART_WINDOW` seconds. Any other exit is the node's own and ends it.
"""

from __future__ import annotations

import importlib
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger(__name__)

#: the heartbeat interval a guarded SuperNode announces (flwr: 30 s; its minimum: 10 s)
HEARTBEAT_SECONDS = 10.0
#: the exit status of a guarded SuperNode whose activation the SuperLink refused (EX_TEMPFAIL:
#: try again later). Flower itself exits 1 for every error (its code 305 is only printed)
ACTIVATION_REFUSED = 75
#: how long a restarted node keeps trying: two heartbeat intervals of the previous session
#: (flwr's default 30 s, in case the previous one was not guarded) and some slack
RESTART_WINDOW = 150.0
RESTART_PAUSE = 3.0

#: where flwr 1.42 reads the interval it announces and beats at (module globals)
_HEARTBEAT_MODULES = ("flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat")


def shorten_heartbeats(seconds: float = HEARTBEAT_SECONDS) -> list[str]:
    """Make this process's SuperNode announce and keep a ``seconds`` heartbeat interval;
    returns the modules changed."""
    changed = []
    for name in _HEARTBEAT_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "HEARTBEAT_DEFAULT_INTERVAL"):
            setattr(module, "HEARTBEAT_DEFAULT_INTERVAL", seconds)  # noqa: B010 - a flwr global
            changed.append(name)
    return changed


def exit_when_refused() -> None:
    """Make this process's SuperNode exit with :data:`ACTIVATION_REFUSED` when the
    SuperLink refuses to activate it (flwr 1.42: ``flwr_exit(305, "... Failed to activate
    SuperNode ...")``, which would exit 1 like any other error)."""
    import os

    import flwr.supernode.fleet_http_connection as fleet

    original = fleet.flwr_exit

    def flwr_exit(code: int, message: str | None = None, *args: Any, **kwargs: Any) -> None:
        if int(code) == 305 and "Failed to activate SuperNode" in (message or ""):
            LOG.error(
                "secagg flower node: the SuperLink refused this node's activation: %s", message
            )
            os._exit(ACTIVATION_REFUSED)  # nothing ran yet: no state to save
            return
        original(code, message, *args, **kwargs)

    fleet.flwr_exit = flwr_exit  # type: ignore[assignment]


def supervise(
    command: list[str],
    *,
    window: float = RESTART_WINDOW,
    pause: float = RESTART_PAUSE,
    log: Callable[[str], None] | None = None,
    start: Callable[..., Any] = subprocess.Popen,
) -> int:
    """Run ``command`` (a guarded SuperNode) and start it again after ``pause`` seconds
    while it exits with :data:`ACTIVATION_REFUSED`, for up to ``window`` seconds; returns
    its last exit code. SIGTERM and SIGINT go on to the child."""
    say = log or LOG.warning
    deadline = time.monotonic() + window
    child: Any = None

    def forward(sig: int, _frame: Any) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(sig)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            child = start(command)
            code = child.wait()
            if code != ACTIVATION_REFUSED:
                return int(code)
            if time.monotonic() + pause > deadline:
                say(
                    f"secagg flower node: the SuperLink refused this node's activation for "
                    f"{window:.0f} s; giving up"
                )
                return int(code)
            say(
                "secagg flower node: the SuperLink still holds this node's previous session "
                f"as online (it is marked offline after two missed heartbeats); starting "
                f"again in {pause:.0f} s"
            )
            time.sleep(pause)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
