"""secagg over Flower against the same run in process: wall time and bytes per round.

Runs the same experiment (default: LARC on ckks, Fed-TCGA-BRCA, 2 rounds, one seed) in
process and on a local Flower deployment (a SuperLink and 6 SuperNodes as separate
processes on loopback, TLS and SuperNode authentication on), alternating in pairs so the
ratio does not ride on the machine's load drifting. Reports per round: wall seconds (the
engine's own timer, the same code in both), the envelopes' bytes (what secagg counts: the
same messages), and Flower's framing per message (``secagg.flower.messages.framing_bytes``:
header, object tree and per-object serialisation, without gRPC/HTTP2 framing).

    python -m benchmarks.flower --pairs 2 --out benchmarks/results --overwrite
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import pandas as pd

from benchmarks.options import output_folder, positive

OUTPUTS = ("flower.md", "flower.csv")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=positive, default=2)
    parser.add_argument("--rounds", type=positive, default=2)
    parser.add_argument("--protocol", default="larc")
    parser.add_argument("--backend", default="ckks")
    parser.add_argument(
        "--executors",
        default="warm,cold",
        help="the SuperNodes' executors to run, in each pair: warm (secagg.flower.warm) "
        "and/or cold (Flower's own: a fresh ClientApp process per message)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "flower", OUTPUTS, args.overwrite)

    import secagg
    from secagg.flower.deployment import prepare
    from secagg.flower.launch import LocalFederation
    from secagg.simulation.config import ExperimentConfig

    config = ExperimentConfig(
        task="tcga-brca",
        protocol=args.protocol,
        backend=args.backend,
        rounds=args.rounds,
        seeds=[3],
        local_steps=5,
    )
    work = out / "flower-work"
    shutil.rmtree(work, ignore_errors=True)
    rows, framing = [], []
    started = time.perf_counter()
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    if not executors or set(executors) - {"warm", "cold"}:
        parser.error(f"--executors: warm and/or cold, got {args.executors!r}")
    for pair in range(1, args.pairs + 1):
        inproc = work / f"in-process-{pair}"
        secagg.run(config, out=inproc)
        rows += _rounds(inproc, "in-process", pair)
        for executor in executors:
            folder = work / f"deployment-{pair}-{executor}"
            prepare(folder, replace(config), tls=True, auth=True)
            with LocalFederation(folder, log=print, warm=executor == "warm") as federation:
                status = federation.run(out=folder / "results", timeout=3600)
            if status != "finished:completed":
                raise SystemExit(f"the Flower run ended {status}; see {folder}/local")
            rows += _rounds(folder / "results", f"flower-{executor}", pair)
            counts = json.loads((folder / "results" / "flower.json").read_text())["framing"]
            framing.append({"pair": pair, "executor": executor, **counts})
        print(f"pair {pair} done after {time.perf_counter() - started:.0f} s", flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "flower.csv", index=False)
    (out / "flower.md").write_text(
        report(table, pd.DataFrame(framing), config, time.perf_counter() - started, executors)
    )
    print((out / "flower.md").read_text())
    shutil.rmtree(work, ignore_errors=True)


def _rounds(folder: Path, transport: str, pair: int) -> list[dict]:
    metrics = pd.read_csv(folder / "metrics.csv")
    metrics = metrics[metrics["round"] > 0]
    return [
        {
            "pair": pair,
            "transport": transport,
            "round": int(r["round"]),
            "wall_s": float(r["seconds_round"]),
            "bytes_up": int(r["bytes_up"]),
            "bytes_down": int(r["bytes_down"]),
        }
        for _, r in metrics.iterrows()
    ]


def report(
    table: pd.DataFrame, framing: pd.DataFrame, config, seconds: float, executors: list[str]
) -> str:
    from benchmarks.overhead import machine

    wall = table.pivot_table(index=["pair", "round"], columns="transport", values="wall_s")
    flowers = [c for c in wall.columns if c.startswith("flower-")]
    extra = {c: (wall[c] - wall["in-process"]).tolist() for c in flowers}
    ratios = {c: (wall[c] / wall["in-process"]).tolist() for c in flowers}
    per_pair = table.groupby(["pair", "transport"])[["wall_s", "bytes_up", "bytes_down"]].mean()
    m = machine()
    sent = framing["bytes_sent"].sum() / framing["messages_sent"].sum()
    received = framing["bytes_received"].sum() / framing["messages_received"].sum()
    messages_per_round = framing["messages_sent"].sum() / (len(framing) * config.rounds)
    pairs = int(table["pair"].max())
    flower_rows = table[table["transport"].str.startswith("flower")]
    envelope_bytes = flower_rows[["bytes_up", "bytes_down"]].sum(axis=1)
    share = (sent + received) * messages_per_round / envelope_bytes.mean()
    lines = [
        "# secagg over Flower vs in process",
        "",
        f"Generated by `python -m benchmarks.flower --pairs {pairs} --rounds "
        f"{config.rounds} --executors {','.join(executors)}` in "
        f"{seconds / 60:.1f} minutes. Machine: {m['cpu']}, {m['cores']} "
        f"cores, {m['memory']}, Python {m['python']}, flwr {version('flwr')}.",
        "",
        f"Setting: {config.protocol} on {config.backend}, {config.task} (6 clients), "
        f"{config.rounds} rounds, seed {config.seeds[0]}, {config.local_steps} local steps. "
        "Flower: a SuperLink and 6 SuperNodes as separate processes on loopback, TLS and "
        "SuperNode authentication on; every message runs in a ClientApp process of its own. "
        "flower-cold: Flower's own executor (a fresh `flwr-clientapp` process per message, "
        "the SuperNode polling the SuperLink every 3 s); flower-warm: secagg's "
        "(`secagg.flower.warm`: each message's process forked from one that imported "
        "everything once, 0.2 s polls). In each pair the runs go in-process, then each "
        "executor, one after another on the same machine.",
        "",
        "## Wall time per round (the engine's timer)",
        "",
        *(
            f"- {c}: {', '.join(f'{e:+.1f}' for e in extra[c])} s per round over in-process "
            f"(median **{statistics.median(extra[c]):+.1f} s**, "
            f"{statistics.median(ratios[c]):.0f}× the in-process round)"
            for c in flowers
        ),
        "",
        "| pair | transport | wall s/round | envelope bytes up/round | down/round |",
        "|---|---|---|---|---|",
        *(
            f"| {p} | {t} | {r.wall_s:.2f} | {r.bytes_up:.0f} | {r.bytes_down:.0f} |"
            for (p, t), r in per_pair.iterrows()
        ),
        "",
        "## Bytes",
        "",
        "secagg counts the envelopes, which are the same messages in both transports (the "
        "ckks envelopes' sizes vary by a few hundred bytes from run to run: SEAL compresses "
        "ciphertexts whose content is random).",
        "",
        f"- Flower's framing: **{sent:.0f} B per request**, **{received:.0f} B per reply** "
        f"(header, object tree and per-object serialisation; gRPC/HTTP2 framing not "
        f"included), {messages_per_round:.0f} requests per round: "
        f"{100 * share:.2f}% on top of the envelopes.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
