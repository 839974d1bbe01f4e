"""benchmarks/flower.py: its 1e6-parameter task and its report (not the runs: those take
minutes and a deployment)."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

pytest.importorskip("flwr")

from benchmarks import flower as bench  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder for the task's module: a process imports a module file of a name once."""
    return tmp_path_factory.mktemp("flower-bench")


def test_the_fedavg_case_runs_a_model_of_about_a_million_parameters_on_lean(work):
    config = bench.case_config("fedavg-1m", 2, work)  # writes and imports the task
    assert (config.protocol, config.backend) == ("fedavg", "ckks")
    assert config.resolved_backend_options()["preset"] == "lean"
    spec = importlib.util.spec_from_file_location("bench_task", work / bench.TASK_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a second import registers nothing twice
    from secagg.clients.tasks import get_task

    task = get_task(bench.TASK_NAME)
    n = sum(p.numel() for p in task.make_model().parameters())
    assert 0.99e6 < n < 1.01e6
    assert len(task.load().train) == 6  # one client per SuperNode


def _table() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, runs = [], []
    for case in ("larc", "fedavg-1m"):
        for transport, wall in (("in-process", 1.0), ("flower-warm", 2.5)):
            for rnd in (1, 2):
                rows.append(
                    {
                        "case": case, "pair": 1, "transport": transport, "round": rnd,
                        "wall_s": wall, "bytes_up": 100, "bytes_down": 200,
                        "phase_train_s": wall / 2, "phase_reveal_s": wall / 4,
                    }
                )  # fmt: skip
            run = {"case": case, "pair": 1, "transport": transport}
            run |= {"envelopes_up": 1000, "envelopes_down": 2000}
            if transport != "in-process":
                run |= {
                    "messages_sent": 10, "bytes_sent": 7000, "messages_received": 10,
                    "bytes_received": 8000, "flwr_inbound": 1100, "flwr_outbound": 2400,
                }  # fmt: skip
            runs.append(run)
    return pd.DataFrame(rows), pd.DataFrame(runs)


def test_the_report_gives_each_case_its_target_phases_and_flowers_own_count(work):
    table, runs = _table()
    configs = {c: bench.case_config(c, 2, work) for c in bench.CASES}
    text = bench.report(table, runs, configs, 60.0, "python -m benchmarks.flower --pairs 1")
    assert "Made by `python -m benchmarks.flower --pairs 1`" in text
    assert "median **+1.5 s**, **2.50×** the in-process round" in text
    assert "at most +3 s per round" in text and "at most 1.5× the in-process round" in text
    assert "| transport | round | train | reveal |" in text
    assert "| 1 | flower-warm | 1000 | 8000 | 1100 | 1.100 | 2000 | 7000 | 2400 | 1.200 |" in text
    assert "flower-cold was not run" in text
