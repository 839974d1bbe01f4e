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
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from benchmarks.dp_tcga import BASE, CLIP, NOISES
from benchmarks.stats import run_complete  # noqa: E402
from secagg.simulation.cli import parse_seeds
from secagg.simulation.privacy import client_level_epsilon

DELTA = 1e-5


def epsilons(events: list[dict]) -> dict[str, float]:
    def eps(multipliers):
        return client_level_epsilon([{"noise_multiplier": z} for z in multipliers], DELTA)

    return {
        "eps_per_release": eps(z for e in events for z in e["per_release_multipliers"]),
        "eps_joint": eps(e["sums_multiplier"] for e in events),
        "eps_per_upload": eps(e["noise_multiplier"] for e in events),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = []
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
            print(f"{protocol} z* {z}: done", flush=True)
    runs = pd.DataFrame(rows)
    table = runs.groupby(["protocol", "z_star"])[
        ["eps_per_release", "eps_joint", "eps_per_upload"]
    ].agg(["mean", "max"])
    args.out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out / "dp_epsilon_joint_runs.csv", index=False)
    table.round(2).to_csv(args.out / "dp_epsilon_joint.csv")
    print(table.round(1).to_string())


if __name__ == "__main__":
    main()
