"""How the server's work grows with the clients: 100 to 1,000 clients at 1e5 parameters.

    python -m benchmarks.many_clients [--clients 100,300,1000] [--params 100000]
                                      [--rounds 3] [--threshold-committee 10]
                                      [--threshold-up-to 1000] [--out DIR]
    secagg bench many_clients ...        (the same)

Each configuration is ``benchmarks.overhead``'s synthetic workload (no training: every
client uploads a fresh random vector, so the round is protocol and crypto only), FedAdam
with streaming aggregation, the clients in 2 worker processes, run in a server process of
its own (``overhead.run_config``); the first round is a warm-up and the rest give medians.
``plain``, ``ckks`` (preset ``lean``) and ``threshold`` (its streaming default, ``lean``,
with a key-holder committee of ``--threshold-committee`` clients) run at every count up to
``--threshold-up-to`` for threshold.

The figure is the server's own busy time per round (``server_work_s``: reading and checking
uploads, folding them into the running sum, checking consents, the reveal's bookkeeping;
not the time it waits for clients), divided by the number of clients: flat means the
server's work per client does not grow with the federation. Beside it, the round's wall time
(all clients on this machine's cores, one after another), the server's peak memory, and the
bytes each client sent and received.

Where it is not flat, and why:

- every contributor signs the release's descriptor, which lists every contributor: each
  consent request carries n entries, so the bytes to the clients grow as n² (encoded once on
  the server, copied into each request) and each client's check is O(n);
- ``threshold`` with every client a key holder (``--threshold-committee 0``) shares each
  upload's one-time key t of n: n shares per upload, n² per round through the server, and a
  reveal asks every holder for its share, so its server work per client, its memory and
  every client's work grow with n (one exploratory run, 100 → 300 clients on a shared
  machine: 8.8 → 19 ms per client, 268 MB → 1.6 GB, a 190 s round). With a committee of c
  holders (``holders_of``) an upload carries c shares whatever n, a round n·c, and the
  reveal asks c holders, each for one ring element over the n uploads: the server's work
  per client no longer grows with n; each holder's does (it checks n consents and opens n
  sealed shares a release).

Writes many_clients.csv (one row per configuration: medians over the measured rounds),
many_clients_rounds.csv (every round) and many_clients.md into --out (default: a new folder
results/bench/many_clients-<date-time>); ``--out benchmarks/results --overwrite``
regenerates the committed one.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import pandas as pd

OUTPUTS = ("many_clients.csv", "many_clients_rounds.csv", "many_clients.md")
#: why ``secagg bench many_clients --check`` has nothing to re-run
NO_CHECK = (
    "every figure it reports is a time or a peak memory on a shared machine, which no "
    "tolerance makes a check; the bytes are the formats the crypto check holds"
)
CLIENTS = (100, 300, 1000)
PARAMS = 100_000
#: the server's work per client at the largest count over that at the smallest: at most this
TARGET = 1.25
#: threshold at every count of the committed run (with the whole roster holding, stop at 200)
THRESHOLD_UP_TO = 1000
#: the key holders of a threshold run (0: every client; at a smaller count, every client)
COMMITTEE = 10
BACKENDS = ("plain", "ckks", "threshold")


def counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: client counts, such as 100,300,1000") from None
    if not values or values[0] < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 2 clients per configuration")
    return values


def committee(backend: str, n: int, size: int) -> int:
    """The committee option a threshold run at ``n`` clients gets (0: every client)."""
    return size if backend == "threshold" and 0 < size < n else 0


def per_configuration(rounds: pd.DataFrame) -> pd.DataFrame:
    """Medians over each configuration's measured rounds (its first is the warm-up)."""
    measured = rounds[rounds["warm"]]
    table = (
        measured.groupby(["backend", "n_clients"], sort=False)
        .agg(
            server_work_s=("server_work_s", "median"),
            wall_s=("wall_s", "median"),
            server_peak_MB=("server_peak_rss_MB", "max"),
            bytes_up=("bytes_up", "median"),
            bytes_down=("bytes_down", "median"),
            key_holders=("key_holders", "first"),
        )
        .reset_index()
    )
    table["server_ms_per_client"] = 1e3 * table["server_work_s"] / table["n_clients"]
    smallest = table.groupby("backend")["server_ms_per_client"].transform("first")
    table["per_client_vs_smallest"] = table["server_ms_per_client"] / smallest
    table["kB_up_per_client"] = table["bytes_up"] / table["n_clients"] / 1e3
    table["kB_down_per_client"] = table["bytes_down"] / table["n_clients"] / 1e3
    return table


