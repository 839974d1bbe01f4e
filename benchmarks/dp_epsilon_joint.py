"""Client-level ε on Fed-TCGA-BRCA accounted three ways, from the same runs.

- per release: each released sum as an independent Gaussian mechanism (the accounting before
  issue 12: it undercounts LARC, whose Ĝ and update share the uploads' noise);
- joint: each round's releases as one mechanism (``secagg.dp.joint_noise_multiplier``),
  what a server seeing only the sums learns (ckks);
- per upload: what a server that reads every noised upload learns (plain).

Settings as ``benchmarks.dp_tcga`` (FLamby split, 5 rounds of 100 local steps, batch 8,
client lr 0.1, server Adam lr 0.01 τ 1e-3, clip 0.5), δ = 1e-5, plain backend (the weights,
and so the multipliers, are those of ckks runs: parity).

    python -m benchmarks.dp_epsilon_joint [--seeds 0-9] [--out benchmarks/results]

Writes dp_epsilon_joint_runs.csv (one row per protocol, z* and seed), dp_epsilon_joint.csv
(mean and max over seeds), dp_epsilon_joint_seeds.csv (joint and per upload, composed over
every seed's rounds: the seeds train on the same data, so this is what the study as a whole
spent), dp_epsilon_joint_dp_sgd.csv (DP-SGD's arms of ``benchmarks.dp_tcga`` at client lr
0.001, each client's ε composed over the seeds from the steps its accountant counted) and
dp_epsilon_joint.md (the tables, and how they were made).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path

import pandas as pd

from benchmarks.dp_tcga import BASE, CLIP, DP_SGD_CLIP, EPSILONS, NOISES
from benchmarks.options import output_folder
from benchmarks.reproduce import CROSS_CPU, Check, made_by, seeds_text
from benchmarks.stats import markdown_table, run_complete
from secagg.simulation.cli import parse_seeds
from secagg.simulation.privacy import client_level_epsilon, composed_epsilon
from secagg.simulation.report import dp_sgd_histories

DELTA = 1e-5
OUTPUTS = (
    "dp_epsilon_joint_runs.csv",
    "dp_epsilon_joint.csv",
    "dp_epsilon_joint_seeds.csv",
    "dp_epsilon_joint_dp_sgd.csv",
    "dp_epsilon_joint.md",
)
#: ``secagg bench dp_epsilon_joint --check``: seed 0 of every protocol and z* (about 30 s)
CHECK = Check(
    args=("--seeds", "0"),
    csv="dp_epsilon_joint_runs.csv",
    keys=("protocol", "z_star", "seed"),
    columns={"eps_per_release": (0.0, 1e-5), "eps_joint": (0.0, 1e-5), "eps_per_upload": 1e-9},
    why="the multipliers come from the clients' sizes and, for LARC, its weights of a run "
    "that seeded DP noise makes deterministic on one machine; LARC's float32 training moves "
    f"its weights, and so its epsilons by up to 1.6e-6 of their values, between {CROSS_CPU}: "
    "1e-5 relative; the accountant itself is deterministic (per upload: exact)",
)


def epsilons(events: list[dict]) -> dict[str, float]:
    def eps(multipliers):
        return client_level_epsilon([{"noise_multiplier": z} for z in multipliers], DELTA)

    return {
        "eps_per_release": eps(z for e in events for z in e["per_release_multipliers"]),
        "eps_joint": eps(e["sums_multiplier"] for e in events),
        "eps_per_upload": eps(e["noise_multiplier"] for e in events),
    }


def composed_over_seeds(events_per_seed: dict[int, list[dict]]) -> dict[str, float]:
    """The joint and the per-upload ε of every seed's rounds composed: one accountant fed
    every round of every seed (the seeds train on the same clients' data)."""
    events = [e for seed in sorted(events_per_seed) for e in events_per_seed[seed]]
    return {
        "eps_joint_composed": client_level_epsilon(
            [{"noise_multiplier": e["sums_multiplier"]} for e in events], DELTA
        ),
        "eps_per_upload_composed": client_level_epsilon(
            [{"noise_multiplier": e["noise_multiplier"]} for e in events], DELTA
        ),
    }


def dp_sgd_composed(protocol: str, target: float, seeds: list[int]) -> dict[str, object]:
    """A DP-SGD arm of ``benchmarks.dp_tcga`` (per-sample clip 100, client lr 0.001, the
    noise calibrated to ``target`` per seed): the worst client's ε in one seed, and each
    client's composed over the seeds from the (z, q, steps) its accountant counted."""
    config = replace(
        BASE,
        protocol=protocol,
        seeds=seeds,
        client_lr="0.001",
        dp_sgd={"clip": DP_SGD_CLIP, "epsilon": target},
        dp_noise="seeded",  # the same runs as dp_tcga's
    )
    result = run_complete(config)
    histories, missing = dp_sgd_histories(result.metrics, seeds)
    if missing:  # this run's clients report their steps: a gap is a bug, not a state
        raise RuntimeError(f"DP-SGD steps missing: {missing}")
    composed = [composed_epsilon(h.values(), DELTA) for h in histories.values()]
    one_seed = result.metrics.groupby("seed")["eps_dp_sgd_max"].max()
    return {
        "protocol": protocol,
        "target_epsilon": target,
        "seeds": len(seeds),
        "steps_per_seed": sorted({steps for h in histories.values() for *_, steps in h.values()}),
        "eps_one_seed_worst_client": float(one_seed.max()),
        "eps_composed_min_client": min(composed),
        "eps_composed_max_client": max(composed),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "dp_epsilon_joint", OUTPUTS, args.overwrite)
    command = shlex.join(
        [
            "python",
            "-m",
            "benchmarks.dp_epsilon_joint",
            "--seeds",
            seeds_text(args.seeds),
            "--out",
            str(args.out),
            "--overwrite",
        ]
    )
    rows, composed = [], []
    for protocol in ("fedadam", "larc"):
        for z in NOISES:
            config = replace(
                BASE,
                protocol=protocol,
                seeds=args.seeds,
                client_dp={"clip": CLIP, "noise": z},
                dp_noise="seeded",  # the same noise, so the same runs, as dp_tcga's
            )
            result = run_complete(config)
            for seed, events in result.privacy_events.items():
                rows.append({"protocol": protocol, "z_star": z, "seed": seed, **epsilons(events)})
            composed.append(
                {
                    "protocol": protocol,
                    "z_star": z,
                    "seeds": len(result.privacy_events),
                    **composed_over_seeds(result.privacy_events),
                }
            )
            print(f"{protocol} z* {z}: done", flush=True)
    dp_sgd = pd.DataFrame(
        [
            dp_sgd_composed(protocol, target, args.seeds)
            for protocol in ("fedadam", "larc")
            for target in EPSILONS
        ]
    )
    dp_sgd["steps_per_seed"] = dp_sgd["steps_per_seed"].map(lambda v: "/".join(map(str, v)))
    dp_sgd.round(2).to_csv(out / "dp_epsilon_joint_dp_sgd.csv", index=False)
    runs = pd.DataFrame(rows)
    table = runs.groupby(["protocol", "z_star"])[
        ["eps_per_release", "eps_joint", "eps_per_upload"]
    ].agg(["mean", "max"])
    runs.to_csv(out / "dp_epsilon_joint_runs.csv", index=False)
    table.round(2).to_csv(out / "dp_epsilon_joint.csv")
    seeds_table = pd.DataFrame(composed)
    seeds_table.round(2).to_csv(out / "dp_epsilon_joint_seeds.csv", index=False)
    shown = table.round(2)
    shown.columns = [f"{a} {b}" for a, b in shown.columns]
    (out / "dp_epsilon_joint.md").write_text(
        "# Client-level ε on Fed-TCGA-BRCA, accounted three ways\n\n"
        f"{made_by(command)}\n\n"
        f"{len(args.seeds)} seeds, δ = {DELTA:g}, clip {CLIP}, ε after 5 rounds (mean and max "
        "over seeds): per release (each released sum alone), joint (each round's releases as "
        "one mechanism: what a server seeing only the sums learns, ckks; the library's "
        "accounting) and per upload (a server reading every noised upload, plain).\n\n"
        + markdown_table(shown.reset_index(), floatfmt=".2f")
        + "\n\nComposed over the seeds (one accountant fed every round of every seed: the "
        "seeds train on the same clients' data, so this is what the study as a whole spent; "
        "each seed's own ε above is what one run spends):\n\n"
        + markdown_table(seeds_table, floatfmt=".2f")
        + "\n\nDP-SGD (per-sample clip "
        f"{DP_SGD_CLIP:g}, client lr 0.001, the noise calibrated per client to the target ε "
        "of one seed): the worst client's ε in one seed, and each client's ε composed over "
        "the seeds from the (noise multiplier, sampling rate, steps) its accountant counted "
        "in each (least and most over the clients):\n\n"
        + markdown_table(dp_sgd, floatfmt=".2f")
        + "\n"
    )
    print(table.round(1).to_string())


if __name__ == "__main__":
    main()
