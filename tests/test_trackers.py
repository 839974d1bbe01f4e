"""The optional tracker writers, read back with TensorBoard's and MLflow's own readers."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from secagg.errors import ConfigError
from secagg.simulation.trackers import (
    MLFLOW_MAX_KEY_LENGTH,
    TRACKERS,
    MLflowWriter,
    RoundRecord,
    TensorBoardWriter,
    TrackerClosed,
    Trackers,
    mlflow_key,
    open_trackers,
)

# the environment defaults MLflowWriter sets; each test that makes one pins them first, so
# monkeypatch puts the process's own values back afterwards
MLFLOW_ENV = ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_DISABLE_TELEMETRY")


@pytest.fixture
def mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in MLFLOW_ENV:
        monkeypatch.setenv(name, "true")


def _row(seed: int, number: int) -> dict:
    """A metrics row as the driver makes it (simulation/experiment.py)."""
    row: dict = {
        "seed": seed,
        "task": "digits",
        "protocol": "fedavg",
        "backend": "plain",
        "round": number,
        "train_pooled": 0.5 + 0.1 * number + 0.01 * seed,
        "train_loss": 1.0 / (number + 1),
        "test_pooled": 0.4 + 0.1 * number + 0.01 * seed,
        "test_loss": 1.2 / (number + 1),
        "test_client_avg": 0.45 + 0.1 * number,
        "test_client_0": 0.3 + 0.1 * number,
        # an AUC with one class present in round 1's test labels is undefined
        "test_auc": float("nan") if number == 1 else 0.7 + 0.05 * number,
    }
    if number == 0:
        return row
    return {
        **row,
        "clients": 3,
        "excluded": 0,
        "skipped": 0,
        "bytes_up": 1000 * number + seed,
        "bytes_down": 2000 * number + seed,
        "seconds_round": 0.25 * number,
        "seconds_train": 0.2 * number,
        "eps_client_level": 1.5 * number,
        "noise_multiplier_realised": float("nan"),  # no noise realised this round
    }


@pytest.fixture
def records() -> list[RoundRecord]:
    """2 seeds × rounds 0..2, and seed 0's pre-stage ("vae") rounds 0..1 first."""
    stage = [
        RoundRecord(seed=0, round=k, stage="vae", metrics={"train_loss": 3.0 - k}, bytes_up=7)
        for k in range(2)
    ]
    return stage + [RoundRecord.from_row(_row(seed, k)) for seed in (0, 1) for k in range(3)]


# ---- the record ------------------------------------------------------------------------------


def test_from_row_sorts_the_columns() -> None:
    row = {
        **_row(3, 2),
        "bytes_up": np.int64(5000),  # numpy scalars, as pandas or a sum of numpy may give
        "test_pooled": np.float64(0.875),
        "eps_dp_sgd_max": np.float64(2.5),
        "aborted": None,
    }
    record = RoundRecord.from_row(row, stage="vae")
    assert (record.seed, record.round, record.stage) == (3, 2, "vae")
    assert (record.bytes_up, record.bytes_down, record.seconds) == (5000, 4003, 0.5)
    assert set(record.metrics) == {
        "train_pooled",
        "train_loss",
        "test_pooled",
        "test_loss",
        "test_client_avg",
        "test_client_0",
        "test_auc",
    }
    assert record.metrics["test_pooled"] == 0.875
    assert type(record.metrics["test_pooled"]) is float
    assert record.metrics["test_auc"] == pytest.approx(0.8)
    # strings, None, the fields' own columns and NaN extras are not extras
    assert dict(record.extra) == {
        "clients": 3.0,
        "excluded": 0.0,
        "skipped": 0.0,
        "seconds_train": pytest.approx(0.4),
        "eps_client_level": 3.0,
        "eps_dp_sgd_max": 2.5,
    }
    nan_round = RoundRecord.from_row(_row(0, 1))
    assert math.isnan(nan_round.metrics["test_auc"])  # a NaN score stays


def test_from_row_round_zero_and_refusals() -> None:
    record = RoundRecord.from_row(_row(1, 0))
    assert (record.round, record.stage, record.bytes_up, record.bytes_down) == (0, None, 0, 0)
    assert record.seconds == 0.0 and dict(record.extra) == {}
    assert record.metrics["test_auc"] == pytest.approx(0.7)
    with pytest.raises(ConfigError, match="seed"):
        RoundRecord.from_row({"round": 1, "test_pooled": 0.5})
    with pytest.raises(TypeError):  # the record's mappings are read-only views
        cast(Any, record.metrics)["test_pooled"] = 1.0


