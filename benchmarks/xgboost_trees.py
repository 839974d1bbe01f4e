"""Federated XGBoost (GenoMed4All D6.2 §10.2) against xgboost's ``hist`` trained centrally.

Breast cancer in 16 shared quantile bins over 4 clients (IID, by label, by the most
predictive feature); depth 3, η 0.3, λ 1, min_child_weight 1, ``--trees`` trees. Per split
and backend: test accuracy and AUC beside xgboost's on the pooled training set with the same
bins and settings, the largest margin difference to xgboost on the training and test sets
(0 up to rounding: the same trees), and the cost per tree. Histograms on plain (float64),
ckks (compact and wide) and threshold (wide); the report's top-S proposal (S = 5) on plain.
Deterministic but for the encrypted backends' noise: one run per cell.

    python -m benchmarks.xgboost_trees --trees 50 --out benchmarks/results

Writes xgboost_trees.csv (one row per split and run, the report's numbers), xgboost_trees.md
and its plot.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.options import output_folder, positive
from benchmarks.reproduce import Check, made_by, shown_path
from benchmarks.stats import markdown_table

OUTPUTS = ("xgboost_trees.md", "xgboost_trees.csv", "xgboost_trees.png")
SPLITS = ("iid", "label", "feature")
RUNS = {
    "plain (float64)": ("plain", {"dtype": "float64"}, {}),
    "ckks compact": ("ckks", {}, {}),
    "ckks wide": ("ckks", {"preset": "wide"}, {}),
    "threshold wide": ("threshold", {"preset": "wide"}, {}),
    "plain, top-S (S = 5)": ("plain", {"dtype": "float64"}, {"top_s": 5}),
}
#: ``--runs`` names of the runs above
RUN_NAMES = {
    "plain": "plain (float64)",
    "ckks-compact": "ckks compact",
    "ckks-wide": "ckks wide",
    "threshold-wide": "threshold wide",
    "top-s": "plain, top-S (S = 5)",
}
MARGINS = ("max abs margin diff to xgboost (train)", "max abs margin diff to xgboost (test)")
#: ``secagg bench xgboost_trees --check``: the 50 trees on plain float64, top-S and ckks wide
#: (the encrypted run that builds xgboost's trees) on every split (~50 s)
CHECK = Check(
    args=("--trees", "50", "--runs", "plain,top-s,ckks-wide", "--splits", "iid,label,feature"),
    csv="xgboost_trees.csv",
    keys=("split", "run", "trees"),
    columns={"test accuracy": 0, "test AUC": 1e-9, **dict.fromkeys(MARGINS, 1e-5)},
    rows="run != 'plain, top-S (S = 5)'",
    why="the trees are the same splits (accuracy, AUC exactly but for rounding); the margin "
    "differences to xgboost are float32-scale (~1e-6) on plain and CKKS-noisy on ckks wide, "
    "so within 1e-5, the threshold for building xgboost's trees. Top-S runs but is not "
    "compared: on an AMD EPYC with AVX2 only (2026-11-28) its trees took other splits than "
    "the committed run's (test accuracy 0.973 -> 0.956 on iid, margins to xgboost moved by "
    "up to 0.95) while the exact runs reproduced to 1e-5: its candidate choice is not "
    "stable across CPUs, and no tolerance of its own is set yet",
)


def centralised(n_trees: int):
    """xgboost's hist with the federated runs' settings (unfitted): the reference."""
    import xgboost

    return xgboost.XGBClassifier(
        tree_method="hist",
        max_bin=256,  # ≥ the 16 bins: every bin boundary is a candidate, as in the federation
        max_depth=3,
        learning_rate=0.3,
        reg_lambda=1.0,
        min_child_weight=1.0,
        gamma=0.0,
        n_estimators=n_trees,
        base_score=0.5,
        grow_policy="depthwise",
    )


def command(args: argparse.Namespace, out: Path) -> str:
    """The complete command that regenerates this run's outputs in ``out``."""
    if args.from_csv is not None:
        argv = ["--from-csv", str(args.from_csv)]
    else:
        argv = ["--trees", str(args.trees), "--splits", args.splits, "--runs", args.runs]
    argv += ["--out", shown_path(out)]
    if args.overwrite:
        argv.append("--overwrite")
    return "python -m benchmarks.xgboost_trees " + shlex.join(argv)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=positive, default=20)
    parser.add_argument("--splits", default=",".join(SPLITS), help="comma-separated splits")
    parser.add_argument(
        "--runs", default=",".join(RUN_NAMES), help=f"comma-separated, of {list(RUN_NAMES)}"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument(
        "--from-csv", type=Path, help="redraw the report from an earlier xgboost_trees.csv"
    )
    args = parser.parse_args(argv)
    splits, runs = args.splits.split(","), args.runs.split(",")
    if set(splits) - set(SPLITS) or set(runs) - set(RUN_NAMES):
        parser.error(f"splits from {list(SPLITS)}, runs from {list(RUN_NAMES)}")
    out = output_folder(parser, args.out, "xgboost_trees", OUTPUTS, args.overwrite)
    provenance = made_by(command(args, out))
    if args.from_csv is not None:
        frame = pd.read_csv(args.from_csv)
        frame.to_csv(out / "xgboost_trees.csv", index=False)
        write_report(out, frame, provenance)
        return

    from sklearn.metrics import roc_auc_score

    import secagg
    from secagg.clients.tasks import trees

    x, y, x_test, y_test = trees.binned_pooled()
    reference = centralised(args.trees).fit(x, y)
    ref_train = reference.predict(x, output_margin=True)
    ref_test = reference.predict(x_test, output_margin=True)
    rows = [
        {
            "split": "pooled",
            "run": "xgboost hist, centralised",
            "trees": args.trees,
            "test accuracy": float(np.mean((ref_test > 0) == (y_test > 0.5))),
            "test AUC": float(roc_auc_score(y_test, ref_test)),
        }
    ]
    for split in splits:
        for label in (RUN_NAMES[r] for r in runs):
            backend, options, protocol_options = RUNS[label]
            result = secagg.run(
                task=f"xgb-breast-cancer-{split}",
                protocol="xgboost",
                backend=backend,
                backend_options=options,
                protocol_options=protocol_options,
                rounds=args.trees,
                seeds=[0],
            )
            if result.aborted:
                raise RuntimeError(f"{split} {label}: {result.aborted}")
            model = result.final_params[0]
            train, test = trees.ensemble_margin(model, x), trees.ensemble_margin(model, x_test)
            metrics = result.metrics[result.metrics["round"] > 0]
            rows.append(
                {
                    "split": split,
                    "run": label,
                    "trees": args.trees,
                    "test accuracy": float(np.mean((test > 0) == (y_test > 0.5))),
                    "test AUC": float(roc_auc_score(y_test, test)),
                    "max abs margin diff to xgboost (train)": np.abs(train - ref_train).max(),
                    "max abs margin diff to xgboost (test)": np.abs(test - ref_test).max(),
                    "kB up / tree": metrics["bytes_up"].median() / 1e3,
                    "s / tree": metrics["seconds_round"].median(),
                }
            )
            print(f"{split:8s} {label:22s} acc {rows[-1]['test accuracy']:.4f}", flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "xgboost_trees.csv", index=False)
    write_report(out, frame, provenance)


def write_report(out: Path, frame: pd.DataFrame, provenance: str) -> None:
    same = frame[(frame[list(MARGINS)] < 1e-5).all(axis=1)]
    plot(frame, out / "xgboost_trees.png")
    text = (
        "# Federated XGBoost against xgboost's hist (GenoMed4All D6.2 §10.2)\n\n"
        + provenance
        + "\n\n"
        f"{int(frame['trees'].max())} trees of depth 3, η 0.3, λ 1, min_child_weight 1, "
        "16 shared bins, 4 clients.\n\n"
        + markdown_table(frame.drop(columns="trees").fillna(""), ".4g")
        + f"\n\n{len(same)} of {len(frame) - 1} federated runs build xgboost's trees (every "
        "margin within 1e-5 on the training and test sets): "
        + ", ".join(f"{r.split} / {r.run}" for r in same.itertuples())
        + ".\n\n![test accuracy and AUC per split and run](xgboost_trees.png)\n"
    )
    (out / "xgboost_trees.md").write_text(text)
    print(text)


def plot(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in dict.fromkeys(frame["run"]) if r != "xgboost hist, centralised"]
    reference = frame[frame["split"] == "pooled"].iloc[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, metric in zip(axes, ("test accuracy", "test AUC")):
        for k, run in enumerate(runs):
            g = frame[frame["run"] == run].set_index("split").reindex(list(SPLITS))
            ax.bar(np.arange(len(SPLITS)) + (k - 2) * 0.15, g[metric], 0.15, label=run)
        ax.axhline(reference[metric], color="k", ls="--", lw=1, label="xgboost hist (central)")
        ax.set_xticks(range(len(SPLITS)), SPLITS)
        ax.set_ylim(0.85, 1.0)
        ax.set_title(metric)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
