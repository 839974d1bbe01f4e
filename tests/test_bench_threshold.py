"""The threshold backend in the benchmarks: its rows of `secagg bench crypto` and the
threshold sweep of `secagg bench overhead` (its own report, beside the plain vs ckks one)."""

import argparse
import shlex

import numpy as np
import pandas as pd
import pytest

from benchmarks import crypto, overhead
from benchmarks.overhead import (
    ALL_SWEEPS,
    OUTPUTS,
    SWEEPS,
    THRESHOLD_CKKS_PRESET,
    THRESHOLD_OUTPUTS,
    THRESHOLD_PRESET,
    THRESHOLD_TARGET,
    Workload,
    holder_bytes,
    outputs_of,
    plan,
    run_config,
    threshold_breakdown,
    threshold_pairs,
    threshold_targets,
)
from secagg.backends import backend_spec
from secagg.backends.base import applied_weight
from secagg.simulation.experiment import ExperimentConfig
from secagg.threshold.params import (
    PRESETS,
    SIGNATURE_BYTES,
    default_t,
    get_preset,
    quantise,
    sealed_share_bytes,
    upload_bytes,
)

# ---- crypto ---------------------------------------------------------------------------------
#: the preset's error bound on a sum of unit weights (test_threshold measures it at ten clients)
ERROR_BOUND = {"lean": 5e-6, "wide": 1e-9}


def threshold_row(preset: str, n: int, clients: int = 3, seed: int = 1):
    rng = np.random.default_rng(seed)
    xs, raw = crypto.inputs(n, clients, rng)
    weights = list(raw / raw.sum())
    return crypto.bench_threshold(get_preset(preset), xs, weights, repeats=1), xs, weights


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_threshold_rows_count_blocks_shares_and_the_error(preset):
    p = get_preset(preset)
    n, clients = 5_000, 3  # two blocks of 4096 values
    row, xs, weights = threshold_row(preset, n, clients)
    blocks = 3 * p.ring_dim * p.coefficient_bytes  # two data blocks and the check block
    # the masked blocks alone, and with one sealed share of the key per holder and the
    # signature: the shares' part is fixed, t − 1 seeds of 32 + 28 bytes and n − t + 1 ring
    # elements of N·(4 or 8) + 28 bytes
    assert row["upload_masked_B_per_param"] == blocks / n
    t = default_t(clients)
    assert upload_bytes(p, n, clients, t) == (
        blocks + (t - 1) * 60 + (clients - t + 1) * sealed_share_bytes(p) + SIGNATURE_BYTES
    )
    assert row["upload_B_per_param"] == pytest.approx(
        upload_bytes(p, n, clients, t) / n, abs=64 / n
    )
    assert sealed_share_bytes(p) == p.ring_dim * p.coefficient_bytes + 28
    # a holder's answer: one ring element (16 KiB on lean, 32 KiB on wide) and an envelope
    share = p.ring_dim * p.coefficient_bytes
    assert share == {"lean": 16_384, "wide": 32_768}[preset]
    assert share < row["holder_up_B_per_reveal"] < share + 512
    # its request: its sealed share from each contributor, with the release and consents
    seed = sealed_share_bytes(p, seeded=True)  # its share may be a seed, or a ring element
    assert clients * seed < row["holder_down_B_per_reveal"]
    assert row["holder_down_B_per_reveal"] < clients * (sealed_share_bytes(p) + 1_024)
    assert np.isnan(row["rel_error_flooded"])  # no flooding: every key is used once
    # against the weights as quantised (lean: by the clients; wide: by the server), the
    # error is the ring's noise and rounding alone, within the preset's bound
    if p.weighted_by_clients:  # 2^-30, as ckks's lean
        ks, bits = [applied_weight(w, p) for w in weights], p.client_weight_bits
    else:  # 2^-16
        ks, bits = [quantise(w, p.weight_bits) for w in weights], p.weight_bits
    quantised = crypto.quantised_sum(xs, ks, bits)
    assert 0 < row["rel_error_noise"] * np.abs(quantised).max() < ERROR_BOUND[preset]
    # against the exact weights the weights' rounding (2^-17 at most on wide) adds
    assert row["rel_error"] < 1e-4
    if p.weighted_by_clients:  # at 2^-30 the rounding is far below the noise
        assert row["rel_error"] == pytest.approx(row["rel_error_noise"], rel=1e-3)
    for key in ("encrypt", "aggregate", "decrypt"):
        assert row[f"{key}_s_per_M"] > 0
    assert 0 < row["holder_s_per_reveal"] < 10


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_holders_bytes_stay_flat_when_the_model_doubles(preset):
    p = get_preset(preset)
    small, _, _ = threshold_row(preset, 2 * p.ring_dim)
    large, _, _ = threshold_row(preset, 4 * p.ring_dim)
    assert large["holder_up_B_per_reveal"] == small["holder_up_B_per_reveal"]
    # the request differs only in the descriptor's digits
    assert abs(large["holder_down_B_per_reveal"] - small["holder_down_B_per_reveal"]) < 16
    # while the data blocks double (per parameter: the same) beside one check block
    per_block = p.ring_dim * p.coefficient_bytes
    assert small["upload_masked_B_per_param"] == 3 * per_block / (2 * p.ring_dim)
    assert large["upload_masked_B_per_param"] == 5 * per_block / (4 * p.ring_dim)
    assert large["upload_B_per_param"] < small["upload_B_per_param"]  # the shares amortise


