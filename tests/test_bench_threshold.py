"""The threshold backend in the benchmarks: its column of `secagg bench crypto` and the
threshold sweep of `secagg bench overhead` (its own report, beside the plain vs ckks one)."""

import argparse

import numpy as np
import pandas as pd
import pytest

from benchmarks import crypto, overhead
from benchmarks.overhead import (
    ALL_SWEEPS,
    OUTPUTS,
    SWEEPS,
    THRESHOLD_OUTPUTS,
    THRESHOLD_PRESET,
    Workload,
    outputs_of,
    plan,
    run_config,
    threshold_pairs,
    threshold_targets,
)
from secagg.threshold.params import PRESETS, ThresholdContext, get_preset

# ---- crypto ---------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_threshold_rows_sum_like_the_others(preset):
    rng = np.random.default_rng(1)
    xs, raw = crypto.inputs(5_000, 3, rng)  # two chunks of 4096 values
    weights = list(raw / raw.sum())
    row = crypto.bench_threshold(get_preset(preset), xs, weights, repeats=1)
    context = ThresholdContext(get_preset(preset))
    # two ciphertexts up, two c1 halves per contributor down, two partials back per holder
    assert row["upload_B_per_param"] == pytest.approx(2 * context.ciphertext_bytes / 5_000, 0.01)
    assert row["share_B_per_param"] == pytest.approx(2 * context.c1_bytes / 5_000, 0.01)
    assert row["download_B_per_param"] == pytest.approx(3 * row["share_B_per_param"], 0.01)
    assert 0 < row["rel_error"] < 1e-3 and np.isnan(row["rel_error_flooded"])
    # against the integer-weighted sum the scheme computes: the encryption noise alone
    noise = {"n8192": 1e-3, "wide": 1e-9}[preset]
    assert 0 < row["rel_error_noise"] < noise
    for key in ("encrypt", "aggregate", "decrypt", "fuse"):
        assert row[f"{key}_s_per_M"] > 0


