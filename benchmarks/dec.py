"""Federated DEC (GenoMed4All D6.2 §7.3–7.4) against centralised and per-client DEC.

Per dataset and seed, the same pipeline (autoencoder pre-training, k-means on its
embedding, KL(P ‖ Q) refinement) three ways, all through the engine on ``plain``:

- federated: every client, FedAvg pre-training, k-means by protected sums, averaged
  refinement (protocol ``dec``);
- centralised: every client's points pooled on one client (the same code, one client);
- per-client: each client alone, on its own points (mean over the clients).

Scored on the pooled training points (every client's: clustering is transductive) and the
held-out points, by DEC's accuracy (Hungarian matching), NMI and ARI against the labels, at
the k-means initialisation (round 0) and after the refinement. Every seed also runs
federated on ckks ("federated (ckks)"), paired with plain: on digits the two drift apart
(the pre-stage's local Adam turns CKKS's 1e-7 differences into lr-sized steps, and k-means
is discontinuous), so parity there is a matter of distributions, not of models.

    python -m benchmarks.dec --seeds 10 --out benchmarks/results

Writes dec_runs.csv (one row per dataset, seed, method and client) and dec.md from it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
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

OUTPUTS = ("dec.md", "dec_runs.csv")
DATASETS = (("digits", "niid1"), ("breast-cancer", "label"))
SETTINGS = {"rounds": 10, "local_steps": 20, "batch_size": 32}
OPTIONS = {"pretrain_rounds": 20}
#: ``--methods`` names: the runs' ``method`` (the per-client runs are one per client)
METHODS = {
    "federated": "federated",
    "centralised": "centralised",
    "per-client": "per-client",
    "federated-ckks": "federated (ckks)",
}
SCORES = ("acc_init_own", "acc_train", "nmi_train", "ari_train", "acc_test", "nmi_test", "ari_test")
#: ``secagg bench dec --check``: seed 0 of both datasets, federated, centralised and each
#: client alone, on plain
CHECK = Check(
    args=("--seeds", "1", "--methods", "federated,centralised,per-client"),
    csv="dec_runs.csv",
    keys=("dataset", "seed", "method", "backend", "client"),
    columns=dict.fromkeys(SCORES, 4.0),
    spread_over="seed",
    why="plain DEC is bit for bit per seed on one machine (one torch thread), but its "
    "float32 clustering is chaotic across CPUs: the same seed moved 72 of 126 scores, a "
    f"client's accuracy by up to 0.063, between {CROSS_CPU}, as another seed would (2.1 standard "
    "deviations at most); so each fresh score must lie within 4 standard deviations of its "
    "row's 10 committed seeds",
)


def scores(task_name: str, params: np.ndarray, dataset: str, split: str) -> dict[str, float]:
    """ACC / NMI / ARI of the model's hard assignments on the pooled train and test points."""
    import torch
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from secagg.clients.tasks import dec as tasks_dec
    from secagg.clients.training import set_flat_params
    from secagg.protocols.dec import clustering_accuracy

    data = tasks_dec.load(dataset, split, only=-1)
    model = tasks_dec.make_model(dataset)
    set_flat_params(model, params)
    out = {}
    for where, part in (("train", data.train[0]), ("test", data.pooled_test)):
        with torch.no_grad():
            clusters = model(part.x).numpy().argmax(axis=1)
        labels = part.y.numpy().ravel()
        out[f"acc_{where}"] = clustering_accuracy(labels, clusters)
        out[f"nmi_{where}"] = normalized_mutual_info_score(labels, clusters)
        out[f"ari_{where}"] = adjusted_rand_score(labels, clusters)
    return out


def run(task_name: str, seed: int, backend: str = "plain") -> tuple[np.ndarray, float]:
    """(final model, cluster accuracy of the k-means initialisation on its own points)."""
    from secagg.runspec.config import ExperimentConfig
    from secagg.server.audit import AuditLog
    from secagg.simulation.experiment import run_seed

    config = ExperimentConfig(
        task=task_name, protocol="dec", backend=backend, protocol_options=OPTIONS, **SETTINGS
    ).validate()
    result = run_seed(config, seed, AuditLog())
    if result.aborted:
        raise RuntimeError(f"{task_name} seed {seed} aborted: {result.aborted}")
    return result.final_params, float(result.rows[0]["train_pooled"])


