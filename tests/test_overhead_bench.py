"""The overhead benchmark's own arithmetic and one tiny end-to-end configuration."""

import numpy as np
import pandas as pd
import pytest

from benchmarks.overhead import (
    CLIENTS,
    CONFIG_KEYS,
    SIZES,
    SWEEPS,
    Workload,
    critical_path_stages,
    critical_path_targets,
    earlier_rows,
    linear_fit,
    machine,
    main,
    mlp_width,
    paired_ratios,
    plan,
    plot_critical_path,
    reuse_key,
    run_config,
    slope,
    summarise,
    targets,
)
from benchmarks.rounds import deployment_seconds


@pytest.mark.parametrize("n", [1_000, 1_000_000, 10_000_000])
def test_mlp_width_is_the_closest_to_the_parameter_count(n):
    def params(h):
        return h * h + 76 * h + 10  # 64-h-h-10 with biases

    h = mlp_width(n)
    assert Workload("mlp", n, 2, "plain").model_params() == params(h)
    assert abs(params(h) - n) <= min(abs(params(h - 1) - n), abs(params(h + 1) - n))
    assert abs(params(h) - n) / n < (0.07 if n < 10_000 else 0.001)


def test_fits_recover_known_growth():
    x = np.array([1e5, 1e6, 1e7])
    assert slope(x, 3 * x**0.9) == pytest.approx(0.9)
    assert linear_fit([2, 10, 100], [1 + 0.5 * k for k in (2, 10, 100)]) == pytest.approx(
        (1.0, 0.5)
    )


@pytest.mark.slow
def test_a_tiny_configuration_measures_every_part():
    # two workers: each builds its share of the clients, all with the parent's one roster
    rows = run_config(Workload("synthetic", 3_000, 3, "ckks"), rounds=2, workers=2)
    assert [r["round"] for r in rows] == [0, 1] and [r["warm"] for r in rows] == [False, True]
    for r in rows:
        assert r["clients_used"] == 3 and r["excluded"] == 0 and r["streaming"]
        assert r["wall_s"] > 0 and r["clients_protect_s"] > 0 and r["server_load_s"] > 0
        # the clients made their uploads' masks beside training; the critical path is at
        # most the CPU of every party, and at least the server's own work
        assert r["clients_protect_offline_s"] > 0
        assert 0 < r["server_work_s"] <= r["critical_path_s"] <= r["cpu_s"]
        # three uploads of one 4096-value ciphertext each on lean (about 33 kB: one 60-bit
        # prime), and one reveal
        assert 3 * 30_000 < r["bytes_train_up"] < 3 * 45_000
        assert r["bytes_reveal_up"] > 3_000 * 8  # the flooded aggregate, float64
        assert 50 < r["server_peak_rss_MB"] < 2048 and r["worker_peak_rss_MB"] > 50
        # the server process ran as a server: no CLI, pandas, matplotlib or torch
        assert r["server_imports"] == "-" and r["protocol"] == "fedadam" and r["preset"] == "lean"
    summary = summarise(pd.DataFrame(rows))
    assert len(summary) == 1 and summary["wall_s"].iloc[0] == rows[1]["wall_s"]  # warm only


def test_targets_say_met_or_not_from_the_figures():
    base = dict(
        protocol="fedadam",
        kind="synthetic",
        preset="lean",
        native=True,
        masks=True,
        streaming=True,
        client_dp=False,
        local_steps=100,
        n_params=1_000_000,
        model_params=1_000_000,
    )
    summary = pd.DataFrame(
        [
            {**base, "backend": "plain", "n_clients": 10, "wall_s": 1.0, "server_peak_rss_MB": 200},
            # the before (TenSEAL's binding alone) is not the headline: 3.0 must not be read
            {
                **base,
                "native": False,
                "backend": "ckks",
                "n_clients": 10,
                "wall_s": 3.0,
                "server_peak_rss_MB": 400,
            },
            {**base, "backend": "ckks", "n_clients": 10, "wall_s": 1.6, "server_peak_rss_MB": 400},
            {
                **base,
                "backend": "ckks",
                "n_clients": 100,
                "wall_s": 30.0,
                "server_peak_rss_MB": 450,
            },
        ]
    )
    lines = "\n".join(targets(summary, quick=False))
    assert "1.60× (target ≤ 1.5×: NOT met)" in lines
    assert "round 30.0 s (target ≤ 600 s: met)" in lines
    assert "400 → 450 MB, +12% (target ≤ +20%: met)" in lines


def test_an_unknown_sweep_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        main(["--sweep", "sizes,everything"])
    assert "unknown sweeps ['everything']" in capsys.readouterr().err


