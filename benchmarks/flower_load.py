"""secagg over Flower under load: does any message get lost when the machine is busy?

Runs LARC on ckks (Fed-TCGA-BRCA, 6 SuperNodes, TLS and node authentication, the warm
executor) for many rounds while ``--burners`` processes spin on the CPU, and counts what a
lost message would show: a client excluded from a round (its reply missed the per-message
timeout, or Flower answered with an error), a round without an update, an aborted seed,
requests without a reply in Flower's framing counts. Reports the machine's load average
while it ran (1-minute, sampled every 5 s) and the seconds per round.

    python -m benchmarks.flower_load --rounds 20 --burners 8 --out benchmarks/results --overwrite
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import threading
import time
from pathlib import Path

import pandas as pd

from benchmarks.reproduce import made_by

OUTPUTS = ("flower-load.md",)
#: why ``secagg bench flower_load --check`` has nothing to re-run
NO_CHECK = (
    "a local Flower deployment's times and lost messages under load: no tolerance makes "
    "them a check (tests/test_flower_e2e.py runs the deployment)"
)


def burn(stop) -> None:  # a busy process: the load the run competes with
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def main(argv: list[str] | None = None) -> None:
    from benchmarks.options import output_folder, positive

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=20)
    parser.add_argument(
        "--burners", type=int, default=8, help="busy processes beside the run (default 8)"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="secagg's per-message timeout (s)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "flower-load", OUTPUTS, args.overwrite)

    from secagg.flower.deployment import prepare
    from secagg.flower.launch import LocalFederation
    from secagg.runspec.config import ExperimentConfig

    config = ExperimentConfig(
        task="tcga-brca", protocol="larc", backend="ckks", rounds=args.rounds, seeds=[3],
        local_steps=5,
    )  # fmt: skip
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="flower-load-"))  # the deployment and its run
    prepare(work / "deployment", config, tls=True, auth=True)
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,)) for _ in range(args.burners)]
    loads: list[float] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(5.0):
            loads.append(os.getloadavg()[0])

    started = time.perf_counter()
    for b in burners:
        b.start()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        time.sleep(30)  # let the load average climb before the run starts
        with LocalFederation(work / "deployment", log=print) as federation:
            run_id = federation.submit(out=str(work / "run"), timeout=args.timeout)
            status = federation.wait(run_id, 7200)
    finally:
        sampling.set()
        stop.set()
        for b in burners:
            b.join(10)
    minutes = (time.perf_counter() - started) / 60
    run = work / "run"
    metrics = pd.read_csv(run / "metrics.csv")
    rounds = metrics[metrics["round"] > 0]
    summary = json.loads((run / "audit_summary.json").read_text())
    flower = json.loads((run / "flower.json").read_text())
    framing = flower["framing"]
    exclusions = summary.get("exclusions", [])
    lost = framing["messages_sent"] - framing["messages_received"]
    lines = [
        "# secagg over Flower under load",
        "",
        made_by(
            f"python -m benchmarks.flower_load --rounds {args.rounds} --burners "
            f"{args.burners} --timeout {args.timeout:g}"
        )
        + f" It took {minutes:.1f} minutes.",
        "",
        f"Setting: larc on ckks, tcga-brca (6 SuperNodes as separate processes on loopback, "
        f"TLS and node authentication, the warm executor), {args.rounds} rounds, seed 3, 5 "
        f"local steps, a per-message timeout of {args.timeout:g} s; {args.burners} busy "
        "processes spinning beside it from 30 s before the run to its end.",
        "",
        f"- Flower run status: **{status}**",
        f"- load average (1 min) while it ran: median **{statistics.median(loads):.1f}**, "
        f"max {max(loads):.1f} ({len(loads)} samples, every 5 s)"
        if loads
        else "- load average: not sampled",
        f"- rounds completed: **{len(rounds)} of {args.rounds}**, clients per round "
        f"{sorted(set(rounds['clients'].astype(int)))}, rounds without an update: "
        f"{int(rounds['skipped'].sum())}",
        f"- exclusions (a client whose reply was missing or failed): **{len(exclusions)}**"
        + "".join(f"\n    - round {e['round']}: {e['peer']}: {e['reason']}" for e in exclusions),
        f"- requests without a reply (Flower's framing counts, {framing['messages_sent']} "
        f"sent): **{lost}**",
        f"- aborted seeds: {flower['aborted'] or 'none'}",
        f"- seconds per round: median {rounds['seconds_round'].median():.2f}, max "
        f"{rounds['seconds_round'].max():.2f}",
        "",
    ]
    (out / "flower-load.md").write_text("\n".join(lines))
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
