"""A per-request deadline in both simulation transports (issue 46, item 4.3).

A client that has not answered a request by its deadline is a dropout for that request: it
is excluded with "no answer by the deadline", the round goes on without waiting for it, and
the others' result stands. Before, the in-process simulation waited for it (a client 8 s
late made the round 8.8 s) and so did a worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from secagg.errors import ConfigError
from secagg.runspec.config import ExperimentConfig
from secagg.server.audit import AuditLog
from secagg.server.transport import DeadlineMissed, InProcessTransport
from secagg.simulation.experiment import default_transport
from secagg.simulation.workers import WorkerPoolTransport
from tests.conftest import honest_client, make_server
from tests.test_engine import fedavg
from tests.test_workers import EchoClients


class Late:
    """An honest client whose first ``train`` answer comes ``seconds`` late (or until
    ``release`` is set); counts the requests it was handed."""

    def __init__(self, cid: str, seconds: float):
        self.answer = honest_client(cid, np.array([9.0, 9.0, 9.0]), 20.0)
        self.seconds, self.handed, self.release = seconds, 0, threading.Event()
        self.done = threading.Event()  # its late first answer is made

    def __call__(self, data: bytes) -> bytes:
        self.handed += 1
        if self.handed == 1:
            self.release.wait(self.seconds)
            try:
                return self.answer(data)
            finally:
                self.done.set()
        return self.answer(data)


def test_a_client_past_the_deadline_is_a_dropout_and_the_round_does_not_wait(honest):
    gs, handlers = honest
    # 60 s late, so that no load on the machine makes a round that did not wait look like one
    # that did (the assertion is about waiting, not about speed)
    late = Late("client_late", 60.0)
    audit = AuditLog()
    server = make_server({**handlers, "client_late": late}, audit=audit, deadline=0.5)
    try:
        start = time.monotonic()
        report = server.run_round(0)
        took = time.monotonic() - start
    finally:
        late.release.set()
    assert took < 30.0, f"the round took {took:.2f} s: it waited for the client 60 s late"
    assert "no answer by the deadline (0.5 s)" in report.excluded["client_late"]
    assert sorted(report.clients) == sorted(gs)
    np.testing.assert_allclose(server.params, fedavg(gs))  # the others' FedAvg stands
    (excluded,) = [r for r in audit.records if r["event"] == "excluded"]
    assert excluded["peer"] == "client_late" and excluded["error"] == "DeadlineMissed"


def test_a_late_client_gets_no_request_while_busy_and_comes_back_when_done(honest):
    gs, handlers = honest
    late = Late("client_late", 30.0)
    server = make_server({**handlers, "client_late": late}, deadline=0.3)
    try:
        assert "client_late" in server.run_round(0).excluded
        busy = server.run_round(1).excluded["client_late"]
        assert "still busy" in busy and late.handed == 1  # round 1's request never reached it
    finally:
        late.release.set()
    assert late.done.wait(30.0)  # its round-0 answer is made now, and dropped
    assert "client_late" in server.run_round(2).clients and late.handed == 2


def test_without_a_deadline_the_handler_runs_in_the_callers_thread():
    seen = []
    transport = InProcessTransport({"c": lambda d: seen.append(threading.current_thread()) or d})
    assert dict(transport.exchange([("c", b"x")])) == {"c": b"x"}
    assert seen == [threading.main_thread()]


def test_a_failing_client_is_still_a_failure_under_a_deadline():
    def crash(data):
        raise RuntimeError("out of memory")

    transport = InProcessTransport({"c": crash}, deadline=5.0)
    ((_, error),) = transport.exchange([("c", b"x")])
    assert not isinstance(error, DeadlineMissed) and "RuntimeError: out of memory" in str(error)


def _busy(log: list[str]):
    """A client that works in Python steps until something is raised in it."""

    def handle(data: bytes) -> bytes:
        try:
            while True:
                time.sleep(0.01)
        except BaseException as exc:
            log.append(type(exc).__name__)
            raise

    return handle


def _client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("secagg-client-")]


def test_closing_the_transport_stops_a_late_client():
    log: list[str] = []
    transport = InProcessTransport({"c": _busy(log)}, deadline=0.2)
    ((_, missed),) = transport.exchange([("c", b"x")])
    assert isinstance(missed, DeadlineMissed) and transport.deadline.late() == ["c"]
    transport.close()  # the driver closes each seed's transport
    assert log == ["ClientStopped"] and not _client_threads()


def test_a_ctrl_c_while_a_client_works_reaches_the_client_as_before():
    """The handler runs on its own thread now; a Ctrl-C the caller gets while it waits is
    raised in the handler too, so that nothing is left running at the interpreter's exit
    (a thread in torch's C++ code then aborts the process)."""
    log: list[str] = []
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            InProcessTransport({"c": _busy(log)}, deadline=30.0).request("c", b"x")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, inherited)
    assert log == ["KeyboardInterrupt"] and not _client_threads()


class SleepyClients(EchoClients):
    """Echo clients in a worker; b"slow" makes one work 60 s first (in short steps, so that
    closing the pool stops it at once)."""

    def __call__(self, ids):
        clients = super().__call__(ids)
        for client in clients.values():
            client.handle = _sleepy(client.handle)
        return clients


def _sleepy(handle):
    def answer(data: bytes) -> bytes:
        if data == b"slow":
            end = time.monotonic() + 60.0
            while time.monotonic() < end:
                time.sleep(0.02)
        return handle(data)

    return answer


def test_a_worker_answers_its_other_clients_while_one_is_past_the_deadline():
    peers = ["c0", "c1", "c2", "c3"]  # c0, c2 in worker 0; c1, c3 in worker 1
    with WorkerPoolTransport(SleepyClients(), peers, workers=2, deadline=0.5) as transport:
        start = time.monotonic()
        first = dict(transport.exchange(iter([("c0", b"slow"), *((p, b"x") for p in peers[1:])])))
        took = time.monotonic() - start
        second = dict(transport.exchange(iter((p, b"y") for p in peers)))
    assert took < 30.0, f"the exchange took {took:.2f} s: it waited for c0, 60 s late"
    assert isinstance(first["c0"], DeadlineMissed)
    assert "no answer by the deadline (0.5 s)" in str(first["c0"])
    assert [first[p] for p in peers[1:]] == [b"c1:x", b"c2:x", b"c3:x"]
    # c0 is still asleep: its next request is not delivered, and its late reply never shows
    assert isinstance(second["c0"], DeadlineMissed) and "still busy" in str(second["c0"])
    assert [second[p] for p in peers[1:]] == [b"c1:y", b"c2:y", b"c3:y"]


class _Factory:
    def __init__(self, config: ExperimentConfig):
        self.config = config

    def __call__(self, ids):
        return EchoClients()(ids)


@pytest.mark.parametrize("seconds, deadline", [(120.0, 120.0), (0.25, 0.25), (0, None)])
def test_the_runs_request_timeout_is_the_in_process_deadline(seconds, deadline):
    config = ExperimentConfig(request_timeout=seconds).validate()
    transport = default_transport(_Factory(config), ["c0"])
    assert isinstance(transport, InProcessTransport)
    assert transport.deadline.seconds == deadline


def test_the_default_request_timeout_is_flowers():
    assert ExperimentConfig().request_timeout == 120.0


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "soon", True])
def test_a_request_timeout_must_be_seconds(bad):
    with pytest.raises(ConfigError, match="request_timeout must be seconds"):
        ExperimentConfig(request_timeout=bad).validate()
