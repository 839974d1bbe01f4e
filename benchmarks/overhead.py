"""What privacy costs, end to end: round time by phase, bytes by message, peak memory.

    python -m benchmarks.overhead [--quick] [--sweep sizes,clients,dp,threshold] [--out DIR]
    secagg bench overhead ...          (the same)

Every configuration runs the real engine (FedAdam, streaming aggregation, CKKS preset ``lean``
unless stated: the clients apply their weights, the server only adds), real clients
(``clients.runtime.Client``) in ``--workers`` worker processes, and the real backends, and
is measured round by round:

- wall time of the round, and where the time goes: on the server (waiting for the training
  phase, loading uploads, homomorphic aggregation, the reveal, the optimizer) and on the
  clients, summed over clients (local training, encode + encrypt, decrypt, envelopes);
  clients and server overlap, so the parts need not add up to the wall time;
- bytes per message type (phase and direction), from the audit;
- peak resident memory of the server process and of the busiest worker process during the
  round (Linux VmHWM, reset before each round). The server process is this one: it holds
  the engine, the audit and no client, since clients live in the workers.

Workloads: ``mlp`` trains an MLP 64-h-h-10 on scikit-learn's digits (split IID over the
clients), h chosen for the target parameter count, ``--local-steps`` SGD steps of batch 32
per round; ``synthetic`` skips training (each client uploads a fresh random vector), so the
round is pure protocol and crypto overhead. Sweeps (``--sweep``):

- ``ratio``: 1e6 parameters × 10 clients, plain and ckks alternately, ``--repeats`` times:
  the headline ratio, robust to the machine's load drifting between configurations; each
  repeat also runs LARC (mlp, ckks on ``compact``: its weights come after the uploads) and
  ``larc-lagged`` (mlp, ckks on ``lean``: its weights are fixed a round ahead, so it streams);
- ``sizes``: 1e3 ... 1e7 parameters at 10 clients, plain vs ckks, both workloads;
- ``clients``: 2 ... 100 clients at 1e6 parameters, plain vs ckks, both workloads;
- ``dp``: client-level DP (clip 1, z* 1) on and off, plain vs ckks, 1e6 × 10, mlp;
- ``presets``: CKKS ``lean`` vs ``compact`` vs ``wide`` at 1e6 × 10;
- ``buffered``: the server without streaming, ckks synthetic, 1e6 parameters, to show why
  streaming matters for memory (on ``compact``: ``lean`` needs a streamed sum's planned
  weights);
- ``steps``: mlp 1e6 × 10 at 1, 2 and 4 times ``--local-steps``: how much local training
  it takes to hide the crypto;
- ``threshold``: 1e6 parameters × 10 clients, both workloads, ckks and the ``threshold``
  backend, both on ``lean`` (the streaming default: the clients apply their planned weights
  and the server only adds), alternately, ``--repeats`` pairs. threshold masks each upload
  under a fresh one-time key that its client Shamir-shares t of n among the clients (t a
  strict majority), the shares sealed in the upload; a reveal asks every holder for its
  share of the key sum (one ring element) and the server interpolates and unmasks. Reported:
  the median threshold/ckks round-time ratio and its spread (target ≤ 1.2×), where the time
  goes, the bytes by message. Its rows and report are its own files (below), so that
  ``--sweep threshold`` leaves the plain vs ckks report as it is.

``--quick`` is a smoke check that every code path runs, not a measurement: 16 configurations
at toy sizes (the synthetic workload at 1e3 and 1e4 parameters and 2 and 10 clients, the mlp
at 1e4 × 10; DP, the wide preset, buffering and twice the local steps once each; the headline
configurations once, as the one interleaved repeat; one ckks/threshold pair, synthetic
1e4 × 10), 2 rounds and 10 local steps each.

``--reuse`` keeps the configurations already in --out's overhead_rounds.csv and runs only the
others (the report then covers both).

Writes overhead_rounds.csv (one row per round), overhead.csv (medians per configuration),
overhead.md (the report, with the machine), overhead_machine.json and overhead_*.png into
--out, and for the threshold sweep overhead_threshold_rounds.csv, overhead_threshold.csv,
overhead_threshold.md and overhead_threshold_machine.json (a run writes only the files of
the sweeps it runs): by default a new folder results/bench/overhead-<YYYYmmdd-HHMMSS> under
the current directory, so a run never replaces earlier results. The committed results that
the README quotes are regenerated with ``--out benchmarks/results --overwrite`` (the
threshold report alone with ``--sweep threshold --out benchmarks/results --overwrite``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.options import output_folder, positive  # noqa: E402
from benchmarks.reproduce import made_by  # noqa: E402
from benchmarks.rounds import (  # noqa: E402, F401 - the workloads, re-exported for tests
    CKKS_PRESET,
    MB,
    SyntheticTrainer,
    Workload,
    initial_params,
    measure_rounds,
    mlp,
    mlp_width,
    preset_option,
)
from benchmarks.stats import markdown_table  # noqa: E402
from secagg.ckks import native  # noqa: E402
from secagg.secret import ckks_masks  # noqa: E402

#: why ``secagg bench overhead --check`` has nothing to re-run (``docs/reference/benchmarks.md``)
NO_CHECK = (
    "every figure it reports is a time or a peak memory on a shared machine, which no "
    "tolerance makes a check; the bytes its rounds send are the formats the crypto and "
    "upload_profile checks hold"
)
SIZES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)
CLIENTS = (2, 5, 10, 20, 50, 100)
#: ``--quick`` is a smoke check, not a measurement: each code path (both workloads and
#: backends, DP, both presets, buffering, the paired ratio, more local steps, every report
#: section and plot) runs once at toy sizes, in about two minutes (see :func:`plan`)
QUICK_SIZES = (1_000, 10_000)
QUICK_CLIENTS = (2, 10)
QUICK_DEFAULTS = {"rounds": 2, "local_steps": 10, "repeats": 1}
FULL_DEFAULTS = {"rounds": 3, "local_steps": 100, "repeats": 3}
SWEEPS = ("ratio", "sizes", "clients", "dp", "presets", "buffered", "steps")
#: ckks vs threshold in interleaved pairs, reported on its own (overhead_threshold.*): the
#: sweeps above are plain vs ckks and write overhead.*
THRESHOLD_SWEEP = "threshold"
#: how the paired ratios name the ckks rounds without the native extension
TENSEAL_ONLY = "tenseal-only"
#: ... and those whose clients encrypt each upload afresh after training and whose decryptors
#: expand every check at the reveal (no masks or checks made beside training:
#: ``SECAGG_UPLOAD_MASKS=off``)
NO_MASKS = "no-masks"
#: the critical-path targets (a deployment's parallel clients; ckks / plain, same run)
#: the critical path's ckks/plain targets; the mlp ratio is stated (a bare ratio is the wrong
#: yardstick behind training: its target is against the floor, ``FLOOR_TARGET``)
CRITICAL_TARGETS: dict[str, float | None] = {
    "mlp": None,
    "synthetic": 2.0,
    "mlp larc": 3.0,
    "mlp larc-lagged": 3.0,  # the variant offered for LARC's target, beside the paper's
}
#: the FedAvg family's privacy overhead on the critical path (ckks minus plain) against the
#: value-dependent floor measured in the same round (``rounds.value_floor``): at most this
FLOOR_TARGET = 1.3
ALL_SWEEPS = (*SWEEPS, THRESHOLD_SWEEP)
#: the threshold preset the sweep runs: what a streaming FedAdam run picks by default
THRESHOLD_PRESET = "lean"
#: the ckks preset it is compared with: the same role on ckks (a streaming run's default)
THRESHOLD_CKKS_PRESET = CKKS_PRESET
#: the threshold sweep's target: its round at most this many times the ckks round
THRESHOLD_TARGET = 1.2
#: what identifies a configuration (a row of the summary)
CONFIG_KEYS = [
    "protocol",
    "kind",
    "backend",
    "preset",
    "native",
    "masks",
    "n_params",
    "model_params",
    "n_clients",
    "local_steps",
    "client_dp",
    "streaming",
]
#: the repository root: the server process runs ``python -m benchmarks.rounds`` from it
ROOT = Path(__file__).resolve().parents[1]


def run_config(
    workload: Workload,
    rounds: int,
    workers: int,
    client_dp: bool = False,
    streaming: bool = True,
    label: str = "",
) -> list[dict[str, Any]]:
    """Run one configuration in a fresh server process (``benchmarks.rounds``), so that its
    peak memory is this configuration's alone and the server's as it would run: this
    process has run others, and imported torch, pandas and matplotlib."""
    args = (workload, initial_params(workload), rounds, workers, client_dp, streaming, label)
    with tempfile.TemporaryDirectory(prefix="secagg-overhead-") as folder:
        given, result = Path(folder) / "args.pickle", Path(folder) / "result.pickle"
        given.write_bytes(pickle.dumps(args))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.rounds", str(given), str(result)],
            cwd=ROOT,
            # the server process and its client workers: the native path or TenSEAL's alone
            env={
                **os.environ,
                native.ENV: "on" if workload.native else "off",
                ckks_masks.ENV: "on" if workload.masks else "off",
            },
        )
        if not result.exists():
            raise RuntimeError(
                f"configuration {workload} failed: server process exit code {done.returncode}"
            )
        status, payload = pickle.loads(result.read_bytes())
    if status != "ok":
        raise RuntimeError(f"configuration {workload} failed:\n{payload}")
    return payload


def headline_size(quick: bool) -> int:
    """Parameters of the configurations the sweeps share (10 clients, DP, presets...)."""
    return QUICK_SIZES[-1] if quick else 1_000_000


def plan(
    sweeps: list[str], quick: bool, steps: int = 100, repeats: int = 3
) -> list[tuple[str, Workload, dict]]:
    """The configurations to run, as (sweep, workload, options).

    ``quick`` is the smoke check: every sweep's code path once, at :data:`QUICK_SIZES` and
    :data:`QUICK_CLIENTS`; only the synthetic workload is swept over sizes, client counts and
    presets (the mlp runs at the headline point), and the headline configurations run once,
    labelled as the (single) interleaved repeat."""
    sizes = QUICK_SIZES if quick else SIZES
    clients = QUICK_CLIENTS if quick else CLIENTS
    n = headline_size(quick)
    out = []
    for kind in ("synthetic", "mlp"):
        swept = kind == "synthetic" or not quick
        for backend in ("plain", "ckks"):
            if "sizes" in sweeps:
                out += [
                    ("sizes", Workload(kind, m, 10, backend, local_steps=steps), {})
                    for m in (sizes if swept else (n,))
                ]
            if "clients" in sweeps:
                out += [
                    ("clients", Workload(kind, n, k, backend, local_steps=steps), {})
                    for k in (clients if swept else (10,))
                ]
    if "dp" in sweeps:
        # quick: DP off is the same configuration as the other sweeps' (so it runs once)
        dp_opts = (
            [{}, {"client_dp": True}] if quick else [{"client_dp": dp} for dp in (False, True)]
        )
        out += [
            ("dp", Workload("mlp", n, 10, backend, local_steps=steps), opts)
            for backend in ("plain", "ckks")
            for opts in dp_opts
        ]
    if "presets" in sweeps:
        out += [
            ("presets", Workload(kind, n, 10, "ckks", preset, local_steps=steps), {})
            for kind in (("synthetic",) if quick else ("synthetic", "mlp"))
            for preset in ("lean", "compact", "wide")
        ]
    if "buffered" in sweeps:  # a server that keeps every upload: weights after the uploads,
        # so the server-weighted preset (lean needs the planned weights a streamed sum has)
        out += [
            (
                "buffered",
                Workload("synthetic", n, k, "ckks", "compact", local_steps=steps),
                {"streaming": False},
            )
            for k in ((10,) if quick else (10, 20, 50, 100))
        ]
    if "ratio" in sweeps:  # the headline ratio from interleaved runs, against drift
        for rep in range(repeats):
            out += [
                (f"ratio#{rep}", Workload(kind, n, 10, backend, local_steps=steps), {})
                for kind in ("mlp", "synthetic")
                for backend in ("plain", "ckks")
            ]
            # the befores: the same ckks rounds with every upload encrypted afresh after
            # training, and on TenSEAL's binding alone (a full run's measurements; the smoke
            # check runs the first once)
            out += [
                (
                    f"ratio#{rep}",
                    Workload(kind, n, 10, "ckks", masks=False, local_steps=steps),
                    {},
                )
                for kind in (("synthetic",) if quick else ("mlp", "synthetic"))
            ]
            out += (
                []
                if quick
                else [
                    (
                        f"ratio#{rep}",
                        Workload(kind, n, 10, "ckks", native=False, local_steps=steps),
                        {},
                    )
                    for kind in ("mlp", "synthetic")
                ]
            )
            # LARC weighs the uploads after they arrive: the server-weighted compact preset
            out += [
                (
                    f"ratio#{rep}",
                    Workload("mlp", n, 10, backend, "compact", "larc", local_steps=steps),
                    {},
                )
                for backend in ("plain", "ckks")
            ]
            # and its before: no committed seeds, so every client expands the probe's check
            # at the probe rather than beside its training
            out += (
                []
                if quick
                else [
                    (
                        f"ratio#{rep}",
                        Workload(
                            "mlp", n, 10, "ckks", "compact", "larc", masks=False, local_steps=steps
                        ),
                        {},
                    )
                ]
            )
            # its variant whose weights are fixed a round ahead streams on the FedAvg
            # family's preset
            out += [
                (
                    f"ratio#{rep}",
                    Workload("mlp", n, 10, backend, protocol="larc-lagged", local_steps=steps),
                    {},
                )
                for backend in ("plain", "ckks")
            ]
    if "steps" in sweeps:  # how much local training hides the crypto
        out += [
            ("steps", Workload("mlp", n, 10, backend, local_steps=steps * f), {})
            for f in ((1, 2) if quick else (1, 2, 4))
            for backend in ("plain", "ckks")
        ]
    if THRESHOLD_SWEEP in sweeps:  # ckks vs threshold, interleaved pairs, against drift
        out += [
            (
                f"{THRESHOLD_SWEEP}#{rep}",
                Workload(kind, n, 10, backend, preset, local_steps=steps),
                {},
            )
            for rep in range(repeats)
            for kind in (("synthetic",) if quick else ("mlp", "synthetic"))
            for backend, preset in (
                ("ckks", THRESHOLD_CKKS_PRESET),
                ("threshold", THRESHOLD_PRESET),
            )
        ]
    # the same configuration can appear in two sweeps: run it once (the ratio repeats are
    # meant as repeats, but in a quick run the first is the other sweeps' run, relabelled;
    # the threshold pairs always run as their own, to be written to their own report)
    seen: dict[tuple, int] = {}
    unique: list[tuple[str, Workload, dict]] = []
    for sweep, workload, opts in out:
        repeat = sweep.startswith(("ratio", f"{THRESHOLD_SWEEP}#"))
        label = sweep if repeat and not (quick and sweep == "ratio#0") else ""
        key = (workload, tuple(sorted(opts.items())), label)
        if key not in seen:
            seen[key] = len(unique)
            unique.append((sweep, workload, opts))
        elif repeat:
            unique[seen[key]] = (sweep, workload, opts)
    return unique


def reuse_key(row: dict[str, Any]) -> tuple:
    """What ``--reuse`` matches a planned configuration on: :data:`CONFIG_KEYS`, the last
    of which (streaming) as asked for where the row records it (a protocol whose weights
    come after the uploads runs unstreamed whatever was asked: LARC's rows were run again),
    then the label."""
    assert CONFIG_KEYS[-1] == "streaming"
    asked = row.get("streaming_asked")
    streaming = row["streaming"] if asked is None or pd.isna(asked) else bool(asked)
    return (*(row[k] for k in CONFIG_KEYS[:-1]), streaming, row["label"])


def earlier_rows(path: Path) -> list[dict[str, Any]]:
    """An earlier run's rounds (``--reuse``), with the configuration keys that rows written
    before a key existed lack: the protocol (FedAdam, the only one then) and the native path
    (rows from before it ran on TenSEAL's binding alone) and the masks (rows from before the
    clients made them beside training)."""
    rows = pd.read_csv(path).to_dict("records")
    for r in rows:
        r.setdefault("protocol", "fedadam")
        r.setdefault("native", False)
        r.setdefault("masks", False)
    return rows


def summarise(rounds: pd.DataFrame) -> pd.DataFrame:
    keys = CONFIG_KEYS
    numeric = [
        c
        for c in rounds.columns
        if c
        not in keys + ["label", "round", "seed", "warm", "batch_size", "workers", "streaming_asked"]
        and pd.api.types.is_numeric_dtype(rounds[c])
    ]
    warm = rounds[rounds["warm"]] if rounds["warm"].any() else rounds
    med = warm.groupby(keys, sort=False)[numeric].median().reset_index()
    peaks = rounds.groupby(keys, sort=False)[["server_peak_rss_MB", "worker_peak_rss_MB"]].max()
    med = med.drop(columns=["server_peak_rss_MB", "worker_peak_rss_MB"]).merge(
        peaks.reset_index(), on=keys
    )
    up = [c for c in med.columns if c.startswith("bytes_") and c.endswith("_up")]
    down = [c for c in med.columns if c.startswith("bytes_") and c.endswith("_down")]
    med["bytes_up_per_client_param"] = med[up].sum(axis=1) / med["n_clients"] / med["model_params"]
    med["bytes_down_per_client_param"] = (
        med[down].sum(axis=1) / med["n_clients"] / med["model_params"]
    )
    return med


def slope(x, y) -> float:
    """Exponent b of y ≈ a·x^b (least squares in log-log)."""
    x, y = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return float(np.polyfit(x, y, 1)[0])


def linear_fit(x, y) -> tuple[float, float]:
    """y ≈ a + b·x: intercept and slope."""
    b, a = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(a), float(b)


# ---- report ------------------------------------------------------------------------------
def machine() -> dict[str, str]:
    import tenseal

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 1024**2
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": f"{mem:.0f} GiB",
        "python": platform.python_version(),
        "tenseal": tenseal.__version__,
        "os": platform.platform(),
    }


def ratio_table(summary: pd.DataFrame, by: str, where) -> pd.DataFrame:
    """ckks vs plain round wall time side by side, same run, per ``by`` value."""
    rows = []
    part = summary[where]
    for kind in ("mlp", "synthetic"):
        for value, g in part[part["kind"] == kind].groupby(by):
            plain = g[g["backend"] == "plain"]
            ckks = g[g["backend"] == "ckks"]
            if plain.empty or ckks.empty:
                continue
            p, c = plain.iloc[0], ckks.iloc[0]
            rows.append(
                {
                    "workload": kind,
                    by: int(value),
                    "plain_wall_s": p["wall_s"],
                    "ckks_wall_s": c["wall_s"],
                    "ckks/plain": c["wall_s"] / p["wall_s"],
                    "ckks_up_B_per_param": c["bytes_up_per_client_param"],
                    "ckks_down_B_per_param": c["bytes_down_per_client_param"],
                    "plain_up_B_per_param": p["bytes_up_per_client_param"],
                    "server_peak_MB (plain / ckks)": (
                        f"{p['server_peak_rss_MB']:.0f} / {c['server_peak_rss_MB']:.0f}"
                    ),
                }
            )
    return pd.DataFrame(rows)


def steps_table(steps: pd.DataFrame) -> pd.DataFrame:
    """ckks/plain per local-step count, and what ckks adds per round in seconds."""
    rows = []
    for count, g in steps.groupby("local_steps"):
        plain, ckks = g[g["backend"] == "plain"], g[g["backend"] == "ckks"]
        if plain.empty or ckks.empty:
            continue
        p, c = plain["wall_s"].iloc[0], ckks["wall_s"].iloc[0]
        rows.append(
            {
                "local steps": int(count),
                "plain_wall_s": p,
                "ckks_wall_s": c,
                "ckks - plain (s)": c - p,
                "ckks/plain": c / p,
            }
        )
    return pd.DataFrame(rows)


def breakdown_table(summary: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "wall_s": "round wall",
        "server_train_s": "server: waiting for uploads",
        "server_load_s": "server: load uploads",
        "server_aggregate_s": "server: aggregate",
        "server_receive_s": "server: decode envelopes",
        "server_reveal_s": "server: reveal (decryptor round trip)",
        "server_optimizer_s": "server: optimizer",
        "clients_train_s": "clients: training",
        "clients_protect_s": "clients: encode + encrypt",
        "clients_protect_offline_s": "clients: masks and checks, beside training",
        "clients_envelope_s": "clients: envelopes",
        "decryptor_reveal_s": "decryptor: decrypt + flood",
        "critical_path_s": "critical path (clients in parallel, folds as uploads arrive)",
        "critical_path_serial_s": "critical path, every server step serial",
        "cpu_s": "CPU, every party",
    }
    rows = []
    for _, r in summary.iterrows():
        rows.append(
            {
                "config": f"{r['kind']} {r['backend']}"
                + (" + client DP" if r["client_dp"] else ""),
                **{label: r.get(col, float("nan")) for col, label in cols.items()},
            }
        )
    return pd.DataFrame(rows)


def main_rows(summary: pd.DataFrame, steps: int = 100) -> pd.DataFrame:
    """The default setting: FedAdam, its default preset (lean), streaming, no DP, the run's
    local steps."""
    return summary[
        (summary["protocol"] == "fedadam")
        & (summary["preset"] == CKKS_PRESET)
        & summary["native"]
        & summary["masks"]
        & summary["streaming"]
        & ~summary["client_dp"]
        & (summary["local_steps"] == steps)
    ]


def bytes_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Bytes per round by message type, per parameter (10 clients, largest common size)."""
    rows = []
    for _, r in summary.iterrows():
        entry = {"config": f"{r['kind']} {r['backend']}"}
        for col in sorted(
            c for c in summary.columns if c.startswith("bytes_") and c.endswith(("_up", "_down"))
        ):
            if pd.notna(r[col]) and r[col] > 0:
                entry[col[len("bytes_") :] + " (B/param)"] = r[col] / r["model_params"]
        rows.append(entry)
    return pd.DataFrame(rows)


def paired_ratios(rounds: pd.DataFrame, column: str = "wall_s") -> dict[str, list[float]]:
    """ckks/plain per interleaved repeat (medians of its warm rounds' ``column``: the wall
    time, or the critical path), per workload and, for the befores, per path."""
    out: dict[str, list[float]] = {}
    rep = rounds[rounds["label"].astype(str).str.startswith("ratio") & rounds["warm"]]
    if column not in rep:
        return out
    if "masks" not in rep:
        rep = rep.assign(masks=True)
    for (protocol, kind, label), g in rep.groupby(["protocol", "kind", "label"]):
        times = g.groupby(["backend", "native", "masks"])[column].median()
        plain = times.get(("plain", True, True))
        key = kind if protocol == "fedadam" else f"{kind} {protocol}"
        for path, name in (
            ((True, True), key),
            ((True, False), f"{key} {NO_MASKS}"),
            ((False, True), f"{key} {TENSEAL_ONLY}"),
        ):
            ckks = times.get(("ckks", *path))
            if plain is not None and ckks is not None and not np.isnan(ckks):
                out.setdefault(name, []).append(float(ckks / plain))
    return out


def floor_overheads(rounds: pd.DataFrame) -> dict[str, list[tuple[float, float, float, float]]]:
    """Per workload and interleaved repeat of the ratio sweep: the critical path's privacy
    overhead (ckks minus plain, medians of the warm rounds), the value-dependent floor of
    the ckks rounds and its two parts (the slowest client's online protect, the slowest
    decryptor's opening), all medians of the same warm rounds."""
    out: dict[str, list[tuple[float, float, float, float]]] = {}
    label = rounds["label"].astype(str)
    rep = rounds[(label.str.startswith("ratio") | (label == "steps")) & rounds["warm"]]
    if "value_floor_s" not in rep:
        return out
    if "masks" not in rep:
        rep = rep.assign(masks=True)
    for (protocol, kind, label, steps), g in rep.groupby(
        ["protocol", "kind", "label", "local_steps"]
    ):
        if protocol != "fedadam":
            continue
        # the steps sweep runs once per length; the ratio sweep's repeats are its base length
        kind = f"{kind}, {steps} local steps" if label == "steps" else kind
        plain = g[(g["backend"] == "plain") & g["native"] & g["masks"]]
        ckks = g[(g["backend"] == "ckks") & g["native"] & g["masks"]]
        if plain.empty or ckks.empty:
            continue
        overhead = float(ckks["critical_path_s"].median() - plain["critical_path_s"].median())
        parts = [
            float(ckks[c].median()) for c in ("value_floor_s", "floor_protect_s", "floor_open_s")
        ]
        out.setdefault(str(kind), []).append((overhead, *parts))
    return out


def floor_targets(floors: dict[str, list[tuple[float, float, float, float]]]) -> list[str]:
    """The overhead-over-floor lines: the target on mlp (the FedAvg family behind training),
    stated on synthetic (no training to hide anything behind)."""
    out = []
    for kind, repeats in floors.items():
        ratios = [o / f for o, f, _, _ in repeats if f > 0]
        if not ratios:
            continue
        ratio = float(np.median(ratios))
        overhead, floor, protect, opening = (float(np.median(x)) for x in zip(*repeats))
        verdict = (
            f"target ≤ {FLOOR_TARGET}×: {'met' if ratio <= FLOOR_TARGET else 'NOT met'}"
            if kind.startswith("mlp")
            else "stated, not a target"
        )
        out.append(
            f"- critical-path privacy overhead over the value-dependent floor, {kind}: "
            f"{overhead:.3f} s (ckks minus plain) against a floor of {floor:.3f} s (the "
            f"slowest client's online encode + add {protect:.3f} s, the slowest decryptor's "
            f"opening {opening:.3f} s); per repeat {', '.join(f'{r:.2f}' for r in ratios)}, "
            f"median {ratio:.2f}× ({verdict})"
        )
    return out


def critical_path_targets(
    critical: dict[str, list[float]], serial: dict[str, list[float]] | None = None
) -> list[str]:
    """The critical-path targets against this run's paired ratios, with the befores and,
    from ``serial``, the upper bound that counts every server step after the last upload."""
    out = []
    for key, target in CRITICAL_TARGETS.items():
        pairs = critical.get(key, [])
        if not pairs:
            continue
        ratio = float(np.median(pairs))
        verdict = (
            "stated: its target is against the value-dependent floor, below"
            if target is None
            else f"target ≤ {target}×: {'met' if ratio <= target else 'NOT met'}"
        )
        line = (
            f"- critical path (a deployment's clients in parallel), {key}: paired ratios "
            f"{', '.join(f'{r:.2f}' for r in pairs)}, median {ratio:.2f}× ({verdict})"
        )
        before = critical.get(f"{key} {NO_MASKS}", [])
        if before:
            line += (
                f"; without the masks and checks made beside training (the before, same run): "
                f"{', '.join(f'{r:.2f}' for r in before)}, median {float(np.median(before)):.2f}×"
            )
        bound = (serial or {}).get(key, [])
        if bound:
            line += f"; every server step serial (upper bound): median {np.median(bound):.2f}×"
        out.append(line)
    return out


def targets(
    summary: pd.DataFrame,
    quick: bool,
    steps: int = 100,
    paired: dict[str, list[float]] | None = None,
) -> list[str]:
    """The issue's targets, checked against this run's figures."""
    main = main_rows(summary, steps)
    n = headline_size(quick)
    out = []

    def pick(kind, backend, clients):
        g = main[
            (main["kind"] == kind)
            & (main["backend"] == backend)
            & (main["n_params"] == n)
            & (main["n_clients"] == clients)
        ]
        return None if g.empty else g.iloc[0]

    for kind in ("mlp", "synthetic"):
        p, c = pick(kind, "plain", 10), pick(kind, "ckks", 10)
        if p is not None and c is not None:
            ratio = c["wall_s"] / p["wall_s"]
            pairs = (paired or {}).get(kind, [])
            if pairs:  # interleaved repeats decide; the pooled medians are shown too
                ratio = float(np.median(pairs))
            out.append(
                f"- {n:.0e} parameters, 10 clients, {kind}: ckks round "
                f"{c['wall_s']:.2f} s vs plain {p['wall_s']:.2f} s"
                + (
                    f"; paired ratios {', '.join(f'{r:.2f}' for r in pairs)}, median"
                    if pairs
                    else " ="
                )
                + f" {ratio:.2f}× (target ≤ 1.5×: "
                f"{'met' if ratio <= 1.5 else 'NOT met'})"
            )
    for kind in ("mlp", "synthetic"):
        before = (paired or {}).get(f"{kind} {TENSEAL_ONLY}", [])
        if before:
            out.append(
                f"- the same, {kind}, on TenSEAL's binding alone (SECAGG_NATIVE=off, the "
                f"before): paired ratios {', '.join(f'{r:.2f}' for r in before)}, median "
                f"{float(np.median(before)):.2f}×"
            )
    for key, what in (
        ("mlp larc", "LARC (weights after the uploads: preset compact)"),
        ("mlp larc-lagged", f"larc-lagged (weights a round ahead: preset {CKKS_PRESET})"),
    ):
        larc = (paired or {}).get(key, [])
        if larc:
            out.append(
                f"- {n:.0e} parameters, 10 clients, mlp, {what}: paired ratios "
                f"{', '.join(f'{r:.2f}' for r in larc)}, median "
                f"{float(np.median(larc)):.2f}× (stated, not a target)"
            )
    for kind in ("synthetic", "mlp"):
        c10, c100 = pick(kind, "ckks", 10), pick(kind, "ckks", 100)
        if c100 is not None:
            out.append(
                f"- {n:.0e} parameters, 100 clients, {kind}, ckks: round "
                f"{c100['wall_s']:.1f} s (target ≤ 600 s: "
                f"{'met' if c100['wall_s'] <= 600 else 'NOT met'}); server peak "
                f"{c100['server_peak_rss_MB']:.0f} MB (target ≤ 2048 MB: "
                f"{'met' if c100['server_peak_rss_MB'] <= 2048 else 'NOT met'})"
            )
            if c10 is not None:
                growth = c100["server_peak_rss_MB"] / c10["server_peak_rss_MB"] - 1
                out.append(
                    f"- server peak memory 10 → 100 clients ({kind}, ckks): "
                    f"{c10['server_peak_rss_MB']:.0f} → "
                    f"{c100['server_peak_rss_MB']:.0f} MB, {growth:+.0%} (target ≤ "
                    f"+20%: {'met' if growth <= 0.2 else 'NOT met'})"
                )
    return out


def dashes(frame: pd.DataFrame) -> pd.DataFrame:
    """What a configuration does not have reads as a dash in a table, not as "nan"."""
    return frame.astype(object).where(frame.notna(), "–")


def is_threshold(label: Any) -> bool:
    """Whether a row belongs to the threshold sweep (its own report)."""
    return str(label).startswith(f"{THRESHOLD_SWEEP}#")


THRESHOLD_PAIR_COLUMNS = ["workload", "pair", "ckks_wall_s", "threshold_wall_s", "threshold/ckks"]


def threshold_pairs(rounds: pd.DataFrame) -> pd.DataFrame:
    """threshold/ckks per interleaved pair (medians of each run's warm rounds), per workload."""
    part = rounds[rounds["label"].map(is_threshold)]
    if part["warm"].any():
        part = part[part["warm"]]
    rows = []
    for (kind, label), g in part.groupby(["kind", "label"], sort=False):
        walls = g.groupby("backend")["wall_s"].median()
        if {"ckks", "threshold"} <= set(walls.index):
            rows.append(
                {
                    "workload": kind,
                    "pair": int(str(label).split("#")[1]) + 1,
                    "ckks_wall_s": walls["ckks"],
                    "threshold_wall_s": walls["threshold"],
                    "threshold/ckks": walls["threshold"] / walls["ckks"],
                }
            )
    return pd.DataFrame(rows, columns=THRESHOLD_PAIR_COLUMNS)


def threshold_targets(pairs: pd.DataFrame) -> list[str]:
    """The median paired ratio per workload, its spread, against :data:`THRESHOLD_TARGET`."""
    out = []
    for kind, g in pairs.groupby("workload", sort=False):
        ratios = g["threshold/ckks"].to_numpy()
        median = float(np.median(ratios))
        spread = (
            f"range {ratios.min():.2f}–{ratios.max():.2f}, {len(ratios)} pairs"
            if len(ratios) > 1
            else "1 pair"
        )
        out.append(
            f"- {kind}: threshold round {g['threshold_wall_s'].median():.2f} s vs ckks "
            f"{g['ckks_wall_s'].median():.2f} s (medians); paired ratios "
            f"{', '.join(f'{r:.2f}' for r in ratios)}: median {median:.2f}× ({spread}) "
            f"(target ≤ {THRESHOLD_TARGET:g}×: "
            f"{'met' if median <= THRESHOLD_TARGET else 'NOT met'})"
        )
    return out


def threshold_breakdown(summary: pd.DataFrame) -> pd.DataFrame:
    """Where a round's time goes, ckks beside threshold, per workload."""
    cols = {
        "wall_s": "round wall",
        "server_train_s": "server: waiting for uploads",
        "server_load_s": "server: load uploads",
        "server_aggregate_s": "server: aggregate",
        "server_consent_s": "server: consents round trip",
        "server_reveal_s": "server: reveal (ckks: the decryptor round trip; threshold: all of it)",
        "server_decrypt_share_s": "server: holders' shares round trip (threshold)",
        "server_unmask_s": "server: interpolate + unmask + check the sum (threshold)",
        "server_optimizer_s": "server: optimizer",
        "clients_train_s": "clients: training",
        "clients_protect_s": "clients: encode + encrypt",
        "clients_consent_s": "clients: consents",
        "decryptor_reveal_s": "decryptor: decrypt + flood (ckks)",
        "holders_share_s": "holders: check the release, combine their shares (threshold)",
        "setup_s": "key setup, once per run",
        "setup_MB": "key setup (MB), once per run",
        "server_peak_rss_MB": "server peak (MB)",
        "worker_peak_rss_MB": "busiest worker peak (MB)",
    }
    rows = []
    for _, r in summary.iterrows():
        # threshold's reveal is the server's own (no decryptor): what is left of it past the
        # consents and the holders' round trip is the interpolation and the unmasking
        unmask = (
            r.get("server_reveal_s", float("nan"))
            - r.get("server_consent_s", 0.0)
            - r.get("server_decrypt_share_s", 0.0)
            if r["backend"] == "threshold"
            else float("nan")
        )
        rows.append(
            {
                "config": f"{r['kind']} {r['backend']}",
                **{label: r.get(col, float("nan")) for col, label in cols.items()},
                cols["server_unmask_s"]: unmask,
                cols["setup_MB"]: r.get("setup_bytes", float("nan")) / MB,
            }
        )
    # one configuration per column: the table is long, not wide
    return pd.DataFrame(rows).set_index("config").T.rename_axis("seconds per round").reset_index()


def holder_bytes(summary: pd.DataFrame) -> list[str]:
    """One threshold holder's bytes per reveal, down and up (flat in the model's size), and
    what the check block adds to each upload."""
    out = []
    for _, r in summary[summary["backend"] == "threshold"].iterrows():
        down = r.get("bytes_decrypt_share_down", float("nan")) / r["n_clients"]
        up = r.get("bytes_decrypt_share_up", float("nan")) / r["n_clients"]
        if pd.notna(down) and pd.notna(up):
            out.append(
                f"- {r['kind']} threshold: one holder receives {down:,.0f} B and sends "
                f"{up:,.0f} B per round ({r['model_params']:,} parameters)"
            )
        upload = r.get("bytes_train_up", float("nan")) / r["n_clients"]
        if pd.notna(upload) and upload > 0:
            check = check_block_bytes(str(r.get("preset", THRESHOLD_PRESET)))
            out.append(
                f"- {r['kind']} threshold: the check block is {check:,} B of each "
                f"{upload:,.0f} B upload ({100 * check / upload:.2f} %)"
            )
    return out


def check_block_bytes(preset: str) -> int:
    """The bytes a threshold upload's check block (zero masked under its key) takes."""
    from secagg.threshold.params import CHECK_BLOCKS, get_preset

    p = get_preset(preset)
    return CHECK_BLOCKS * p.ring_dim * p.coefficient_bytes


def preset_setting(n_clients: int) -> tuple[str, str]:
    """The two presets the sweep compares, as the report describes them (computed from the
    presets, so that the text follows them): ckks's, then threshold's with its t of n."""
    from secagg.ckks.presets import get_preset as ckks_preset
    from secagg.threshold.params import default_t
    from secagg.threshold.params import get_preset as threshold_preset

    c = ckks_preset(THRESHOLD_CKKS_PRESET)
    data = c.coeff_bits[:-1]  # the last is SEAL's special prime, which never travels
    primes = f"one {data[0]}-bit data prime" if len(data) == 1 else f"{len(data)} data primes"
    t = threshold_preset(THRESHOLD_PRESET)
    return (
        f"`{THRESHOLD_CKKS_PRESET}` (N={c.poly_modulus_degree}, {primes}; one key the "
        "clients share, one decryptor per reveal, 30-bit noise flooding)",
        f"`{THRESHOLD_PRESET}` (key-additive RLWE masking, N={t.ring_dim}, one "
        f"{t.prime_bits}-bit prime at Δ = 2^{t.scale_bits}, {t.coefficient_bytes} bytes a "
        f"value, and a check block of {check_block_bytes(THRESHOLD_PRESET):,} B an upload: "
        "zero masked under the upload's key, which the unmasked sum must show as noise): every "
        f"upload is masked under a fresh one-time key that its client Shamir-shares among the "
        f"{n_clients} clients (t = {default_t(n_clients)}, a strict majority)",
    )


def write_threshold_report(
    rounds: pd.DataFrame, summary: pd.DataFrame, out: Path, args, elapsed: float
) -> str:
    """overhead_threshold.md: the paired threshold/ckks ratios and where the time goes."""
    m = machine()
    n = headline_size(args.quick)
    pairs = threshold_pairs(rounds)
    ckks_text, threshold_text = preset_setting(10)
    lines = [
        "# Threshold vs ckks: what a key no client holds costs per round",
        "",
        made_by(f"python -m benchmarks.overhead {' '.join(args.argv)}")
        + f" Measuring the threshold sweep took {elapsed / 60:.1f} minutes on {m['cpu']}, "
        f"{m['memory']}, {m['os']}.",
        "",
        f"Setting: FedAdam, streaming aggregation, {n:.0e} parameters, 10 clients in "
        f"{args.workers} worker processes, {args.rounds} rounds per run in a fresh server "
        "process (the first a warm-up: in `overhead_threshold_rounds.csv`, not in the "
        "medians). Both backends on their streaming preset, where the clients apply their "
        f"planned weights and the server only adds. `ckks`: preset {ckks_text}. "
        f"`threshold`: preset {threshold_text}, each share sealed for "
        "its holder inside the upload; a reveal gathers the consents, asks every holder for "
        "its share of the key sum (each checks the release, opens its sealed shares and "
        "combines them into one ring element), and the server interpolates the key sum, "
        "unmasks and checks the sum (its check block, and every value within the headroom). "
        "No key setup: the holders are the provisioned roster. Runs alternate "
        f"ckks, threshold, ckks, ... ({args.repeats} pair(s) per workload), so the ratio does not "
        f"ride on the machine's load drifting. `mlp`: MLP 64-h-h-10 on digits, "
        f"{args.local_steps} local SGD steps of batch 32 per round; `synthetic`: no training. "
        "The machine is shared and noisy: compare within one run.",
        "",
        *(
            [
                f"**`--quick`: a smoke check at toy sizes ({n:.0e} parameters), not a "
                "measurement: do not quote these figures.**",
                "",
            ]
            if args.quick
            else []
        ),
        f"## Target (threshold round ≤ {THRESHOLD_TARGET:g}× the ckks round)",
        "",
        *threshold_targets(pairs),
        "",
        "## Interleaved pairs (medians of each run's warm rounds)",
        "",
        markdown_table(dashes(pairs), ".3g"),
        "",
        "## Where the time goes (medians of the warm rounds over all pairs)",
        "",
        "Seconds per round unless stated. Clients' and holders' figures are summed over "
        f"clients: they run in parallel on {args.workers} workers and overlap the server's "
        "work, so the parts do not add up to the wall time. On threshold the server's reveal "
        "is its own (no decryptor): the consents, the holders' round trip, and what is left, "
        "interpolating the key sum, unmasking and checking the sum. Key setup (key wrapping "
        "on ckks; nothing on threshold) happens once per run, before the rounds.",
        "",
        markdown_table(dashes(threshold_breakdown(summary)), ".3g"),
        "",
        "## Bytes per round by message (totals over all clients, per parameter)",
        "",
        "`train_up`: the uploads; `train_down`: the model to every client; ckks: "
        "`reveal_down` the aggregate to the decryptor, `reveal_up` its flooded plaintext; "
        "threshold: `train_up` includes each upload's check block, `decrypt_share_down` "
        "the release with its consents and each holder's "
        "sealed key share from every contributor, `decrypt_share_up` every holder's share of "
        "the key sum (both flat in the model's size); `consent_*`: the release descriptors "
        "and signatures.",
        "",
        markdown_table(dashes(bytes_table(summary)), ".3g"),
        "",
        *holder_bytes(summary),
        "",
        "Raw rows: `overhead_threshold_rounds.csv`; medians: `overhead_threshold.csv`.",
        "",
    ]
    text = "\n".join(lines)
    (out / "overhead_threshold.md").write_text(text)
    return text


def write_report(
    summary: pd.DataFrame,
    out: Path,
    args,
    elapsed: float,
    paired: dict[str, list[float]] | None = None,
    critical: dict[str, list[float]] | None = None,
    serial: dict[str, list[float]] | None = None,
    floors: dict[str, list[tuple[float, float, float, float]]] | None = None,
    stages: pd.DataFrame | None = None,
) -> str:
    """The report; ``paired``, ``critical`` and ``serial``: the interleaved repeats'
    ckks/plain ratios of the round's wall time, of its critical path and of that path's
    upper bound (:func:`paired_ratios`); ``floors``: the critical path's overhead against
    the value-dependent floor (:func:`floor_overheads`)."""
    m = machine()
    n = headline_size(args.quick)
    main = main_rows(summary, args.local_steps)
    # the tables describe FedAdam; LARC's paired ratio is among the targets
    summary = summary[
        (summary["protocol"] == "fedadam")
        & summary["local_steps"].isin(
            [args.local_steps]
            + ([args.local_steps * f for f in (2, 4)] if "steps" in args.sweep else [])
        )
    ]
    lines = [
        "# End-to-end overhead: what privacy costs",
        "",
        made_by(f"python -m benchmarks.overhead {' '.join(args.argv)}")
        + f" Measuring took {elapsed / 60:.1f} minutes on {m['cpu']}, {m['memory']}, "
        f"{m['os']}.",
        "",
        f"Setting: FedAdam, streaming aggregation, clients in {args.workers} worker "
        "processes; CKKS preset `lean` (N=4096, one 60-bit data prime: the clients apply "
        "their planned weights and the server only adds; 128-bit security, 30-bit noise "
        "flooding) unless stated; the server process imports no CLI, pandas, matplotlib "
        f"or torch (`benchmarks/rounds.py`). Each configuration runs {args.rounds} rounds in a "
        "fresh server process; the first round is a warm-up (in `overhead_rounds.csv`, "
        "not in the medians below); peaks are maxima over the measured rounds. "
        f"`mlp`: MLP 64-h-h-10 on digits (IID split), {args.local_steps} local SGD steps "
        "of batch 32 per round; `synthetic`: no training, so the round is pure protocol "
        "and crypto overhead. The machine is shared and noisy: compare within one run.",
        "",
        *(
            [
                f"**`--quick`: a smoke check that every sweep runs, at toy sizes ({n:.0e} "
                "parameters and fewer), not a measurement: do not quote these figures; the "
                "targets are meant for 1e6 parameters.**",
                "",
            ]
            if args.quick
            else []
        ),
        "## Targets",
        "",
        *targets(summary, args.quick, args.local_steps, paired),
        *critical_path_targets(critical or {}, serial),
        *floor_targets(floors or {}),
        "",
        "The wall time is the in-process round: 10 clients share this machine's cores in "
        f"{args.workers} worker processes, one after another. The critical path is what a "
        "deployment whose clients run in parallel, each on its own machine, would wait for "
        "(network left out): the server's own work plus, per phase, the slowest client's "
        "answer, except that the server folds each upload as it arrives (at its client's "
        "measured answer time, taking the round's mean load and add time), so the training "
        "phase ends when the last upload is folded; the upper bound counts every server step "
        "after the last answer. CPU is the busy seconds of every party summed, the masks "
        "and checks clients make beside training included (`benchmarks/rounds.py`, "
        "`deployment_seconds`).",
        "",
    ]
    sizes = main[main["n_clients"] == 10]
    if "sizes" in args.sweep and not sizes.empty:
        lines += [
            "## Model size (10 clients)",
            "",
            markdown_table(ratio_table(main, "n_params", main["n_clients"] == 10), ".3g"),
            "",
            "Fitted growth from 1e5 parameters up (round wall ∝ params^b):",
            "",
        ]
        for kind in ("mlp", "synthetic"):
            for backend in ("plain", "ckks"):
                g = sizes[
                    (sizes["kind"] == kind)
                    & (sizes["backend"] == backend)
                    & (sizes["model_params"] >= 1e5)
                ]
                if len(g) >= 2:
                    a, b = linear_fit(g["model_params"] / 1e6, g["wall_s"])
                    lines.append(
                        f"- {kind} {backend}: b = "
                        f"{slope(g['model_params'], g['wall_s']):.2f}; "
                        f"≈ {a:.2f} s + {b:.2f} s per million parameters"
                    )
        lines.append("")
    clients = main[main["n_params"] == n]
    if "clients" in args.sweep and not clients.empty:
        lines += [
            f"## Client count ({n:.0e} parameters)",
            "",
            markdown_table(ratio_table(main, "n_clients", main["n_params"] == n), ".3g"),
            "",
            "Fitted growth (least squares, linear in clients):",
            "",
        ]
        for kind in ("mlp", "synthetic"):
            for backend in ("plain", "ckks"):
                g = clients[(clients["kind"] == kind) & (clients["backend"] == backend)]
                if len(g) >= 2:
                    a, b = linear_fit(g["n_clients"], g["wall_s"])
                    ma, mb = linear_fit(g["n_clients"], g["server_peak_rss_MB"])
                    lines.append(
                        f"- {kind} {backend}: round ≈ {a:.2f} s + {b:.3f} s per "
                        f"client; server peak ≈ {ma:.0f} MB + {mb:.2f} MB per client"
                    )
        lines.append("")
    at = main[(main["n_params"] == n) & (main["n_clients"] == 10)]
    if not at.empty:
        lines += [
            f"## Bytes per round by message ({n:.0e} parameters, 10 clients)",
            "",
            "Totals over all clients, divided by the model's parameter count "
            "(`train_up`: the uploads; `train_down`: the model to every client; "
            "`reveal_*`: the aggregate to the decryptor and its flooded plaintext back).",
            "",
            markdown_table(bytes_table(at), ".3g"),
            "",
        ]
    presets = summary[
        (summary["backend"] == "ckks")
        & (summary["n_params"] == n)
        & (summary["n_clients"] == 10)
        & summary["native"]
        & summary["streaming"]
        & ~summary["client_dp"]
        & (summary["local_steps"] == args.local_steps)
    ]
    if "presets" in args.sweep and presets["preset"].nunique() > 1:
        table = presets[
            [
                "kind",
                "preset",
                "wall_s",
                "clients_protect_s",
                "server_load_s",
                "server_aggregate_s",
                "bytes_up_per_client_param",
            ]
        ]
        lines += [
            f"## CKKS presets ({n:.0e} parameters, 10 clients)",
            "",
            markdown_table(table, ".3g"),
            "",
        ]
    buffered = summary[~summary["streaming"]]
    if not buffered.empty:
        streamed = summary[
            summary["streaming"]
            & (summary["kind"] == "synthetic")
            & (summary["backend"] == "ckks")
            & (summary["preset"] == CKKS_PRESET)
            & summary["native"]
            & ~summary["client_dp"]
            & (summary["n_params"] == buffered["n_params"].iloc[0])
        ]
        table = buffered[["n_clients", "server_peak_rss_MB", "wall_s"]].merge(
            streamed[["n_clients", "server_peak_rss_MB", "wall_s"]],
            on="n_clients",
            how="left",
            suffixes=(" buffered", " streaming"),
        )
        lines += [
            f"## Streaming vs buffering the uploads (ckks, synthetic, "
            f"{buffered['n_params'].iloc[0]:.0e} parameters; buffered on `compact`, whose "
            f"weights may come after the uploads, streamed on `{CKKS_PRESET}`)",
            "",
            markdown_table(table, ".4g"),
            "",
        ]
    dp = summary[
        (summary["kind"] == "mlp")
        & (summary["n_clients"] == 10)
        & (summary["n_params"] == n)
        & (summary["preset"] == CKKS_PRESET)
        & summary["native"]
        & summary["streaming"]
        & (summary["local_steps"] == args.local_steps)
    ]
    if not dp.empty:
        lines += [
            f"## Where the time goes (mlp, {n:.0e} parameters, 10 clients)",
            "",
            "Seconds per round. Clients' figures are summed over clients: they run in "
            f"parallel on {args.workers} workers and overlap the server's work, so the "
            "parts do not add up to the wall time.",
            "",
            markdown_table(breakdown_table(dp), ".3g"),
            "",
        ]
    steps = summary[
        (summary["kind"] == "mlp")
        & (summary["n_params"] == n)
        & (summary["n_clients"] == 10)
        & (summary["preset"] == CKKS_PRESET)
        & summary["native"]
        & summary["streaming"]
        & ~summary["client_dp"]
    ]
    if "steps" in args.sweep and steps["local_steps"].nunique() > 1:
        lines += [
            f"## How much local training hides the crypto (mlp, {n:.0e} parameters, 10 clients)",
            "",
            markdown_table(steps_table(steps), ".3g"),
            "",
        ]
    if stages is not None and not stages.empty:
        lines += [
            f"## Where the critical path goes ({n:.0e} parameters, 10 clients)",
            "",
            "Seconds per round, medians of the interleaved repeats' warm rounds: the "
            "server's own work and, per phase, its slowest client's answer; they add up to "
            "the serial critical path (the upper bound). `critical_path_s` folds the uploads "
            "as they arrive; `value_floor_s` is the part nothing can precompute "
            "(`overhead_critical_path.png`).",
            "",
            markdown_table(stages_table(stages), ".3g"),
            "",
        ]
    lines += [
        "Raw rows: `overhead_rounds.csv`; medians: `overhead.csv`; plots: "
        "`overhead_sizes.png`, `overhead_clients.png`, `overhead_critical_path.png`.",
        "",
    ]
    text = "\n".join(lines)
    (out / "overhead.md").write_text(text)
    return text


def plot(summary: pd.DataFrame, out: Path, steps: int = 100) -> list[str]:
    """Round time and server peak memory against model size and against client count
    (with the buffered server beside the streaming one); the names of the files written."""
    written = []
    base = main_rows(summary, steps)
    buffered = summary[~summary["streaming"] & (summary["local_steps"] == steps)]
    for by, title, name in (
        ("model_params", "10 clients", "sizes"),
        ("n_clients", "by client count", "clients"),
    ):
        if by == "model_params":
            part = base[base["n_clients"] == 10]
        else:
            part = base[base["n_params"] == base[base["n_clients"] != 10]["n_params"].max()]
        if part.empty:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        series = [((kind, backend), g) for (kind, backend), g in part.groupby(["kind", "backend"])]
        if by == "n_clients" and not buffered.empty:
            series.append((("synthetic", "ckks, buffered"), buffered))
        for (kind, backend), g in series:
            g = g.sort_values(by)
            style = "-" if backend.startswith("ckks") else "--"
            for ax, col in zip(axes, ("wall_s", "server_peak_rss_MB")):
                ax.plot(g[by], g[col], style, marker="o", label=f"{kind} {backend}")
        for ax, ylabel in zip(axes, ("round wall time (s)", "server peak RSS (MB)")):
            ax.set_xscale("log")
            if ylabel.startswith("round"):
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
            ax.set_xlabel("model parameters" if by == "model_params" else "clients")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"secagg overhead, {title} (medians of warm rounds)")
        fig.tight_layout()
        fig.savefig(out / f"overhead_{name}.png", dpi=120)
        plt.close(fig)
        written.append(f"overhead_{name}.png")
    return written