def test_the_full_plan_covers_every_sweep_at_full_scale():
    configs = plan(list(SWEEPS), quick=False)
    assert len(configs) == 95
    workloads = [w for _, w, _ in configs]
    assert {w.n_params for w in workloads} == set(SIZES)
    assert {w.n_clients for w in workloads} == set(CLIENTS)
    assert {w.local_steps for w in workloads} == {100, 200, 400}
    # each repeat: FedAdam plain and ckks (native with and without masks made beside
    # training, and TenSEAL's binding alone), mlp and synthetic, and LARC (with and without
    # the probe's check made beside training) and larc-lagged (mlp) plain and ckks
    assert sum(s.startswith("ratio#") for s, _, _ in configs) == 3 * 13
    before = [w for _, w, _ in configs if not w.native]
    assert {(w.kind, w.backend) for w in before} == {("mlp", "ckks"), ("synthetic", "ckks")}
    unmasked = [w for s, w, _ in configs if not w.masks]
    assert {(w.kind, w.backend, w.native, w.protocol) for w in unmasked} == {
        ("mlp", "ckks", True, "fedadam"),
        ("synthetic", "ckks", True, "fedadam"),
        ("mlp", "ckks", True, "larc"),  # its probe's check made at the probe
    } and len(unmasked) == 3 * 3
    larc = [w for _, w, _ in configs if w.protocol == "larc"]
    assert {(w.kind, w.preset) for w in larc} == {("mlp", "compact")} and len(larc) == 3 * 3
    lagged = [w for _, w, _ in configs if w.protocol == "larc-lagged"]  # it streams: lean
    assert {(w.kind, w.preset) for w in lagged} == {("mlp", "lean")} and len(lagged) == 3 * 2


def test_quick_runs_every_code_path_once_at_toy_sizes():
    configs = plan(list(SWEEPS), quick=True, steps=10, repeats=1)
    assert {s.split("#")[0] for s, _, _ in configs} == set(SWEEPS)
    assert len(configs) <= 20  # each costs seconds of process start-up alone
    workloads = [w for _, w, _ in configs]
    assert {(w.kind, w.backend) for w in workloads} == {
        (kind, backend) for kind in ("mlp", "synthetic") for backend in ("plain", "ckks")
    }
    assert max(w.n_params for w in workloads) <= 10_000
    assert {w.preset for w in workloads} == {"lean", "compact", "wide"}
    assert {w.local_steps for w in workloads} == {10, 20}
    assert {w.backend for _, w, o in configs if o.get("client_dp")} == {"plain", "ckks"}
    assert any(o.get("streaming") is False for _, _, o in configs)
    # an unstreamed server sums after the uploads: never on lean (its clients need a plan)
    assert all(w.preset != "lean" for _, w, o in configs if o.get("streaming") is False)
    keys = [(w, tuple(sorted(o.items()))) for _, w, o in configs]
    assert len(keys) == len(set(keys))  # nothing runs twice
    ratio = [w for s, w, _ in configs if s == "ratio#0"]
    assert len(ratio) == 9 and {w.n_clients for w in ratio} == {10}  # LARC and its variant
    assert [w.kind for w in ratio if not w.masks] == ["synthetic"]  # the before, once
    # more repeats are more runs
    assert len(plan(list(SWEEPS), quick=True, steps=10, repeats=2)) == len(configs) + 9


def test_paired_ratios_keep_the_native_path_and_the_before_apart():
    rows = [
        {
            "label": f"ratio#{rep}",
            "warm": True,
            "protocol": "fedadam",
            "kind": "mlp",
            "backend": backend,
            "native": native,
            "masks": masks,
            "wall_s": wall * (1 + rep),
            "critical_path_s": wall * (1 + rep) / 2,
        }
        for rep in range(2)
        for backend, native, masks, wall in (
            ("plain", True, True, 2.0),
            ("ckks", True, True, 2.6),
            ("ckks", True, False, 3.0),
            ("ckks", False, True, 3.6),
        )
    ]
    pairs = paired_ratios(pd.DataFrame(rows))
    expected = {"mlp": 1.3, "mlp no-masks": 1.5, "mlp tenseal-only": 1.8}
    assert set(pairs) == set(expected)
    for name, ratio in expected.items():
        assert pairs[name] == pytest.approx([ratio, ratio])
    critical = paired_ratios(pd.DataFrame(rows), "critical_path_s")
    assert critical == pairs  # every time halved: the same ratios
    lines = "\n".join(critical_path_targets(critical))
    assert "median 1.30× (stated: its target is against the value-dependent floor" in lines
    assert "without the masks and checks made beside training (the before, same run): 1.50" in lines
    serial = "\n".join(critical_path_targets(critical, {"mlp": [1.6, 1.8]}))
    assert "every server step serial (upper bound): median 1.70×" in serial


