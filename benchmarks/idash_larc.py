"""LARC vs its FedAdam baseline on the iDASH 2024 Track 2 variant, over paired seeds, and
``larc-lagged`` (LARC whose weights are fixed before the uploads, so that it streams) beside
both.

Study 1 (the paper's Table 1): all 900 patients train, c-index on the pooled training set.
Study 2 (the paper's Table 2): each client's data split 5:1 at random into train/test; 10
distinct splits (split = seed mod 10), c-index on the pooled held-out sets. Seeds that share a
split are not independent, so this study's interval is also given split-clustered (the
paired differences averaged per split, a t-interval over the 10 split means).
Study 3: the models of study 1 (trained on all 900) scored on the patients of FLamby's
Fed-TCGA-BRCA (1,088) that are not among the 900: nobody trained on them or chose anything
with them. The seeds there share no split, so the per-seed interval applies; the test set
is one fixed sample of patients, so a second interval resamples the patients as well.

Every arm of a seed shares it: same initial model, same batch order, same split. Each study
reports three paired comparisons (LARC − FedAdam, lagged − FedAdam, lagged − LARC), with
Holm's adjustment of their t-test p-values over the three (the split-clustered ones in
study 2, where seeds share splits).

    python -m benchmarks.idash_larc --seeds 0-49 --full-data-seeds 0-99 \
        --out benchmarks/results --overwrite

``--seeds`` are study 2's seeds, ``--full-data-seeds`` those of studies 1 and 3 (one set of
runs on all 900 patients serves both).

Writes idash_larc_runs.csv, idash_larc.md and idash_larc.png to ``--out`` (default: a new
folder under results/bench).
"""

from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from benchmarks.corrections import holm  # noqa: E402
from benchmarks.options import output_folder  # noqa: E402
from benchmarks.reproduce import Check, made_by, shown_path  # noqa: E402
from benchmarks.stats import (  # noqa: E402
    format_difference,
    mean_std,
    paired_difference,
    run_complete,
)
from secagg.clients.tasks import get_task  # noqa: E402
from secagg.clients.tasks.tcga_brca import N_FEATURES, VARIANTS, ClientData  # noqa: E402
from secagg.clients.training import set_flat_params  # noqa: E402
from secagg.simulation.cli import parse_seeds  # noqa: E402
from secagg.simulation.experiment import ExperimentConfig, stderr_progress  # noqa: E402

HERE = Path(__file__).parent
OUTPUTS = ("idash_larc_runs.csv", "idash_larc.md", "idash_larc.png")
#: ``secagg bench idash_larc --check``: seeds 0 and 1 of every study, every arm
CHECK = Check(
    args=("--seeds", "0,1", "--full-data-seeds", "0,1"),
    csv="idash_larc_runs.csv",
    keys=("study", "arm", "seed"),
    columns={"c_index": 1e-9, "split": 0},
    why="plain float64 aggregation of torch CPU training with fixed seeds: two runs of this "
    "subset gave bit-for-bit equal c-indices, so 1e-9 only allows for rounding",
)
IDASH = ExperimentConfig(
    task="tcga-brca-idash", client_lr="0.1", server_opt={"name": "adam", "lr": 0.01, "tau": 1e-3}
)
BASELINE, LARC, LAGGED = "FedAdam (baseline)", "LARC q=19 b=0.5", "LARC lagged"
ARMS = {
    BASELINE: {"protocol": "fedadam"},
    LARC: {"protocol": "larc"},
    # weights fixed before the uploads: Ĝ is the update, its α weight the next round
    LAGGED: {"protocol": "larc-lagged"},
}
#: the paired comparisons (treatment, control) each study reports, one Holm family a study
COMPARISONS = ((LARC, BASELINE), (LAGGED, BASELINE), (LAGGED, LARC))
TRAIN_SET = "1: train-set evaluation"
SPLITS = "2: 5:1 client splits (10 splits of the 900)"
UNUSED = "3: never-used patients"
SPLIT_COUNT = 10
SPLIT_OPTIONS = {"client_split": 1 / 6, "client_split_count": SPLIT_COUNT}
SHORT = {BASELINE: "FedAdam", LARC: "LARC", LAGGED: "lagged"}  # the figure's labels
BOOTSTRAP = 2000  # replicates of the seeds-and-patients bootstrap (study 3)


