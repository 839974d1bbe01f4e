"""benchmarks/flower_floor.py: the message plan it reads from a run's traffic.csv, its echo
App (in this process, through ``flower_grid.LoopbackGrid``), the deployment it pins that App
in, and its report; the run itself (a local Flower deployment) is the slow test."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("flwr")

from benchmarks import flower_floor as bench  # noqa: E402


def _traffic(rounds=(1, 2)) -> pd.DataFrame:
    """A traffic.csv as secagg writes it: per round, phase, direction and peer the fields'
    bytes and the envelope's framing (whose row counts the messages)."""
    rows = []

    def add(rnd, phase, direction, peer, sizes, messages=1):
        for field, size in sizes.items():
            rows.append(
                {
                    "run": 3, "round": rnd, "stage": "round", "phase": phase,
                    "direction": direction, "peer": peer, "field": field,
                    "kind": "framing" if field == "<envelope>" else "ciphertext",
                    "bytes": size, "messages": messages,
                }
            )  # fmt: skip

    add(0, "key_hello", "down", "client_0", {"setup": 48, "<envelope>": 138})
    for rnd in rounds:
        for k in range(3):
            add(rnd, "train", "down", f"client_{k}", {"model": 1000 + rnd, "<envelope>": 100})
            add(rnd, "train", "up", f"client_{k}", {"update": 2000 + k, "<envelope>": 200})
        for k in range(3):  # twice a round: a message each way each time, counted together
            add(rnd, "consent", "down", f"client_{k}", {"release": 600, "<envelope>": 40}, 2)
            add(rnd, "consent", "up", f"client_{k}", {"consent": 100, "<envelope>": 20}, 2)
        for k in (2, 1):
            add(rnd, "reveal", "down", f"client_{k}", {"aggregate": 5000, "<envelope>": 7})
            add(rnd, "reveal", "up", f"client_{k}", {"update": 4000, "<envelope>": 9})
    return pd.DataFrame(rows)


SEQUENCE = ("train", "consent", "reveal", "consent")


def test_the_plan_takes_each_messages_bytes_from_traffic_csv(tmp_path):
    path = tmp_path / "traffic.csv"
    _traffic().to_csv(path, index=False)
    plan = bench.message_plan(path, SEQUENCE)  # the last round's
    assert [step["phase"] for step in plan] == list(SEQUENCE)
    train, consent, reveal, again = (step["messages"] for step in plan)
    assert train == [[0, 1102, 2200], [1, 1102, 2201], [2, 1102, 2202]]  # fields + framing
    assert consent == again == [[0, 320, 60], [1, 320, 60], [2, 320, 60]]  # half each time
    assert reveal == [[2, 5007, 4009], [1, 5007, 4009]]  # the peers the round asked
    assert bench.message_plan(path, SEQUENCE, round_=1)[0]["messages"][0] == [0, 1101, 2200]
    up, down = bench.round_bytes(plan)
    table = _traffic()
    last = table[table["round"] == 2]
    assert (up, down) == tuple(
        int(last.loc[last["direction"] == d, "bytes"].sum()) for d in ("up", "down")
    )


def test_the_fedavg_case_reads_the_measured_sizes():
    """The sizes of the measurement the benchmark reproduces (a fedavg-1m round at 1e6
    parameters), from the traffic.csv rows of one of its peers."""
    rows = []
    for phase, direction, size in (
        ("train", "down", 3994545), ("train", "up", 8044533),
        ("consent", "down", 877), ("consent", "up", 244),
    ):  # fmt: skip
        for k in range(6):
            rows += [
                {"round": 1, "phase": phase, "direction": direction, "peer": f"client_{k}",
                 "field": "x", "bytes": size - 100, "messages": 1},
                {"round": 1, "phase": phase, "direction": direction, "peer": f"client_{k}",
                 "field": "<envelope>", "bytes": 100, "messages": 1},
            ]  # fmt: skip
    for direction, size in (("down", 8115205), ("up", 7988751)):
        for k in (4, 5):
            rows.append(
                {"round": 1, "phase": "reveal", "direction": direction, "peer": f"client_{k}",
                 "field": "<envelope>", "bytes": size, "messages": 1}
            )  # fmt: skip
    plan = bench.message_plan(pd.DataFrame(rows), bench.SEQUENCES["fedavg-1m"])
    assert [(s["phase"], len(s["messages"])) for s in plan] == [
        ("train", 6),
        ("consent", 6),
        ("reveal", 2),
    ]
    assert plan[0]["messages"][0][1:] == [3994545, 8044533]
    assert plan[1]["messages"][5][1:] == [877, 244]
    assert plan[2]["messages"] == [[4, 8115205, 7988751], [5, 8115205, 7988751]]