def test_the_overhead_is_set_against_the_floor_of_the_same_rounds():
    """Per interleaved repeat, the critical path's ckks-minus-plain against the ckks rounds'
    value-dependent floor (the slowest client's online protect plus the slowest opening):
    the target on mlp, stated on synthetic; the other paths and protocols stay out."""
    from benchmarks.overhead import floor_overheads, floor_targets
    from benchmarks.rounds import value_floor

    floor = value_floor(
        {
            "client_0": {"protect": 0.02, "reveal_open": 0.03},
            "client_1": {"protect": 0.025},
            "client_2": {"protect": 0.01, "reveal_open": 0.028},
        }
    )
    assert floor == pytest.approx(
        {"floor_protect_s": 0.025, "floor_open_s": 0.03, "value_floor_s": 0.055}
    )
    assert value_floor({"client_0": {"phase:train": 1.0}})["value_floor_s"] == 0.0  # plain
    rows = [
        {
            "label": f"ratio#{rep}",
            "warm": True,
            "protocol": protocol,
            "kind": kind,
            "backend": backend,
            "native": True,
            "masks": masks,
            "local_steps": 100,
            "critical_path_s": path + rep,
            **(floor if backend == "ckks" else value_floor({})),
        }
        for rep in range(2)
        for protocol in ("fedadam", "larc")
        for kind in ("mlp", "synthetic")
        for backend, masks, path in (
            ("plain", True, 1.0),
            ("ckks", True, 1.066 if kind == "mlp" else 1.11),
            ("ckks", False, 9.0),  # the before: not the floor's
        )
    ]
    floors = floor_overheads(pd.DataFrame(rows))
    assert set(floors) == {"mlp", "synthetic"}  # LARC is not of the FedAvg family
    assert [round(o, 3) for o, *_ in floors["mlp"]] == [0.066, 0.066]
    lines = floor_targets(floors)
    assert "mlp: 0.066 s (ckks minus plain) against a floor of 0.055 s" in lines[0]
    assert "median 1.20× (target ≤ 1.3×: met)" in lines[0]
    assert "median 2.00× (stated, not a target)" in lines[1]


def test_deployment_seconds_takes_the_slowest_client_per_phase():
    """10 s of wall in process: the server waited 6 s in the training phase (0.5 s of it
    decoding replies) and 2 s in the reveal; the clients' answers took 1, 2 and 3 s
    (training) and the decryptor's 1.5 s (reveal), one made masks for 0.4 s beside."""
    clients = {
        "a": {"phase:train": 1.0, "protect_offline": 0.4},
        "b": {"phase:train": 2.0},
        "c": {"phase:train": 3.0, "phase:reveal": 1.5},
    }
    server = {"train": 6.0, "receive": 0.5, "reveal": 2.0, "load": 0.7, "optimizer": 0.1}
    got = deployment_seconds(10.0, server, clients)
    work = 10.0 - (6.0 + 2.0 - 0.5)  # the server's own: 2.5 s
    # folded: uploads arrive at 1, 2 and 3 s and take 0.7 / 3 s each to load: the first two
    # are folded while c still trains, the last ends the phase at 3 + 0.7 / 3
    assert got == pytest.approx(
        {
            "server_work_s": work,
            "critical_path_s": (work - 0.7) + (3.0 + 0.7 / 3) + 1.5,
            "critical_path_serial_s": work + 3.0 + 1.5,
            "cpu_s": work + 1.0 + 2.0 + 3.0 + 1.5 + 0.4,
            # the serial path by stage: the server's work and each phase's slowest answer
            "path_server_s": work,
            "path_train_s": 3.0,
            "path_reveal_s": 1.5,
        }
    )
    stages = sum(v for k, v in got.items() if k.startswith("path_"))
    assert stages == pytest.approx(got["critical_path_serial_s"])
    # clients that finish together: the folds queue up, the serial figure
    together = {c: {"phase:train": 3.0} for c in "abc"}
    tied = deployment_seconds(10.0, server, together)
    assert tied["critical_path_s"] == pytest.approx(tied["critical_path_serial_s"])
    # a buffered run adds after the last upload: only the loads overlap
    server["aggregate"] = 0.3
    buffered = deployment_seconds(10.0, server, clients, streaming=False)
    assert buffered["critical_path_s"] == pytest.approx((work - 0.7) + (3.0 + 0.7 / 3) + 1.5)
    streamed = deployment_seconds(10.0, server, clients)
    assert streamed["critical_path_s"] == pytest.approx((work - 1.0) + (3.0 + 1.0 / 3) + 1.5)
    # plain: the server's own "reveal" is its own work (no client answered one)
    plain = deployment_seconds(10.0, {"train": 6.0, "reveal": 2.0}, {"a": {"phase:train": 5.0}})
    assert plain["server_work_s"] == pytest.approx(4.0)


