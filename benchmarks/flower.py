"""secagg over Flower against the same run in process: wall time and bytes per round.

Runs the same experiment in process and on a local Flower deployment (a SuperLink and 6
SuperNodes as separate processes on loopback, TLS and SuperNode authentication on),
alternating in pairs so the comparison does not ride on the machine's load drifting. Cases
(``--cases``):

- ``larc``: LARC on ckks (its default preset), Fed-TCGA-BRCA, 5 local steps: a round of
  many small messages (the target: at most 3 s more per round than in process);
- ``fedavg-1m``: FedAvg on ckks ``lean``, an MLP 64-962-962-10 (998,566 parameters) on
  scikit-learn's digits dealt IID to 6 clients, 2 local steps: a round of few large
  messages (the target: at most 1.5 times the in-process round). The task is defined in a
  module this benchmark writes into its work folder (:data:`TASK_MODULE`), which the run,
  the ServerApp and every node import.

Reports per round: wall seconds (the engine's own timer, the same code in both), per phase
(the engine's phase timers in metrics.csv), the envelopes' bytes (what secagg counts: the
same messages), Flower's framing per message (``secagg.flower.messages.framing_bytes``:
header, object tree and per-object serialisation, without HTTP framing), and after each
Flower run what Flower itself counted of the run's traffic (``flwr ls``'s network-traffic:
the SuperLink's Fleet API, to and from the nodes) beside secagg's count of the same run.

    python -m benchmarks.flower --pairs 2 --out benchmarks/results --overwrite
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.reproduce import made_by

OUTPUTS = ("flower.md", "flower.csv")
#: why ``secagg bench flower --check`` has nothing to re-run
NO_CHECK = (
    "a local Flower deployment's times per round: no tolerance makes them a check "
    "(tests/test_flower_e2e.py runs the deployment)"
)
CASES = ("larc", "fedavg-1m")
#: the module that defines the fedavg-1m case's task, written into the work folder
TASK_MODULE = "secagg_flower_bench_task.py"
TASK_NAME = "flower-bench-mlp"
TASK_SOURCE = '''"""The task of secagg's Flower benchmark, written by benchmarks/flower.py (the
in-process run, the ServerApp and every node import it): an MLP 64-h-h-10 of about 1e6
parameters on scikit-learn's digits, dealt IID to 6 clients."""

import numpy as np
import torch
from torch import nn

from secagg.clients.tasks import TASKS, Task, register_task
from secagg.clients.tasks.digits import accuracy, cross_entropy
from secagg.clients.tasks.tcga_brca import ClientData, FederatedData

NAME, WIDTH, CLIENTS = "flower-bench-mlp", 962, 6


def load() -> FederatedData:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16).astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(y.size)
    test, train = order[:360], order[360:]

    def part(idx):
        return ClientData(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    return FederatedData(
        name="digits-iid6",
        train=[part(train[k::CLIENTS]) for k in range(CLIENTS)],
        test=None,
        pooled_test=part(test),
    )


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)
    )


if NAME not in TASKS:
    register_task(
        NAME,
        Task(
            NAME,
            f"MLP 64-{WIDTH}-{WIDTH}-10 on digits, IID over {CLIENTS} clients",
            load,
            make_model,
            cross_entropy,
            accuracy,
            "accuracy",
        ),
    )