def command(args: argparse.Namespace, out: Path | None) -> str:
    """The complete command that regenerates this run's outputs (in ``out``)."""
    if args.report_only is not None:
        argv = ["--report-only", str(args.report_only)]
    else:
        argv = ["--seeds", str(args.seeds), "--datasets", args.datasets]
        argv += ["--methods", args.methods, "--out", shown_path(out)]
        if args.overwrite:
            argv.append("--overwrite")
    return "python -m benchmarks.dec " + shlex.join(argv)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive, default=10, help="seeds per dataset")
    parser.add_argument(
        "--datasets",
        default=",".join(f"{d}-{s}" for d, s in DATASETS),
        help="comma-separated, of " + ", ".join(f"{d}-{s}" for d, s in DATASETS),
    )
    parser.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated, of {list(METHODS)}"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="RUNS_CSV",
        help="rebuild dec.md from an earlier run's dec_runs.csv (no training)",
    )
    args = parser.parse_args(argv)
    datasets = [(d, s) for d, s in DATASETS if f"{d}-{s}" in args.datasets.split(",")]
    methods = args.methods.split(",")
    if len(datasets) != len(args.datasets.split(",")) or set(methods) - set(METHODS):
        parser.error(
            f"datasets from {[f'{d}-{s}' for d, s in DATASETS]}, methods from {list(METHODS)}"
        )
    if args.report_only is not None:
        frame = pd.read_csv(args.report_only)
        text = report(frame, int(frame["seed"].nunique()), made_by(command(args, None)))
        (args.report_only.parent / "dec.md").write_text(text)
        print(text)
        return
    out = output_folder(parser, args.out, "dec", OUTPUTS, args.overwrite)
    provenance = made_by(command(args, out))

    import torch

    from secagg.clients.tasks import dec as tasks_dec
    from secagg.clients.tasks import dec_task, register_task

    torch.set_num_threads(1)
    rows: list[dict] = []
    for dataset, split in datasets:
        n_clients = tasks_dec.load(dataset, split).n_clients
        variants: dict[str, int | None] = {"federated": None, "centralised": -1}
        variants.update({f"client {c}": c for c in range(n_clients)})
        variants["federated (ckks)"] = None
        chosen = [METHODS[m] for m in methods]
        variants = {
            k: v
            for k, v in variants.items()
            if k in chosen or (k.startswith("client") and "per-client" in chosen)
        }
        for only in variants.values():
            if only is not None:
                register_task(dec_task(dataset, split, only).name, dec_task(dataset, split, only))
        for seed in range(args.seeds):
            for name, only in variants.items():
                task_name = dec_task(dataset, split, only).name
                start = time.perf_counter()
                params, init_acc = run(task_name, seed, "ckks" if "ckks" in name else "plain")
                row = {
                    "dataset": f"{dataset}-{split}",
                    "seed": seed,
                    "method": "per-client" if name.startswith("client") else name,
                    "backend": "ckks" if "ckks" in name else "plain",
                    "client": only if name.startswith("client") else -1,
                    "acc_init_own": init_acc,
                    **scores(task_name, params, dataset, split),
                    "seconds": time.perf_counter() - start,
                }
                rows.append(row)
                print(
                    f"{dataset}-{split} seed {seed} {name}: acc {row['acc_train']:.3f} "
                    f"(k-means init {init_acc:.3f}) nmi {row['nmi_train']:.3f} "
                    f"{row['seconds']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            pd.DataFrame(rows).to_csv(out / "dec_runs.csv", index=False)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "dec_runs.csv", index=False)
    (out / "dec.md").write_text(report(frame, args.seeds, provenance))
    print((out / "dec.md").read_text())


def report(frame: pd.DataFrame, seeds: int, provenance: str) -> str:
    per_seed = (
        frame.groupby(["dataset", "method", "seed"], sort=False)
        .mean(numeric_only=True)
        .reset_index()
    )
    lines = [
        "# Federated DEC against centralised and per-client DEC",
        "",
        provenance,
        "",
        f"Mean ± SD over {seeds} seeds (per-client: each client's DEC, averaged over the "
        "clients first). ACC: DEC's clustering accuracy (Hungarian matching of clusters to "
        "labels), on every client's training points (train) and the held-out points (test); "
        "`acc k-means init`: the accuracy after k-means on the pre-trained embedding, before "
        "the KL refinement, on the points that run clustered (its own). Settings: "
        f"{SETTINGS}, DEC options {OPTIONS} (otherwise the protocol's defaults).",
        "",
    ]
    metrics = ["acc_init_own", "acc_train", "nmi_train", "ari_train", "acc_test", "nmi_test"]
    table = []
    for (dataset, method), group in per_seed.groupby(["dataset", "method"], sort=False):
        table.append(
            {
                "dataset": dataset,
                "method": method,
                **{m.replace("_own", "").replace("_", " "): mean_std(group[m]) for m in metrics},
            }
        )
    lines += [markdown_table(pd.DataFrame(table)), "", "Paired differences (95 % interval):", ""]
    for dataset, group in per_seed.groupby("dataset", sort=False):
        wide = group.pivot(index="seed", columns="method")
        if "federated" not in wide["acc_train"]:
            continue
        for other in ("centralised", "per-client", "federated (ckks)"):
            if other not in wide["acc_train"]:
                continue
            for metric in ("acc_train", "nmi_train"):
                d = paired_difference(wide[metric]["federated"], wide[metric][other])
                lines.append(f"- {dataset}: federated − {other}, {metric}: {format_difference(d)}")
        d = paired_difference(wide["acc_train"]["federated"], wide["acc_init_own"]["federated"])
        lines.append(
            f"- {dataset}: federated, refined − k-means init, acc_train: {format_difference(d)}"
        )
    lines += [
        "",
        'Findings (the report, §7.4.2: federating DEC over equal splits shows "no '
        'significant loss of clustering quality"):',
        "",
    ]
    for dataset, group in per_seed.groupby("dataset", sort=False):
        wide = group.pivot(index="seed", columns="method")
        if not {"federated", "centralised", "per-client"} <= set(wide["acc_train"]):
            continue
        loss = paired_difference(wide["acc_train"]["federated"], wide["acc_train"]["centralised"])
        gain = paired_difference(wide["acc_train"]["federated"], wide["acc_train"]["per-client"])
        refine = paired_difference(
            wide["acc_train"]["federated"], wide["acc_init_own"]["federated"]
        )
        verdict = (
            "no significant loss against centralised DEC (the report's finding holds)"
            if clear_sign(loss) == 0
            else f"a {'loss' if loss['mean_diff'] < 0 else 'gain'} of "
            f"{abs(loss['mean_diff']):.3f} against centralised DEC (its interval excludes 0)"
        )
        lines.append(
            f"- {dataset}: {verdict}; {gain['mean_diff']:+.3f} over each client's own DEC; "
            f"the KL refinement {'raises' if refine['mean_diff'] > 0 else 'lowers'} the "
            f"accuracy of its k-means start by {abs(refine['mean_diff']):.3f} "
            f"({format_difference(refine)})."
        )
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