def test_rows_from_before_the_protocol_and_native_keys_reuse_as_what_they_were(tmp_path):
    """--reuse of a rounds file written before the protocol and native columns (the OpenFHE
    threshold report's, now benchmarks/results/history/overhead_threshold_rounds.csv): the
    rows read as FedAdam on TenSEAL's binding alone, so every configuration key is there
    (reading them raised KeyError: 'protocol')."""
    old = {k: 1 for k in CONFIG_KEYS if k not in ("protocol", "native")}
    new = {**old, "protocol": "larc", "native": True}
    pd.DataFrame([{**old, "label": "sizes"}]).to_csv(tmp_path / "old.csv", index=False)
    pd.DataFrame([{**new, "label": "sizes"}]).to_csv(tmp_path / "new.csv", index=False)
    (row,) = earlier_rows(tmp_path / "old.csv")
    assert (row["protocol"], row["native"]) == ("fedadam", False)
    assert all(k in row for k in CONFIG_KEYS)
    (row,) = earlier_rows(tmp_path / "new.csv")  # columns present: kept as written
    assert (row["protocol"], row["native"]) == ("larc", True)


def test_the_machine_names_what_the_rounds_run_on_and_no_openfhe():
    """Both reports' machine line and json: the threshold backend no longer uses OpenFHE."""
    m = machine()
    assert {"cpu", "cores", "memory", "python", "tenseal", "os"} == set(m)
    assert int(m["cores"]) >= 1


def test_the_critical_path_figure_stacks_each_stage_per_workload(tmp_path):
    """The ratio sweep's warm rounds, default path: per workload and backend the median of
    each stage; a stage a backend never asks (plain has no reveal) counts 0; a cold round,
    a before (no masks) and another label are left out; the figure is written."""

    def row(kind, protocol, preset, backend, server, train, reveal=None, **extra):
        return {
            "label": "ratio#0", "warm": True, "native": True, "masks": True, "kind": kind,
            "protocol": protocol, "preset": preset, "backend": backend,
            "path_server_s": server, "path_train_s": train, "path_reveal_s": reveal,
            "critical_path_s": server + train + (reveal or 0.0) - 0.01,
            "value_floor_s": 0.0 if backend == "plain" else 0.05, **extra,
        }  # fmt: skip

    rounds = pd.DataFrame(
        [
            row("mlp", "fedadam", "lean", "plain", 0.02, 0.30),
            row("mlp", "fedadam", "lean", "plain", 0.04, 0.32),
            row("mlp", "fedadam", "lean", "ckks", 0.05, 0.35, 0.10),
            row("mlp", "fedadam", "lean", "ckks", 9.0, 9.0, 9.0, warm=False),  # warm-up
            row("mlp", "fedadam", "lean", "ckks", 9.0, 9.0, 9.0, masks=False),  # a before
            row("mlp", "fedadam", "lean", "ckks", 9.0, 9.0, 9.0, label="steps"),
            row("mlp", "larc", "compact", "ckks", 0.5, 0.4, 0.2, path_larc_probe_s=0.3),
        ]
    )
    stages = critical_path_stages(rounds)
    assert list(zip(stages["workload"], stages["backend"])) == [
        ("FedAvg family (mlp)", "plain"), ("FedAvg family (mlp)", "ckks"), ("LARC (mlp)", "ckks"),
    ]  # fmt: skip
    plain, ckks, larc = (stages.iloc[i] for i in range(3))
    assert (plain["path_server_s"], plain["path_train_s"]) == pytest.approx((0.03, 0.31))
    assert plain["path_reveal_s"] == 0.0 and plain["path_larc_probe_s"] == 0.0
    assert (ckks["path_server_s"], ckks["path_reveal_s"]) == pytest.approx((0.05, 0.10))
    assert larc["path_larc_probe_s"] == pytest.approx(0.3)
    assert plot_critical_path(stages, tmp_path) == ["overhead_critical_path.png"]
    assert (tmp_path / "overhead_critical_path.png").stat().st_size > 0
    assert critical_path_stages(rounds.drop(columns=["path_server_s"])).empty  # older rows


def test_reuse_matches_a_larc_row_on_the_streaming_it_asked_for():
    """LARC runs unstreamed whatever was asked (its weights come after the uploads): --reuse
    matches its row on what was asked, so it is not run again; a row from before the
    column was written falls back to what ran."""
    base = {k: 1 for k in CONFIG_KEYS[:-1]} | {"label": "ratio#0"}
    larc = reuse_key({**base, "streaming": False, "streaming_asked": True})
    assert larc == (*(1 for _ in CONFIG_KEYS[:-1]), True, "ratio#0")
    assert reuse_key({**base, "streaming": False})[-2] is False
