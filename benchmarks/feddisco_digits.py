"""FedDisco-style VAE discrepancy weights on label-skewed digits: an α sweep, like the poster.

Poster setting: NIID-1 (10 clients) and NIID-2 (6 clients), 25 rounds, batch 64, 10 local
epochs, several α. Here: scikit-learn digits, MLP 64-64-10, client SGD lr 0.1, b = 0.1, the
β-VAE (β 0.1) trained first for 10 federated rounds; α = 0 is FedAvg's weighting.

    python -m benchmarks.feddisco_digits --split niid2 --seeds 0-9 --alphas 0,0.1,0.3,0.5 \
        --rounds 25 --out benchmarks/results --overwrite

(and the same with ``--split niid1``). Writes feddisco_<split>.csv and .md (final and
last-5-rounds accuracy, paired difference to α = 0) to ``--out`` (default: a new folder
under results/bench).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pandas as pd

from benchmarks.options import output_folder, positive
from benchmarks.reproduce import Check, made_by, shown_path
from benchmarks.stats import (
    format_difference,
    mean_std,
    paired_difference,
    run_complete,
)
from secagg.runspec.settings import parse_seeds
from secagg.simulation.experiment import ExperimentConfig, stderr_progress

HERE = Path(__file__).parent
#: ``secagg bench feddisco_digits --check``: NIID-1, seed 0, α 0 and 0.3, all 25 rounds
#: the results files it writes, one per run's arguments (the reference page lists them)
RESULTS = "feddisco_*.md"

CHECK = Check(
    args=("--split", "niid1", "--seeds", "0", "--alphas", "0,0.3"),
    csv="feddisco_niid1.csv",
    keys=("alpha", "seed"),
    columns={"final_acc": 1e-9, "avg_acc_last5": 1e-9},
    why="plain float64 aggregation of torch CPU training with fixed seeds: two runs of this "
    "subset gave bit-for-bit equal accuracies, so 1e-9 only allows for rounding",
)


def command(args: argparse.Namespace, out: Path) -> str:
    """The command that makes these results again (every option spelled out)."""
    folder = shown_path(out)
    argv = ["--split", args.split, "--seeds", args.seeds, "--alphas", args.alphas]
    argv += ["--rounds", str(args.rounds), "--out", folder]
    return shlex.join(["python", "-m", "benchmarks.feddisco_digits", *argv]) + (
        " --overwrite" if args.overwrite else ""
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["niid1", "niid2"], default="niid2")
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,1")
    parser.add_argument("--alphas", default="0,0.1,0.3,0.5", help="comma-separated; must include 0")
    parser.add_argument("--rounds", type=positive, default=25)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    if 0.0 not in alphas:
        parser.error("--alphas must include 0 (FedAvg's weighting, the reference)")
    outputs = [f"feddisco_{args.split}.csv", f"feddisco_{args.split}.md"]
    out = output_folder(parser, args.out, f"feddisco_{args.split}", outputs, args.overwrite)
    rows = []
    for alpha in alphas:
        cfg = ExperimentConfig(
            task=f"digits-{args.split}",
            protocol="feddisco",
            seeds=seeds,
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
        f"# FedDisco-style weights on digits {args.split} ({len(seeds)} seeds, "
        f"{args.rounds} rounds, 10 local epochs, b = 0.1)\n\n"
        + made_by(command(args, out))
        + "\n\nΔ: the paired difference (same seeds) of the last-5-rounds average accuracy "
        "against α = 0, with its 95% t-interval.\n\n" + table + "\n"
    )
    print(table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
