"""Clients in worker processes, so that they train and encrypt in parallel across the cores.

Threads would not do: SEAL's Python binding holds the GIL, and two threads encrypting a
million parameters each took 0.81 s against 0.36 s for one (measured here). So the
simulation starts ``workers`` processes (spawned, not forked: forking after torch or SEAL
has started threads is unsafe), each builds its share of the clients itself from a
picklable ``build(ids) -> {id: client}`` and answers their envelopes. The server process
never holds a client, so its memory is its own, and the bytes it exchanges with a worker
are the envelopes a network would carry.

The transport keeps at most ``in_flight`` requests outstanding per worker (requests are
serialised only when sent, so the server never holds a round's requests at once) and yields
replies as they arrive, so a streaming server folds one upload while the next ones are
being computed. A reader thread in each worker drains requests so that neither side can
block the other on a full pipe.

Each request has a deadline (``deadline`` seconds, the run's ``request_timeout``), counted
by the worker from when it hands the request to its client (so a client is not late because
another client of its worker was): a client that has not answered by then is a missing
answer for that request (``DeadlineMissed``), the worker goes on to its next request, and
the late client's reply is dropped when it comes (``secagg.server.transport.Deadline``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from typing import Any

from secagg.errors import ClientRefused, ConfigError
from secagg.server.transport import (
    ClientDeclined,
    ClientUnavailable,
    Deadline,
    DeadlineMissed,
    Reply,
    check_reply,
)

Build = Callable[[list[str]], dict[str, Any]]  # ids -> objects with .handle(bytes) -> bytes


def _status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (0 where there is none)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident memory since start or the last ``reset_peak_rss``."""
    return _status_bytes("VmHWM")


def current_rss_bytes() -> int:
    return _status_bytes("VmRSS")


def reset_peak_rss() -> None:
    """Restart the peak-memory count (Linux: writing 5 to clear_refs resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not permitted: peaks then count from process start
        pass


def _send(conn: Connection, kind: str, peer: str | None, payload: Any = None) -> None:
    """A message on a pipe: a small pickled header, and bytes payloads (envelopes) sent raw
    after it, so that a model-sized envelope is not copied into a pickle on the way."""
    if isinstance(payload, (bytes, bytearray)):
        conn.send((kind, peer, None, True))
        conn.send_bytes(payload)
    else:
        conn.send((kind, peer, payload, False))


def _recv(conn: Connection) -> tuple[str, str | None, Any]:
    kind, peer, payload, raw = conn.recv()
    return kind, peer, conn.recv_bytes() if raw else payload


def _serve(
    build: Build,
    ids: list[str],
    inbox: Connection,
    outbox: Connection,
    threads: int,
    deadline: float | None = None,
    log_level: int | None = None,
) -> None:
    """A worker's main loop: build its clients, then answer requests in order, each by its
    deadline (``deadline`` seconds from when the request is handed over; None: none).
    ``log_level``: the parent's secagg log lines go to stderr from this level
    (``secagg.logs.stderr_level``), so do the worker's (a spawned process starts without)."""
    if log_level is not None:
        from secagg.logs import to_stderr

        to_stderr(log_level)
    # Ctrl-C reaches the whole process group: the parent handles it (saves what finished
    # and closes the pool); a worker that also raised would print a traceback per process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        clients = build(ids)
        if "torch" in sys.modules:  # each worker trains on its own core(s)
            sys.modules["torch"].set_num_threads(threads)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        _send(outbox, "failed", None, traceback.format_exc())
        return
    _send(outbox, "ready", None, os.getpid())
    pending: queue.Queue = queue.Queue()
    clock = Deadline(deadline)

    def drain():  # always read, so the server never blocks writing a request
        while True:
            try:
                message = _recv(inbox)
            except (EOFError, OSError):
                message = ("stop", None, None)
            pending.put(message)
            if message[0] == "stop":
                return

    threading.Thread(target=drain, daemon=True).start()
    while True:
        kind, peer, data = pending.get()
        if kind == "stop":
            clock.close()  # late clients: stopped, not left to the interpreter's exit
            return
        if kind == "request":
            try:
                _send(outbox, "reply", peer, clock.call(peer, clients[peer].handle, data))
            except DeadlineMissed as exc:  # the client goes on in the background
                _send(outbox, "late", peer, str(exc))
            except ClientRefused as exc:  # its own rules forbid it: a refusal, not a dropout
                _send(outbox, "refused", peer, str(exc))
            except Exception as exc:  # noqa: BLE001 - a client's failure is a missing answer
                _send(outbox, "error", peer, f"{type(exc).__name__}: {exc}")
            del data
        elif kind == "stats":
            _send(
                outbox,
                "stats",
                None,
                {
                    "pid": os.getpid(),
                    "peak_rss_bytes": peak_rss_bytes(),
                    "clients": {c: dict(getattr(obj, "seconds", {})) for c, obj in clients.items()},
                },
            )
        elif kind == "reset_peak":
            reset_peak_rss()
            _send(outbox, "reset", None)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C until the block is done, then act on it as usual.

    Starting a spawned worker writes its pickled arguments down a pipe; a KeyboardInterrupt
    in the middle leaves the child reading half of them, and its EOFError traceback ends the
    user's terminal output instead of the "interrupted; continue with --resume" line. SIGINT
    is also blocked for the children while they start (they inherit the mask across exec;
    ``_serve`` then ignores it: the parent handles Ctrl-C for the pool)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


