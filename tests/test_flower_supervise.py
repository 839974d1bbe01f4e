"""A guarded SuperNode that is restarted comes back by itself (``secagg.flower.supervise``):
its activation refused while the SuperLink still counts its previous session online, it is
started again; any other exit ends it. A killed node's restart over a real SuperLink:
``test_flower_e2e.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from secagg.flower import supervise as S


class Child:
    def __init__(self, code: int):
        self.code = code

    def wait(self) -> int:
        return self.code

    def poll(self) -> int:
        return self.code


def starts(*codes: int):
    started: list[list[str]] = []
    queue = list(codes)

    def start(command):
        started.append(command)
        return Child(queue.pop(0))

    return started, start


def test_a_refused_activation_is_retried_until_the_node_runs():
    started, start = starts(S.ACTIVATION_REFUSED, S.ACTIVATION_REFUSED, 0)
    said: list[str] = []
    assert S.supervise(["node"], pause=0, start=start, log=said.append) == 0
    assert started == [["node"]] * 3
    assert len(said) == 2 and "previous session" in said[0]


@pytest.mark.parametrize("code", [0, 1, 2, -9])
def test_any_other_exit_is_the_nodes_own_and_ends_it(code):
    started, start = starts(code, 0)
    assert S.supervise(["node"], pause=0, start=start, log=lambda _: None) == code
    assert len(started) == 1


def test_a_node_refused_for_the_whole_window_gives_up():
    started, start = starts(*[S.ACTIVATION_REFUSED] * 3)
    said: list[str] = []
    code = S.supervise(["node"], window=0.0, pause=0.01, start=start, log=said.append)
    assert code == S.ACTIVATION_REFUSED and len(started) == 1 and "giving up" in said[-1]


def test_a_guarded_node_announces_a_shorter_heartbeat():
    import flwr.supercore.heartbeat as beats
    import flwr.supernode.fleet_http_connection as fleet

    before = (fleet.HEARTBEAT_DEFAULT_INTERVAL, beats.HEARTBEAT_DEFAULT_INTERVAL)
    try:
        assert set(S.shorten_heartbeats(10.0)) == set(S._HEARTBEAT_MODULES)
        assert fleet.HEARTBEAT_DEFAULT_INTERVAL == beats.HEARTBEAT_DEFAULT_INTERVAL == 10.0
    finally:
        fleet.HEARTBEAT_DEFAULT_INTERVAL, beats.HEARTBEAT_DEFAULT_INTERVAL = before


def test_a_node_folder_that_is_not_one_fails_with_what_to_do(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "secagg.flower.guard", str(tmp_path), "--insecure"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "secagg flower node: error:" in done.stderr and "secagg flower prepare" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_refused_activation_exits_with_a_status_of_its_own(monkeypatch):
    """Flower exits 1 for every error; the supervisor must tell a refused activation apart."""
    import flwr.supernode.fleet_http_connection as fleet

    exits, calls = [], []
    monkeypatch.setattr(fleet, "flwr_exit", lambda code, message=None: calls.append(code))
    monkeypatch.setattr("os._exit", exits.append)
    S.exit_when_refused()
    fleet.flwr_exit(305, "Failed to initialize ...\n[code: 2004] Failed to activate SuperNode.")
    assert exits == [S.ACTIVATION_REFUSED] and calls == []
    fleet.flwr_exit(305, "Failed to initialize the connection: connection refused")
    assert calls == [305] and exits == [S.ACTIVATION_REFUSED]  # any other error is Flower's