#: the critical-path figure's workloads, from the ratio sweep: (title, kind, protocol, preset)
PATH_WORKLOADS = (
    ("FedAvg family (mlp)", "mlp", "fedadam", CKKS_PRESET),
    ("synthetic (no training)", "synthetic", "fedadam", CKKS_PRESET),
    ("LARC (mlp)", "mlp", "larc", "compact"),
    ("LARC lagged (mlp)", "mlp", "larc-lagged", CKKS_PRESET),
)


def critical_path_stages(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per workload of :data:`PATH_WORKLOADS` and backend: the medians over the ratio
    sweep's warm rounds (default path) of each stage of the serial critical path
    (``path_*_s``: the server's work and each phase's slowest answer,
    ``rounds.deployment_seconds``), with the folded critical path and the value floor."""
    if "path_server_s" not in rounds:
        return pd.DataFrame()
    rep = rounds[rounds["label"].astype(str).str.startswith("ratio") & rounds["warm"]]
    rep = rep[rep["native"] & rep["masks"]]
    rows = []
    for title, kind, protocol, preset in PATH_WORKLOADS:
        for backend in ("plain", "ckks"):
            part = rep[
                (rep["kind"] == kind)
                & (rep["protocol"] == protocol)
                & (rep["preset"] == preset)
                & (rep["backend"] == backend)
            ]
            if part.empty:
                continue
            stages = [c for c in part.columns if c.startswith("path_") and part[c].notna().any()]
            rows.append(
                {
                    "workload": title,
                    "backend": backend,
                    **{c: float(part[c].fillna(0.0).median()) for c in stages},
                    "critical_path_s": float(part["critical_path_s"].median()),
                    "value_floor_s": float(part["value_floor_s"].median()),
                }
            )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    stages = [c for c in table.columns if c.startswith("path_")]
    first = [c for c in ("path_server_s", "path_train_s") if c in stages]
    ordered = first + sorted(c for c in stages if c not in first)
    table = table[["workload", "backend", *ordered, "critical_path_s", "value_floor_s"]]
    return table.fillna({c: 0.0 for c in ordered})


def plot_critical_path(stages: pd.DataFrame, out: Path) -> list[str]:
    """Stacked bars: where each workload's serial critical path goes, plain beside ckks."""
    if stages.empty:
        return []
    columns = [c for c in stages.columns if c.startswith("path_")]  # in the table's order
    colours = dict(zip(columns, plt.get_cmap("tab10").colors, strict=False))
    labels = {c: "server's own work" if c == "path_server_s" else c[5:-2] for c in columns}
    workloads = list(dict.fromkeys(stages["workload"]))
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 1.6 + 1.3 * len(workloads)))
    for ax, workload in zip(np.atleast_1d(axes), workloads, strict=True):
        part = stages[stages["workload"] == workload].reset_index(drop=True)
        left = np.zeros(len(part))
        for column in columns:
            width = part[column].to_numpy()
            if not np.any(width > 0):
                continue
            ax.barh(part["backend"], width, left=left, color=colours[column])
            left += width
        for y, r in part.iterrows():
            if r["backend"] != "plain":  # plain has no floor: nothing to encode or open
                ax.annotate(
                    f"floor {r['value_floor_s']:.3f} s",
                    (left[y], y),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=7,
                )
        ax.set_title(workload, fontsize=9, loc="left")
        ax.set_xlabel("seconds (serial critical path: medians of warm rounds)", fontsize=8)
        ax.margins(x=0.12)  # room for the floor's label
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[c]) for c in columns]
    fig.legend(handles, [labels[c] for c in columns], loc="lower center", ncol=len(columns))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out / "overhead_critical_path.png", dpi=120)
    plt.close(fig)
    return ["overhead_critical_path.png"]