'''
#: the targets of the issue "A deployment hospitals could run"
LARC_TARGET_S, FEDAVG_TARGET_RATIO = 3.0, 1.5


def case_config(case: str, rounds: int, work: Path):
    """The experiment of a case (``work``: where the fedavg-1m task's module is written)."""
    from secagg.runspec.config import ExperimentConfig

    if case == "larc":
        return ExperimentConfig(
            task="tcga-brca", protocol="larc", backend="ckks", rounds=rounds, seeds=[3],
            local_steps=5,
        )  # fmt: skip
    if case == "fedavg-1m":
        module = work / TASK_MODULE
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(TASK_SOURCE)
        return ExperimentConfig(
            task=TASK_NAME, protocol="fedavg", backend="ckks",
            backend_options={"preset": "lean"}, rounds=rounds, seeds=[3], local_steps=2,
            imports=[str(module.resolve())],
        )  # fmt: skip
    raise ValueError(f"unknown case {case!r}")


def main(argv: list[str] | None = None) -> None:
    from benchmarks.options import output_folder, positive

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=positive, default=2)
    parser.add_argument("--rounds", type=positive, default=2)
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"which cases, in each pair: {', '.join(CASES)}"
    )
    parser.add_argument(
        "--executors",
        default="warm",
        help="the SuperNodes' executors to run, in each pair: warm (secagg.flower.warm) "
        "and/or cold (Flower's own: a fresh ClientApp process per message)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "flower", OUTPUTS, args.overwrite)
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    if not executors or set(executors) - {"warm", "cold"}:
        parser.error(f"--executors: warm and/or cold, got {args.executors!r}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - set(CASES):
        parser.error(f"--cases: some of {', '.join(CASES)}, got {args.cases!r}")

    import secagg
    from secagg.flower.deployment import prepare
    from secagg.flower.launch import LocalFederation

    work = out / "flower-work"
    shutil.rmtree(work, ignore_errors=True)
    configs = {case: case_config(case, args.rounds, work) for case in cases}
    rows: list[dict] = []
    runs: list[dict] = []
    started = time.perf_counter()
    for pair in range(1, args.pairs + 1):
        for case, config in configs.items():
            inproc = work / f"{case}-in-process-{pair}"
            secagg.run(config, out=inproc)
            rows += _rounds(inproc, case, "in-process", pair)
            runs.append(_run_bytes(inproc, case, "in-process", pair))
            for executor in executors:
                folder = work / f"{case}-deployment-{pair}-{executor}"
                prepare(folder, replace(config), tls=True, auth=True)
                with LocalFederation(folder, log=print, warm=executor == "warm") as federation:
                    status = federation.run(out=folder / "results", timeout=3600)
                    if status != "finished:completed":
                        raise SystemExit(f"the Flower run ended {status}; see {folder}/local")
                    assert federation.run_id is not None
                    counted = federation.traffic(federation.run_id)
                transport = f"flower-{executor}"
                rows += _rounds(folder / "results", case, transport, pair)
                framing = json.loads((folder / "results" / "flower.json").read_text())["framing"]
                runs.append(
                    {
                        **_run_bytes(folder / "results", case, transport, pair),
                        **framing,
                        "flwr_inbound": counted["inbound-bytes"],
                        "flwr_outbound": counted["outbound-bytes"],
                    }
                )
            elapsed = time.perf_counter() - started
            print(f"pair {pair} {case} done after {elapsed:.0f} s", flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "flower.csv", index=False)
    command = (
        f"python -m benchmarks.flower --pairs {args.pairs} --rounds {args.rounds} "
        f"--cases {','.join(cases)} --executors {','.join(executors)}"
    )
    (out / "flower.md").write_text(
        report(table, pd.DataFrame(runs), configs, time.perf_counter() - started, command)
    )
    print((out / "flower.md").read_text())
    shutil.rmtree(work, ignore_errors=True)


def _rounds(folder: Path, case: str, transport: str, pair: int) -> list[dict]:
    """One row per round: wall seconds, the engine's phase timers, the envelopes' bytes."""
    metrics = pd.read_csv(folder / "metrics.csv")
    metrics = metrics[metrics["round"] > 0]
    phases = [c for c in metrics.columns if c.startswith("seconds_") and c != "seconds_round"]
    return [
        {
            "case": case,
            "pair": pair,
            "transport": transport,
            "round": int(r["round"]),
            "wall_s": float(r["seconds_round"]),
            "bytes_up": int(r["bytes_up"]),
            "bytes_down": int(r["bytes_down"]),
            **{f"phase_{c.removeprefix('seconds_')}_s": float(r[c]) for c in phases},
        }
        for _, r in metrics.iterrows()
    ]


def _run_bytes(folder: Path, case: str, transport: str, pair: int) -> dict[str, Any]:
    """secagg's count of a whole run's envelopes (traffic.csv: setup and every round), up
    (to the server) and down."""
    traffic = pd.read_csv(folder / "traffic.csv")
    by = traffic.groupby("direction")["bytes"].sum()
    return {
        "case": case,
        "pair": pair,
        "transport": transport,
        "envelopes_up": int(by.get("up", 0)),
        "envelopes_down": int(by.get("down", 0)),
    }


def _phase_table(table: pd.DataFrame) -> list[str]:
    phases = [c for c in table.columns if c.startswith("phase_") and table[c].notna().any()]
    transports = sorted(table["transport"].unique(), key=lambda t: (t != "in-process", t))
    medians = table.groupby("transport")[["wall_s", *phases]].median()
    names = [p.removeprefix("phase_").removesuffix("_s") for p in phases]
    lines = [
        "| transport | round | " + " | ".join(names) + " |",
        "|---|---" + "|---" * len(names) + "|",
    ]
    for t in transports:
        r = medians.loc[t]
        lines.append(
            f"| {t} | {r['wall_s']:.2f} | " + " | ".join(f"{r[p]:.2f}" for p in phases) + " |"
        )
    return lines


def report(
    table: pd.DataFrame, runs: pd.DataFrame, configs: dict, seconds: float, command: str
) -> str:
    from benchmarks.overhead import machine

    m = machine()
    lines = [
        "# secagg over Flower vs in process",
        "",
        made_by(command) + f" It took {seconds / 60:.1f} minutes on {m['cpu']}, {m['memory']}.",
        "",
        "Flower: a SuperLink and 6 SuperNodes as separate processes on loopback, TLS and "
        "SuperNode authentication on; every message runs in a ClientApp process of its own. "
        "flower-warm: secagg's executor (`secagg.flower.warm`: each message's process forked "
        "from one that imported everything and built the node's CKKS parameters once, the "
        "SuperNode waking it as it stores a task; the SuperNode polls the SuperLink every "
        "0.2 s and its own state for a reply every 20 ms; every Flower process asks again "
        "for a message's object that has not arrived after 50 ms rather than 1 s); "
        "an envelope of 1 MiB or more travels as a Flower Array (5 MB chunks, each hashed "
        "once), a smaller one as bytes in a ConfigRecord (`secagg.flower.messages`); "
        "flower-cold: Flower's own executor (a fresh `flwr-clientapp` process per message, "
        "the SuperNode polling the SuperLink every 3 s). In each pair the runs go "
        "in-process, then each executor, one after another on the same machine.",
    ]
    if not table["transport"].eq("flower-cold").any():
        lines += [
            "",
            "flower-cold was not run (`--executors warm`): Flower's own executor costs about "
            "+100 s per LARC round on this machine (the previous run of this benchmark), "
            "which would make the whole run take most of an hour.",
        ]
    for case, config in configs.items():
        rows = table[table["case"] == case]
        wall = rows.pivot_table(index=["pair", "round"], columns="transport", values="wall_s")
        flowers = [c for c in wall.columns if c.startswith("flower-")]
        extra = {c: (wall[c] - wall["in-process"]).tolist() for c in flowers}
        ratio = {c: (wall[c] / wall["in-process"]).tolist() for c in flowers}
        size = "998,566-parameter MLP" if case == "fedavg-1m" else "Cox model"
        preset = config.resolved_backend_options()["preset"]
        lines += [
            "",
            f"## {case}: {config.protocol} on {config.backend} `{preset}`, {config.task} "
            f"({size}, 6 clients), {config.rounds} rounds, seed {config.seeds[0]}, "
            f"{config.local_steps} local steps",
            "",
            "Wall time per round (the engine's timer):",
            "",
            *(
                f"- {c}: {', '.join(f'{e:+.1f}' for e in extra[c])} s per round over "
                f"in-process (median **{statistics.median(extra[c]):+.1f} s**, "
                f"**{statistics.median(ratio[c]):.2f}×** the in-process round)"
                for c in flowers
            ),
            "- target: "
            + (
                f"at most +{LARC_TARGET_S:g} s per round"
                if case == "larc"
                else f"at most {FEDAVG_TARGET_RATIO:g}× the in-process round"
            ),
            "",
            "| pair | transport | wall s/round | envelope bytes up/round | down/round |",
            "|---|---|---|---|---|",
            *(
                f"| {p} | {t} | {r.wall_s:.2f} | {r.bytes_up:.0f} | {r.bytes_down:.0f} |"
                for (p, t), r in rows.groupby(["pair", "transport"])[
                    ["wall_s", "bytes_up", "bytes_down"]
                ]
                .mean()
                .iterrows()
            ),
            "",
            "Median seconds per round by phase (the engine's phase timers, metrics.csv; "
            "phases overlap where the server streams, so they need not add up to the round):",
            "",
            *_phase_table(rows),
        ]
        flown = runs[(runs["case"] == case) & runs["transport"].str.startswith("flower")]
        if len(flown):
            messages = flown["messages_sent"].sum()
            sent = flown["bytes_sent"].sum() / messages
            received = flown["bytes_received"].sum() / flown["messages_received"].sum()
            lines += [
                "",
                "Bytes of a whole run (setup and every round), per Flower run: secagg's "
                "envelopes (traffic.csv), Flower's framing around them as secagg counts it "
                "(`framing_bytes`), and what Flower's SuperLink counted (`flwr ls`: its "
                "Fleet API's protobuf messages to and from the nodes, without HTTP/TLS):",
                "",
                "| pair | transport | envelopes up | framing up | flwr inbound | ratio up "
                "| envelopes down | framing down | flwr outbound | ratio down |",
                "|---|---|---|---|---|---|---|---|---|---|",
                *(
                    f"| {r.pair} | {r.transport} | {r.envelopes_up:.0f} | "
                    f"{r.bytes_received:.0f} | {r.flwr_inbound:.0f} | "
                    f"{r.flwr_inbound / r.envelopes_up:.3f} | {r.envelopes_down:.0f} | "
                    f"{r.bytes_sent:.0f} | {r.flwr_outbound:.0f} | "
                    f"{r.flwr_outbound / r.envelopes_down:.3f} |"
                    for r in flown.itertuples()
                ),
                "",
                f"Flower's framing: **{sent:.0f} B per request**, **{received:.0f} B per "
                f"reply**, {messages / len(flown):.0f} requests per run (besides the hellos, which "
                "Flower counts and secagg does not).",
            ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
