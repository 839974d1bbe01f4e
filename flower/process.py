"""What each of secagg's processes on Flower sets up for itself, on either side: the
ServerApp's (``secagg.flower.transport``) and a node's (the SuperNode that
``secagg.flower.guard`` starts, the warm executor and each message's process,
``secagg.flower.warm``).

The server side imports this module and never the node's modules; nothing here imports
more than the standard library until it is called.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: Flower's first wait before it asks again for an object that has not arrived (flwr: 1 s,
#: doubling up to 10 s). A message's receiver often asks while its sender is still pushing
#: the objects (measured: 8 of 64 replies of a LARC run waited the whole second)
OBJECT_PULL_BACKOFF = 0.05


def shorten_object_pulls(seconds: float = OBJECT_PULL_BACKOFF) -> None:
    """Make this process's Flower wait ``seconds`` (not 1 s) before it asks again for an
    object that is not there yet; the later waits still double up to Flower's cap, and its
    limits on tries and time are unchanged."""
    from flwr.supercore.inflatable import inflatable_utils as objects

    for pull in (objects.pull_objects, objects.pull_and_inflate_object_from_tree):
        defaults: dict[str, Any] = pull.__kwdefaults__ or {}
        defaults["initial_backoff"] = min(seconds, defaults["initial_backoff"])


def profile_process(role: str) -> Callable[[], None] | None:
    """A diagnostic: where ``SECAGG_FLOWER_PROFILE`` names a folder, profile this process
    (cProfile) from now to its exit, into ``<folder>/<role>-<pid>.prof`` (the ServerApp,
    the executor, each message's process); returns what stops and writes it (also run at
    exit, which a forked child that leaves by ``os._exit`` calls itself), None when not
    asked."""
    where = os.environ.get("SECAGG_FLOWER_PROFILE", "")
    if not os.path.isdir(where):
        return None
    import atexit
    import cProfile

    profile = cProfile.Profile()
    path = os.path.join(where, f"{role}-{os.getpid()}.prof")

    def dump() -> None:
        atexit.unregister(dump)
        profile.disable()
        profile.dump_stats(path)

    atexit.register(dump)
    profile.enable()
    return dump
