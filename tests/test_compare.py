"""Comparing run folders: paired differences on common seeds (split-clustered when seeds
share splits), the defaults for metric and round, and actionable errors for folders that
cannot be compared."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from scipy import stats

from secagg.errors import ConfigError
from secagg.simulation.compare import compare_runs, format_table, seed_clusters


def write_run(
    path,
    finals: dict[int, float],
    *,
    task="toy",
    protocol="fedavg",
    backend="plain",
    rounds=2,
    settings=None,
    flat_config=False,
    metrics=("test_pooled", "train_pooled"),
):
    """A run folder whose metrics reach ``finals[seed]`` at the last round (linearly from
    0.5); bytes and seconds per round are fixed so their means are known."""
    rows = []
    for seed, final in finals.items():
        for r in range(rounds + 1):
            value = 0.5 + (final - 0.5) * r / rounds
            row = {"seed": seed, "task": task, "protocol": protocol, "backend": backend}
            row |= {"round": r} | {m: value for m in metrics}
            if r >= 1:
                row |= {"bytes_up": 1000.0 * r, "bytes_down": 500.0, "seconds_round": 0.25}
            rows.append(row)
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path / "metrics.csv", index=False)
    flat = {"task": task, "protocol": protocol, "backend": backend, "seeds": list(finals)}
    flat |= {"client_split": None, "client_split_count": None} | (settings or {})
    config = flat if flat_config else {"settings": flat, "resolved": {}, "provenance": {}}
    (path / "config.json").write_text(json.dumps(config))
    return path


SEEDS = [0, 1, 2, 3, 4, 5]


def test_a_constant_offset_gives_that_difference_with_a_zero_width_interval(tmp_path):
    base = {s: 0.5 + 0.0625 * s for s in SEEDS}
    a = write_run(tmp_path / "a", base)
    b = write_run(tmp_path / "b", {s: v + 0.015625 for s, v in base.items()})
    table = compare_runs([a, b]).set_index("label")
    ref, other = table.loc["a"], table.loc["b"]
    assert ref["note"] == "reference" and np.isnan(ref["diff_mean"])
    assert other["diff_mean"] == pytest.approx(0.015625)
    assert other["diff_ci_low"] == pytest.approx(0.015625)
    assert other["diff_ci_high"] == pytest.approx(0.015625)
    assert other["n_pairs"] == 6 and other["interval"] == "per seed"
    # the side-by-side numbers
    assert other["metric"] == "test_pooled" and other["round"] == 2 and other["n_seeds"] == 6
    assert other["mean"] == pytest.approx(np.mean(list(base.values())) + 0.015625)
    assert other["std"] == pytest.approx(np.std(list(base.values()), ddof=1))
    assert other["bytes_up"] == pytest.approx(1500.0)  # rounds 1 and 2: 1000, 2000
    assert other["bytes_down"] == pytest.approx(500.0)
    assert other["seconds_round"] == pytest.approx(0.25)


def test_pairs_only_common_seeds_and_says_when_there_is_no_interval(tmp_path):
    a = write_run(tmp_path / "a", {1: 0.6, 2: 0.7, 3: 0.8})
    b = write_run(tmp_path / "b", {2: 0.75, 3: 0.9, 9: 0.1})  # seed 9 has no partner
    c = write_run(tmp_path / "c", {3: 0.5, 8: 0.5})
    d = write_run(tmp_path / "d", {7: 0.5})
    table = compare_runs([a, b, c, d]).set_index("label")
    assert table.loc["b", "n_pairs"] == 2
    assert table.loc["b", "diff_mean"] == pytest.approx(0.075)
    assert np.isfinite(table.loc["b", "diff_ci_low"])
    assert table.loc["c", "diff_mean"] == pytest.approx(-0.3)
    assert np.isnan(table.loc["c", "diff_ci_low"]) and np.isnan(table.loc["c", "p_value"])
    assert "1 seed in common" in table.loc["c", "note"]
    assert table.loc["d", "n_pairs"] == 0 and np.isnan(table.loc["d", "diff_mean"])
    assert "no seed in common" in table.loc["d", "note"]


def differences_by_split(tmp_path, settings_a, settings_b):
    # differences repeat with period 3: seeds s and s + 3 behave alike, as when they share
    # a split; clustered, the sample is the 3 split means
    diffs = {s: [0.1, 0.2, 0.4][s % 3] for s in SEEDS}
    a = write_run(tmp_path / "a", {s: 0.5 for s in SEEDS}, settings=settings_a)
    b = write_run(tmp_path / "b", {s: 0.5 + diffs[s] for s in SEEDS}, settings=settings_b)
    return compare_runs([a, b]).iloc[1], np.array([diffs[s] for s in SEEDS])


def t_half_width(sample) -> float:
    sample = np.asarray(sample, dtype=float)
    return stats.t.ppf(0.975, sample.size - 1) * sample.std(ddof=1) / np.sqrt(sample.size)


def test_seeds_sharing_splits_get_a_split_clustered_interval(tmp_path):
    shared = {"client_split": 0.5, "client_split_count": 3}
    row, d = differences_by_split(tmp_path / "x", shared, shared)
    assert row["interval"] == "split-clustered (3 splits)" and row["n_clusters"] == 3
    split_means = np.array([0.1, 0.2, 0.4])
    half = t_half_width(split_means)
    assert row["diff_mean"] == pytest.approx(d.mean())
    assert row["diff_ci_low"] == pytest.approx(split_means.mean() - half)
    assert row["diff_ci_high"] == pytest.approx(split_means.mean() + half)

    per_seed, _ = differences_by_split(tmp_path / "y", {}, {})
    assert per_seed["interval"] == "per seed" and per_seed["n_clusters"] == 6
    assert per_seed["diff_ci_high"] - per_seed["diff_ci_low"] == pytest.approx(2 * t_half_width(d))
    # six seeds that are really three splits: the per-seed interval is too narrow
    assert per_seed["diff_ci_high"] - per_seed["diff_ci_low"] < 0.5 * (
        row["diff_ci_high"] - row["diff_ci_low"]
    )


def test_one_run_sharing_splits_is_enough_to_cluster(tmp_path):
    row, _ = differences_by_split(tmp_path, {"client_split": 0.5, "client_split_count": 3}, {})
    assert row["interval"] == "split-clustered (3 splits)"
    # a split per seed (no count) shares nothing
    row, _ = differences_by_split(tmp_path / "own", {"client_split": 0.5}, {})
    assert row["interval"] == "per seed"


def test_seed_clusters_join_seeds_linked_through_any_run():
    assert seed_clusters([0, 1, 2, 3], [None, None]) is None
    labels = seed_clusters([0, 1, 2, 3, 4, 5], [3, None])
    assert len(set(labels)) == 3 and labels[0] == labels[3] and labels[1] == labels[4]
    # G=2 links 0-2-4 and 1-3-5, G=3 links 0-3: one cluster
    assert len(set(seed_clusters([0, 1, 2, 3, 4, 5], [2, 3]))) == 1


def test_defaults_explicit_round_labels_and_old_config_layout(tmp_path):
    a = write_run(tmp_path / "run", {1: 0.6, 2: 0.7}, rounds=3, metrics=("train_pooled",))
    b = write_run(
        tmp_path / "other" / "run", {1: 0.7, 2: 0.8}, rounds=5, flat_config=True,
        metrics=("train_pooled", "test_pooled"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"different rounds \(run: 3, run \(2\): 5\).*round="):
        compare_runs([a, b])
    table = compare_runs([a, b], round=3)
    assert list(table["label"]) == ["run", "run (2)"]
    assert table["metric"].tolist() == ["train_pooled"] * 2  # test_pooled is not in both
    # at round 3 the second run is 3/5 of the way from 0.5 to its final value
    assert table.loc[1, "mean"] == pytest.approx(0.5 + 0.6 * 0.25)
    named = compare_runs([a, b], round=1, labels=["FedAvg", "LARC"])
    assert list(named["label"]) == ["FedAvg", "LARC"]


def test_unusable_folders_are_config_errors_that_say_what_to_do(tmp_path):
    a = write_run(tmp_path / "a", {1: 0.6, 2: 0.7})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"empty has no metrics.csv: it is not a run folder"):
        compare_runs([a, tmp_path / "empty"])
    other = write_run(tmp_path / "digits", {1: 0.9}, task="digits")
    with pytest.raises(ConfigError, match=r"different tasks \(a: toy, digits: digits\)"):
        compare_runs([a, other])
    with pytest.raises(ConfigError, match=r"'auc' is not in .*\['test_pooled', 'train_pooled'\]"):
        compare_runs([a, a], metric="auc")
    with pytest.raises(ConfigError, match="round 7 is not in every run"):
        compare_runs([a], round=7)
    with pytest.raises(ConfigError, match="1 labels for 2 run folders"):
        compare_runs([a, a], labels=["x"])


def test_out_writes_table_figure_and_markdown(tmp_path):
    a = write_run(tmp_path / "a", {s: 0.5 + 0.01 * s for s in SEEDS})
    b = write_run(tmp_path / "b", {s: 0.55 + 0.02 * s for s in SEEDS}, backend="ckks")
    single = write_run(tmp_path / "single", {0: 0.6})
    out = tmp_path / "cmp" / "new"
    table = compare_runs([a, b, single], out=out)
    saved = pd.read_csv(out / "compare.csv")
    assert list(saved["label"]) == ["a", "b", "single"]
    assert saved.loc[1, "diff_mean"] == pytest.approx(table.loc[1, "diff_mean"])
    image = imread(out / "compare.png")
    assert image.ndim == 3 and image.shape[1] > 1000
    md = (out / "compare.md").read_text()
    assert md.startswith("| run | protocol | backend |")
    # no run.json: its status is unknown
    assert (
        "| b | fedavg | ckks | unknown | – | 6 |" in md and "single: 1 seed in common with a" in md
    )
    text = format_table(table)
    assert "(reference)" in text and "per seed" in text
    assert f"{table.loc[1, 'diff_mean']:+.4f} [{table.loc[1, 'diff_ci_low']:+.4f}," in text


def test_clear_sign_reads_an_interval_off_zero_as_a_direction():
    from secagg.simulation.stats import clear_sign, paired_difference

    control = np.array([0.5, 0.6, 0.7, 0.8])
    above = paired_difference(control + [0.09, 0.11, 0.10, 0.12], control)
    below = paired_difference(control - [0.09, 0.11, 0.10, 0.12], control)
    # a positive mean whose interval holds 0: no clear difference, not "better"
    across = paired_difference(control + [0.3, -0.2, 0.25, -0.15], control)
    assert across["mean_diff"] > 0 and across["ci_low"] < 0
    assert [clear_sign(above), clear_sign(below), clear_sign(across)] == [1, -1, 0]


def test_the_over_the_run_cell_says_the_guarantee_and_the_weakest_share():
    from secagg.simulation.compare import server_view_cell

    view = {"releases": 3, "guarantee": "run (one contributor set, ...)", "weakest_share": 0.66}
    assert server_view_cell(view) == "run, weakest 0.66"
    assert server_view_cell({"releases": 0}) == "no release"
    assert server_view_cell(None) == "–"  # plain: no run view, the server reads every update
