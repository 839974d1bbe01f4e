"""Federated Cox strategies on 8 artificial centres (GenoMed4All D6.2 §8.3, Tables 8.1–8.3).

For each data set (GBSG2, Fed-TCGA-BRCA pooled) and each of the report's four scenarios
(balanced IID, unbalanced IID with a 40 % hub, non-IID survival times, non-IID most
predictive feature):

- a fixed tuning partition, 25 % of the patients (drawn once per data set), that is in no
  split's test set: the hyperparameters of every strategy are chosen by the report's
  centre-based K-fold cross-validation (§8.2.5: leave one centre out, concordance of the
  concatenated held-out predictions) on the tuning patients alone, spread over the 8
  centres by the scenario;
- ``--splits`` random splits: a blind test set of ⌊n/4⌋ patients drawn from the other
  75 % of the patients, the rest (tuning patients included) the training set, spread over
  the 8 centres by the scenario (the split's rules are ``secagg.clients.tasks.survival``'s:
  min-max scaling on the training ranges, the same centre layouts);
- DeepCox (8-4, Cox loss, first-layer L1/L2, Adam with the report's decaying rate) trained by
  Sequential, Weights Averaging (FedAvg) and Ensemble, with the chosen hyperparameters;
- the bounds: isolated centres (each centre's own model; the mean of the 8 c-indices) and
  the centralised model (all training patients pooled), with the hyperparameters the
  cross-validation chose for the centralised model;
- the reference: the exact federated Cox model (``coxph``: Newton on the whole federation's
  risk-set sums; a linear Cox model, identical to a centralised Cox fit).

Everything runs on the plain backend. The report gives the blind-test c-index mean ± SD over
splits, and every paired comparison (Weights Averaging − Sequential and − Ensemble; the
centralised bound − each strategy) with the ordinary paired 95 % t-interval, the
Nadeau–Bengio corrected interval and p-value (the splits' training sets overlap:
``benchmarks.corrections.nadeau_bengio``) and the Holm-adjusted p-value over its table's
family (``benchmarks.corrections.holm``).

    python -m benchmarks.cox_strategies --splits 10 --jobs 2 --out benchmarks/results

Writes cox_strategies.md, cox_strategies_runs.csv (one row per run), cox_strategies_cv.csv
(the cross-validation grid) and cox_strategies.png. ``--tuning committed`` takes the
hyperparameters from the committed cox_strategies_cv.csv instead of cross-validating again
(the ``CHECK``, ``secagg bench cox_strategies --check``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import shlex
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.corrections import holm, nadeau_bengio
from benchmarks.options import output_folder, positive
from benchmarks.reproduce import CROSS_CPU, RESULTS, Check, made_by
from benchmarks.stats import markdown_table, mean_std, paired_difference

OUTPUTS = (
    "cox_strategies.md",
    "cox_strategies_runs.csv",
    "cox_strategies_cv.csv",
    "cox_strategies.png",
)
DATASETS = ("gbsg2", "tcga")
SCENARIOS = ("balanced", "hub", "times", "feature")
STRATEGIES = {"sequential": "Sequential", "fedavg": "Weights Averaging", "ensemble": "Ensemble"}
#: the cross-validation grid (§8.3.1 searched federated epochs, internal epochs, batches and
#: the initial rate; here the rate and the internal epochs, 20 federated epochs, batch 32)
GRID = {"client_lr": ("0.01", "0.03", "0.1"), "local_epochs": (1, 5)}
ROUNDS, BATCH = 20, 32
N_CENTRES = 8
PENALIZER = {"gbsg2": 0.0, "tcga": 1e-3}  # TCGA-BRCA's features are collinear
#: the tuning partition: this share of the patients, drawn once per data set with this seed,
#: is in no split's test set (the cross-validation sees only these patients)
TUNING_SHARE, TUNING_SEED = 0.25, 0x7E57
SPLIT_SEED = 0xC0C5  # split s draws its test set with default_rng([SPLIT_SEED, s])
WITHIN = 0.01  # "within 0.01 of the centralised bound": the corrected interval inside ±0.01

#: ``secagg bench cox_strategies --check``: split 0 of GBSG2 in the times scenario (the cell
#: where Sequential is least stable), every model, with the committed cross-validation's
#: hyperparameters
CHECK = Check(
    args=("--splits", "1", "--datasets", "gbsg2", "--scenarios", "times", "--tuning", "committed"),
    csv="cox_strategies_runs.csv",
    keys=("dataset", "scenario", "split", "model"),
    columns={"c_index": 1e-9, "client_lr": 0, "local_epochs": 0},
    rows="model != 'sequential'",
    why="each run is seeded (split, centres' batch orders) and trains on CPU with one thread: "
    "the subset's c-indices are the same bit for bit on one machine and, but for Sequential, "
    f"between {CROSS_CPU}; 1e-9 leaves room for the c-index's float rounding only. "
    "Sequential at rate 0.1 is chaotic (a changed float anywhere moves it by 1e-3 or "
    "collapses it to 0.5: 1.3e-3 between the two CPUs), so it is not compared",
)


def tuning_partition(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the tuning patients, the others): a fixed random TUNING_SHARE of the n patients."""
    order = np.random.default_rng(TUNING_SEED).permutation(n)
    k = int(round(TUNING_SHARE * n))
    return np.sort(order[:k]), np.sort(order[k:])


