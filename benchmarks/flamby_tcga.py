"""FLamby's FedAvg and FedAdam configs on Fed-TCGA-BRCA, over many seeds, next to FLamby's
published per-seed results (benchmarks/reference/flamby_tcga_brca, seeds 42-46).

    python -m benchmarks.flamby_tcga [--seeds 42-61]

Writes benchmarks/results/flamby_tcga_runs.csv (one row per seed and method) and
benchmarks/results/flamby_tcga.md (the comparison table).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from scipy import stats

from benchmarks.stats import (
    mean_std,
    run_complete,
)
from secagg.simulation.cli import parse_seeds
from secagg.simulation.experiment import ExperimentConfig, stderr_progress

HERE = Path(__file__).parent
CONFIGS = {
    "FedAvg": ExperimentConfig(protocol="fedavg", client_lr="0.1"),
    "FedAdam": ExperimentConfig(
        protocol="fedadam", client_lr="0.01", server_opt={"lr": 0.1, "tau": 1e-8}
    ),
}


def flamby_published() -> pd.DataFrame:
    """Per seed: pooled-test c-index and client-average c-index of FLamby's runs."""
    frames = [pd.read_csv(p) for p in sorted((HERE / "reference/flamby_tcga_brca").glob("*.csv"))]
    ref = pd.concat(frames)
    rows = []
    for method in CONFIGS:
        part = ref[ref["Method"] == f"{method}100"]
        for seed, g in part.groupby("seed"):
            clients = g[g["Test"].str.startswith("client_test")]["Metric"]
            rows.append(
                {
                    "method": method,
                    "seed": seed,
                    "source": "FLamby (published)",
                    "test_pooled": float(g[g["Test"] == "Pooled Test"]["Metric"].iloc[0]),
                    "test_client_avg": float(clients.mean()),
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-61"))
    args = parser.parse_args()

    rows = []
    for method, config in CONFIGS.items():
        config.seeds = args.seeds
        metrics, _ = run_complete(config, progress=stderr_progress)
        final = metrics[metrics["round"] == config.rounds]
        for _, r in final.iterrows():
            rows.append(
                {
                    "method": method,
                    "seed": r["seed"],
                    "source": "secagg (plain)",
                    "test_pooled": r["test_pooled"],
                    "test_client_avg": r["test_client_avg"],
                }
            )
    runs = pd.concat([pd.DataFrame(rows), flamby_published()], ignore_index=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    runs.to_csv(out / "flamby_tcga_runs.csv", index=False)

    lines = [
        "| method | source | seeds | pooled-test c-index | median | client-average "
        "c-index | Mann-Whitney p vs FLamby (pooled) |",
        "|---|---|---|---|---|---|---|",
    ]
    ours_same = runs[(runs["source"] == "secagg (plain)") & runs["seed"].between(42, 46)]
    groups = list(runs.groupby(["method", "source"], sort=False)) + [
        ((m, "secagg, seeds 42-46 only"), g) for m, g in ours_same.groupby("method", sort=False)
    ]
    for (method, source), g in groups:
        ref = runs[(runs["method"] == method) & (runs["source"] == "FLamby (published)")]
        p = (
            ""
            if source.startswith("FLamby")
            else f"{stats.mannwhitneyu(g['test_pooled'], ref['test_pooled']).pvalue:.2f}"
        )
        lines.append(
            f"| {method} | {source} | {len(g)} | {mean_std(g['test_pooled'])} | "
            f"{g['test_pooled'].median():.4f} | {mean_std(g['test_client_avg'])} | "
            f"{p} |"
        )
    table = "\n".join(lines)
    (out / "flamby_tcga.md").write_text(
        "# FLamby configs on Fed-TCGA-BRCA (5 rounds, 100 local steps, batch 8)\n\n"
        "Mean ± std over seeds of the final global model. FLamby's numbers are recomputed "
        "from its published per-seed files. Seeds fix different random streams in the two "
        "code bases, so only the distributions are comparable.\n\n" + table + "\n"
    )
    print(table)


if __name__ == "__main__":
    main()