def test_scalar_names() -> None:
    record = RoundRecord(
        seed=0, round=2, stage="vae", metrics={"train_loss": 1.0}, bytes_up=3, extra={"e": 2.0}
    )
    assert record.scalars() == [
        ("vae/metrics/train_loss", 1.0),
        ("vae/traffic/bytes_up", 3.0),
        ("vae/traffic/bytes_down", 0.0),
        ("vae/time/seconds", 0.0),
        ("vae/extra/e", 2.0),
    ]
    # round 0 ran no round: no traffic or time
    assert RoundRecord(seed=0, round=0, metrics={"test_loss": 2.0}).scalars() == [
        ("metrics/test_loss", 2.0)
    ]


def test_mlflow_key() -> None:
    assert mlflow_key("metrics/test_pooled") == "metrics/test_pooled"
    assert mlflow_key("extra/eps:client (x)") == "extra/eps_client _x_"
    assert mlflow_key("/a//b/../.") == "_/a/_/b/_/_"
    long = mlflow_key("a/" + "b" * 300)
    assert len(long) <= MLFLOW_MAX_KEY_LENGTH
    # a cut that leaves an empty or dotted last component
    assert mlflow_key("a" * 248 + "/.x") == "a" * 248 + "/_"
    assert mlflow_key("a" * 248 + "/") == "a" * 248 + "/_"


# ---- TensorBoard -----------------------------------------------------------------------------


def _tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _close(a: float, b: float) -> bool:
    # TensorBoard stores float32
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)


def test_tensorboard_writes_what_its_reader_reads(tmp_path: Path, records) -> None:
    with TensorBoardWriter(logdir=tmp_path, run_name="run-a") as writer:
        for record in records:
            writer(record)
    assert sorted(p.name for p in (tmp_path / "run-a").iterdir()) == ["seed-0", "seed-1"]
    for seed in (0, 1):
        got = _tensorboard_scalars(tmp_path / "run-a" / f"seed-{seed}")
        expected: dict[str, list[tuple[int, float]]] = {}
        for record in records:
            if record.seed == seed:
                for tag, value in record.scalars():
                    expected.setdefault(tag, []).append((record.round, value))
        assert set(got) == set(expected)
        for tag, points in expected.items():
            assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
            assert all(_close(a, b) for (_, a), (_, b) in zip(got[tag], points, strict=True))
        assert [s for s, _ in got["metrics/test_pooled"]] == [0, 1, 2]
        assert got["traffic/bytes_up"] == [(1, 1000 + seed), (2, 2000 + seed)]
        assert math.isnan(got["metrics/test_auc"][1][1])  # written as NaN, not dropped
        assert _close(got["extra/eps_client_level"][1][1], 3.0)
    stage = _tensorboard_scalars(tmp_path / "run-a" / "seed-0")
    assert stage["vae/metrics/train_loss"] == [(0, 3.0), (1, 2.0)]
    assert stage["vae/traffic/bytes_up"] == [(1, 7.0)]
    with pytest.raises(TrackerClosed):
        writer(records[0])


def test_tensorboard_refuses_a_path_as_run_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run_name"):
        TensorBoardWriter(logdir=tmp_path, run_name="../elsewhere")


# ---- MLflow ----------------------------------------------------------------------------------


def test_mlflow_writes_what_its_client_reads(tmp_path: Path, records, mlflow_env) -> None:
    from mlflow.tracking import MlflowClient

    params = {"protocol": "fedavg", "lr": 0.1, "lr:client": 0.05, "preset": "x" * 7000}
    writer = MLflowWriter(tracking_dir=tmp_path / "mlruns", run_name="run-a", params=params)
    assert writer.tracking_uri == "file://" + str((tmp_path / "mlruns").resolve())
    for record in records:
        writer(record)
    writer.close()
    writer.close()  # idempotent

    client = MlflowClient(tracking_uri=writer.tracking_uri)
    experiment = client.get_experiment_by_name("secagg")
    assert experiment is not None
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"run-a-seed-0", "run-a-seed-1"}
    for seed in (0, 1):
        run = runs[f"run-a-seed-{seed}"]
        assert run.info.status == "FINISHED"
        assert run.data.params == {
            "protocol": "fedavg",
            "lr": "0.1",
            "lr_client": "0.05",
            "preset": "x" * 6000,
            "seed": str(seed),
        }
        ours = [r for r in records if r.seed == seed]
        expected: dict[str, list[tuple[int, float]]] = {}
        for record in ours:
            for name, value in record.scalars():
                if not math.isnan(value):  # skipped by the writer
                    expected.setdefault(name, []).append((record.round, value))
        assert set(run.data.metrics) == set(expected)
        for name, points in expected.items():
            history = client.get_metric_history(run.info.run_id, name)
            assert sorted((m.step, m.value) for m in history) == points, name  # exact: float64
        auc = client.get_metric_history(run.info.run_id, "metrics/test_auc")
        assert sorted(m.step for m in auc) == [0, 2]  # round 1's NaN skipped
    stage = client.get_metric_history(runs["run-a-seed-0"].info.run_id, "vae/metrics/train_loss")
    assert sorted((m.step, m.value) for m in stage) == [(0, 3.0), (1, 2.0)]
    with pytest.raises(TrackerClosed):
        writer(records[0])


