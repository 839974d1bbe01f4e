"""RoLePRO's aggregators and two-phase protocol on Fed-TCGA-BRCA, like the paper's Tables 1–3.

Paper setting (FeTS 2022): 13 rounds, OptAlgo B (server momentum β 0.9, λs 0.1); metrics are
the best and the last-5-rounds average of the validation score and loss. Here: pooled-test
c-index and pooled-test Cox loss, mean ± std over seeds, plain backend (the ckks backend gives
the same models up to CKKS precision: tests/test_ckks_rounds.py, benchmarks/parity.py).

    python -m benchmarks.rolepro_tcga [--seeds 0-9] [--rounds 13]

Writes benchmarks/results/rolepro_tcga_runs.csv, rolepro_tcga.md and rolepro_tcga.png.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.stats import (  # noqa: E402
    format_difference,
    mean_std,
    paired_difference,
    run_complete,
)
from secagg.simulation.cli import parse_seeds  # noqa: E402
from secagg.simulation.experiment import ExperimentConfig, run_experiment, stderr_progress  # noqa

HERE = Path(__file__).parent
OPT_B = {"name": "momentum", "lr": 0.1, "beta": 0.9}
OPT_C = {"name": "adam", "lr": 0.01, "tau": 1e-3}
TABLE1 = [
    "fedavg",
    "costwagg",
    "roundcwagg",
    "regagg",
    "regmedagg",
    "regcostagg",
    "simagg",
    "trimmedmean",
    "topkregcost",
]
TWO_PHASE = ["costwagg", "regagg", "trimmedmean", "topkregcost"]


def summarize_run(metrics: pd.DataFrame, last: int = 5) -> pd.DataFrame:
    rows = []
    for seed, g in metrics[metrics["round"] > 0].groupby("seed"):
        tail = g.sort_values("round").tail(last)
        rows.append(
            {
                "seed": seed,
                "best_c_index": g["test_pooled"].max(),
                "avg_c_index": tail["test_pooled"].mean(),
                "best_loss": g["test_loss"].min(),
                "avg_loss": tail["test_loss"].mean(),
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    parser.add_argument("--rounds", type=int, default=13)
    args = parser.parse_args()
    base = ExperimentConfig(seeds=args.seeds, rounds=args.rounds, client_lr="0.1")
    runs = []
    curves = {}

    def run(label: str, table: str, config: ExperimentConfig) -> None:
        metrics = run_complete(config, progress=stderr_progress).metrics
        curves[(table, label)] = metrics.groupby("round")["test_pooled"].mean()
        runs.append(summarize_run(metrics).assign(table=table, method=label))

    for name in TABLE1:
        run(name, "Table 1 (OptAlgo B)", replace(base, protocol=name, server_opt=OPT_B))
    for opt_name, opt in (("B", OPT_B), ("C", OPT_C)):
        run(
            "fedavg only",
            f"two-phase, OptAlgo {opt_name}",
            replace(base, protocol="fedavg", server_opt=opt),
        )
        for then in TWO_PHASE:
            run(
                f"fedavg -> {then}",
                f"two-phase, OptAlgo {opt_name}",
                replace(
                    base,
                    protocol="rolepro",
                    server_opt=opt,
                    protocol_options={"then": then, "switch_round": 3},
                ),
            )
    table = pd.concat(runs, ignore_index=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    table.to_csv(out / "rolepro_tcga_runs.csv", index=False)

    lines = []
    for name, g in table.groupby("table", sort=False):
        ref = g[g["method"].isin(["fedavg", "fedavg only"])]
        lines += [
            f"\n## {name}\n",
            "| method | best c-index | avg c-index (last 5) | best loss "
            "| avg loss (last 5) | Δ avg c-index vs FedAvg (95% CI) |",
            "|---|---|---|---|---|---|",
        ]
        for method, m in g.groupby("method", sort=False):
            d = paired_difference(
                m.sort_values("seed")["avg_c_index"].to_numpy(),
                ref.sort_values("seed")["avg_c_index"].to_numpy(),
            )
            diff = "—" if method in ("fedavg", "fedavg only") else format_difference(d)
            lines.append(
                f"| {method} | {mean_std(m['best_c_index'])} | "
                f"{mean_std(m['avg_c_index'])} | {mean_std(m['best_loss'])} | "
                f"{mean_std(m['avg_loss'])} | {diff} |"
            )
    text = "\n".join(lines)
    (out / "rolepro_tcga.md").write_text(
        f"# RoLePRO aggregators on Fed-TCGA-BRCA ({args.rounds} rounds, {len(args.seeds)} "
        "seeds, client SGD lr 0.1, 100 steps, batch 8; pooled test set)\n" + text + "\n"
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, name in zip(axes, table["table"].unique()):
        for (t, label), curve in curves.items():
            if t == name:
                ax.plot(curve.index, curve.values, marker=".", label=label)
        ax.set_title(name)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("pooled-test c-index (mean over seeds)")
    fig.tight_layout()
    fig.savefig(out / "rolepro_tcga.png", dpi=110)
    print(text)


if __name__ == "__main__":
    main()