class WorkerPoolTransport:
    """A transport whose clients live in ``workers`` processes (client k in worker k % workers);
    ``deadline``: seconds each request may take once its worker hands it over (None: none)."""

    def __init__(
        self,
        build: Build,
        peers: list[str],
        workers: int,
        in_flight: int = 2,
        torch_threads: int = 1,
        deadline: float | None = None,
    ):
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}")
        self._peers = list(peers)
        self.in_flight = in_flight
        workers = min(workers, len(self._peers))
        self._owner = {p: k % workers for k, p in enumerate(self._peers)}
        ctx = mp.get_context("spawn")
        self._inboxes: list[Connection] = []
        self._outboxes: list[Connection] = []
        self._procs: list[Any] = []  # the spawn context's Process objects
        self._dead: set[int] = set()
        self.deadline = deadline
        try:
            self._start(ctx, build, workers, torch_threads)
        except BaseException:  # a deferred Ctrl-C: the started workers stop with the run
            self.close()
            raise
        for w, box in enumerate(self._outboxes):
            kind, _, detail = self._receive(w)
            if kind != "ready":
                self.close()
                raise ConfigError(f"worker {w} could not build its clients:\n{detail}")

    def _start(self, ctx: Any, build: Build, workers: int, torch_threads: int) -> None:
        """Start the worker processes (a Ctrl-C mid-spawn would leave a child reading half a
        pickle: it is held until every worker has its arguments)."""
        from secagg.logs import stderr_level

        level = stderr_level()
        with sigint_deferred():
            for w in range(workers):
                req_read, req_write = ctx.Pipe(duplex=False)
                rep_read, rep_write = ctx.Pipe(duplex=False)
                ids = [p for p in self._peers if self._owner[p] == w]
                proc = ctx.Process(
                    target=_serve,
                    args=(build, ids, req_read, rep_write, torch_threads, self.deadline, level),
                    daemon=True,
                )
                proc.start()
                req_read.close()
                rep_write.close()
                self._inboxes.append(req_write)
                self._outboxes.append(rep_read)
                self._procs.append(proc)

    @property
    def peers(self) -> list[str]:
        return list(self._peers)

    @property
    def workers(self) -> int:
        return len(self._procs)

    def _receive(self, w: int) -> tuple:
        try:
            return _recv(self._outboxes[w])
        except (EOFError, OSError):
            code = self._procs[w].exitcode
            return ("dead", None, f"worker {w} exited (code {code})")

    def exchange(self, requests: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, Reply]]:
        """Send requests in order, at most ``in_flight`` per worker outstanding; a request
        whose worker is full waits (and holds back the ones behind it)."""
        requests = iter(requests)
        outstanding: list[deque[str]] = [deque() for _ in self._procs]
        results: deque[tuple[str, Reply]] = deque()
        next_up: tuple[str, bytes] | None = None
        exhausted = False

        def send_what_fits() -> None:
            nonlocal next_up, exhausted
            while True:
                if next_up is None:
                    try:
                        next_up = next(requests)
                    except StopIteration:
                        exhausted = True
                        return
                peer, data = next_up
                w = self._owner.get(peer)
                if w is None or w in self._dead:
                    results.append(
                        (
                            peer,
                            ClientUnavailable(
                                f"{peer}: no such client" if w is None else f"{peer}'s worker died"
                            ),
                        )
                    )
                elif len(outstanding[w]) >= self.in_flight:
                    return
                else:
                    try:
                        _send(self._inboxes[w], "request", peer, data)
                        outstanding[w].append(peer)
                    except OSError as exc:  # BrokenPipeError: the worker is gone
                        self._dead.add(w)
                        results.append((peer, ClientUnavailable(f"{peer}'s worker: {exc}")))
                next_up = None

        send_what_fits()
        while True:
            while results:
                yield results.popleft()
            busy = [w for w, o in enumerate(outstanding) if o]
            if not busy:
                if exhausted:
                    return
                send_what_fits()
                continue
            for box in wait([self._outboxes[w] for w in busy]):
                w = next(k for k in busy if self._outboxes[k] is box)  # wait() returns them
                kind, peer, payload = self._receive(w)
                if kind == "dead":  # every request it held goes unanswered
                    self._dead.add(w)
                    results += [(p, ClientUnavailable(payload)) for p in outstanding[w]]
                    outstanding[w].clear()
                    continue
                outstanding[w].popleft()  # a worker answers its requests in order
                if kind == "reply":
                    try:
                        results.append((peer, check_reply(peer, payload)))
                    except ClientUnavailable as exc:
                        results.append((peer, exc))
                elif kind == "late":
                    results.append((peer, DeadlineMissed(payload)))
                elif kind == "refused":
                    results.append((peer, ClientDeclined(payload)))  # it names the client
                else:
                    results.append((peer, ClientUnavailable(f"{peer} failed: {payload}")))
            send_what_fits()

    # ---- measurement (the experimenter's view, not the server's) --------------------------
    def _broadcast(self, kind: str) -> list[Any]:
        for box in self._inboxes:
            _send(box, kind, None)
        return [self._receive(w)[2] for w in range(len(self._procs))]

    def stats(self) -> list[dict[str, Any]]:
        """Per worker: pid, peak RSS since the last reset, and each client's seconds."""
        return self._broadcast("stats")

    def reset_peaks(self) -> None:
        self._broadcast("reset_peak")

    def close(self) -> None:
        for box, proc in zip(self._inboxes, self._procs):
            try:
                _send(box, "stop", None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()

    def __enter__(self) -> WorkerPoolTransport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