# ---- the patients nobody used --------------------------------------------------------------
def unused_patients() -> tuple[ClientData, dict[str, object]]:
    """FLamby's Fed-TCGA-BRCA patients (its 866 + 222 split) that are not among the iDASH
    variant's 900, read from the files the tasks load (nothing in clients/ changes).

    Checks on the way that the 900 are a subset of the 1,088 with identical rows (so the two
    files share their preprocessing) and that each iDASH client k holds only FLamby region k.
    """
    flamby, idash = VARIANTS["flamby"], VARIANTS["idash2024"]
    rows = pd.read_csv(flamby / "brca.csv").set_index("pid")
    split = pd.read_csv(flamby / "train_test_split.csv").set_index("pid")
    idash_rows = pd.read_csv(idash / "brca.csv").set_index("pid")
    idash_split = pd.read_csv(idash / "train_test_split.csv").set_index("pid")
    if not idash_split.index.isin(split.index).all():
        raise RuntimeError("the iDASH patients are not a subset of FLamby's split")
    if not idash_rows.equals(rows.loc[idash_rows.index]):
        raise RuntimeError("the iDASH rows differ from FLamby's rows for the same patients")
    region = idash_split["fold2"].str.split("_").str[1]
    if not (region == split.loc[idash_split.index, "fold2"].str.split("_").str[1]).all():
        raise RuntimeError("an iDASH client holds patients of another FLamby region")
    rest = split.index[~split.index.isin(idash_split.index)]
    part = rows.loc[rest]
    x = torch.tensor(part.iloc[:, :N_FEATURES].to_numpy(dtype=np.float32))
    y = torch.tensor(part[["E", "T"]].to_numpy(dtype=np.float32))
    fold = split.loc[rest, "fold"]
    info = {
        "n": len(rest),
        "events": int(part["E"].sum()),
        "flamby_train": int((fold == "train").sum()),
        "flamby_test": int((fold == "test").sum()),
        "per_region": split.loc[rest, "fold2"].str.split("_").str[1].value_counts().sort_index(),
    }
    return ClientData(x, y), info


def risks(params: np.ndarray, part: ClientData) -> np.ndarray:
    model = get_task(IDASH.task).make_model()
    set_flat_params(model, params)
    model.eval()
    with torch.no_grad():
        return model(part.x).numpy().reshape(-1)


def c_index(params: np.ndarray, part: ClientData) -> float:
    """The task's own metric (lifelines' Harrell C) of a final model on ``part``."""
    return get_task(IDASH.task).metric(part.y.numpy(), risks(params, part))


