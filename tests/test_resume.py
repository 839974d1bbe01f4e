"""A run never loses work: Ctrl-C (a real SIGINT to a real `secagg run` process) keeps the
finished seeds, and --resume completes the run to exactly the uninterrupted result."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secagg.simulation.cli import main

RUN = ["--protocol", "larc", "--rounds", "3", "--seeds", "1,2,3", "--local-steps", "40"]


def comparable(folder: Path) -> pd.DataFrame:
    """metrics.csv without the wall-clock columns (the only ones that may differ)."""
    metrics = pd.read_csv(folder / "metrics.csv")
    return metrics.drop(columns=[c for c in metrics if c.startswith("seconds_")])


def finished_seeds(folder: Path) -> int:
    try:
        return len(json.loads((folder / "run.json").read_text())["finished"])
    except (OSError, json.JSONDecodeError, KeyError):
        return 0


def interrupt_after_first_seed(
    folder: Path, *extra: str, sig: int = signal.SIGINT
) -> subprocess.CompletedProcess:
    """Start `secagg run`, send ``sig`` once a seed has finished, return how it ended."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "secagg.simulation.cli", "run", *RUN, *extra, "--out", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 300
    while finished_seeds(folder) < 1:
        assert proc.poll() is None, f"the run ended before a seed finished: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no seed finished within 300 s"
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("whole") / "run"
    assert main(["run", *RUN, "--quiet", "--out", str(folder)]) == 0
    return folder


@pytest.mark.parametrize("workers", ["0", pytest.param("2", marks=pytest.mark.slow)])
def test_sigint_keeps_finished_seeds_and_resume_gives_the_same_run(
    uninterrupted, tmp_path, workers
):
    folder = tmp_path / "run"
    stopped = interrupt_after_first_seed(folder, "--workers", workers)
    assert stopped.returncode == 130, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert "interrupted" in last and "--resume" in last, stopped.stderr
    assert "Traceback" not in stopped.stderr, stopped.stderr
    state = json.loads((folder / "run.json").read_text())
    assert state["status"] == "interrupted"
    done = sorted(int(s) for s in state["finished"])
    assert 1 <= len(done) < 3, "SIGINT came too late to test anything"
    # what finished is complete on disk: its rows, its model, the tables
    saved = comparable(folder)
    assert set(saved["seed"]) <= {*done, done[-1] + 1}  # + the seed in progress, per round
    for seed in done:
        assert (saved["seed"] == seed).sum() == 4  # round 0 + 3 rounds
        assert (folder / "models" / f"seed-{seed}.npy").is_file()
    assert (folder / "summary.csv").is_file() and (folder / "audit_summary.json").is_file()

    # resumed in this process (the worker count may change: it changes speed, not results)
    assert main(["run", "--resume", str(folder), "--workers", "0", "--quiet"]) == 0
    pd.testing.assert_frame_equal(comparable(folder), comparable(uninterrupted))
    for name in ("audit_summary.json", "privacy.json"):
        assert json.loads((folder / name).read_text()) == json.loads(
            (uninterrupted / name).read_text()
        ), name
    for seed in (1, 2, 3):
        np.testing.assert_array_equal(
            np.load(folder / "models" / f"seed-{seed}.npy"),
            np.load(uninterrupted / "models" / f"seed-{seed}.npy"),
        )
    assert json.loads((folder / "run.json").read_text())["status"] == "complete"


def test_resume_refuses_other_settings_and_a_folder_without_a_run(uninterrupted, tmp_path, capsys):
    assert main(["run", "--resume", str(uninterrupted), "--rounds", "4", "--quiet"]) == 2
    assert "other settings (rounds)" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["run", "--resume", str(tmp_path / "empty"), "--quiet"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_resuming_a_complete_run_trains_nothing_and_keeps_its_results(
    uninterrupted, tmp_path, capsys
):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(uninterrupted, copy)
    assert main(["run", "--resume", str(copy)]) == 0
    assert "round 1/" not in capsys.readouterr().err  # no seed ran again
    pd.testing.assert_frame_equal(comparable(copy), comparable(uninterrupted))


def test_sigterm_stops_like_ctrl_c_and_the_folder_is_locked_while_a_run_writes(tmp_path, capsys):
    """What SLURM sends at the time limit: the run stops as on Ctrl-C, with its one line,
    its finished seeds kept and its folder marked interrupted and resumable, but exits 143
    (128 + SIGTERM), as the shell counts it. While a process writes a folder, another one
    is refused."""
    from secagg.simulation.outputs import lock_folder

    folder = tmp_path / "run"
    stopped = interrupt_after_first_seed(folder, sig=signal.SIGTERM)
    assert stopped.returncode == 143, stopped.stderr
    assert "Traceback" not in stopped.stderr, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert "interrupted by SIGTERM" in last and "--resume" in last, stopped.stderr
    state = json.loads((folder / "run.json").read_text())
    assert state["status"] == "interrupted"
    done = sorted(int(s) for s in state["finished"])
    assert 1 <= len(done) < 3, "SIGTERM came too late to test anything"
    for seed in done:  # what finished is kept: its rows and its model
        assert (comparable(folder)["seed"] == seed).sum() == 4
        assert (folder / "models" / f"seed-{seed}.npy").is_file()
    held = lock_folder(folder)  # as a second process would hold it
    try:
        assert main(["run", "--resume", str(folder), "--quiet"]) == 2
        assert f"in use by another secagg run (pid {os.getpid()})" in capsys.readouterr().err
    finally:
        held.close()
    assert main(["run", "--resume", str(folder), "--quiet"]) == 0
    assert json.loads((folder / "run.json").read_text())["status"] == "complete"