def stages_table(stages: pd.DataFrame) -> pd.DataFrame:
    """The figure's numbers: one row per workload and backend, a column per stage."""
    renamed = {
        c: ("server" if c == "path_server_s" else c[5:-2]) for c in stages if c.startswith("path_")
    }
    return stages.rename(columns=renamed)


# ---- where the outputs go (benchmarks.crypto uses these too) -----------------------------
#: what a run writes into its --out folder
OUTPUTS = (
    "overhead_rounds.csv",
    "overhead.csv",
    "overhead.md",
    "overhead_machine.json",
    "overhead_sizes.png",
    "overhead_clients.png",
    "overhead_critical_path.png",
)
#: what the threshold sweep writes (its own report, beside the plain vs ckks one)
THRESHOLD_OUTPUTS = (
    "overhead_threshold_rounds.csv",
    "overhead_threshold.csv",
    "overhead_threshold.md",
    "overhead_threshold_machine.json",
)


def outputs_of(sweeps: list[str]) -> tuple[str, ...]:
    """The files a run of these sweeps writes: the plain vs ckks report's if any of its
    sweeps runs, the threshold report's if the threshold sweep does."""
    return (OUTPUTS if set(sweeps) & set(SWEEPS) else ()) + (
        THRESHOLD_OUTPUTS if THRESHOLD_SWEEP in sweeps else ()
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked, with the output folder chosen and created: every argument error
    ends the run here (exit status 2), before anything is measured."""
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(
        prog="secagg bench overhead",
        description=__doc__.splitlines()[0]
        + " Every configuration runs the real engine, clients (in worker processes) and "
        "backends, in a fresh server process; the module's docstring "
        "(benchmarks/overhead.py) says what each sweep measures.",
        epilog="Writes "
        + ", ".join(OUTPUTS)
        + " into --out, and the threshold sweep "
        + ", ".join(THRESHOLD_OUTPUTS)
        + ". The committed tables that the README quotes are regenerated with --out "
        "benchmarks/results --overwrite (the full run: about 35 minutes on 2 cores for the "
        "plain vs ckks sweeps, and the threshold sweep's own; --sweep threshold regenerates "
        "its report alone).",
    )
    parser.add_argument(
        "--sweep",
        default=",".join(ALL_SWEEPS),
        help="which sweeps to run, comma separated, from: %(default)s (default: all of them; "
        f"{THRESHOLD_SWEEP!r}, ckks vs threshold in interleaved pairs, writes a report of "
        "its own)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke check that every code path runs, not a measurement (do not quote its "
        "figures): each sweep once at toy sizes (the synthetic workload at "
        f"{' and '.join(f'{m:,}' for m in QUICK_SIZES)} parameters and "
        f"{' and '.join(map(str, QUICK_CLIENTS))} clients, the mlp at {QUICK_SIZES[-1]:,} × 10; "
        "DP, the wide preset, buffering and twice the local steps once each; the headline "
        "configurations run once, as the one interleaved repeat), "
        f"{QUICK_DEFAULTS['rounds']} rounds and {QUICK_DEFAULTS['local_steps']} local steps "
        "unless given; about 2 minutes on 2 cores",
    )
    parser.add_argument(
        "--rounds",
        type=positive,
        help="rounds per configuration; the first is a warm-up, reported in "
        "overhead_rounds.csv but not in the medians "
        f"(default: {FULL_DEFAULTS['rounds']}; {QUICK_DEFAULTS['rounds']} with --quick)",
    )
    parser.add_argument(
        "--local-steps",
        type=positive,
        help="local SGD steps of batch 32 per round of the mlp workload "
        f"(default: {FULL_DEFAULTS['local_steps']}; {QUICK_DEFAULTS['local_steps']} with "
        "--quick)",
    )
    parser.add_argument(
        "--workers",
        type=positive,
        default=cpus,
        help=f"worker processes the clients run in (default: the CPU count, here {cpus})",
    )
    parser.add_argument(
        "--repeats",
        type=positive,
        help="interleaved plain/ckks repeats of the headline configurations (the ratio "
        "sweep), and ckks/threshold pairs per workload (the threshold sweep) "
        f"(default: {FULL_DEFAULTS['repeats']}; {QUICK_DEFAULTS['repeats']} with --quick)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="folder for the outputs (default: a new folder "
        "results/bench/overhead-YYYYmmdd-HHMMSS under the current directory); "
        "--out benchmarks/results regenerates the committed tables (with --overwrite)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let --out be a folder that already holds this benchmark's outputs, and "
        "replace them (default: refuse)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the configurations already in --out's overhead_rounds.csv and run only "
        "the others; needs --out, and replaces that folder's report",
    )
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.sweep = [s.strip() for s in args.sweep.split(",") if s.strip()]
    unknown = set(args.sweep) - set(ALL_SWEEPS)
    if unknown:
        parser.error(f"unknown sweeps {sorted(unknown)}; choose from {', '.join(ALL_SWEEPS)}")
    for key, value in (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.reuse and args.out is None:
        parser.error("--reuse reads an earlier run's overhead_rounds.csv: give its folder as --out")
    args.out = output_folder(
        parser, args.out, "overhead", outputs_of(args.sweep), args.overwrite or args.reuse
    )
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    print(f"writing to {args.out}", flush=True)
    configs = plan(args.sweep, args.quick, args.local_steps, args.repeats)
    # two reports, each with its own files: plain vs ckks (False) and the threshold sweep
    # (True); a run touches only the files of the sweeps it runs
    reports: dict[bool, tuple[str, ...]] = {}
    if set(args.sweep) & set(SWEEPS):
        reports[False] = OUTPUTS
    if THRESHOLD_SWEEP in args.sweep:
        reports[True] = THRESHOLD_OUTPUTS
    rows: dict[bool, list[dict]] = {threshold: [] for threshold in reports}
    done: set[tuple] = set()
    if args.reuse:
        for threshold, files in reports.items():
            if (args.out / files[0]).exists():
                rows[threshold] = earlier_rows(args.out / files[0])
                done |= {reuse_key(r) for r in rows[threshold]}
    spent = {threshold: 0.0 for threshold in reports}
    for i, (sweep, workload, opts) in enumerate(configs, 1):
        name = (
            f"{workload.kind} {workload.backend} {workload.n_params:.0e} params "
            f"× {workload.n_clients} clients, {workload.local_steps} steps, {workload.preset}"
            + ("" if workload.native or workload.backend != "ckks" else " (TenSEAL binding only)")
            + (
                ""
                if workload.masks or workload.backend != "ckks"
                else " (no masks beside training)"
            )
            + "".join(f" {k}={v}" for k, v in opts.items())
        )
        key = (  # CONFIG_KEYS' order, then the label
            workload.protocol,
            workload.kind,
            workload.backend,
            workload.preset,
            workload.native,
            workload.masks,
            workload.n_params,
            workload.model_params(),
            workload.n_clients,
            workload.local_steps,
            opts.get("client_dp", False),
            opts.get("streaming", True),
            sweep,
        )
        if key in done:
            print(f"[{i}/{len(configs)}] {name}: reused", flush=True)
            continue
        print(f"[{i}/{len(configs)}] {name} ...", flush=True)
        threshold = is_threshold(sweep)
        start = time.perf_counter()
        got = run_config(workload, args.rounds, args.workers, label=sweep, **opts)
        spent[threshold] += time.perf_counter() - start
        rows[threshold] += got
        print(
            "    "
            + "  ".join(f"{r['wall_s']:.2f} s" for r in got)
            + "  (critical path "
            + "  ".join(f"{r['critical_path_s']:.2f} s" for r in got)
            + ")"
            + f"  server peak {max(r['server_peak_rss_MB'] for r in got):.0f} MB",
            flush=True,
        )
        pd.DataFrame(rows[threshold]).to_csv(args.out / reports[threshold][0], index=False)
    summaries = []
    for threshold, files in reports.items():
        rounds_csv, summary_csv, report_md, machine_json = files[:4]
        elapsed = spent[threshold]
        if elapsed == 0 and (args.out / machine_json).exists():  # a pure --reuse
            elapsed = 60 * json.loads((args.out / machine_json).read_text()).get(
                "measuring_minutes", 0.0
            )
        rounds = pd.DataFrame(rows[threshold])
        summary = summarise(rounds)
        summary.to_csv(args.out / summary_csv, index=False)
        if threshold:
            print(write_threshold_report(rounds, summary, args.out, args, elapsed))
        else:
            stages = critical_path_stages(rounds)
            written = plot(summary, args.out, args.local_steps)
            written += plot_critical_path(stages, args.out)
            for stale in {f for f in OUTPUTS if f.endswith(".png")} - set(written):
                (args.out / stale).unlink(missing_ok=True)  # an earlier run's plot this lacks
            report = write_report(
                summary,
                args.out,
                args,
                elapsed,
                paired_ratios(rounds),
                paired_ratios(rounds, "critical_path_s"),
                paired_ratios(rounds, "critical_path_serial_s"),
                floor_overheads(rounds),
                stages,
            )
            print(report)
        (args.out / machine_json).write_text(
            json.dumps({**machine(), "measuring_minutes": elapsed / 60}, indent=2)
        )
        summaries.append(summary)
    return pd.concat(summaries, ignore_index=True)


if __name__ == "__main__":
    main()
