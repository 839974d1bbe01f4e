"""How envelopes reach clients: any object with ``peers`` and ``exchange``.

``exchange`` takes the round's requests lazily, one (peer, bytes) at a time, and yields the
replies in the order they arrive, so the server can fold each upload into a running sum and
drop it before the next one comes (and never builds every request at once).

In-process by default: a dict of callables bytes -> bytes, answered one after another.
``simulation.workers`` runs clients in worker processes instead, in parallel. The server
never imports the client package: the experiment driver hands it the transport.

Both give each request a deadline (``request_timeout`` in the run's settings), counted from
when the request is handed to its client: one that has not answered by then is a missing
answer for that request (:class:`DeadlineMissed`), and the round goes on without it. A
simulated client cannot be stopped midway, so it goes on in the background (:class:`Deadline`)
and its late reply is dropped; a request that reaches a client still busy with a late one
waits for it within its own deadline, and is never delivered if it does not get its turn
(as a network message whose time to live ran out).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from secagg.errors import ClientInputError, ClientRefused, UnknownSender

Reply = bytes | ClientInputError  # a reply, or why there is none


class ClientUnavailable(ClientInputError):
    """The client did not answer (in-process: its handler raised)."""

    #: the client answered that it will not do this (one of its rules forbids it), rather
    #: than not answering (down, late, failed): the engine treats a refusal as the
    #: client's decision and a missing answer as a dropout that may come back
    refused = False


class ClientDeclined(ClientUnavailable):
    """The client refused the request (:class:`~secagg.errors.ClientRefused`: its own
    rules forbid it); only the client, the phase and the refusal's code are known."""

    refused = True


class DeadlineMissed(ClientUnavailable):
    """The client did not answer by the request's deadline: a dropout for that request."""


class ClientStopped(BaseException):
    """Raised inside a late client's handler when its transport closes (a BaseException,
    so that the handler's own ``except Exception`` does not take it for its own failure)."""


def _raise_in(thread: threading.Thread, exc: type[BaseException]) -> None:
    """Raise ``exc`` in ``thread`` at its next Python step (after the C call it is in, as
    a signal's KeyboardInterrupt reaches the main thread)."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc)
        )


class Deadline:
    """Runs clients' handlers with a deadline per request: ``seconds`` (None: none, the
    handler runs in the caller's thread as it always did).

    Each request runs on a thread of its own while the caller waits, so requests still run
    one after another unless one is late: that one goes on in the background (a handler
    cannot be stopped midway: its state would be half-updated) and its reply is dropped.
    The next request to the same client waits for it within its own deadline and is not
    delivered if the client is still busy then. A late handler shares the process with the
    ones that follow it (in particular torch's global random generator, which
    ``fork_rng`` saves and restores around a client's training): a round that had a late
    client is not bit-for-bit reproducible. The deadline counts from the hand-over, so a
    handler that holds the GIL in one long C call (SEAL's binding) delays the verdict by
    that call.

    The threads are not daemons: the interpreter never ends under a handler in C++ code
    (which aborts the process: "terminate called without an active exception"). A Ctrl-C
    while the caller waits is raised in the handler too, as it was when the handler ran in
    the caller's thread, and :meth:`close` stops the late ones (:class:`ClientStopped`)."""

    #: seconds :meth:`close` and an interrupted wait give handlers to stop
    STOP_WAIT = 10.0

    def __init__(self, seconds: float | None):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a deadline must be positive seconds or None, got {seconds!r}")
        self.seconds = seconds
        self._late: dict[str, threading.Thread] = {}  # a client's late request, running

    def call(self, peer: str, handler: Callable[[bytes], Any], data: bytes) -> Any:
        """``handler(data)``'s reply (its exception re-raised), or DeadlineMissed."""
        if self.seconds is None:
            return handler(data)
        due = time.monotonic() + self.seconds
        busy = self._late.get(peer)
        if busy is not None:
            busy.join(max(due - time.monotonic(), 0.0))
            if busy.is_alive():
                raise self.missed(peer, "still busy with a request it missed before")
            del self._late[peer]
        box: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                box.append((True, handler(data)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box.append((False, exc))

        thread = threading.Thread(target=run, name=f"secagg-client-{peer}")
        thread.start()
        try:
            thread.join(max(due - time.monotonic(), 0.0))
        except BaseException:  # Ctrl-C (or SIGTERM) while waiting: the handler gets it too
            _raise_in(thread, KeyboardInterrupt)
            thread.join(self.STOP_WAIT)
            raise
        if thread.is_alive():
            self._late[peer] = thread
            raise self.missed(peer)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def missed(self, peer: str, why: str = "") -> DeadlineMissed:
        return DeadlineMissed(
            f"{peer}: no answer by the deadline ({self.seconds:g} s)" + (f"; {why}" if why else "")
        )

    def late(self) -> list[str]:
        """The clients whose late request is still running."""
        return [p for p, t in self._late.items() if t.is_alive()]

    def close(self) -> None:
        """Stop the late handlers still running (:class:`ClientStopped` at their next
        Python step) and wait up to ``STOP_WAIT`` seconds for them."""
        end = time.monotonic() + self.STOP_WAIT
        for thread in self._late.values():
            _raise_in(thread, ClientStopped)
        for thread in self._late.values():
            thread.join(max(end - time.monotonic(), 0.0))
        self._late.clear()


class Transport(Protocol):
    @property
    def peers(self) -> list[str]:
        """The clients connected."""

    def exchange(self, requests: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, Reply]]:
        """Deliver each request; yield (peer, reply or error) as replies arrive."""


class InProcessTransport:
    """Clients in this process, answered one after another; ``deadline``: seconds each
    request may take (None: no deadline), as :class:`Deadline` keeps it."""

    def __init__(
        self, handlers: Mapping[str, Callable[[bytes], bytes]], deadline: float | None = None
    ):
        self._handlers = dict(handlers)
        self.deadline = Deadline(deadline)

    @property
    def peers(self) -> list[str]:
        return list(self._handlers)

    def exchange(self, requests: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, Reply]]:
        for peer, data in requests:
            try:
                yield peer, self.request(peer, data)
            except ClientInputError as exc:
                yield peer, exc

    def close(self) -> None:
        """Stop the clients still busy with a request they missed (:meth:`Deadline.close`)."""
        self.deadline.close()

    def request(self, peer: str, data: bytes) -> bytes:
        handler = self._handlers.get(peer)
        if handler is None:
            raise UnknownSender(f"no client called {peer!r} is connected")
        try:
            reply = self.deadline.call(peer, handler, data)
        except DeadlineMissed:
            raise
        except ClientRefused as exc:
            raise ClientDeclined(str(exc)) from exc  # it names the client
        except Exception as exc:  # the client failed; to the server that is a missing answer
            raise ClientUnavailable(f"{peer} failed: {type(exc).__name__}: {exc}") from exc
        return check_reply(peer, reply)


def check_reply(peer: str, reply: object) -> bytes:
    if not isinstance(reply, (bytes, bytearray)):
        raise ClientUnavailable(f"{peer} answered with {type(reply).__name__}, not bytes")
    return bytes(reply)
