"""Every protocol on an encrypted backend against plain: the same short run, side by side.

    python -m benchmarks.protocol_parity [--backend threshold] [--rounds 3] [--out DIR]

For each registered protocol, one short run (``short_run``: 1 seed, 3 local steps, the
protocol's own kind of task, its backend's default preset) on ``plain`` and on the chosen
backend, with the same seed: the largest |Δ| of the final parameters and of the last round's
test metric, whether the run aborted or excluded anyone, and the seconds each took. Adaptive
server optimizers compare at τ = 1e-3 (FLamby's 1e-8 blows any difference in a near-zero
gradient up to order lr: README, "Parity"). ``tests/test_ckks_rounds.py`` and
``tests/test_threshold.py`` run the same configurations.

Writes protocol_parity_<backend>.csv and .md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.reproduce import Check, made_by
from benchmarks.stats import markdown_table
from secagg.protocols import PROTOCOLS, make_protocol, protocol_spec
from secagg.simulation.experiment import ExperimentConfig, run_experiment

#: where its results go unless ``--out`` says (the committed ones: benchmarks/results)
RESULTS_FOLDER = Path(__file__).resolve().parent / "results"
SMALL = ExperimentConfig(rounds=2, seeds=[1], local_steps=3, backend="ckks")
#: ``secagg bench protocol_parity --check``: four protocols of different kinds (a FedAvg
#: round, LARC's weights after the uploads, the exact Cox model, XGBoost's histograms)
#: the results files it writes, one per run's arguments (the reference page lists them)
RESULTS = "protocol_parity_*.md"

CHECK = Check(
    args=("--protocols", "fedavg,larc,coxph,xgboost"),
    csv="protocol_parity_threshold.csv",
    keys=("protocol",),
    columns={
        "task": 0,
        "preset": 0,
        "metric_plain": 1e-9,
        "max_abs_param_gap": 1e-5,
        "max_abs_metric_gap": 1e-6,
        "aborted": 0,
        "exclusions": 0,
    },
    why="plain is deterministic; the threshold run adds fresh one-time keys' noise each time, "
    "so its gap to plain moves but must stay at the backend's precision (1e-6 to 1e-5 on "
    "these presets) with no abort and no exclusion",
)


#: what a protocol needs on ``threshold`` to pass the clients' coalition rules
#: (``secagg.backends.coalition``): LARC releases two weightings of the same uploads (Ĝ,
#: then the update), which t − 1 = 3 colluders of 6 (the default majority t = 4) could
#: combine into a sum one honest upload dominates in about 40 % of rounds (weakest share
#: below 0.01), so its clients refuse those; at t = 3 (2 colluders) no round of 24 measured
#: came below 0.02. SimAgg releases the centre (weights 1/n) and the FedAvg sum (ν) of the
#: same uploads: two TCGA-BRCA centres hold 129 patients each, so at t = 4 their difference
#: is one honest update exactly. SAVAE's prior task has 2 clients: one colluder reads the
#: other's upload from any sum, which its clients must accept explicitly.
THRESHOLD_OPTIONS: dict[str, dict[str, int]] = {
    "larc": {"threshold_t": 3},
    "simagg": {"threshold_t": 3},
    "savae_prior": {"min_contributors": 1},
}


def short_run(protocol: str, **changes) -> ExperimentConfig:
    """A short run of the protocol on its own kind of task: the example registered with it
    (``secagg.protocols.registry.Example``), then ``changes``."""
    allow = make_protocol(protocol).capabilities.needs_individual_updates  # medians: not sums
    settings = {**protocol_spec(protocol).example.settings, **changes}
    if "local_epochs" in settings:  # epochs replace the short run's steps
        settings.setdefault("local_steps", ExperimentConfig.local_steps)
    return replace(SMALL, protocol=protocol, allow_plaintext_updates=allow, **settings)


def gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def side_by_side(protocol: str, backend: str, rounds: int) -> dict:
    """One protocol's short run on plain and on ``backend``: the gaps and the costs."""
    cfg = short_run(protocol, rounds=rounds, backend=backend)
    if backend == "threshold" and protocol in THRESHOLD_OPTIONS:
        cfg = replace(cfg, backend_options={**cfg.backend_options, **THRESHOLD_OPTIONS[protocol]})
    if cfg.optimizer_config()["name"] in ("adam", "yogi", "adagrad"):
        cfg = replace(cfg, server_opt={"tau": 1e-3})
    start = time.perf_counter()
    # plain with the encrypted backend's weight cap (plain's own is off): the same algorithm
    cap = {"max_weight_share": cfg.policy().max_weight_share}
    plain = run_experiment(replace(cfg, backend="plain", backend_options=cap))
    middle = time.perf_counter()
    other = run_experiment(cfg)
    end = time.perf_counter()
    seed = cfg.seeds[0]
    metric = "test_pooled"
    return {
        "protocol": protocol,
        "task": cfg.task,
        "preset": cfg.resolved_backend_options().get("preset", ""),
        "max_abs_param_gap": float(
            np.abs(plain.final_params[seed] - other.final_params[seed]).max()
        ),
        "metric_plain": float(plain.metrics[metric].iloc[-1]),
        f"metric_{backend}": float(other.metrics[metric].iloc[-1]),
        "max_abs_metric_gap": float((plain.metrics[metric] - other.metrics[metric]).abs().max()),
        "aborted": bool(other.aborted),
        "exclusions": len(other.audit.summary()["exclusions"]),
        "plain_s": round(middle - start, 2),
        f"{backend}_s": round(end - middle, 2),
    }


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="threshold", choices=("ckks", "threshold"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS_FOLDER)
    args = parser.parse_args(argv)
    rows = []
    for protocol in args.protocols.split(","):
        rows.append(side_by_side(protocol, args.backend, args.rounds))
        row = rows[-1]
        print(
            f"{protocol:12s} |Δparam| {row['max_abs_param_gap']:.2e}  "
            f"|Δmetric| {row['max_abs_metric_gap']:.1e}  aborted {row['aborted']}",
            flush=True,
        )
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"protocol_parity_{args.backend}"
    table.to_csv(args.out / f"{stem}.csv", index=False)
    command = (
        f"python -m benchmarks.protocol_parity --backend {args.backend} --rounds {args.rounds}"
        + ("" if args.protocols == ",".join(PROTOCOLS) else f" --protocols {args.protocols}")
    )
    (args.out / f"{stem}.md").write_text(
        f"# Every protocol on {args.backend} against plain\n\n"
        + made_by(command)
        + f"\n\n1 seed, {args.rounds} rounds, 3 local steps, each protocol's default "
        f"preset on {args.backend}. Largest |Δ| of the final parameters and of the test "
        "metric over the rounds; adaptive optimizers at τ = 1e-3.\n\n"
        + markdown_table(table, floatfmt=".3g")
        + "\n"
    )
    return table


if __name__ == "__main__":
    main()
