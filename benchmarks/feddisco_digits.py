"""FedDisco-style VAE discrepancy weights on label-skewed digits: an α sweep, like the poster.

Poster setting: NIID-1 (10 clients) and NIID-2 (6 clients), 25 rounds, batch 64, 10 local
epochs, several α. Here: scikit-learn digits, MLP 64-64-10, client SGD lr 0.1, b = 0.1, the
β-VAE (β 0.1) trained first for 10 federated rounds; α = 0 is FedAvg's weighting.

    python -m benchmarks.feddisco_digits --split niid2 [--seeds 0-9] [--alphas 0,0.1,0.3,0.5]

Writes benchmarks/results/feddisco_<split>.csv and .md (final and last-5-rounds accuracy,
paired difference to α = 0).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from benchmarks.stats import (
    format_difference,
    mean_std,
    paired_difference,
    run_complete,
)
from secagg.simulation.cli import parse_seeds
from secagg.simulation.experiment import ExperimentConfig, stderr_progress

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["niid1", "niid2"], default="niid2")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    parser.add_argument("--alphas", default="0,0.1,0.3,0.5")
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    rows = []
    for alpha in [float(a) for a in args.alphas.split(",")]:
        cfg = ExperimentConfig(
            task=f"digits-{args.split}",
            protocol="feddisco",
            seeds=args.seeds,
            rounds=args.rounds,
            local_epochs=10,
            batch_size=64,
            client_lr="0.1",
            protocol_options={"alpha": alpha, "b": 0.1},
        )
        metrics = run_complete(cfg, progress=stderr_progress).metrics
        for seed, g in metrics[metrics["round"] > 0].groupby("seed"):
            g = g.sort_values("round")
            rows.append(
                {
                    "alpha": alpha,
                    "seed": seed,
                    "final_acc": g["test_pooled"].iloc[-1],
                    "avg_acc_last5": g["test_pooled"].tail(5).mean(),
                }
            )
    runs = pd.DataFrame(rows)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    runs.to_csv(out / f"feddisco_{args.split}.csv", index=False)
    base = runs[runs["alpha"] == 0].sort_values("seed")
    lines = [
        "| α | final accuracy | avg accuracy (last 5) | Δ avg vs α = 0 (95% CI) |",
        "|---|---|---|---|",
    ]
    for alpha, g in runs.groupby("alpha"):
        g = g.sort_values("seed")
        d = paired_difference(g["avg_acc_last5"].to_numpy(), base["avg_acc_last5"].to_numpy())
        diff = "—" if alpha == 0 else format_difference(d)
        lines.append(
            f"| {alpha:g} | {mean_std(g['final_acc'])} | {mean_std(g['avg_acc_last5'])} | {diff} |"
        )
    table = "\n".join(lines)
    (out / f"feddisco_{args.split}.md").write_text(
        f"# FedDisco-style weights on digits {args.split} ({len(args.seeds)} seeds, "
        f"{args.rounds} rounds, 10 local epochs, b = 0.1)\n\n" + table + "\n"
    )
    print(table)


if __name__ == "__main__":
    main()