def test_mlflow_marks_runs_failed_after_an_exception(tmp_path: Path, mlflow_env) -> None:
    from mlflow.tracking import MlflowClient

    with pytest.raises(RuntimeError, match="boom"):
        with MLflowWriter(tracking_dir=tmp_path, experiment="exp") as writer:
            writer(RoundRecord(seed=5, round=0, metrics={"test_pooled": 0.5}))
            raise RuntimeError("boom")
    client = MlflowClient(tracking_uri=writer.tracking_uri)
    experiment = client.get_experiment_by_name("exp")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert (run.info.run_name, run.info.status) == ("seed-5", "FAILED")
    assert run.data.params == {"seed": "5"}
    # a second writer on the same store and experiment adds its own run
    with MLflowWriter(tracking_dir=tmp_path, experiment="exp") as again:
        again(RoundRecord(seed=5, round=0))
    assert len(client.search_runs([experiment.experiment_id])) == 2


def test_mlflow_sets_its_environment_defaults_only_when_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in MLFLOW_ENV:
        monkeypatch.setenv(name, "x")  # recorded, so the test's own changes are undone
        monkeypatch.delenv(name)
    MLflowWriter(tracking_dir=tmp_path / "a").close()
    assert [os.environ[name] for name in MLFLOW_ENV] == ["true", "true"]
    # a user who forbids the file store gets a ConfigError, not mlflow's exception
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    with pytest.raises(ConfigError, match="file store"):
        MLflowWriter(tracking_dir=tmp_path / "b")


# ---- missing libraries, the registry -----------------------------------------------------------


def test_a_missing_library_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # None: the import fails
    with pytest.raises(ConfigError, match=r"pip install 'secagg\[trackers\]'"):
        MLflowWriter(tracking_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match=r"pip install 'secagg\[trackers\]'"):
        TensorBoardWriter(logdir=tmp_path)
    # open_trackers closes what it opened before the failing one
    with pytest.raises(ConfigError, match="scripts/setup.sh"):
        open_trackers("tensorboard", tmp_path, run_name="r")


def test_open_trackers(tmp_path: Path, mlflow_env) -> None:
    assert set(TRACKERS) == {"tensorboard", "mlflow"}
    with pytest.raises(ConfigError, match="known: tensorboard, mlflow"):
        open_trackers("tensorboard,wandb", tmp_path, run_name="r")
    with open_trackers(" tensorboard, mlflow ", tmp_path, run_name="r", params={"a": 1}) as both:
        assert [type(w) for w in both.writers] == [TensorBoardWriter, MLflowWriter]
        for number in range(2):
            both.log_row(_row(0, number))
    assert (tmp_path / "tensorboard" / "r" / "seed-0").is_dir()
    got = _tensorboard_scalars(tmp_path / "tensorboard" / "r" / "seed-0")
    assert [s for s, _ in got["metrics/test_pooled"]] == [0, 1]
    mlflow = both.writers[1]
    assert isinstance(mlflow, MLflowWriter)
    assert mlflow.tracking_uri == (tmp_path / "mlruns").resolve().as_uri()


def test_trackers_closes_every_writer_even_when_one_fails() -> None:
    closed: list[tuple[str, bool]] = []

    class Stub:
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail
            self.seen: list[RoundRecord] = []

        def __call__(self, record: RoundRecord) -> None:
            self.seen.append(record)

        def close(self, failed: bool = False) -> None:
            closed.append((self.name, failed))
            if self.fail:
                raise OSError(self.name)

    a, b = Stub("a", fail=True), Stub("b")
    trackers = Trackers([a, b])
    trackers(RoundRecord(seed=0, round=0))
    assert len(a.seen) == len(b.seen) == 1
    with pytest.raises(OSError, match="a"):
        trackers.close(failed=True)
    assert closed == [("a", True), ("b", True)]


def test_a_run_refuses_an_unknown_tracker_or_no_folder_before_writing_anything(tmp_path):
    import secagg

    with pytest.raises(ConfigError, match="unknown tracker 'tensorbord'; known: tensorboard"):
        secagg.run(rounds=1, local_steps=1, trackers="tensorbord", out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="pass out=FOLDER"):
        secagg.run(rounds=1, local_steps=1, trackers=["tensorboard"])
