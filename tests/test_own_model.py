"""docs/tutorials/own-model.md's walkthrough, run exactly as written: its commands, in a copy of the
example folder, and the trackers' files read back with TensorBoard's and MLflow's readers."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secagg.simulation.cli import main
from tests.test_plugins import registries  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "tutorials" / "own-model.md"


def walkthrough_commands() -> list[list[str]]:
    """The commands of the walkthrough's "Run it" section, as argument lists."""
    section = DOC.read_text().split("## Run it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "docs/tutorials/own-model.md lost its commands"
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.usefixtures("registries")
@pytest.mark.slow
def test_the_own_model_walkthrough_runs_as_documented(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "examples" / "own_model", tmp_path / "examples" / "own_model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SITES_DIR", raising=False)
    commands = walkthrough_commands()
    assert [c[0] for c in commands] == ["python", "secagg", "secagg", "secagg", "secagg"]
    for command in commands:
        if command[0] == "python":
            subprocess.run([sys.executable, *command[1:]], check=True, capture_output=True)
        else:
            assert main(command[1:]) == 0, command
    out = capsys.readouterr().out
    results = tmp_path / "results"

    # two metrics in every table, and the rerun (config.toml, two worker processes)
    # reproduces the first run's numbers, up to CKKS's noise (fresh from the OS each run:
    # the models differ by ~1e-6, which can move an AUC by a near-tied pair)
    ckks, workers, plain = (
        pd.read_csv(results / name / "metrics.csv")
        for name in ("own-ckks", "own-ckks-workers", "own-plain")
    )
    for column in ("test_pooled", "test_auc", "train_auc"):
        assert ckks[column].notna().all()
        np.testing.assert_allclose(workers[column], ckks[column], atol=1e-3)
    assert sorted(ckks["seed"].unique()) == [1, 2]
    assert ckks["test_auc"].iloc[-1] > 0.9  # it learned, and AUC is not accuracy
    assert not np.allclose(ckks["test_auc"], ckks["test_pooled"])
    assert "test_auc_mean" in pd.read_csv(results / "own-ckks" / "summary.csv")
    # ckks's CKKS noise moves the model by ~1e-6 against plaintext: the same accuracy
    np.testing.assert_allclose(ckks["test_pooled"], plain["test_pooled"], atol=0.02)
    assert "test_auc @ round 3" in out  # secagg compare's extra column
    assert "imports = [" in (results / "own-ckks" / "config.toml").read_text()

    # TensorBoard, read by its own reader: one series per seed, round = step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = sorted((results / "own-ckks" / "tensorboard").glob("*/seed-*"))
    assert [p.name for p in board] == ["seed-1", "seed-2"]
    for folder in board:
        seed = int(folder.name.split("-")[1])
        events = EventAccumulator(str(folder))
        events.Reload()
        auc = events.Scalars("metrics/test_auc")
        rows = ckks[ckks["seed"] == seed].sort_values("round")
        assert [e.step for e in auc] == rows["round"].tolist()
        np.testing.assert_allclose([e.value for e in auc], rows["test_auc"], rtol=1e-6)
        up = events.Scalars("traffic/bytes_up")  # from round 1: round 0 sends nothing
        trained = rows[rows["round"] >= 1]
        assert [e.step for e in up] == trained["round"].tolist()
        assert [e.value for e in up] == trained["bytes_up"].astype(float).tolist()

    # MLflow, read by its own client from the local store: one finished run per seed
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(results / "own-ckks" / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("secagg")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["seed"] for r in runs) == ["1", "2"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params["task"] == "sites-mlp"
        history = client.get_metric_history(run.info.run_id, "metrics/test_auc")
        rows = ckks[ckks["seed"] == int(run.data.params["seed"])].sort_values("round")
        assert sorted(m.step for m in history) == rows["round"].tolist()
        np.testing.assert_allclose(
            [m.value for m in sorted(history, key=lambda m: m.step)], rows["test_auc"], rtol=1e-9
        )
