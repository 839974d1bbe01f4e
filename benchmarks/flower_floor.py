"""The floor of Flower's own path: a Flower App that computes nothing and only echoes the
message pattern of one secagg round, against the whole secagg round in process.

Why: ``python -m benchmarks.flower`` measures secagg over a local Flower deployment against
the same run in process. Part of the difference is secagg's (its node and server work in
separate processes), part is Flower's (each message goes ServerApp -> SuperLink ->
SuperNode -> a ClientApp process and back, its objects serialised, hashed, pushed and
pulled at every hop). This benchmark measures Flower's part alone: a bare Flower App
(ServerApp + ClientApp) that this benchmark writes into its work folder sends, round after
round, the same messages as a secagg round (how many, to how many nodes, in which phases,
of which sizes: read from the in-process run's ``traffic.csv`` each time, so they follow
secagg) and answers each with a reply of the recorded size, doing nothing else. If the echo
alone takes longer than a target allows, no change to secagg meets that target.

The echo runs where secagg's deployment runs: a deployment ``secagg.flower.deployment``
prepares for the case (TLS and SuperNode authentication on) whose App is replaced by the
echo App (and the nodes' pin with it), started by ``secagg.flower.launch.LocalFederation``
(a SuperLink and 6 SuperNodes on loopback, each node secagg's guarded SuperNode with its
warm executor, ``secagg.flower.warm``). Each envelope is laid out as secagg's transport lays
it out (``secagg.flower.messages``: 1 MiB or more as a Flower Array, smaller as bytes in a
ConfigRecord); every message's bytes are distinct (Flower stores and sends an object
once, and secagg's envelopes never repeat). The ServerApp pushes a phase's requests one by
one and pulls until every reply is in, polling every 50 ms, as ``FlowerTransport`` does.

Cases (``--cases``), as in ``benchmarks/flower.py`` (whose ``case_config`` builds them):

- ``fedavg-1m``: FedAvg on ckks ``lean``, a 998,566-parameter MLP, 6 clients: train (6
  nodes, ~4 MB down, ~8 MB up each), consent (6 nodes, < 1 kB), reveal (2 nodes, ~8 MB
  each way);
- ``larc``: LARC on ckks, Fed-TCGA-BRCA: train, consent, probe, consent, reveal, all small.

In each pair the in-process run (``secagg.run``, ``--warmup`` + 1 rounds) goes first, then
the echo (a fresh local deployment, the same number of rounds after a hello to every node);
the deployment is stopped before the next in-process run, so neither competes with the
other's processes. Only the last round of each run is measured (the warm-up rounds are in
the CSV, flagged). Reports per round the in-process round (the engine's timer), the echo
round (the ServerApp's timer, first push to last reply), their ratio, and per phase the
engine's phase timers and the echo's exchange times.

    python -m benchmarks.flower_floor --rounds 5 --out benchmarks/results --overwrite
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.flower import FEDAVG_TARGET_RATIO, LARC_TARGET_S, case_config
from benchmarks.reproduce import made_by
from secagg.flower.deployment import app_pyproject

NAME = "flower-floor"
OUTPUTS = ("flower-floor.md", "flower-floor.csv")
#: why ``secagg bench flower_floor --check`` has nothing to re-run
NO_CHECK = (
    "a local Flower deployment's times per round: no tolerance makes them a check "
    "(tests/test_flower_e2e.py runs the deployment)"
)
#: where the results go unless --out says otherwise (refused if they exist: --overwrite)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
#: the exchanges of one round of each case, in order (traffic.csv counts a phase's
#: messages together: a phase named twice here gets half of its messages each time)
SEQUENCES: dict[str, tuple[str, ...]] = {
    "fedavg-1m": ("train", "consent", "reveal"),
    "larc": ("train", "consent", "larc_probe", "consent", "reveal"),
}
CASES = tuple(SEQUENCES)
#: the echo App's module, written into the deployment's app/ folder
ECHO_MODULE = "secagg_flower_floor_echo"
ECHO_TOML = app_pyproject(
    comment="The echo App of benchmarks/flower_floor.py: Flower's path without secagg's work",
    name="secagg-flower-floor",
    description="echoes a secagg round's messages, computing nothing",
    module=ECHO_MODULE,
    config='deployment = ""\nout = ""\nplan = ""\ntimeout = 300.0\n',
)
ECHO_SOURCE = '''"""The echo App of benchmarks/flower_floor.py (written by it).

