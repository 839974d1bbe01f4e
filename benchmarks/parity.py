"""Parity: the same runs on ``plain`` and an encrypted backend give the same model up to
CKKS precision.

    python -m benchmarks.parity [--seeds 42-46] [--preset compact] [--flooding-bits 30]
    python -m benchmarks.parity --backend threshold [--preset n8192]

For LARC and FedAdam on Fed-TCGA-BRCA, prints and writes (benchmarks/results/parity.md) the
max |Δparam| between backends after the last round and the c-index of both, per seed
(``parity_<preset>_flood<bits>.md`` for ckks, ``parity_threshold_<preset>.md``).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.stats import (
    markdown_table,
    run_complete,
)
from secagg.simulation.cli import parse_seeds
from secagg.simulation.experiment import ExperimentConfig

HERE = Path(__file__).parent
CONFIGS = {
    "fedadam": ExperimentConfig(protocol="fedadam", client_lr="0.01"),
    "larc": ExperimentConfig(protocol="larc", client_lr="0.1"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-46"))
    parser.add_argument("--backend", choices=("ckks", "threshold"), default="ckks")
    parser.add_argument("--preset", help="the backend's preset (compact / n8192 by default)")
    parser.add_argument("--flooding-bits", type=int, default=30, help="ckks only")
    args = parser.parse_args()
    encrypted = args.backend
    preset = args.preset or {"ckks": "compact", "threshold": "n8192"}[encrypted]
    options = (
        {"preset": preset, "flooding_bits": args.flooding_bits}
        if encrypted == "ckks"
        else {"preset": preset}
    )
    rows = []
    for name, base in CONFIGS.items():
        runs = {
            b: run_complete(
                replace(
                    base,
                    backend=b,
                    seeds=args.seeds,
                    backend_options={} if b == "plain" else options,
                )
            )
            for b in ("plain", encrypted)
        }
        for seed in args.seeds:
            final = {
                b: r.metrics[
                    (r.metrics["seed"] == seed) & (r.metrics["round"] == base.rounds)
                ].iloc[0]
                for b, r in runs.items()
            }
            diff = np.abs(runs["plain"].final_params[seed] - runs[encrypted].final_params[seed])
            rows.append(
                {
                    "protocol": name,
                    "seed": seed,
                    "max_abs_param_diff": float(diff.max()),
                    # the last parameter is nn.Linear's bias, which the Cox partial likelihood
                    # ignores: its true gradient is 0, so Adam turns any noise there into steps
                    "max_abs_diff_weights": float(diff[:-1].max()),
                    "c_index_plain": final["plain"]["test_pooled"],
                    f"c_index_{encrypted}": final[encrypted]["test_pooled"],
                    "same_c_index_4dp": round(final["plain"]["test_pooled"], 4)
                    == round(final[encrypted]["test_pooled"], 4),
                }
            )
    table = pd.DataFrame(rows)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    md = markdown_table(table)
    if encrypted == "ckks":
        name = f"parity_{preset}_flood{args.flooding_bits}.md"
        title = f"plain vs ckks (preset {preset}, flooding {args.flooding_bits} bits)"
    else:
        name = f"parity_threshold_{preset}.md"
        title = f"plain vs threshold (preset {preset}, OpenFHE's fixed partial noise)"
    (out / name).write_text(f"# Parity {title}\n\n" + md + "\n")
    print(md)


if __name__ == "__main__":
    main()