def test_ratios_compare_with_nvflare_at_the_same_size_and_client_count():
    rows = []
    for clients, nv_upload in ((3, 60.0), (10, 30.0)):
        rows += [
            {"config": "secagg compact", "params": 10, "clients": clients, "upload_B_per_param": 15.0, "encrypt_s_per_M": 0.5},  # noqa: E501
            {"config": crypto.NVFLARE, "params": 10, "clients": clients, "upload_B_per_param": nv_upload, "encrypt_s_per_M": 1.0},  # noqa: E501
            {"config": "secagg threshold n8192", "params": 10, "clients": clients, "upload_B_per_param": 30.0, "encrypt_s_per_M": 2.0, "share_B_per_param": 16.0},  # noqa: E501
        ]  # fmt: skip
    frame = crypto.table(rows)
    assert list(frame.columns) == crypto.COLUMNS
    assert frame["upload_B_per_param_vs_nvflare"].tolist() == [4.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    assert frame["encrypt_s_per_M_vs_nvflare"].tolist() == [2.0, 1.0, 0.5] * 2
    assert frame["share_B_per_param"].isna().tolist() == [True, True, False] * 2


@pytest.mark.parametrize("text", ["3,x", "0,3", "3,3", ""])
def test_client_counts_are_distinct_and_positive(text):
    with pytest.raises(argparse.ArgumentTypeError):
        crypto.counts(text)
    assert crypto.counts("3,6,10") == [3, 6, 10]


def test_one_table_holds_every_configuration_at_every_client_count(tmp_path):
    table = crypto.main(
        ["--sizes", "3000", "--clients", "2,3", "--repeats", "1", "--out", str(tmp_path)]
    )
    configs = ["secagg compact", "secagg wide", "secagg lean", crypto.NVFLARE, crypto.NVFLARE_PK]
    # lean again on one native thread and on TenSEAL's binding alone (the before)
    configs += [f"secagg lean {crypto.ONE_THREAD}", f"secagg lean {crypto.TENSEAL_ONLY}"]
    configs += [f"secagg threshold {name}" for name in PRESETS]
    # flwr's SecAgg+ masking: 1 neighbour of 2 clients, 2 of 3 (the sparse graph and the
    # complete one coincide at these sizes)
    masking = {
        (f"{crypto.SECAGGPLUS} (1 neighbour)", 2),
        (f"{crypto.SECAGGPLUS} (2 neighbours)", 3),
    }
    assert len(table) == 2 * len(configs) + len(masking)
    assert (
        set(zip(table["config"], table["clients"]))
        == {(config, k) for config in configs for k in (2, 3)} | masking
    )
    summed = table[~table["config"].str.startswith(crypto.SECAGGPLUS)]
    assert (summed["rel_error"] < 1e-3).all()
    flower = table[table["config"].str.startswith(crypto.SECAGGPLUS)]
    assert (flower["upload_B_per_param"] > 8).all()  # int64 masked values, and a header
    assert table["encrypt_s_per_M_vs_secaggplus"].notna().all()
    # the lean preset: the clients' weighted uploads, only added, sum like the others
    lean = table[table["config"] == "secagg lean"]
    assert (lean["rel_error_noise"] < 1e-9).all() and (lean["rel_error_flooded"] < 1e-2).all()
    for path in (crypto.ONE_THREAD, crypto.TENSEAL_ONLY):  # the same sums on every path
        same = table[table["config"] == f"secagg lean {path}"]
        assert (same["rel_error_noise"] < 1e-9).all()
        assert (same["upload_B_per_param"].to_numpy() < 1.001 * lean["upload_B_per_param"]).all()
    compact = table[table["config"] == "secagg compact"]
    # the aggregate travels as first polynomials: half a compact sum's two 93-bit polynomials
    assert (
        lean["download_B_per_param"].to_numpy() < compact["download_B_per_param"].to_numpy() / 3
    ).all()
    assert (
        lean["upload_B_per_param"]
        < table[table["config"] == "secagg compact"]["upload_B_per_param"].to_numpy()
    ).all()
    pk = table["encrypt_s_per_M_vs_nvflare_pk"]
    assert (
        pk.notna().all()
        and (
            table[table["config"] == crypto.NVFLARE_PK].eval("encrypt_s_per_M_vs_nvflare_pk") == 1
        ).all()
    )
    md = (tmp_path / "crypto.md").read_text()
    assert "| secagg threshold n8192 | 3000 | 3 |" in md and "nan" not in md
    assert pd.read_csv(tmp_path / "crypto.csv").shape == table.shape


# ---- overhead --------------------------------------------------------------------------------


def test_the_threshold_sweep_alternates_ckks_and_threshold_in_pairs():
    configs = [(s, w) for s, w, _ in plan(list(ALL_SWEEPS), quick=False) if s.startswith("thr")]
    assert [(s, w.kind, w.backend) for s, w in configs[:4]] == [
        ("threshold#0", "mlp", "ckks"),
        ("threshold#0", "mlp", "threshold"),
        ("threshold#0", "synthetic", "ckks"),
        ("threshold#0", "synthetic", "threshold"),
    ]
    assert len(configs) == 3 * 4
    assert {(w.n_params, w.n_clients) for _, w in configs} == {(1_000_000, 10)}
    assert {w.preset for _, w in configs if w.backend == "threshold"} == {THRESHOLD_PRESET}
    # the other sweeps' plan is what it was (with the ratio sweep's TenSEAL-only pairs)
    assert len(plan(list(SWEEPS), quick=False)) == 80


def test_quick_smoke_tests_one_tiny_threshold_pair():
    configs = plan(list(ALL_SWEEPS), quick=True, steps=10, repeats=1)
    pair = [w for s, w, _ in configs if s == "threshold#0"]
    assert [w.backend for w in pair] == ["ckks", "threshold"]
    assert {(w.kind, w.n_params) for w in pair} == {("synthetic", 10_000)}
    assert len(configs) == len(plan(list(SWEEPS), quick=True, steps=10, repeats=1)) + 2


def test_the_threshold_sweep_alone_leaves_the_other_report_alone(tmp_path):
    assert outputs_of(["threshold"]) == THRESHOLD_OUTPUTS
    assert outputs_of(["ratio"]) == OUTPUTS
    assert outputs_of(list(ALL_SWEEPS)) == OUTPUTS + THRESHOLD_OUTPUTS
    for name in OUTPUTS:  # an earlier plain vs ckks report: not this run's to replace
        (tmp_path / name).write_text("keep")
    args = overhead.parse_args(["--sweep", "threshold", "--out", str(tmp_path)])
    assert args.out == tmp_path
    (tmp_path / "overhead_threshold.md").write_text("earlier")
    with pytest.raises(SystemExit):
        overhead.parse_args(["--sweep", "threshold", "--out", str(tmp_path)])


def test_pairs_give_the_median_ratio_and_its_spread():
    rows = []
    for rep, (ckks, thr) in enumerate(((2.0, 5.0), (2.0, 7.0), (4.0, 10.0))):
        for backend, wall in (("ckks", ckks), ("threshold", thr)):
            for rnd in range(3):  # the warm-up round does not count
                rows.append(
                    {
                        "kind": "mlp",
                        "label": f"threshold#{rep}",
                        "backend": backend,
                        "warm": rnd > 0,
                        "wall_s": 100.0 if rnd == 0 else wall,
                    }
                )
    rows.append({"kind": "mlp", "label": "ratio#0", "backend": "ckks", "warm": True, "wall_s": 1})
    pairs = threshold_pairs(pd.DataFrame(rows))
    assert pairs["threshold/ckks"].tolist() == [2.5, 3.5, 2.5]
    assert pairs["pair"].tolist() == [1, 2, 3]
    (line,) = threshold_targets(pairs)
    assert "median 2.50× (range 2.50–3.50, 3 pairs) (target ≤ 3×: met)" in line


@pytest.mark.slow
def test_a_tiny_threshold_configuration_measures_the_reveal():
    rows = run_config(
        Workload("synthetic", 3_000, 3, "threshold", THRESHOLD_PRESET), rounds=2, workers=2
    )
    for r in rows:
        assert r["clients_used"] == 3 and r["excluded"] == 0
        assert r["holders_partial_s"] > 0 and r["clients_protect_s"] > 0
        # one 4096-value chunk per upload (about 132 kB), one c1 half per contributor to each
        # of the 3 holders, one partial back from each
        assert 3 * 120_000 < r["bytes_train_up"] < 3 * 150_000
        assert 9 * 60_000 < r["bytes_decrypt_share_down"] < 9 * 75_000
        assert 3 * 60_000 < r["bytes_decrypt_share_up"] < 3 * 75_000
        assert r["setup_bytes"] > 0


@pytest.mark.slow
def test_the_threshold_report_alone(tmp_path):
    (tmp_path / "overhead.md").write_text("an earlier plain vs ckks report")
    summary = overhead.main(["--quick", "--sweep", "threshold", "--out", str(tmp_path)])
    assert set(summary["backend"]) == {"ckks", "threshold"}
    assert (tmp_path / "overhead.md").read_text() == "an earlier plain vs ckks report"
    assert not (tmp_path / "overhead_rounds.csv").exists()
    assert not (tmp_path / "overhead_machine.json").exists()
    assert all((tmp_path / name).exists() for name in THRESHOLD_OUTPUTS)
    report = (tmp_path / "overhead_threshold.md").read_text()
    assert "synthetic: threshold round" in report and "1 pair" in report
    assert "decrypt_share_up" in report