A ServerApp that sends the messages of a secagg round (the plan: a JSON file) and a
ClientApp that answers each with a reply of the size the request names, both computing
nothing. Envelopes are laid out as secagg's (secagg.flower.messages); every message's
bytes are distinct."""

import json
import os
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from secagg.flower import messages

server_app = ServerApp()
client_app = ClientApp()
_BASE = bytearray()


def payload(n: int) -> bytes:
    """n bytes that no other message holds: a pattern with a fresh random 16-byte tag at
    the start of each of Flower's array chunks (Flower stores and sends an object once;
    nothing on the way compresses, so the pattern's bytes cost what random ones would)."""
    global _BASE
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE as CHUNK

    if len(_BASE) < n:
        _BASE = bytearray(bytes(range(256)) * (n // 256 + 1))
    data = _BASE[:n]
    for start in range(0, n, CHUNK):
        tag = os.urandom(16)[: n - start]
        data[start : start + len(tag)] = tag
    return bytes(data)


@client_app.query("secagg")
def answer(message: Message, context: Context) -> Message:
    envelope, asked = messages.read_request(message)
    got = 0 if envelope is None else len(envelope)
    if got != int(asked["size"]):
        raise ValueError(f"received {got} bytes, the request says {asked['size']}")
    return messages.reply(message, payload(int(asked["reply"])))


def exchange(grid, requests, timeout: float, poll: float = 0.05) -> float:
    """Push each (node, envelope, reply size) one by one, then pull until every reply is
    in (secagg.flower.transport.FlowerTransport.exchange); returns the seconds it took."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout
    waiting = {}
    for node, envelope, reply in requests:
        asked = {"size": len(envelope), "reply": reply}
        (mid,) = grid.push_messages([messages.request(node, envelope, asked, ttl=timeout)])
        waiting[mid] = reply
    while waiting:
        for answer in grid.pull_messages(list(waiting)):
            mid = answer.metadata.reply_to_message_id
            if mid not in waiting:
                continue
            if answer.has_error():
                raise RuntimeError(f"a node failed: {answer.error.reason}")
            size, asked = len(messages.read_reply(answer)), waiting.pop(mid)
            if size != asked:
                raise RuntimeError(f"a reply of {size} bytes, not the {asked} asked")
        if waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(waiting)} replies missing after {timeout:g} s")
            time.sleep(poll)
    return time.perf_counter() - started


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    from secagg.flower.process import shorten_object_pulls

    shorten_object_pulls()  # as secagg's ServerApp does (FlowerNodes)
    config = context.run_config
    plan = json.loads(Path(str(config["plan"])).read_text())
    out, timeout = Path(str(config["out"])), float(config["timeout"])
    deadline = time.monotonic() + timeout
    nodes = []
    while len(nodes) < plan["nodes"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(nodes)} of {plan['nodes']} SuperNodes connected")
        time.sleep(0.2)
        nodes = sorted(int(n) for n in grid.get_node_ids())
    exchange(grid, [(node, payload(64), 64) for node in nodes], timeout)  # hello: all up
    rounds = []
    for number in range(1, plan["rounds"] + 1):
        envelopes = [  # made before the round's timer starts: secagg's work, not Flower's
            [(nodes[peer], payload(down), up) for peer, down, up in step["messages"]]
            for step in plan["exchanges"]
        ]
        phases = {}
        started = time.perf_counter()
        for step, requests in zip(plan["exchanges"], envelopes):
            seconds = exchange(grid, requests, timeout)
            phases[step["phase"]] = phases.get(step["phase"], 0.0) + seconds
        seconds = time.perf_counter() - started
        rounds.append({"round": number, "wall_s": seconds, "phases": phases})
        del envelopes
    done = out.with_name(out.name + ".part")
    done.write_text(json.dumps({"nodes": nodes, "rounds": rounds}, indent=1))
    done.replace(out)  # whole or not at all: the benchmark waits for this file
'''


def _peer_index(peer: str) -> int:
    """client_3 -> 3 (the echo's nodes are the SuperNodes sorted by id: any order will do,
    they are alike)."""
    return int(str(peer).rsplit("_", 1)[-1])


def message_plan(
    traffic: Path | pd.DataFrame, sequence: tuple[str, ...], round_: int | None = None
) -> list[dict[str, Any]]:
    """The exchanges of one round as a run's ``traffic.csv`` recorded them (``round_``: its
    last round unless given), in the order of ``sequence``: for each, its phase and its
    messages as ``[peer index, bytes down, bytes up]`` (an envelope's bytes: its fields and
    its framing). A phase named k times in ``sequence`` has its messages to each peer dealt
    evenly over its k exchanges. ValueError where the round holds a phase ``sequence`` does not
    name, or the reverse, or a peer's messages do not divide evenly."""
    table = traffic if isinstance(traffic, pd.DataFrame) else pd.read_csv(traffic)
    table = table[table["round"] == (table["round"].max() if round_ is None else round_)]
    if table.empty:
        raise ValueError(f"traffic has no round {round_}")
    found, named = list(dict.fromkeys(table["phase"])), list(dict.fromkeys(sequence))
    if set(found) != set(named):
        raise ValueError(f"the round's phases are {found}, the sequence names {named}")
    per_phase: dict[str, list[list[int]]] = {}
    for phase in named:
        rows = table[table["phase"] == phase]
        times = sequence.count(phase)
        sizes = rows.groupby(["peer", "direction"], sort=False)["bytes"].sum()
        count = (
            rows[rows["field"] == "<envelope>"]
            .groupby(["peer", "direction"], sort=False)["messages"]
            .sum()
        )
        messages: list[list[int]] = []  # one exchange's: each peer's share, in order
        for peer in dict.fromkeys(rows["peer"]):
            down, up = int(count.get((peer, "down"), 0)), int(count.get((peer, "up"), 0))
            if down != up or down % times:
                raise ValueError(
                    f"{phase}: {peer} got {down} requests and sent {up} replies, not "
                    f"{times} exchange(s)' worth"
                )
            each = [round(sizes[(peer, "down")] / down), round(sizes[(peer, "up")] / up)]
            messages += [[_peer_index(peer), *each] for _ in range(down // times)]
        per_phase[phase] = messages
    return [{"phase": phase, "messages": per_phase[phase]} for phase in sequence]


def round_bytes(plan: list[dict[str, Any]]) -> tuple[int, int]:
    """(bytes up, bytes down) of one round of ``plan``: envelopes, as secagg counts them."""
    up = sum(m[2] for step in plan for m in step["messages"])
    down = sum(m[1] for step in plan for m in step["messages"])
    return up, down


def prepare_echo(folder: Path, config: Any) -> Path:
    """A deployment of ``config`` (TLS, SuperNode authentication: ``prepare``) whose App is
    the echo App, and whose nodes pin that App instead (the guard runs it and no other)."""
    from secagg.flower.deployment import prepare
    from secagg.flower.guard import app_digest, build_app

    prepare(folder, replace(config), tls=True, auth=True)
    app = folder / "app"
    (app / "pyproject.toml").write_text(ECHO_TOML)
    (app / f"{ECHO_MODULE}.py").write_text(ECHO_SOURCE)
    pin = app_digest(build_app(app))
    for spec in [folder / "deployment.json", *sorted((folder / "nodes").glob("*/node.json"))]:
        data = json.loads(spec.read_text())
        data["app"] = pin
        spec.write_text(json.dumps(data, indent=1) + "\n")
    return folder


def run_echo(
    folder: Path, plan: list[dict[str, Any]], rounds: int, *, timeout: float = 900.0
) -> list[dict[str, Any]]:
    """Start the echo deployment in ``folder``, run ``rounds`` rounds of ``plan``, stop it;
    the ServerApp's rounds (``round``, ``wall_s``, ``phases``)."""
    from secagg.flower.launch import DeploymentError, LocalFederation

    nodes = len(json.loads((folder / "deployment.json").read_text())["clients"])
    run = folder / f"run-{time.time_ns()}"
    run.mkdir()
    (run / "plan.json").write_text(
        json.dumps({"nodes": nodes, "rounds": rounds, "exchanges": plan})
    )
    out = run / "echo.json"
    groups: list[int] = []  # the process groups it started (each process's own)
    try:
        with LocalFederation(folder, log=print, warm=True) as federation:
            groups = [p.pid for p in (federation.superlink, *federation.nodes.values()) if p]
            run_id = federation.submit(out=str(out), plan=str(run / "plan.json"))
            federation.run_id = run_id
            started = time.monotonic()
            looked = started
            while not out.exists():  # no `flwr ls` (a process, CPU) while the rounds run ...
                if time.monotonic() - started > timeout:
                    raise DeploymentError(f"the echo run gave nothing in {timeout:.0f} s")
                if time.monotonic() - looked > 30:  # ... but a look now and then: did it fail?
                    looked = time.monotonic()
                    status = federation.status(run_id)
                    if status.startswith("finished") and not out.exists():
                        raise DeploymentError(f"the echo run ended {status}; see {folder}/local")
                time.sleep(0.25)
            status = federation.wait(run_id, 120, poll=1.0)
            if status != "finished:completed":
                raise DeploymentError(f"the echo run ended {status}; see {folder}/local")
    finally:
        _wait_gone(groups)
    return list(json.loads(out.read_text())["rounds"])


def _wait_gone(groups: list[int], timeout: float = 10.0) -> None:
    """Wait until every process of ``groups`` has exited, SIGKILL what is left after
    ``timeout`` s: LocalFederation waits for each group's first process, and the others
    (the SuperLink's SuperExec and ServerApp, a node's executor) may still be on their way
    out, writing into the work folder."""
    deadline = time.monotonic() + timeout
    for group in groups:
        while True:
            try:
                os.killpg(group, 0)
            except (ProcessLookupError, PermissionError):
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            time.sleep(0.1)


def _remove(folder: Path) -> None:
    for _ in range(20):  # a process that was on its way out may have written to it
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.5)


def echo_rows(
    rounds: list[dict[str, Any]], plan: list[dict[str, Any]], case: str, pair: int, warmup: int
) -> list[dict[str, Any]]:
    up, down = round_bytes(plan)
    return [
        {
            "case": case,
            "pair": pair,
            "transport": "echo",
            "round": int(r["round"]),
            "warmup": int(r["round"]) <= warmup,
            "wall_s": float(r["wall_s"]),
            "bytes_up": up,
            "bytes_down": down,
            **{f"phase_{p}_s": float(s) for p, s in r["phases"].items()},
        }
        for r in rounds
    ]


def measure(
    cases: list[str], pairs: int, warmup: int, work: Path
) -> tuple[pd.DataFrame, dict[str, list[dict[str, Any]]]]:
    """The interleaved runs: for each pair and case, in process then the echo. Returns the
    rows (one per run and round) and each case's plan (of its last pair)."""
    import secagg
    from benchmarks.flower import _rounds

    rounds = warmup + 1
    configs = {case: case_config(case, rounds, work) for case in cases}
    echo = {case: prepare_echo(work / f"{case}-echo", config) for case, config in configs.items()}
    rows: list[dict[str, Any]] = []
    plans: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    for pair in range(1, pairs + 1):
        for case, config in configs.items():
            inproc = work / f"{case}-in-process-{pair}"
            load = os.getloadavg()[0]  # the machine's other load, as each run starts
            secagg.run(config, out=inproc)
            rows += [
                {**r, "warmup": r["round"] <= warmup, "load_1m": load}
                for r in _rounds(inproc, case, "in-process", pair)
            ]
            plans[case] = plan = message_plan(inproc / "traffic.csv", SEQUENCES[case])
            load = os.getloadavg()[0]
            echoed = echo_rows(run_echo(echo[case], plan, rounds), plan, case, pair, warmup)
            rows += [{**r, "load_1m": load} for r in echoed]
            shutil.rmtree(inproc, ignore_errors=True)
            last = pd.DataFrame(rows[-2 * rounds :])
            measured = last[~last["warmup"]].set_index("transport")["wall_s"]
            print(
                f"pair {pair} {case}: in-process {measured['in-process']:.2f} s, echo "
                f"{measured['echo']:.2f} s ({time.perf_counter() - started:.0f} s so far)",
                flush=True,
            )
    return pd.DataFrame(rows), plans


def _phases(frame: pd.DataFrame, first: list[str]) -> list[str]:
    """The phases ``frame`` timed: ``first`` (those of them it has), then the others."""
    timed = [
        c.removeprefix("phase_").removesuffix("_s")
        for c in frame.columns
        if c.startswith("phase_") and frame[c].notna().any()
    ]
    return [p for p in first if p in timed] + [p for p in timed if p not in first]


def report(
    table: pd.DataFrame,
    plans: dict[str, list[dict[str, Any]]],
    *,
    command: str,
    machine: dict[str, str],
    seconds: float,
) -> str:
    """The Markdown report of ``table`` (the rows of :func:`measure`)."""
    warmup = table["warmup"].astype(bool)
    measured = table[~warmup]
    warm = int(table.loc[warmup, "round"].max()) if warmup.any() else 0
    lines = [
        "# The floor of Flower's path: a bare echo App vs the secagg round in process",
        "",
        made_by(command) + f" It took {seconds / 60:.1f} minutes on {machine['cpu']}, "
        f"{machine.get('memory', '?')}.",
        "",
        "in-process: the secagg round (`secagg.run`, the engine's timer). echo: a Flower App "
        "that computes nothing and sends the same messages as that round (the sizes from "
        "its traffic.csv; envelopes laid out as secagg's, 1 MiB or more as a Flower Array), "
        "each answered with a reply of the recorded size, over a local deployment: a "
        "SuperLink and 6 SuperNodes on loopback, TLS and SuperNode authentication on, "
        "secagg's guarded SuperNodes with the warm executor (`secagg.flower.launch`, "
        "`secagg.flower.deployment.prepare`). In each pair the in-process run goes first, "
        "then the echo on a fresh deployment; "
        + (
            f"each run makes {warm} warm-up round{'s' if warm > 1 else ''} first (in the "
            "CSV, not here) and the next one is measured. "
            if warm
            else "each run's first round is measured. "
        )
        + "The echo's round is Flower's own cost of moving the round's messages: no change "
        "to secagg makes a round over Flower shorter than it.",
    ]
    for case in dict.fromkeys(measured["case"]):
        rows = measured[measured["case"] == case]
        wall = rows.pivot_table(index="pair", columns="transport", values="wall_s")
        ratio, extra = wall["echo"] / wall["in-process"], wall["echo"] - wall["in-process"]
        plan = plans.get(case, [])
        up, down = round_bytes(plan) if plan else (0, 0)
        load = (
            f" The machine's 1-minute load average as each run started: "
            f"{rows['load_1m'].min():.1f} to {rows['load_1m'].max():.1f} "
            f"({machine['cores']} cores)."
            if "load_1m" in rows and rows["load_1m"].notna().any()
            else ""
        )
        lines += [
            "",
            f"## {case}",
            "",
            f"Median: in-process **{wall['in-process'].median():.2f} s** per round, echo "
            f"**{wall['echo'].median():.2f} s** per round: the echo alone takes "
            f"**{ratio.median():.2f}×** the whole in-process round"
            + (
                f" (the target for a round over Flower: at most {FEDAVG_TARGET_RATIO:g}×)."
                if case == "fedavg-1m"
                else f", **{extra.median():+.2f} s** over it (the target for a round over "
                f"Flower: at most +{LARC_TARGET_S:g} s)."
                if case == "larc"
                else "."
            )
            + load,
            "",
            "| pair | in-process s | echo s | echo / in-process |",
            "|---|---|---|---|",
            *(
                f"| {p} | {wall.loc[p, 'in-process']:.2f} | {wall.loc[p, 'echo']:.2f} "
                f"| {ratio.loc[p]:.2f} |"
                for p in wall.index
            ),
            f"| median | {wall['in-process'].median():.2f} | {wall['echo'].median():.2f} "
            f"| {ratio.median():.2f} |",
            "",
            "Median seconds per phase: in-process, the engine's phase timers (metrics.csv; "
            "they overlap where the server streams); echo, each exchange from its first push "
            "to its last reply (a phase twice in a round: both together):",
            "",
        ]
        echo_phases = list(dict.fromkeys(step["phase"] for step in plan))
        phases = _phases(rows, echo_phases)
        lines += [
            "| transport | round | " + " | ".join(phases) + " |",
            "|---|---" + "|---" * len(phases) + "|",
        ]
        for transport in ("in-process", "echo"):
            part = rows[rows["transport"] == transport]
            cells = [
                f"{part[f'phase_{p}_s'].median():.2f}" if part[f"phase_{p}_s"].notna().any() else ""
                for p in phases
            ]
            lines.append(
                f"| {transport} | {part['wall_s'].median():.2f} | " + " | ".join(cells) + " |"
            )
        lines += [
            "",
            f"The echo's round (from the in-process run's traffic.csv, last round; "
            f"{down:,} bytes down and {up:,} up per round, envelopes as secagg counts them; "
            f"the echo's exchanges: {', '.join(echo_phases)}):",
            "",
            "| exchange | messages | bytes down per message | bytes up per message |",
            "|---|---|---|---|",
            *(
                f"| {step['phase']} | {len(step['messages'])} | "
                f"{_span(m[1] for m in step['messages'])} | "
                f"{_span(m[2] for m in step['messages'])} |"
                for step in plan
            ),
        ]
    return "\n".join(lines) + "\n"


def _span(values: Any) -> str:
    values = list(values)
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


def main(argv: list[str] | None = None) -> None:
    from benchmarks.options import output_folder, positive

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=positive, default=5, help="measured rounds of each: pairs of runs"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="rounds each run makes before its measured one (in the CSV, flagged)",
    )
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"which cases, in each pair: {', '.join(CASES)}"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - set(CASES):
        parser.error(f"--cases: some of {', '.join(CASES)}, got {args.cases!r}")
    if args.warmup < 0:
        parser.error("--warmup: at least 0")
    out = output_folder(parser, args.out, NAME, OUTPUTS, args.overwrite)
    command = (
        f"python -m benchmarks.flower_floor --rounds {args.rounds} --warmup {args.warmup} "
        f"--cases {','.join(cases)}"
    )

    def stop(signum: int, _frame: Any) -> None:  # every process stops on the way out
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    work = Path(tempfile.mkdtemp(prefix="flower-floor-"))
    started = time.perf_counter()
    try:
        table, plans = measure(cases, args.rounds, args.warmup, work)
    finally:
        if args.keep:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            _remove(work)
    from benchmarks.overhead import machine

    table.to_csv(out / "flower-floor.csv", index=False)
    text = report(
        table,
        plans,
        command=command,
        machine=machine(),
        seconds=time.perf_counter() - started,
    )
    (out / "flower-floor.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