@pytest.mark.parametrize(
    "sequence",
    [("train", "consent"), ("train", "consent", "reveal", "probe"), ("train",) + ("consent",) * 3],
)
def test_a_plan_that_does_not_fit_the_round_is_refused(sequence):
    with pytest.raises(ValueError):
        bench.message_plan(_traffic(), sequence)


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    """The echo App's module as the benchmark writes it."""
    folder = tmp_path_factory.mktemp("echo-app")
    path = folder / f"{bench.ECHO_MODULE}.py"
    path.write_text(bench.ECHO_SOURCE)
    spec = importlib.util.spec_from_file_location(bench.ECHO_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_payload_is_distinct_in_each_of_flowers_chunks(echo):
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE as CHUNK

    n = 2 * CHUNK + 10
    first, second = echo.payload(n), echo.payload(n)
    assert len(first) == len(second) == n
    for start in range(0, n, CHUNK):  # no chunk of one is a chunk of the other
        assert first[start : start + CHUNK] != second[start : start + CHUNK]
    assert len(echo.payload(5)) == 5 and echo.payload(0) == b""


def test_the_echo_app_sends_the_plan_and_times_each_phase(echo, tmp_path):
    from flwr.app import Context, RecordDict

    from tests.flower_grid import LoopbackGrid

    plan = bench.message_plan(_traffic(), SEQUENCE)
    (tmp_path / "plan.json").write_text(json.dumps({"nodes": 3, "rounds": 2, "exchanges": plan}))
    grid = LoopbackGrid({30 + k: tmp_path for k in range(3)})
    grid.client_app = echo.client_app
    sent = []
    push = grid.push_messages

    def counted(messages):
        messages = list(messages)
        sent.extend(m.metadata.dst_node_id for m in messages)
        return push(messages)

    grid.push_messages = counted
    out = tmp_path / "echo.json"
    config = {"plan": str(tmp_path / "plan.json"), "out": str(out), "timeout": 10.0}
    echo.main(grid, Context(7, 0, {}, RecordDict(), config))
    result = json.loads(out.read_text())
    assert result["nodes"] == [30, 31, 32]
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert set(result["rounds"][0]["phases"]) == {"train", "consent", "reveal"}
    per_round = sum(len(step["messages"]) for step in plan)
    assert len(sent) == grid.delivered == 3 + 2 * per_round  # hellos, then the rounds
    assert sent[3 + 6 : 3 + 8] == [32, 31]  # the reveal: to client_2, then client_1


def test_the_echo_app_refuses_a_request_of_the_wrong_size(echo):
    from secagg.flower import messages
    from tests.flower_grid import as_server

    as_server()
    request = messages.request(5, b"12345", {"size": 6, "reply": 3}, ttl=10)
    with pytest.raises(ValueError, match="received 5 bytes"):
        echo.answer(request, None)


def test_the_echo_deployment_pins_the_echo_app(tmp_path):
    from secagg.flower.guard import app_digest, build_app, check_app, pinned_app

    folder = bench.prepare_echo(tmp_path / "dep", bench.case_config("larc", 2, tmp_path))
    spec = json.loads((folder / "deployment.json").read_text())
    assert spec["tls"] and spec["auth"]
    fab = build_app(folder / "app")  # what `flwr run app/` submits
    assert f"{bench.ECHO_MODULE}:server_app" in (folder / "app" / "pyproject.toml").read_text()
    assert spec["app"] == app_digest(fab)
    for node in sorted((folder / "nodes").iterdir()):
        check_app(fab, pinned_app(node))  # the guard runs it


def _rows() -> pd.DataFrame:
    rows = []
    for pair, (inproc, echo) in enumerate([(2.0, 4.0), (1.9, 4.2), (2.1, 4.1)], start=1):
        for rnd, warm in ((1, True), (2, False)):
            slow = 3.0 if warm else 1.0  # the warm-up rounds must not count
            rows.append(
                {
                    "case": "fedavg-1m", "pair": pair, "transport": "in-process",
                    "round": rnd, "warmup": warm, "wall_s": inproc * slow,
                    "phase_train_s": inproc / 2, "phase_load_s": 0.05, "load_1m": 1 + pair / 10,
                }
            )  # fmt: skip
            rows.append(
                {
                    "case": "fedavg-1m", "pair": pair, "transport": "echo", "round": rnd,
                    "warmup": warm, "wall_s": echo * slow, "phase_train_s": echo / 2,
                    "phase_consent_s": 0.8, "phase_reveal_s": 1.0, "load_1m": 1.0,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_report_gives_each_round_the_ratio_and_the_echos_phases():
    plan = [
        {"phase": "train", "messages": [[k, 3994545, 8044533] for k in range(6)]},
        {"phase": "consent", "messages": [[k, 877, 244] for k in range(6)]},
        {"phase": "reveal", "messages": [[0, 8115205, 7988751], [1, 8115205, 7988751]]},
    ]
    text = bench.report(
        _rows(),
        {"fedavg-1m": plan},
        command="python -m benchmarks.flower_floor --rounds 3",
        machine={"cpu": "Some CPU", "cores": "2", "memory": "24 GiB"},
        seconds=120,
    )
    assert "Made by `python -m benchmarks.flower_floor --rounds 3` at commit" in text
    assert "It took 2.0 minutes on Some CPU, 24 GiB." in text
    assert "1 warm-up round first" in text
    assert "load average as each run started: 1.0 to 1.3 (2 cores)" in text
    assert "| 1 | 2.00 | 4.00 | 2.00 |" in text
    assert "| 2 | 1.90 | 4.20 | 2.21 |" in text
    assert "| median | 2.00 | 4.10 | 2.00 |" in text
    assert "**2.00×** the whole in-process round (the target" in text
    # the echo's phases first, in its order; the engine's own after them
    assert "| transport | round | train | consent | reveal | load |" in text
    assert "| in-process | 2.00 | 1.00 |  |  | 0.05 |" in text
    assert "| echo | 4.10 | 2.05 | 0.80 | 1.00 |  |" in text
    assert "| train | 6 | 3,994,545 | 8,044,533 |" in text
    assert "| reveal | 2 | 8,115,205 | 7,988,751 |" in text
    assert "40,202,942 bytes down and 64,246,164 up" in text


def test_a_bad_case_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--cases", "fedavg-2m", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--cases" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _our_processes() -> list[str]:
    """Command lines of running processes that belong to a flower_floor work folder."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            line = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"/flower-floor-" in line:
            found.append(line.decode(errors="replace"))
    return found


@pytest.mark.slow
def test_one_round_end_to_end(tmp_path, capsys):
    """One pair of fedavg-1m (about 80 s on 2 cores): in process, then the echo over a
    local deployment; both outputs written, every Flower process gone."""
    bench.main(["--rounds", "1", "--warmup", "0", "--cases", "fedavg-1m", "--out", str(tmp_path)])
    table = pd.read_csv(tmp_path / "flower-floor.csv")
    assert sorted(table["transport"]) == ["echo", "in-process"]
    assert (table["bytes_up"].nunique(), table["bytes_down"].nunique()) == (1, 1)
    echo = table[table["transport"] == "echo"].iloc[0]
    assert echo["wall_s"] > 0 and echo["phase_train_s"] > 0 and echo["phase_reveal_s"] > 0
    text = (tmp_path / "flower-floor.md").read_text()
    assert "## fedavg-1m" in text and "| 1 |" in text
    assert text in capsys.readouterr().out
    assert not _our_processes()
