"""SAVAE (GenoMed4All D6.2 §6.4) on a good node and a bad node, evaluated as §6.6.1 asks:
the isolated good node is the upper bound, the isolated bad node the lower bound, and the
federated bad node should land in between, near the upper bound.

Per survival set (Fed-TCGA-BRCA pooled, GBSG2) and split seed (75/25 train/test; the bad
node holds 10 % of the training patients, the good node the rest; the test set halves into
the nodes' test sets; ``clients/tasks/savae.py``), four arms through the engine on ``plain``:

- isolated good node: SAVAE trained on the good node alone (fedavg with one client);
- isolated bad node: the same on the bad node alone;
- federated: both nodes, weight averaging (``fedavg``);
- federated + joint prior: both nodes, ``savae_prior`` (pseudo-points shared, §6.5.1), the
  nodes' pseudo-point mixtures combined as the report's product of experts (Eq. 6.23) or as
  the mixture of experts it names as the alternative.

The global (or isolated) model is scored by the concordance of its predicted median times
on the bad node's test set and on the pooled test set; mean ± SD over split seeds and the
paired differences against the isolated bad node (95 % t-interval). One seed of the
federated arms also runs on ``ckks`` to show it matches ``plain``.

    python -m benchmarks.savae --out benchmarks/results

``--datasets`` and ``--no-ckks`` run a part (one set; no ckks section), as the check does.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.options import output_folder, positive
from benchmarks.reproduce import CROSS_CPU, Check, made_by, shown_path
from benchmarks.stats import (
    clear_sign,
    format_difference,
    markdown_table,
    mean_std,
    paired_difference,
)

OUTPUTS = ("savae.md", "savae.csv", "savae_runs.csv")
DATASETS = ("tcga", "gbsg2")
#: arm -> (which node trains alone (None: both), joint prior (None: N(0, I)), protocol)
ARMS = {
    "isolated good (upper bound)": (0, None, "fedavg"),
    "isolated bad (lower bound)": (1, None, "fedavg"),
    "federated (fedavg)": (None, None, "fedavg"),
    "federated + joint prior (product)": (None, "product", "savae_prior"),
    "federated + joint prior (mixture)": (None, "mixture", "savae_prior"),
}
LOWER = "isolated bad (lower bound)"
UPPER = "isolated good (upper bound)"
#: ckks presets of the parity check: compact (precise sums) and lean (fedavg's default)
PRESETS = ("compact", "lean")
#: ``secagg bench savae --check``: split seed 0 of Fed-TCGA-BRCA, every arm, plain (~20 s)
CHECK = Check(
    args=("--seeds", "1", "--datasets", "tcga", "--no-ckks"),
    csv="savae_runs.csv",
    keys=("dataset", "seed", "arm", "backend"),
    columns={
        "c_index_bad_test": 4.0,
        "c_index_good_test": 4.0,
        "c_index_pooled_test": 4.0,
        "rounds_completed": 0,
        "aborted": 0,
    },
    spread_over="seed",
    why="seeded plain training is bit for bit on one machine, but the VAEs' float32 "
    "training is chaotic across CPUs: the same seed moved every c-index by up to 0.039 "
    f"between {CROSS_CPU}, as another seed would (2.2 standard deviations at most); so each fresh "
    "c-index must lie within 4 standard deviations of its arm's 10 committed seeds, and "
    "every run must complete its rounds",
)


def task_name(dataset: str, seed: int, only: int | None, prior: str | None) -> str:
    """The task of this arm and split seed, registered on first use."""
    from secagg.clients.tasks import TASKS, register_task, savae_task

    task = savae_task(dataset, seed, only, prior)
    if task.name not in TASKS:
        register_task(task.name, task)
    return task.name


def run_arm(
    dataset: str, seed: int, arm: str, backend: str, args, preset: str | None = None
) -> tuple[dict, np.ndarray]:
    from secagg.runspec.config import ExperimentConfig
    from secagg.server.audit import AuditLog
    from secagg.simulation.experiment import run_seed

    only, prior, protocol = ARMS[arm]
    config = ExperimentConfig(
        task=task_name(dataset, seed, only, prior),
        protocol=protocol,
        backend=backend,
        backend_options={} if preset is None else {"preset": preset},
        rounds=args.rounds,
        seeds=[seed],
        local_steps=args.local_steps,
        batch_size=32,
        client_lr=str(args.client_lr),
    )
    start = time.perf_counter()
    models: dict[int, np.ndarray] = {}
    run = run_seed(
        config.validate(), seed, AuditLog(), on_model=lambda s, k, w: models.__setitem__(k, w)
    )
    if run.aborted and not prior:
        raise RuntimeError(f"{dataset} {arm} seed {seed}: {run.aborted}")
    last = run.rows[-1]  # an aborted joint-prior run: its last completed round, flagged
    row = {
        "dataset": dataset,
        "seed": seed,
        "arm": arm,
        "backend": backend,
        "c_index_bad_test": last["test_client_1"],
        "c_index_good_test": last["test_client_0"],
        "c_index_pooled_test": last["test_pooled"],
        "seconds": time.perf_counter() - start,
        "rounds_completed": last["round"],
        "aborted": run.aborted or "",
    }
    return row, models


def divergence(ckks: dict[int, np.ndarray], plain: dict[int, np.ndarray]) -> str:
    """max |ckks − plain| of the global model after rounds 1, 2, 5, 10, 20 (those run)."""
    rounds = [k for k in (1, 2, 5, 10, 20) if k in ckks and k in plain]
    return " / ".join(f"{np.abs(ckks[k] - plain[k]).max():.0e}" for k in rounds)


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for dataset, by_dataset in runs.groupby("dataset", sort=False):
        lower = by_dataset[by_dataset.arm == LOWER].set_index("seed")
        upper = by_dataset[by_dataset.arm == UPPER].set_index("seed").loc[lower.index]
        for arm, g in by_dataset.groupby("arm", sort=False):
            g = g.set_index("seed").loc[lower.index]
            row = {
                "dataset": dataset,
                "arm": arm,
                "seeds": len(g),
                "aborted": int((g.aborted != "").sum()),
                "c-index, bad node's test": mean_std(g.c_index_bad_test),
                "c-index, pooled test": mean_std(g.c_index_pooled_test),
            }
            for column, label in (
                ("c_index_bad_test", "bad node's test"),
                ("c_index_pooled_test", "pooled test"),
            ):
                row[f"− isolated bad, {label} (95% CI)"] = (
                    "–"
                    if arm == LOWER
                    else format_difference(paired_difference(g[column], lower[column]))
                )
            row["− isolated good, bad node's test (95% CI)"] = (
                "–"
                if arm == UPPER
                else format_difference(
                    paired_difference(g.c_index_bad_test, upper.c_index_bad_test)
                )
            )
            rows.append(row)
    return pd.DataFrame(rows)


def finding(runs: pd.DataFrame) -> str:
    """One sentence per set on §6.6.1's expectation, from the bad node's test c-index: does
    federation lift the bad node above its isolated bound (interval above 0) and to the good
    node's (interval against the good node reaching 0)?"""
    parts = []
    for dataset, g in runs.groupby("dataset", sort=False):
        by_arm = {arm: a.set_index("seed").c_index_bad_test for arm, a in g.groupby("arm")}
        fed = by_arm["federated (fedavg)"]
        up = paired_difference(fed, by_arm[UPPER].loc[fed.index])
        low = paired_difference(fed, by_arm[LOWER].loc[fed.index])
        lifted = clear_sign(low) > 0
        reaches = up["ci_high"] >= 0
        verdict = (
            "holds" if lifted and reaches else ("holds in part" if lifted else "does not hold")
        )
        parts.append(
            f"on {dataset} it {verdict}: federated − isolated bad "
            f"{format_difference(low)}, federated − isolated good {format_difference(up)}"
        )
    return (
        "**Finding (§6.6.1: the federated bad node should lie between the bounds, near the "
        "upper one), on the bad node's test set:** "
        + "; ".join(parts)
        + ".\n\n"
        + prior_finding(runs)
    )