def test_ratios_compare_with_nvflare_at_the_same_size_and_client_count():
    rows = []
    for clients, nv_upload in ((3, 60.0), (10, 30.0)):
        rows += [
            {"config": "secagg compact", "params": 10, "clients": clients, "upload_B_per_param": 15.0, "encrypt_s_per_M": 0.5},  # noqa: E501
            {"config": crypto.NVFLARE, "params": 10, "clients": clients, "upload_B_per_param": nv_upload, "encrypt_s_per_M": 1.0},  # noqa: E501
            {"config": "secagg threshold lean", "params": 10, "clients": clients, "upload_B_per_param": 30.0, "encrypt_s_per_M": 2.0, "upload_masked_B_per_param": 4.0, "holder_up_B_per_reveal": 16_549},  # noqa: E501
        ]  # fmt: skip
    frame = crypto.table(rows)
    assert list(frame.columns) == crypto.COLUMNS
    assert frame["upload_B_per_param_vs_nvflare"].tolist() == [4.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    assert frame["encrypt_s_per_M_vs_nvflare"].tolist() == [2.0, 1.0, 0.5] * 2
    for column in ("upload_masked_B_per_param", "holder_up_B_per_reveal"):
        assert frame[column].isna().tolist() == [True, True, False] * 2


@pytest.mark.parametrize("text", ["3,x", "0,3", "3,3", ""])
def test_client_counts_are_distinct_and_positive(text):
    with pytest.raises(argparse.ArgumentTypeError):
        crypto.counts(text)
    assert crypto.counts("3,6,10") == [3, 6, 10]


def test_one_table_holds_every_configuration_at_every_client_count(tmp_path):
    argv = ["--sizes", "3000", "--clients", "2,3", "--repeats", "1", "--out", str(tmp_path)]
    table = crypto.main(argv)
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
    # every aggregate travels as first polynomials, one 64-bit word a value and prime: lean's
    # one prime is half compact's two (a whole compact ciphertext would be four words)
    ratio = lean["download_B_per_param"].to_numpy() / compact["download_B_per_param"].to_numpy()
    assert ((0.45 < ratio) & (ratio < 0.55)).all()
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
    # threshold: a holder's answer per reveal is one ring element whatever the client count;
    # its request grows with the contributors (one sealed share each); no client downloads
    threshold = table[table["config"].str.startswith("secagg threshold")]
    assert threshold["download_B_per_param"].isna().all()
    for preset in PRESETS:
        rows = table[table["config"] == f"secagg threshold {preset}"].set_index("clients")
        assert rows.loc[2, "holder_up_B_per_reveal"] == rows.loc[3, "holder_up_B_per_reveal"]
        grown = rows.loc[3, "holder_down_B_per_reveal"] - rows.loc[2, "holder_down_B_per_reveal"]
        # one more sealed share: a seed (this holder is x = 1) or a ring element
        p = get_preset(preset)
        assert sealed_share_bytes(p, seeded=True) <= grown < sealed_share_bytes(p) + 1_024
    md = (tmp_path / "crypto.md").read_text()
    assert "| secagg threshold lean | 3000 | 3 |" in md and "nan" not in md
    assert f"Made by `python -m benchmarks.crypto {shlex.join(argv)}`" in md
    assert "OpenFHE" not in md
    up = int(table[table["config"] == "secagg threshold lean"]["holder_up_B_per_reveal"].iloc[0])
    assert f"| {up} |" in md  # bytes as counted, not 1.65e+04
    assert pd.read_csv(tmp_path / "crypto.csv").shape == table.shape


# ---- overhead --------------------------------------------------------------------------------


def test_the_threshold_sweep_alternates_ckks_lean_and_threshold_lean_in_pairs():
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
    assert {w.preset for _, w in configs if w.backend == "ckks"} == {THRESHOLD_CKKS_PRESET}
    # each backend on what a streaming FedAdam run picks by default: both lean
    streaming = {
        b: backend_spec(b).default_preset(streams=True, precise_sums=False)
        for b in ("ckks", "threshold")
    }
    assert THRESHOLD_PRESET == streaming["threshold"] == "lean"
    assert THRESHOLD_CKKS_PRESET == streaming["ckks"] == "lean"
    for backend, preset in (("threshold", THRESHOLD_PRESET), ("ckks", THRESHOLD_CKKS_PRESET)):
        run = ExperimentConfig(protocol="fedadam", backend=backend)
        assert run.resolved_backend_options()["preset"] == preset
    assert all(w.protocol == "fedadam" for _, w in configs)
    # the other sweeps' plan is what it was (with the ratio sweep's befores: TenSEAL-only,
    # and FedAvg's and LARC's without the masks and checks made beside training)
    assert len(plan(list(SWEEPS), quick=False)) == 95


def test_quick_smoke_tests_one_tiny_threshold_pair():
    configs = plan(list(ALL_SWEEPS), quick=True, steps=10, repeats=1)
    pair = [w for s, w, _ in configs if s == "threshold#0"]
    assert [(w.backend, w.preset) for w in pair] == [("ckks", "lean"), ("threshold", "lean")]
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


def pair_rows(walls):
    rows = []
    for rep, (ckks, thr) in enumerate(walls):
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
    return pd.DataFrame(rows)


def test_pairs_give_the_median_ratio_and_its_spread_against_1_2():
    assert THRESHOLD_TARGET == 1.2
    pairs = threshold_pairs(pair_rows(((2.0, 2.2), (2.0, 2.6), (4.0, 4.4))))
    assert pairs["threshold/ckks"].tolist() == pytest.approx([1.1, 1.3, 1.1])
    assert pairs["pair"].tolist() == [1, 2, 3]
    (line,) = threshold_targets(pairs)
    assert "median 1.10× (range 1.10–1.30, 3 pairs) (target ≤ 1.2×: met)" in line
    (line,) = threshold_targets(threshold_pairs(pair_rows(((2.0, 2.6), (2.0, 2.5)))))
    assert "median 1.27× (range 1.25–1.30, 2 pairs) (target ≤ 1.2×: NOT met)" in line


def test_the_breakdown_names_the_shares_and_what_is_left_of_the_reveal():
    base = {"n_clients": 10, "model_params": 1_000_000, "server_consent_s": 0.1}
    summary = pd.DataFrame(
        [
            {**base, "kind": "mlp", "backend": "ckks", "server_reveal_s": 1.5},
            {
                **base,
                "kind": "mlp",
                "backend": "threshold",
                "server_reveal_s": 1.0,
                "server_decrypt_share_s": 0.6,
                "holders_share_s": 0.4,
                "bytes_decrypt_share_down": 10 * 170_000,
                "bytes_decrypt_share_up": 10 * 16_549,
            },
        ]
    )
    table = threshold_breakdown(summary).set_index("seconds per round")
    assert not any("partial" in label for label in table.index)
    unmask = table.loc["server: interpolate + unmask + check the sum (threshold)"]
    assert np.isnan(unmask["mlp ckks"]) and unmask["mlp threshold"] == pytest.approx(0.3)
    holders = "holders: check the release, combine their shares (threshold)"
    assert table.loc[holders, "mlp threshold"] == 0.4
    (line,) = holder_bytes(summary)
    assert "one holder receives 170,000 B and sends 16,549 B per round" in line


@pytest.mark.slow
def test_a_tiny_threshold_configuration_measures_the_reveal():
    p = get_preset(THRESHOLD_PRESET)
    rows = run_config(
        Workload("synthetic", 3_000, 3, "threshold", THRESHOLD_PRESET), rounds=2, workers=2
    )
    for r in rows:
        assert r["clients_used"] == 3 and r["excluded"] == 0 and r["preset"] == "lean"
        assert r["holders_share_s"] > 0 and r["clients_protect_s"] > 0
        # one 4096-value block and the check block per upload (16 KiB each on lean) and a
        # sealed share per holder
        upload = upload_bytes(p, 3_000, 3, default_t(3))
        assert 3 * upload < r["bytes_train_up"] < 3 * (upload + 4_000)
        # each holder: its sealed share from each of the 3 contributors, one share back;
        # together, every share of every upload
        shares = upload - 2 * p.ring_dim * 4 - SIGNATURE_BYTES  # a data and a check block
        assert 3 * shares < r["bytes_decrypt_share_down"] < 3 * shares + 9 * 2_000
        assert 3 * p.ring_dim * 4 < r["bytes_decrypt_share_up"] < 3 * (p.ring_dim * 4 + 512)


@pytest.mark.slow
def test_the_threshold_report_alone(tmp_path):
    (tmp_path / "overhead.md").write_text("an earlier plain vs ckks report")
    summary = overhead.main(["--quick", "--sweep", "threshold", "--out", str(tmp_path)])
    assert set(summary["backend"]) == {"ckks", "threshold"}
    assert set(summary["preset"]) == {"lean"}
    assert (tmp_path / "overhead.md").read_text() == "an earlier plain vs ckks report"
    assert not (tmp_path / "overhead_rounds.csv").exists()
    assert not (tmp_path / "overhead_machine.json").exists()
    assert all((tmp_path / name).exists() for name in THRESHOLD_OUTPUTS)
    report = (tmp_path / "overhead_threshold.md").read_text()
    assert "synthetic: threshold round" in report and "1 pair" in report
    assert "decrypt_share_up" in report and "target ≤ 1.2×" in report
    assert "OpenFHE" not in report and "partial" not in report
    assert "one holder receives" in report
    assert "openfhe" not in (tmp_path / "overhead_threshold_machine.json").read_text()
