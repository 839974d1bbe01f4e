"""A run's figures: bands only with several seeds, integer rounds, setup and pre-stage traffic
in their own bars, phase seconds stacked under the wall time, and aborted runs handled."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib import pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.image import imread

from secagg.errors import ConfigError
from secagg.simulation.figures import (
    bytes_figure,
    convergence_figure,
    seconds_figure,
    traffic_by_stage,
    write_figures,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def make_metrics(seeds=(1, 2, 3), rounds=3) -> pd.DataFrame:
    """metrics.csv-like rows; seed s's pooled test metric is 0.5 + 0.01 s + 0.02 round."""
    rows = []
    for s in seeds:
        for r in range(rounds + 1):
            row = {"seed": s, "task": "toy", "protocol": "fedavg", "backend": "plain", "round": r}
            row |= {
                "test_pooled": 0.5 + 0.01 * s + 0.02 * r,
                "test_client_avg": 0.45 + 0.01 * s + 0.02 * r,
                "train_pooled": 0.55 + 0.01 * s + 0.02 * r,
                "train_loss": 1.0 - 0.1 * r,
                "test_loss": 1.1 - 0.1 * r,
            }
            if r >= 1:
                row |= {
                    "bytes_up": 3000.0,
                    "bytes_down": 2000.0,
                    "seconds_train": 0.1 * s,
                    "seconds_reveal": 0.05,
                    "seconds_receive": 0.02,  # inside train's time: must not be stacked
                    "seconds_round": 0.1 * s + 0.05 + 0.03,
                }
            rows.append(row)
    return pd.DataFrame(rows)


def summarize(metrics: pd.DataFrame) -> pd.DataFrame:
    """summary.csv-like: n_seeds and <col>_mean/<col>_std per round."""
    values = metrics.drop(columns=["seed", "task", "protocol", "backend"])
    grouped = values.groupby("round")
    out = grouped.mean().add_suffix("_mean").join(grouped.std(ddof=1).add_suffix("_std"))
    out.insert(0, "n_seeds", metrics.groupby("round")["seed"].nunique())
    return out.reset_index()


def make_traffic(legacy: bool = False) -> pd.DataFrame:
    """Two seeds, two rounds, key setup as round 0 (``stage`` "setup"), an observe phase,
    and seed 1's pre-stage (its own enrolment, then its rounds 1 and 2); seed 2 sends no
    reveal in its second round. ``legacy``: as traffic.csv was written before it had a
    ``stage`` column (engine rounds from 0, set-up under round 0, told by its phases)."""
    rows = []
    shift = 1 if legacy else 0  # legacy rounds: metrics.csv's round - 1

    def add(run, rnd, phase, direction, nbytes, setup=False):
        row = {"run": run, "round": 0 if setup else rnd - shift}
        if not legacy:
            row["stage"] = "setup" if setup else "round"
        rows.append(
            {
                **row,
                "phase": phase,
                "direction": direction,
                "peer": "client_0",
                "field": "x",
                "kind": "k",
                "bytes": nbytes,
                "messages": 1,
            }
        )

    for run in ("1", "2"):
        add(run, 0, "key_hello", "down", 100, setup=True)
        add(run, 0, "key_install", "down", 5000, setup=True)
        add(run, 0, "key_hello", "up", 200, setup=True)
        for rnd in (1, 2):
            add(run, rnd, "train", "up", 3000)
            add(run, rnd, "train", "down", 1000)
            add(run, rnd, "observe", "up", 99_999)  # not protocol traffic
            if not (run == "2" and rnd == 2):
                add(run, rnd, "reveal", "down", 1000)
    add("1-beta-vae", 0, "enroll", "up", 50, setup=True)
    add("1-beta-vae", 1, "train", "up", 700)
    add("1-beta-vae", 2, "train", "up", 900)
    return pd.DataFrame(rows)


def polygons(fig) -> int:
    return sum(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)


def assert_png(path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200


# ---- convergence ---------------------------------------------------------------------------
def test_convergence_has_one_panel_per_curve_and_bands_only_with_several_seeds():
    fig = convergence_figure(summarize(make_metrics()), title="t", metric_name="accuracy")
    titles = {ax.get_title() for ax in fig.axes}
    assert titles == {
        "pooled test",
        "client-average test",
        "pooled train",
        "train loss",
        "test loss",
    }
    assert polygons(fig) == 5
    assert "mean ± std over 3 seeds" in fig.axes[0].get_ylabel()
    assert fig.axes[0].get_ylabel().startswith("accuracy")

    single = convergence_figure(summarize(make_metrics(seeds=(7,))), title="t", metric_name="a")
    assert polygons(single) == 0
    labels = [ax.get_ylabel() for ax in single.axes if ax.get_ylabel()]
    assert labels and all("1 seed" in y and "±" not in y for y in labels)


def test_convergence_ticks_are_whole_rounds():
    fig = convergence_figure(summarize(make_metrics(rounds=2)), title="t", metric_name="a")
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks)


def test_convergence_without_any_curve_is_a_config_error():
    with pytest.raises(ConfigError, match="none of the curves"):
        convergence_figure(pd.DataFrame({"round": [0], "n_seeds": [1]}), title="t", metric_name="a")