def pair_matrices(part: ClientData, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Harrell's C as pair matrices, counted as lifelines counts: (i, j) is admissible when
    i has the event and j leaves later (or is censored at i's time); it is concordant when
    i's risk is higher (a tie counts 1/2). C = sum(K) / sum(A); with patient weights w,
    C(w) = w K w / w A w, which is C on the resampled patients (a patient and its copy are
    never a pair, as in lifelines)."""
    e, t = part.y[:, 0].numpy().astype(bool), part.y[:, 1].numpy().astype(float)
    later = (t[None, :] > t[:, None]) | ((t[None, :] == t[:, None]) & ~e[None, :])
    admissible = (e[:, None] & later).astype(float)
    higher = (risk[:, None] > risk[None, :]) + 0.5 * (risk[:, None] == risk[None, :])
    return admissible, admissible * higher


def seeds_and_patients_bootstrap(
    part: ClientData, treatment: list[np.ndarray], control: list[np.ndarray], rng_seed: int = 0
) -> tuple[float, float]:
    """95 % percentile interval of the mean paired c-index difference when both the seeds
    (pairs) and the test patients are resampled: the uncertainty of a fixed test set of few
    events on top of the training randomness. Pairs come as final-model parameter vectors."""
    rng = np.random.default_rng(rng_seed)
    n, s = len(part), len(treatment)
    admissible, _ = pair_matrices(part, np.zeros(n))
    # per pair: K_treatment - K_control, flattened (C is linear in K for fixed weights)
    delta = []
    for a, b in zip(treatment, control):
        ka, kb = (pair_matrices(part, risks(p, part))[1] for p in (a, b))
        for params, k in ((a, ka), (b, kb)):  # the matrix form must be the task's metric
            if not np.isclose(k.sum() / admissible.sum(), c_index(params, part), atol=1e-12):
                raise RuntimeError("the pair-matrix c-index disagrees with the task's metric")
        delta.append((ka - kb).reshape(-1))
    delta = np.stack(delta)
    out = []
    for start in range(0, BOOTSTRAP, 200):
        b = min(200, BOOTSTRAP - start)
        w = rng.multinomial(n, np.full(n, 1 / n), size=b).astype(float)
        ww = (w[:, :, None] * w[:, None, :]).reshape(b, -1)
        per_pair = (ww @ delta.T) / (ww @ admissible.reshape(-1))[:, None]  # b × s
        picks = rng.multinomial(s, np.full(s, 1 / s), size=b)
        out.append((per_pair * picks).sum(1) / s)
    low, high = np.percentile(np.concatenate(out), [2.5, 97.5])
    return float(low), float(high)


# ---- runs ---------------------------------------------------------------------------------
def train(seeds: list[int], extra: dict, metric: str) -> dict[str, tuple[pd.Series, dict]]:
    """Each arm: the final-round metric per seed and the final parameters per seed."""
    out = {}
    for arm, options in ARMS.items():
        config = replace(IDASH, seeds=seeds, **extra, **options)
        result = run_complete(config, progress=stderr_progress)
        final = result.metrics[result.metrics["round"] == config.rounds].set_index("seed")
        out[arm] = (final[metric], result.final_params)
    return out


def interval_marker(ax, x: float, mean: float, bounds, marker: str, color: str, label: str):
    """A mean with its interval drawn as an error bar at ``x``."""
    low, high = bounds
    ax.errorbar(
        [x], [mean], [[mean - low], [high - mean]], fmt=marker, color=color, capsize=4, label=label
    )


def command(args: argparse.Namespace, out: Path) -> str:
    """The command that makes these results again (every option spelled out)."""
    folder = shown_path(out)
    argv = ["--seeds", args.seeds_text, "--full-data-seeds", args.full_data_seeds_text]
    return shlex.join(["python", "-m", "benchmarks.idash_larc", *argv, "--out", folder]) + (
        " --overwrite" if args.overwrite else ""
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-49", help="study 2's seeds (e.g. 0-49 or 0,1)")
    parser.add_argument(
        "--full-data-seeds",
        default="0-99",
        help="seeds of the runs on all 900 patients (studies 1 and 3)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    args.seeds_text, args.full_data_seeds_text = args.seeds, args.full_data_seeds
    try:
        args.seeds, args.full_data_seeds = map(parse_seeds, (args.seeds, args.full_data_seeds))
    except ValueError as exc:
        parser.error(str(exc))
    out = output_folder(parser, args.out, "idash_larc", OUTPUTS, args.overwrite)
    started = time.perf_counter()
    unused, unused_info = unused_patients()
    idash_train = ClientData.concat(get_task(IDASH.task).load().train)

    # studies 1 and 3: one set of runs on all 900 patients
    full = train(args.full_data_seeds, {}, "train_pooled")
    rows, finals = [], {}

    def row(study: str, arm: str, seed: int, value: float, split: int | None = None) -> None:
        rows.append({"study": study, "arm": arm, "seed": seed, "split": split, "c_index": value})

    for arm, (train_pooled, params) in full.items():
        finals[arm] = [params[s] for s in args.full_data_seeds]
        for seed in args.full_data_seeds:
            # the final parameters are the model the metrics row scored
            again = c_index(params[seed], idash_train)
            if not np.isclose(again, train_pooled[seed], atol=1e-12):
                raise RuntimeError(f"{arm} seed {seed}: {again} != {train_pooled[seed]}")
            row(TRAIN_SET, arm, seed, train_pooled[seed])
        for seed in args.full_data_seeds:
            row(UNUSED, arm, seed, c_index(params[seed], unused))
    # study 2: the paper's 5:1 splits
    for arm, (test_pooled, _) in train(args.seeds, SPLIT_OPTIONS, "test_pooled").items():
        for seed in args.seeds:
            row(SPLITS, arm, seed, test_pooled[seed], seed % SPLIT_COUNT)
    runs = pd.DataFrame(rows)
    runs["split"] = runs["split"].astype("Int64")
    runs.to_csv(out / "idash_larc_runs.csv", index=False)

    boot = {
        (t, c): seeds_and_patients_bootstrap(unused, finals[t], finals[c]) for t, c in COMPARISONS
    }
    evaluated_on = {
        TRAIN_SET: "the 900 training patients",
        SPLITS: "each split's held-out sixth (~150 of the 900)",
        UNUSED: f"{unused_info['n']} patients outside the 900 ({unused_info['events']} events)",
    }
    lines = [
        "| study | evaluated on | treatment − control | control c-index | treatment c-index | "
        "difference, per seed (95% CI) | p per seed (t / Wilcoxon) | difference, "
        "split-clustered (95% CI) | p split-clustered (t / Wilcoxon) | Holm p (t, the "
        "study's 3 comparisons) | seeds resampled with patients (95% CI) | pairs / "
        "independent units | treatment better in |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), sharey=True)
    for ax, study in zip(axes, [TRAIN_SET, SPLITS, UNUSED]):
        g = runs[runs["study"] == study]
        wide = g.pivot(index="seed", columns="arm", values="c_index")
        splits = [s % SPLIT_COUNT for s in wide.index] if study == SPLITS else None
        # the study's family: the clustered test where seeds share splits, else per seed
        tests = [paired_difference(wide[t], wide[c], clusters=splits) for t, c in COMPARISONS]
        adjusted = holm([d["p_ttest"] for d in tests])
        for x, ((t, c), dt, p_holm) in enumerate(zip(COMPARISONS, tests, adjusted)):
            d = dt if splits is None else paired_difference(wide[t], wide[c])
            per_seed = f"{format_difference(d)} | {d['p_ttest']:.3g} / {d['p_wilcoxon']:.3g}"
            clustered, units, better = "— | —", f"{d['n_pairs']} / {d['n_pairs']} seeds", ""
            diff = (wide[t] - wide[c]).to_numpy()
            if study == SPLITS:
                split_means = (wide[t] - wide[c]).groupby(splits).mean()
                clustered = (
                    f"{format_difference(dt)} | {dt['p_ttest']:.3g} / {dt['p_wilcoxon']:.3g}"
                )
                units = f"{d['n_pairs']} / {dt['n_clusters']} splits"
                better = f"; {int((split_means > 0).sum())}/{dt['n_clusters']} splits"
            bootstrapped = "—"
            if study == UNUSED:
                bootstrapped = f"[{boot[t, c][0]:+.4f}, {boot[t, c][1]:+.4f}]"
            lines.append(
                f"| {study} | {evaluated_on[study]} | {t} − {c} | {mean_std(wide[c])} | "
                f"{mean_std(wide[t])} | {per_seed} | {clustered} | {p_holm:.3g} | "
                f"{bootstrapped} | {units} | {d['wins']}/{d['n_pairs']} pairs{better} |"
            )
            jitter = np.random.default_rng(x).uniform(-0.12, 0.12, diff.size)
            ax.scatter(x + jitter, diff, s=8, color="0.65", label="per seed" if x == 0 else None)
            interval_marker(
                ax,
                x + 0.25,
                dt["mean_diff"],
                (dt["ci_low"], dt["ci_high"]),
                "s" if study == SPLITS else "o",
                "C1" if study == SPLITS else "C0",
                ("split-clustered 95% CI" if study == SPLITS else "per-seed 95% CI")
                if x == 0
                else None,
            )
            if study == UNUSED:
                interval_marker(
                    ax,
                    x + 0.38,
                    d["mean_diff"],
                    boot[t, c],
                    "s",
                    "C2",
                    "seeds + patients resampled" if x == 0 else None,
                )
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(COMPARISONS)))
        ax.set_xticklabels([f"{SHORT[t]}\n− {SHORT[c]}" for t, c in COMPARISONS], fontsize=8)
        ax.set_xlim(-0.6, len(COMPARISONS) - 0.4)
        ax.set_title(f"{study}\n({evaluated_on[study]})", fontsize=9)
        ax.set_ylabel("paired c-index difference")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out / "idash_larc.png", dpi=120)
    table = "\n".join(lines)
    regions = ", ".join(f"{n}" for n in unused_info["per_region"])
    (out / "idash_larc.md").write_text(
        "# LARC, its lagged variant and FedAdam on the iDASH 2024 variant (5 rounds, 100 "
        "steps, batch 8, client lr 0.1, server Adam lr 0.01, tau 1e-3)\n\n"
        + made_by(command(args, out))
        + "\n\n"
        "LARC lagged (`larc-lagged`, not in the paper): the probe's sum Ĝ, weighted by the "
        "last round's α, is the global update, and the α this round's probe finds weight the "
        "next round's uploads (normalised to sum to 1), so that the weights are fixed before "
        "the uploads. "
        "The paper reports 69.02% → 74.28% (training "
        "set) and 65.08% → 69.15% (held-out splits).\n\n" + table + "\n\n"
        f"Studies 1 and 3 score the same {len(args.full_data_seeds)} seeds' final models "
        "(trained on all 900 patients); study 2 has its own "
        f"{len(args.seeds)} seeds. Study 2's seeds share {SPLIT_COUNT} random splits of the "
        "same 900 patients (split = seed mod 10, every arm of a seed on the same split), so "
        "they are not independent: its split-clustered interval averages the paired "
        f"differences per split and is a t-interval over the {SPLIT_COUNT} split means "
        "(9 degrees of freedom); the per-seed interval beside it treats the seeds as "
        "independent and is too narrow. Study 3's patients are FLamby's Fed-TCGA-BRCA patients "
        f"not among the 900 ({unused_info['n']}: {unused_info['flamby_train']} from FLamby's "
        f"train and {unused_info['flamby_test']} from its test fold; {regions} per region "
        f"0–5; {unused_info['events']} events); no run trained on them and nothing was chosen "
        "with them. Its seeds share no split, so the per-seed interval is the right one for "
        "the training randomness; it is conditional on these few patients, and the "
        "bootstrap column resamples the seeds and the patients together "
        f"({BOOTSTRAP} replicates, percentile interval). Holm's adjustment is over a study's "
        "three comparisons (its t-test p-values: split-clustered in study 2, per seed "
        "otherwise); the other intervals and p-values are per comparison.\n"
    )
    print(table)
    print(f"benchmark time: {time.perf_counter() - started:.0f} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
