"""Privacy–utility on Fed-TCGA-BRCA: pooled-test c-index against ε, FedAdam and LARC.

Setting: FLamby's split, 5 rounds of 100 local steps, batch 8, client lr 0.1, server Adam
lr 0.01, τ 1e-3 for both protocols (the iDASH baseline's optimizer), δ = 1e-5.

- client-level DP: clip C = 0.5 (about the median update norm without DP), target noise
  multipliers z* ∈ {0.5, 1, 2, 4}; ε is accounted from the *realised* multipliers (uneven
  client sizes and LARC's weights make them smaller than z*; LARC releases two sums a round);
- DP-SGD (Opacus): target ε ∈ {4, 64} per client for the run at per-sample clip 100 (at
  client lr 0.1 and 0.001), and
  "clip only" runs (noise multiplier 0.01, ε meaningless) at clips 1, 10 and 100 that show
  what clipping alone does to the Cox loss: FLamby's mini-batch Cox loss is not a sum over
  samples, and per-sample clipping below ~100 (the 90th percentile of per-sample gradient
  norms is ~30, the median 0) biases the summed gradient until the model learns the wrong
  sign (c-index < 0.5);
- the ckks backend for one client-level point per protocol, to show it gives the same models.

    python -m benchmarks.dp_tcga [--seeds 0-9] [--only REGEX] [--reuse] [--out DIR]

``--only`` runs the arms whose "protocol, mechanism, backend" matches REGEX (all by default);
``--reuse`` keeps the rows of every arm not run from DIR's dp_tcga_runs.csv (without
``--only``: runs only the arms missing from it). ε of client-level DP is the library's: each
round's releases accounted jointly (LARC's Ĝ and update share the same noised uploads).

Writes dp_tcga_runs.csv, dp_tcga.md and dp_tcga.png into DIR (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.options import output_folder  # noqa: E402
from benchmarks.reproduce import Check, made_by, seeds_text  # noqa: E402
from benchmarks.stats import format_difference, mean_std, paired_difference  # noqa: E402
from secagg.simulation.cli import parse_seeds  # noqa: E402
from secagg.simulation.experiment import ExperimentConfig, run_experiment, stderr_progress  # noqa

HERE = Path(__file__).parent
BASE = ExperimentConfig(
    task="tcga-brca",
    rounds=5,
    local_steps=100,
    batch_size=8,
    client_lr="0.1",
    server_opt={"name": "adam", "lr": 0.01, "tau": 1e-3},
)
CLIP = 0.5
NOISES = [0.5, 1.0, 2.0, 4.0]
EPSILONS = [4.0, 64.0]
DP_SGD_CLIP = 100.0
CLIP_ONLY = [1.0, 10.0, 100.0]
PROTOCOLS = {"FedAdam": "fedadam", "LARC": "larc"}
OUTPUTS = ("dp_tcga_runs.csv", "dp_tcga.md", "dp_tcga.png")
#: ``secagg bench dp_tcga --check``: seed 0 of LARC's client-level z*=1 on plain and ckks and
#: DP-SGD ε=4 at client lr 0.001 (about 30 s; no DP's ε is inf, which the comparison cannot
#: subtract)
CHECK = Check(
    args=(
        "--seeds",
        "0",
        "--only",
        "^LARC, (client-level z\\*=1|DP-SGD ε=4, client lr 0.001), ",
    ),
    csv="dp_tcga_runs.csv",
    keys=("protocol", "mechanism", "backend", "seed"),
    columns={"diverged": 0, "epsilon": 1e-3, "realised_z_last": 1e-5, "c_index": 1e-12},
    why="seeded DP noise makes plain runs deterministic (bit for bit, ε and z included: "
    "measured); on ckks LARC's weights come from decrypted sums, so its multipliers, and ε, "
    "move with the fresh CKKS noise (measured: ε by up to 6e-5, z by 1.5e-6, the c-index not "
    "at all); the c-index is a ratio of pair counts",
)


def arms() -> list[tuple[str, str, dict, str]]:
    """(protocol label, mechanism, config changes, backend)."""
    out = []
    for label, proto in PROTOCOLS.items():
        out.append((label, "none", {"protocol": proto}, "plain"))
        for z in NOISES:
            out.append(
                (
                    label,
                    f"client-level z*={z:g}",
                    {"protocol": proto, "client_dp": {"clip": CLIP, "noise": z}},
                    "plain",
                )
            )
        out.append(
            (
                label,
                "client-level z*=1",
                {"protocol": proto, "client_dp": {"clip": CLIP, "noise": 1.0}},
                "ckks",
            )
        )
        for eps in EPSILONS:
            out.append(
                (
                    label,
                    f"DP-SGD ε={eps:g}",
                    {"protocol": proto, "dp_sgd": {"clip": DP_SGD_CLIP, "epsilon": eps}},
                    "plain",
                )
            )
            out.append(
                (
                    label,
                    f"DP-SGD ε={eps:g}, client lr 0.001",
                    {
                        "protocol": proto,
                        "client_lr": "0.001",
                        "dp_sgd": {"clip": DP_SGD_CLIP, "epsilon": eps},
                    },
                    "plain",
                )
            )
        for clip in CLIP_ONLY:
            out.append(
                (
                    label,
                    f"DP-SGD clip only C={clip:g}",
                    {"protocol": proto, "dp_sgd": {"clip": clip, "noise": 0.01}},
                    "plain",
                )
            )
    return out


def command(args: argparse.Namespace) -> str:
    """The command that makes these results again, from the parsed arguments."""
    words = ["python", "-m", "benchmarks.dp_tcga", "--seeds", seeds_text(args.seeds)]
    if args.only is not None:
        words += ["--only", args.only]
    if args.reuse:
        words.append("--reuse")
    return shlex.join([*words, "--out", str(args.out), "--overwrite"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    parser.add_argument(
        "--only",
        metavar="REGEX",
        help='run only the arms whose "protocol, mechanism, backend" matches (re.search)',
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the rows of the arms not run from the runs CSV in --out (without --only: "
        "run only the arms missing from it)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "dp_tcga", OUTPUTS, args.overwrite or args.reuse)
    selected = [
        a for a in arms() if args.only is None or re.search(args.only, f"{a[0]}, {a[1]}, {a[3]}")
    ]
    if not selected:
        parser.error(f"--only {args.only!r} matches no arm")
    rows = []
    done = set()
    kept = 0
    if args.reuse and (out / "dp_tcga_runs.csv").is_file():
        old = pd.read_csv(out / "dp_tcga_runs.csv")
        arm_of = list(zip(old["protocol"], old["mechanism"], old["backend"]))
        rerun = {(a[0], a[1], a[3]) for a in selected} if args.only is not None else set()
        old = old[[k not in rerun for k in arm_of]]
        rows = old.to_dict("records")
        kept = len(rows)
        done = set(zip(old["protocol"], old["mechanism"], old["backend"]))
    for label, mechanism, changes, backend in selected:
        if (label, mechanism, backend) in done:
            continue
        stderr_progress(f"== {label}, {mechanism}, {backend}")
        for seed in args.seeds:
            cfg = replace(BASE, seeds=[seed], backend=backend, **changes)
            if mechanism != "none":  # a reproducible study: the same seed draws the same
                # DP noise, so the plain and ckks arms are paired (insecure outside simulation)
                cfg = replace(cfg, dp_noise="seeded")
            row = {
                "protocol": label,
                "mechanism": mechanism,
                "backend": backend,
                "seed": seed,
                "diverged": False,
            }
            result = run_experiment(cfg)
            m = result.metrics
            if result.aborted:  # every client's update went non-finite: the run diverged
                rows.append(
                    {
                        **row,
                        "diverged": True,
                        "epsilon": np.nan,
                        "c_index": np.nan,
                        "realised_z_last": np.nan,
                    }
                )
                continue
            r = m[m["round"] == cfg.rounds].iloc[0]
            eps = (  # client level: against a server that sees the released sums only (ckks)
                r["eps_client_level_sums"]
                if "client_dp" in changes
                else r["eps_dp_sgd_max"]
                if "dp_sgd" in changes
                else np.inf
            )
            rows.append(
                {
                    **row,
                    "epsilon": eps,
                    "c_index": r["test_pooled"],
                    # the last round's smallest multiplier of one release alone, as the
                    # README's table shows it; ε above accounts each round's releases jointly
                    "realised_z_last": min(
                        result.privacy_events[seed][-1]["per_release_multipliers"], default=np.nan
                    )
                    if result.privacy_events.get(seed)
                    else np.nan,
                }
            )
    order = {(a[0], a[1], a[3]): i for i, a in enumerate(arms())}
    runs = pd.DataFrame(rows)
    runs = runs.assign(
        _order=[
            order.get(k, len(order))
            for k in zip(runs["protocol"], runs["mechanism"], runs["backend"])
        ]
    )
    runs = runs.sort_values(["_order", "seed"], kind="stable").drop(columns="_order")
    runs.to_csv(out / "dp_tcga_runs.csv", index=False)
    n_seeds = runs["seed"].nunique()

    lines = [
        "| protocol | mechanism | backend | ε (δ 1e-5) | realised z (last round) | "
        "c-index | Δ vs no DP (95% CI) | diverged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (label, mechanism, backend), g in runs.groupby(
        ["protocol", "mechanism", "backend"], sort=False
    ):
        diverged = int(g["diverged"].sum())
        base = runs[(runs["protocol"] == label) & (runs["mechanism"] == "none")]
        both = g.merge(base[["seed", "c_index"]], on="seed", suffixes=("", "_base")).dropna(
            subset=["c_index", "c_index_base"]
        )
        if len(both) < 2:
            lines.append(
                f"| {label} | {mechanism} | {backend} | — | — | — | — | {diverged}/{len(g)} |"
            )
            continue
        diff = (
            "—"
            if mechanism == "none"
            else format_difference(paired_difference(both["c_index"], both["c_index_base"]))
        )
        eps = "∞" if mechanism == "none" else mean_std(g["epsilon"].dropna())
        z = "—" if g["realised_z_last"].isna().all() else f"{g['realised_z_last'].mean():.3f}"
        lines.append(
            f"| {label} | {mechanism} | {backend} | {eps} | {z} | "
            f"{mean_std(g['c_index'].dropna())} | {diff} | {diverged}/{len(g)} |"
        )
    table = "\n".join(lines)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, kind in zip(axes, ("client-level", "DP-SGD")):
        for label in PROTOCOLS:
            sel = runs[
                (runs["protocol"] == label)
                & runs["mechanism"].str.startswith(kind)
                & ~runs["mechanism"].str.contains("clip only")
                & (runs["backend"] == "plain")
            ]
            sel = sel.dropna(subset=["c_index"])
            if sel.empty:
                continue
            pts = (
                sel.groupby("mechanism")
                .agg(eps=("epsilon", "mean"), mean=("c_index", "mean"), std=("c_index", "std"))
                .sort_values("eps")
            )
            ax.errorbar(
                pts["eps"], pts["mean"], yerr=pts["std"], marker="o", capsize=3, label=label
            )
            none = runs[(runs["protocol"] == label) & (runs["mechanism"] == "none")]
            ax.axhline(none["c_index"].mean(), ls="--", lw=0.8, color=ax.lines[-1].get_color())
        if ax.lines:
            ax.set_xscale("log")
        else:
            ax.text(0.5, 0.5, "every run diverged", ha="center", transform=ax.transAxes)
        ax.set_xlabel("ε at δ = 1e-5 (log)")
        ax.set_title(f"{kind} DP (dashed: no DP)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel(f"pooled test c-index (mean ± std, {n_seeds} seeds)")
    fig.tight_layout()
    fig.savefig(out / "dp_tcga.png", dpi=120)
    note = (
        f" It ran {len(rows) - kept} runs and kept the {kept} rows of the arms it did not run "
        "from the previous dp_tcga_runs.csv (`--reuse`); `secagg bench dp_tcga --check` re-runs "
        "some of those."
        if kept
        else ""
    )
    (out / "dp_tcga.md").write_text(
        f"# Privacy–utility on Fed-TCGA-BRCA ({n_seeds} seeds, 5 rounds)\n\n"
        f"{made_by(command(args))}{note}\n\n"
        f"Client-level clip C = {CLIP}; DP-SGD per-sample clip {DP_SGD_CLIP:g} (clip-only "
        f"rows: noise 0.01, so their ε is meaningless); ε is the worst client's for DP-SGD "
        "and, for client-level DP, that of the sums a server sees (ckks), each round's releases "
        "accounted as one mechanism (LARC's Ĝ and update share the same noised uploads; "
        f"`benchmarks.dp_epsilon_joint` sets it beside the per-release ε).\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