# ---- bytes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("legacy", [False, True], ids=["stage-column", "legacy"])
def test_traffic_by_stage_separates_setup_and_pre_stage_and_averages_over_seeds(legacy):
    table = traffic_by_stage(make_traffic(legacy)).set_index(["stage", "direction", "phase"])
    stages = list(table.index.get_level_values("stage").categories)
    assert stages == ["beta-vae pre-stage", "setup", "1", "2"]
    assert table.loc[("setup", "down", "key_install"), "bytes"] == 5000
    assert table.loc[("1", "up", "train"), "bytes"] == 3000  # legacy: engine round 0
    # seed 2 sent no reveal in round 2: it counts as 0 in the mean over both seeds
    assert table.loc[("2", "down", "reveal"), "bytes"] == 500
    assert table.loc[("beta-vae pre-stage", "up", "train"), "bytes"] == 1600
    assert table.loc[("beta-vae pre-stage", "up", "enroll"), "bytes"] == 50
    assert "observe" not in set(table.index.get_level_values("phase"))
    assert table.loc[("2", "up", "train"), "n_runs"] == 2


@pytest.mark.parametrize("legacy", [False, True], ids=["stage-column", "legacy"])
def test_bytes_figure_labels_setup_units_and_seed_mean(legacy):
    fig = bytes_figure(make_traffic(legacy), title="t")
    up, down = fig.axes[0], fig.axes[1]
    ticks = [t.get_text() for t in down.get_xticklabels()]
    assert ticks[:2] == ["beta-vae\npre-stage\n(all 2 rounds)", "setup\n(once)"]
    assert ticks[2:] == ["1", "2"]
    assert "kB" in up.get_ylabel() and "mean over 2 seeds" in up.get_ylabel()
    # stacked bars: round 1 down = train 1000 + reveal 1000 bytes = 2 kB on top
    tops: dict[int, float] = {}
    for bar in down.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert tops[2] == pytest.approx(2.0) and tops[3] == pytest.approx(1.5)
    with pytest.raises(ConfigError, match="no traffic"):
        bytes_figure(pd.DataFrame(columns=make_traffic().columns), title="t")


# ---- seconds ----------------------------------------------------------------------------------
def test_seconds_stack_phases_but_not_nested_receive_and_mark_wall_time():
    metrics = make_metrics(seeds=(1, 2, 3))
    fig = seconds_figure(metrics, title="t")
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "receive" not in labels and {"train", "reveal"} <= set(labels)
    assert any(label.startswith("round wall time") for label in labels)
    top = max(bar.get_y() + bar.get_height() for bar in ax.patches)
    assert top == pytest.approx(0.2 + 0.05)  # mean train over seeds 1..3 + reveal
    assert "mean over 3 seeds" in ax.get_ylabel()
    lo, hi = ax.get_xlim()
    assert all(float(t).is_integer() for t in ax.get_xticks() if lo <= t <= hi)


# ---- files --------------------------------------------------------------------------------
def test_write_figures_writes_three_pngs(tmp_path):
    metrics = make_metrics(seeds=(5,))
    files = write_figures(
        tmp_path / "out",
        metrics=metrics,
        summary=summarize(metrics),
        traffic=make_traffic(),
        title="fedavg on plain",
        metric_name="accuracy",
    )
    assert sorted(files) == ["bytes.png", "convergence.png", "seconds.png"]
    for path in files.values():
        assert_png(path)


def test_write_figures_after_an_aborted_run_writes_only_convergence(tmp_path):
    metrics = make_metrics(seeds=(1,), rounds=0)
    for name in ("bytes.png", "seconds.png"):  # left from an earlier run in the folder
        (tmp_path / name).write_bytes(PNG_MAGIC)
    files = write_figures(
        tmp_path,
        metrics=metrics,
        summary=summarize(metrics),
        traffic=pd.DataFrame(),
        title="aborted",
        metric_name="accuracy",
    )
    assert list(files) == ["convergence.png"]
    assert_png(files["convergence.png"])
    assert not (tmp_path / "bytes.png").exists() and not (tmp_path / "seconds.png").exists()

    # every seed stopped before its first evaluation (e.g. in a pre-stage): nothing to draw
    empty = write_figures(
        tmp_path / "none",
        metrics=pd.DataFrame(),
        summary=pd.DataFrame(columns=["n_seeds", "task", "protocol", "backend", "round"]),
        traffic=None,
        title="aborted",
        metric_name="accuracy",
    )
    assert empty == {}


# ---- a real run -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    import secagg

    out = tmp_path_factory.mktemp("run")
    return secagg.run(
        protocol="fedavg", backend="plain", rounds=2, seeds=[1, 2], local_steps=3, out=out
    ), out


@pytest.mark.slow
def test_real_run_round_bars_match_the_metrics_bytes(real_run, tmp_path):
    result, out = real_run
    metrics = pd.read_csv(out / "metrics.csv")
    traffic = pd.read_csv(out / "traffic.csv")
    table = traffic_by_stage(traffic)
    rounds = table[table["stage"] != "setup"]
    per_round = rounds.groupby(["stage", "direction"], observed=True)["bytes"].sum().unstack()
    expected = metrics[metrics["round"] >= 1].groupby("round")[["bytes_up", "bytes_down"]].mean()
    assert list(per_round.index) == [str(r) for r in expected.index]
    np.testing.assert_allclose(per_round["up"].to_numpy(), expected["bytes_up"].to_numpy())
    np.testing.assert_allclose(per_round["down"].to_numpy(), expected["bytes_down"].to_numpy())
    assert (table["stage"] == "setup").any()  # enrolment before round 1

    files = write_figures(
        tmp_path,
        metrics=metrics,
        summary=pd.read_csv(out / "summary.csv"),
        traffic=traffic,
        title="fedavg on plain",
        metric_name="c_index",
    )
    assert sorted(files) == ["bytes.png", "convergence.png", "seconds.png"]
    for path in files.values():
        assert_png(path)