def flat(table: pd.DataFrame, backend: str) -> tuple[float, bool] | None:
    """The largest count's per-client server work over the smallest's, and whether it meets
    :data:`TARGET`; None where the backend ran at one count only."""
    rows = table[table["backend"] == backend]
    if len(rows) < 2:
        return None
    ratio = float(rows["per_client_vs_smallest"].iloc[-1])
    return ratio, ratio <= TARGET


def report(table: pd.DataFrame, command: str, params: int) -> str:
    from benchmarks.reproduce import made_by
    from benchmarks.stats import markdown_table

    lines = [
        "# The server's work per client as the clients grow",
        "",
        made_by(command),
        "",
        f"Synthetic workload (no training), {params:.0e} parameters, FedAdam with streaming "
        "aggregation, clients in 2 worker processes; medians of the measured rounds (the "
        "first is a warm-up). `server_ms_per_client`: the server's own busy time per round "
        "over the clients (`benchmarks/many_clients.py` says what it holds). `key_holders`: "
        "the clients that hold shares of threshold's one-time keys (0 on plain and ckks).",
        "",
        "## Targets",
        "",
    ]
    for backend in table["backend"].unique():
        rows = table[table["backend"] == backend]
        got = flat(table, backend)
        if got is None:
            continue
        ratio, met = got
        low, high = rows.iloc[0], rows.iloc[-1]
        lines.append(
            f"- {backend}: {low['server_ms_per_client']:.2f} ms per client at "
            f"{int(low['n_clients'])} clients, {high['server_ms_per_client']:.2f} at "
            f"{int(high['n_clients'])}: {ratio:.2f}× (target ≤ {TARGET}×, flat: "
            f"{'met' if met else 'NOT met'}"
            + ("" if high["n_clients"] >= table["n_clients"].max() else "; not run further")
            + ")"
        )
    lines += [
        "",
        "## By configuration",
        "",
        markdown_table(
            table[
                [
                    "backend",
                    "n_clients",
                    "key_holders",
                    "server_work_s",
                    "server_ms_per_client",
                    "per_client_vs_smallest",
                    "wall_s",
                    "server_peak_MB",
                    "kB_up_per_client",
                    "kB_down_per_client",
                ]
            ]
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    from benchmarks.options import output_folder, positive
    from benchmarks.reproduce import shown_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=counts, default=CLIENTS)
    parser.add_argument("--params", type=positive, default=PARAMS)
    parser.add_argument("--rounds", type=positive, default=3, help="the first is a warm-up")
    parser.add_argument(
        "--threshold-up-to",
        type=int,
        default=THRESHOLD_UP_TO,
        help="run threshold only at client counts up to this (0: not at all)",
    )
    parser.add_argument(
        "--threshold-committee",
        type=int,
        default=COMMITTEE,
        help="threshold's key holders (0: every client, n² shares a round: keep "
        "--threshold-up-to at 200 or below); at a count at or below it, every client holds",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the first round is a warm-up")
    if args.threshold_committee < 0:
        parser.error("--threshold-committee must be 0 (every client) or a count of holders")
    out = output_folder(parser, args.out, "many_clients", OUTPUTS, args.overwrite)

    from benchmarks.overhead import run_config
    from benchmarks.rounds import Workload

    plan = [
        (backend, n)
        for backend in BACKENDS
        for n in args.clients
        if backend != "threshold" or n <= args.threshold_up_to
    ]
    rows: list[dict[str, Any]] = []
    for step, (backend, n) in enumerate(plan, 1):
        print(f"[{step}/{len(plan)}] {backend}, {n} clients", file=sys.stderr, flush=True)
        holders = committee(backend, n, args.threshold_committee)
        extra = (("committee", holders),) if holders else ()
        workload = Workload("synthetic", args.params, n, backend, extra_options=extra)
        for row in run_config(workload, rounds=args.rounds, workers=2):
            row["bytes_up"] = sum(
                v for k, v in row.items() if k.startswith("bytes_") and k.endswith("_up")
            )
            row["bytes_down"] = sum(
                v for k, v in row.items() if k.startswith("bytes_") and k.endswith("_down")
            )
            row["key_holders"] = holders or (n if backend == "threshold" else 0)
            rows.append(row)
    rounds = pd.DataFrame(rows)
    table = per_configuration(rounds)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--out" in given:
        at = given.index("--out") + 1
        given[at] = shown_path(Path(given[at]))
    command = shlex.join(["python", "-m", "benchmarks.many_clients", *given])
    rounds.drop(columns=["policy"], errors="ignore").to_csv(
        out / "many_clients_rounds.csv", index=False
    )
    table.to_csv(out / "many_clients.csv", index=False)
    (out / "many_clients.md").write_text(report(table, command, args.params))
    print(f"wrote {', '.join(OUTPUTS)} to {out}", file=sys.stderr)
    return table


if __name__ == "__main__":
    main()
