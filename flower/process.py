"""What each of secagg's processes on Flower sets up for itself, on either side: the
ServerApp's (``secagg.flower.transport``) and a node's (the SuperNode that
``secagg.flower.guard`` starts, the warm executor and each message's process,
``secagg.flower.warm``).

The server side imports this module and never the node's modules; nothing here imports
more than the standard library until it is called.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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


#: the time (``time.monotonic``) by which the replies being pulled must be in, set by the
#: ServerApp's transport around each pull (:func:`objects_due`); None: Flower's own limits
_OBJECTS_DUE: ContextVar[float | None] = ContextVar("secagg_objects_due", default=None)
#: the longest wait between two asks for a missing object while a deadline is set (flwr's
#: cap is 10 s, which would overshoot the deadline by as much)
BOUNDED_BACKOFF_CAP = 1.0
#: the least a pull is given, however late it starts
LEAST_PULL_SECONDS = 0.5


def bound_object_pulls() -> None:
    """Make this process's grid give up a reply whose content has not arrived by the
    deadline that :func:`objects_due` sets, instead of after Flower's limits (7200 s or
    500 tries per object).

    Why: flwr 1.42's ``Grid.pull_messages`` lists a reply as soon as its node has pushed
    the reply's header and then pulls the replies' objects one message after another. A
    node that dies while pushing its reply leaves one whose objects never come; the call
    waited for them (measured: 183 s) and held every other reply it had listed, which the
    SuperLink had marked delivered and would not list again, until their messages expired
    there: a round lost every client but one. Bounded, the dead node's reply fails as
    Flower's ``MESSAGE_UNAVAILABLE`` (a dropout) in time for the others."""
    from flwr.superlink.grid import http_grid

    pull = http_grid.pull_objects
    if getattr(pull, "bounded_by_secagg", False):
        return

    def pull_objects(object_ids: list[str], pull_object_fn: Any, **kwargs: Any) -> Any:
        due = _OBJECTS_DUE.get()
        if due is not None:
            defaults = pull.__kwdefaults__ or {}
            left = max(due - time.monotonic(), LEAST_PULL_SECONDS)
            limit = kwargs.get("max_time", defaults.get("max_time"))
            kwargs["max_time"] = left if limit is None else min(limit, left)
            cap = kwargs.get("backoff_cap", defaults.get("backoff_cap"))
            kwargs["backoff_cap"] = (
                BOUNDED_BACKOFF_CAP if cap is None else min(cap, BOUNDED_BACKOFF_CAP)
            )
        return pull(object_ids, pull_object_fn, **kwargs)

    pull_objects.bounded_by_secagg = True  # type: ignore[attr-defined]
    http_grid.pull_objects = pull_objects


@contextmanager
def objects_due(deadline: float) -> Iterator[None]:
    """Within this block, a pull of replies gives up on any reply whose objects have not
    all arrived by ``deadline`` (``time.monotonic``; :func:`bound_object_pulls`)."""
    token = _OBJECTS_DUE.set(deadline)
    try:
        yield
    finally:
        _OBJECTS_DUE.reset(token)


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