def prior_finding(runs: pd.DataFrame) -> str:
    """The joint prior (§6.5.1) against plain weight averaging, paired by split seed on the
    bad node's test set: better, worse, or no clear difference (interval across 0)."""
    parts = []
    for dataset, g in runs.groupby("dataset", sort=False):
        by_arm = {arm: a.set_index("seed").c_index_bad_test for arm, a in g.groupby("arm")}
        fed = by_arm["federated (fedavg)"]
        for arm in (a for a in ARMS if ARMS[a][1] is not None and a in by_arm):
            diff = paired_difference(by_arm[arm], fed.loc[by_arm[arm].index])
            verdict = {1: "better than", 0: "no clear difference from", -1: "worse than"}[
                clear_sign(diff)
            ]
            combine = ARMS[arm][1]
            parts.append(f"{dataset}, {combine}: {verdict} FedAvg, {format_difference(diff)}")
    return (
        "**The joint prior (§6.5.1) against weight averaging alone** (federated + joint prior "
        "− federated, bad node's test set): " + "; ".join(parts) + "."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive, default=10, help="split seeds 0..N-1")
    parser.add_argument("--rounds", type=positive, default=20)
    parser.add_argument("--local-steps", type=positive, default=50)
    parser.add_argument("--client-lr", type=float, default=0.01)
    parser.add_argument(
        "--datasets", nargs="+", choices=DATASETS, default=list(DATASETS), metavar="SET"
    )
    parser.add_argument(
        "--no-ckks", action="store_true", help="skip the ckks-against-plain section"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "savae", OUTPUTS, args.overwrite)
    words = ["python", "-m", "benchmarks.savae", "--seeds", str(args.seeds)]
    words += ["--rounds", str(args.rounds), "--local-steps", str(args.local_steps)]
    words += ["--client-lr", f"{args.client_lr:g}", "--datasets", *args.datasets]
    if args.no_ckks:
        words.append("--no-ckks")
    command = shlex.join([*words, "--out", shown_path(out), "--overwrite"])

    import torch

    torch.set_num_threads(1)
    rows = []
    for dataset in args.datasets:
        for seed in range(args.seeds):
            for arm in ARMS:
                row, _ = run_arm(dataset, seed, arm, "plain", args)
                rows.append(row)
                print(
                    f"{dataset:6s} seed {seed:2d} {arm:34s} bad-test {row['c_index_bad_test']:.4f} "
                    f"pooled {row['c_index_pooled_test']:.4f}  {row['seconds']:.1f} s",
                    flush=True,
                )
    runs = pd.DataFrame(rows)
    parity = []
    for dataset in [] if args.no_ckks else args.datasets:
        for arm in ("federated (fedavg)", "federated + joint prior (product)"):
            plain_row, plain_models = run_arm(dataset, 0, arm, "plain", args)
            for preset in PRESETS:
                ckks_row, ckks_models = run_arm(dataset, 0, arm, "ckks", args, preset)
                parity.append(
                    {
                        "dataset": dataset,
                        "arm": arm,
                        "ckks preset": preset,
                        "max |Δ param| after round 1 / 2 / 5 / 10 / 20": divergence(
                            ckks_models, plain_models
                        ),
                        "ckks rounds completed": ckks_row["rounds_completed"],
                        "c-index bad test, plain / ckks": (
                            f"{plain_row['c_index_bad_test']:.4f} / "
                            f"{ckks_row['c_index_bad_test']:.4f}"
                        ),
                        "c-index pooled, plain / ckks": (
                            f"{plain_row['c_index_pooled_test']:.4f} / "
                            f"{ckks_row['c_index_pooled_test']:.4f}"
                        ),
                        "seconds plain / ckks": (
                            f"{plain_row['seconds']:.1f} / {ckks_row['seconds']:.1f}"
                        ),
                    }
                )
                print(parity[-1], flush=True)
    table = summary(runs)
    runs.to_csv(out / "savae_runs.csv", index=False)
    table.to_csv(out / "savae.csv", index=False)
    ckks = (
        ""
        if args.no_ckks
        else "## ckks against plain (split seed 0)\n\n"
        + markdown_table(pd.DataFrame(parity))
        + "\n\n"
        "The ckks run gets the plain run's model to CKKS precision after a round; over "
        f"{args.rounds * args.local_steps:,} local Adam steps of a sampling VAE the two "
        "trajectories then drift apart (chaotic amplification of the encryption noise, not a "
        "bias): compare the c-index columns, not the parameters, at the last round.\n"
    )
    text = (
        "# SAVAE: good node, bad node, federated (GenoMed4All D6.2 §6.4–6.6)\n\n"
        f"{made_by(command)}\n\n"
        f"Survival VAE with a Weibull time model; two nodes per split seed (the bad node holds "
        f"10 % of the training patients); {args.seeds} split seeds (0–{args.seeds - 1}), "
        f"{args.rounds} rounds of {args.local_steps} local Adam steps (batch 32, rate "
        f"{args.client_lr}); plain backend. Concordance of the predicted median time; "
        "differences are paired by split seed against the isolated bad node (mean, 95 % "
        "t-interval).\n\n" + markdown_table(table) + "\n\n" + finding(runs) + "\n\n" + ckks
    )
    (out / "savae.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