def sizes(dataset: str) -> tuple[int, int]:
    """(n_train, n_test) of every evaluation split of a data set."""
    from secagg.clients.tasks.survival import pooled

    n = len(pooled(dataset)[1])
    return n - n // 4, n // 4


def federation(
    dataset: str, scenario: str, split: int | None
) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """(the 8 centres' (x, y), the blind test set's (x, y)). ``split`` None: the tuning
    partition's patients over the 8 centres (no test set: the cross-validation holds out a
    centre). Otherwise split ``split``: ⌊n/4⌋ test patients drawn from outside the tuning
    partition, every other patient in training. Scaling and centre layouts as
    ``secagg.clients.tasks.survival.split``."""
    from secagg.clients.tasks.survival import centres_and_test, pooled

    x, y = pooled(dataset)
    n = len(y)
    tune, pool = tuning_partition(n)
    if split is None:
        rng = np.random.default_rng([TUNING_SEED, 1])
        test, train = np.empty(0, dtype=np.int64), rng.permutation(tune)
    else:
        rng = np.random.default_rng([SPLIT_SEED, split])
        test = np.sort(rng.choice(pool, n // 4, replace=False))
        train = rng.permutation(np.setdiff1d(np.arange(n), test))
    return centres_and_test(x, y, train, test, scenario, rng)


def load_federation(
    dataset: str, scenario: str, split: int | None, only: int | None, holdout: int | None
):
    """The FederatedData of :func:`federation` (``only`` and ``holdout`` as
    ``secagg.clients.tasks.survival.load``'s)."""
    from secagg.clients.tasks.survival import federated

    centres, test = federation(dataset, scenario, split)
    name = f"{dataset}[{scenario}, " + ("tuning" if split is None else f"split {split}") + "]"
    return federated(centres, test, name, only, holdout)


def make_task(job: dict[str, Any]):
    """The library's DeepCox (or linear Cox) task on this benchmark's federation."""
    from secagg.clients.tasks import Ref, coxph_task, deepcox_task

    make = coxph_task if job["protocol"] == "coxph" else deepcox_task
    only, holdout = job.get("only"), job.get("holdout")
    base = make(job["dataset"], job["scenario"], 0, only, holdout)
    split = job["split"]
    where = "tuning" if split is None else f"split {split}"
    return dataclasses.replace(
        base,
        name=f"{base.name}-bench-" + ("tune" if split is None else f"s{split}"),
        description=f"{base.description.split(', split seed')[0]}, {where} (cox_strategies)",
        load=Ref(
            "benchmarks.cox_strategies",
            "load_federation",
            (job["dataset"], job["scenario"], split, only, holdout),
        ),
    )


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One training run (a worker process can run it: only plain values in and out)."""
    import torch

    from secagg.clients.tasks import TASKS, register_task
    from secagg.clients.training import set_flat_params
    from secagg.runspec.config import ExperimentConfig
    from secagg.server.audit import AuditLog
    from secagg.simulation.experiment import run_seed

    task = make_task(job)
    if task.name not in TASKS:
        register_task(task.name, task)
    torch.set_num_threads(1)  # one core per worker process: the runs are tiny
    if job["protocol"] == "coxph":
        settings = {
            "rounds": 30,
            "protocol_options": {"penalizer": PENALIZER[job["dataset"]]},
            "backend_options": {"dtype": "float64"},
        }
    else:
        settings = {
            "rounds": ROUNDS,
            "local_epochs": job["local_epochs"],
            "client_lr": job["client_lr"],
            "batch_size": BATCH,
        }
    seed = 0 if job["split"] is None else job["split"]
    config = ExperimentConfig(
        task=task.name, protocol=job["protocol"], backend="plain", seeds=[seed], **settings
    )
    start = time.perf_counter()
    run = run_seed(config, seed, AuditLog())
    if run.aborted:
        raise RuntimeError(f"{job}: {run.aborted}")
    data = task.load()
    if run.final_predictions is not None:
        scores = np.asarray(run.final_predictions)
    else:
        model = task.make_model()
        set_flat_params(model, run.final_params)
        with torch.no_grad():
            scores = model(data.pooled_test.x).numpy().reshape(-1)
    return {
        **job,
        "c_index": run.rows[-1]["test_pooled"],
        "scores": scores.tolist(),
        "truth": data.pooled_test.y.numpy().tolist(),
        "seconds": time.perf_counter() - start,
    }


def cv_jobs(dataset: str, scenario: str) -> list[dict[str, Any]]:
    """Centre-based K-fold on the tuning partition: every grid point, every held-out centre."""
    jobs = []
    for protocol in (*STRATEGIES, "centralised"):
        for lr, epochs in itertools.product(GRID["client_lr"], GRID["local_epochs"]):
            for k in range(N_CENTRES):
                jobs.append(
                    {
                        "stage": "cv",
                        "dataset": dataset,
                        "scenario": scenario,
                        "split": None,
                        "protocol": "fedavg" if protocol == "centralised" else protocol,
                        "strategy": protocol,
                        "client_lr": lr,
                        "local_epochs": epochs,
                        "holdout": k,
                        "only": -1 if protocol == "centralised" else None,
                    }
                )
    return jobs


def cv_scores(results: list[dict[str, Any]]) -> pd.DataFrame:
    """One concordance per strategy and grid point over the concatenated held-out folds."""
    from secagg.clients.tasks.tcga_brca import c_index

    rows = []
    key = ["dataset", "scenario", "strategy", "client_lr", "local_epochs"]
    frame = pd.DataFrame(results)
    for values, g in frame.groupby(key):
        truth = np.vstack([np.asarray(t) for t in g["truth"]])
        scores = np.concatenate([np.asarray(s) for s in g["scores"]])
        rows.append({**dict(zip(key, values)), "cv_c_index": c_index(truth, scores)})
    return pd.DataFrame(rows)


def chosen(cv: pd.DataFrame) -> pd.DataFrame:
    """The grid point with the highest cross-validated concordance per strategy."""
    return (
        cv.sort_values("cv_c_index", ascending=False, kind="stable")
        .groupby(["dataset", "scenario", "strategy"], as_index=False)
        .first()
    )


def eval_jobs(dataset: str, scenario: str, splits: int, cv: pd.DataFrame) -> list[dict]:
    best_rows = chosen(cv)

    def best(strategy: str) -> dict[str, Any]:
        row = best_rows[
            (best_rows["dataset"] == dataset)
            & (best_rows["scenario"] == scenario)
            & (best_rows["strategy"] == strategy)
        ].iloc[0]
        return {"client_lr": str(row["client_lr"]), "local_epochs": int(row["local_epochs"])}

    jobs = []
    for split in range(splits):
        base = {"stage": "eval", "dataset": dataset, "scenario": scenario, "split": split}
        for strategy in STRATEGIES:
            jobs.append(
                {**base, "protocol": strategy, "strategy": strategy, "model": strategy}
                | best(strategy)
            )
        central = best("centralised")
        jobs.append(
            {**base, "protocol": "fedavg", "strategy": "centralised", "model": "centralised"}
            | {"only": -1, **central}
        )
        for k in range(N_CENTRES):
            jobs.append(
                {**base, "protocol": "fedavg", "strategy": "isolated", "model": f"isolated_c{k}"}
                | {"only": k, **central}
            )
        jobs.append(
            {**base, "protocol": "coxph", "strategy": "exact_coxph", "model": "exact_coxph"}
        )
    return jobs


def run_all(jobs: list[dict[str, Any]], workers: int, label: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for k, result in enumerate(pool.map(run_one, jobs, chunksize=4), 1):
            out.append(result)
            if k % 50 == 0 or k == len(jobs):
                elapsed = time.perf_counter() - started
                print(
                    f"  {label}: {k}/{len(jobs)} runs, {elapsed:.0f} s "
                    f"(about {elapsed / k * (len(jobs) - k):.0f} s left)",
                    flush=True,
                )
    return out


LABELS = {
    "centralised": "Centralised (upper bound)",
    "isolated": "Isolated centres (lower bound)",
    **STRATEGIES,
    "exact_coxph": "Exact federated CoxPH (linear, reference)",
}


def per_split(runs: pd.DataFrame) -> pd.DataFrame:
    """One c-index per (dataset, scenario, split, strategy): isolated centres averaged."""
    keys = ["dataset", "scenario", "split", "strategy"]
    return runs.groupby(keys, as_index=False)["c_index"].mean()


def table(scores: pd.DataFrame) -> pd.DataFrame:
    """The report's layout: a row per model, a column per scenario (mean ± SD over splits)."""
    rows = []
    for (dataset, strategy), g in scores.groupby(["dataset", "strategy"]):
        row: dict[str, Any] = {"data": dataset, "model": LABELS[strategy]}
        for scenario in SCENARIOS:
            values = g[g["scenario"] == scenario].sort_values("split")["c_index"]
            row[scenario] = mean_std(values) if len(values) else ""
        rows.append((dataset, list(LABELS).index(strategy), row))
    return pd.DataFrame([row for *_, row in sorted(rows, key=lambda r: r[:2])])


def comparisons(scores: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """Each (treatment − control) pair in every (dataset, scenario), paired over splits: the
    ordinary paired t-test and the Nadeau–Bengio corrected one, and Holm's adjustment of
    each over the whole family (every row of the returned table)."""
    rows = []
    for dataset in dict.fromkeys(scores["dataset"]):
        n_train, n_test = sizes(dataset)
        for scenario in SCENARIOS:
            g = scores[(scores["dataset"] == dataset) & (scores["scenario"] == scenario)]
            if g.empty:
                continue
            wide = g.pivot(index="split", columns="strategy", values="c_index")
            for treatment, control in pairs:
                paired = paired_difference(wide[treatment], wide[control])
                nb = nadeau_bengio(wide[treatment] - wide[control], n_train, n_test)
                rows.append(
                    {
                        "data": dataset,
                        "scenario": scenario,
                        "treatment": treatment,
                        "control": control,
                        "difference": paired["mean_diff"],
                        "paired_low": paired["ci_low"],
                        "paired_high": paired["ci_high"],
                        "p_paired": paired["p_ttest"],
                        "nb_low": nb["ci_low"],
                        "nb_high": nb["ci_high"],
                        "p_nb": nb["p"],
                    }
                )
    frame = pd.DataFrame(rows)
    frame["holm_paired"] = holm(frame["p_paired"].to_numpy())
    frame["holm_nb"] = holm(frame["p_nb"].to_numpy())
    return frame


def interval(low: float, high: float) -> str:
    return f"[{low:+.4f}, {high:+.4f}]"


def comparison_table(frame: pd.DataFrame, within: bool = False) -> pd.DataFrame:
    """The printed form of :func:`comparisons`."""
    rows = []
    for r in frame.itertuples(index=False):
        row = {
            "data": r.data,
            "scenario": r.scenario,
            "comparison": f"{LABELS[r.treatment].split(' (')[0]} − {STRATEGIES[r.control]}"
            if r.treatment != "fedavg"
            else f"WA − {STRATEGIES[r.control]}",
            "difference": f"{r.difference:+.4f}",
            "paired 95 % CI": interval(r.paired_low, r.paired_high),
            "p paired": f"{r.p_paired:.2g}",
            "Holm p (paired)": f"{r.holm_paired:.2g}",
            "NB 95 % CI": interval(r.nb_low, r.nb_high),
            "p NB": f"{r.p_nb:.2g}",
            "Holm p (NB)": f"{r.holm_nb:.2g}",
            "survives": "yes" if r.holm_nb < 0.05 else "no",
        }
        if within:
            row["NB CI within ±0.01"] = "yes" if -WITHIN < r.nb_low and r.nb_high < WITHIN else "no"
        rows.append(row)
    return pd.DataFrame(rows)


def describe(frame: pd.DataFrame, what: str) -> str:
    """A sentence on which comparisons of a family survive which correction."""

    def names(mask: pd.Series) -> str:
        picked = frame[mask]
        if picked.empty:
            return "none"
        return "; ".join(
            f"{r.data} {r.scenario} {STRATEGIES.get(r.control, r.control)} ({r.difference:+.4f})"
            for r in picked.itertuples(index=False)
        )

    m = len(frame)
    ordinary = (frame["paired_low"] > 0) | (frame["paired_high"] < 0)
    return (
        f"Of the {m} {what}, {int(ordinary.sum())} have an ordinary paired 95 % interval that "
        f"excludes 0 ({names(ordinary)}); {int((frame['holm_paired'] < 0.05).sum())} survive "
        f"Holm's correction of the paired p-values ({names(frame['holm_paired'] < 0.05)}); "
        f"{int((frame['p_nb'] < 0.05).sum())} have a Nadeau–Bengio p below 0.05 "
        f"({names(frame['p_nb'] < 0.05)}), and {int((frame['holm_nb'] < 0.05).sum())} survive "
        f"Holm's correction of those ({names(frame['holm_nb'] < 0.05)})."
    )


def plot(scores: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(scores["dataset"]))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        g = scores[scores["dataset"] == dataset]
        for k, strategy in enumerate(LABELS):
            means, sds = [], []
            for scenario in SCENARIOS:
                v = g[(g["scenario"] == scenario) & (g["strategy"] == strategy)]["c_index"]
                means.append(v.mean())
                sds.append(v.std(ddof=1))
            x = np.arange(len(SCENARIOS)) + (k - 2.5) * 0.13
            ax.errorbar(x, means, yerr=sds, fmt="o", ms=4, capsize=2, label=LABELS[strategy])
        ax.set_xticks(range(len(SCENARIOS)), SCENARIOS)
        ax.set_title(dataset)
        ax.set_ylabel("blind-test c-index")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=positive, default=10, help="train/test splits")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--jobs", type=positive, default=2, help="worker processes")
    parser.add_argument(
        "--lrs", default=",".join(GRID["client_lr"]), help="client rates cross-validated"
    )
    parser.add_argument(
        "--epochs",
        default=",".join(map(str, GRID["local_epochs"])),
        help="internal epochs cross-validated",
    )
    parser.add_argument(
        "--tuning",
        choices=("cv", "committed"),
        default="cv",
        help="cv: cross-validate on the tuning partition; committed: take the hyperparameters "
        "from the committed cox_strategies_cv.csv (the CHECK)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    datasets, scenarios = args.datasets.split(","), args.scenarios.split(",")
    if set(datasets) - set(DATASETS):
        parser.error(f"datasets are {DATASETS}")
    if set(scenarios) - set(SCENARIOS):
        parser.error(f"scenarios are {SCENARIOS}")
    command = "python -m benchmarks.cox_strategies " + shlex.join(
        [a for a in (argv if argv is not None else __import__("sys").argv[1:])]
    )
    out = output_folder(parser, args.out, "cox_strategies", OUTPUTS, args.overwrite)
    GRID["client_lr"] = tuple(args.lrs.split(","))
    GRID["local_epochs"] = tuple(int(e) for e in args.epochs.split(","))

    started = time.perf_counter()
    if args.tuning == "committed":
        cv = pd.read_csv(RESULTS / "cox_strategies_cv.csv", dtype={"client_lr": str})
    else:
        cv = cv_scores(
            run_all(
                [j for d in datasets for s in scenarios for j in cv_jobs(d, s)],
                args.jobs,
                "cross-validation",
            )
        )
    cv.to_csv(out / "cox_strategies_cv.csv", index=False)
    runs = pd.DataFrame(
        run_all(
            [j for d in datasets for s in scenarios for j in eval_jobs(d, s, args.splits, cv)],
            args.jobs,
            "evaluation",
        )
    )
    columns = ["stage", "dataset", "scenario", "split", "model", "strategy", "protocol"]
    columns += ["client_lr", "local_epochs", "only", "c_index", "seconds"]
    runs = runs[columns]
    runs.to_csv(out / "cox_strategies_runs.csv", index=False)
    tuned = (
        "the hyperparameters were read from the committed cox_strategies_cv.csv, which the "
        "same command with `--tuning cv` makes"
        if args.tuning == "committed"
        else ""
    )
    write_report(out, runs, cv, args.splits, command, time.perf_counter() - started, tuned)


def write_report(
    out: Path,
    runs: pd.DataFrame,
    cv: pd.DataFrame,
    splits: int,
    command: str,
    seconds: float,
    tuned: str = "",
) -> None:
    scores = per_split(runs)
    summary = table(scores)
    plot(scores, out / "cox_strategies.png")
    sizes_text = "; ".join(
        f"{d}: {sizes(d)[0]} training and {sizes(d)[1]} test patients per split"
        for d in dict.fromkeys(scores["dataset"])
    )
    text = (
        "# Federated Cox strategies on 8 centres (GenoMed4All D6.2 Tables 8.1–8.3)\n\n"
        + made_by(command)
        + f" It took {seconds / 60:.0f} min"
        + (f"; {tuned}" if tuned else "")
        + ".\n\n"
        f"Blind-test c-index, mean ± SD over {splits} train/test splits ({sizes_text}). "
        f"DeepCox 8-4, {ROUNDS} federated epochs, batch {BATCH}; the rate and internal epochs "
        "chosen by centre-based cross-validation on a fixed tuning partition "
        f"({TUNING_SHARE:.0%} of the patients) that is in no split's test set (the splits' "
        "test sets are drawn from the other patients; the tuning patients train in every "
        "split). Plain backend.\n\n" + markdown_table(summary) + "\n\n"
    )
    if splits >= 2:
        wa = comparisons(scores, [("fedavg", "sequential"), ("fedavg", "ensemble")])
        gap = comparisons(scores, [("centralised", s) for s in STRATEGIES])
        text += (
            "Every paired comparison, over the splits: the difference in c-index, the ordinary "
            "paired 95 % t-interval and p, the Nadeau–Bengio corrected interval and p (the "
            "splits' training sets overlap, so the ordinary interval is too narrow: variance "
            "× (1/J + n_test/n_train), J splits), and Holm's adjustment of each p over the "
            "table's family. *survives*: the Holm-adjusted Nadeau–Bengio p is below 0.05.\n\n"
            f"Weights Averaging (WA) against the other strategies (a family of {len(wa)}):\n\n"
            + markdown_table(comparison_table(wa))
            + "\n\n"
            + describe(wa, "Weights Averaging comparisons")
            + f"\n\nThe centralised bound − each strategy (a family of {len(gap)}; *within "
            "±0.01*: the corrected interval lies inside ±0.01 — the strategy is within 0.01 "
            "of the bound in that cell; otherwise the data do not show it):\n\n"
            + markdown_table(comparison_table(gap, within=True))
            + "\n\n"
            + describe(gap, "gaps to the centralised bound")
            + "\n\n"
        )
    text += (
        "![c-index per scenario](cox_strategies.png)\n\nHyperparameters chosen by "
        "cross-validation on the tuning partition:\n\n"
        + markdown_table(
            chosen(cv)[
                ["dataset", "scenario", "strategy", "client_lr", "local_epochs", "cv_c_index"]
            ],
            ".4f",
        )
        + "\n"
    )
    (out / "cox_strategies.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
