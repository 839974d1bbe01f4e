"""Where the server's memory goes in one FedAvg round, per backend: its peak, per parameter,
and what holds it at that moment.

    python -m benchmarks.server_memory [--params 10000000] [--clients 10] [--rounds 2]
                                       [--backends plain,ckks,threshold]
                                       [--part-values 0,1000000] [--out DIR]
    secagg bench server_memory ...        (the same)

Each backend runs ``benchmarks.overhead``'s synthetic workload (no training), FedAvg with
streaming aggregation on the backend's streaming preset (``lean``), the clients in 2 worker
processes, in a server process of its own that imports what a server imports and nothing of
pandas or torch (``benchmarks.rounds``). There ``tracemalloc`` traces every allocation of
the server process (numpy reports its buffers to it): the report gives the largest amount
traced at once over the rounds (``peak_traced_MB``, and per parameter), the process's peak
resident memory beside it (``server_peak_rss_MB``: the interpreter, its imports and what
tracemalloc itself keeps are in it too), and the allocation sites that held the most at the
traced peak (a sampling thread snapshots the heap whenever it grows by 2 %, so the sites are
those of the largest sample, within a few per cent of the peak).

What a bounded-memory round needs is read off these sites: every whole-model buffer the
server holds at once is one row (the params in float64, 8 B a parameter; the running sum,
8 B on ``lean``; an upload and its receive buffer; a decryptor's reply...). The initial
model is the benchmark's, made before tracing starts and never touched (zeros the server
copies), so only the server's own copy of it counts.

Writes server_memory.csv (one row per backend), server_memory_sites.csv (the sites at each
backend's peak) and server_memory.md into --out (default: a new folder
results/bench/server_memory-<date-time>); ``--out benchmarks/results --overwrite``
regenerates the committed one.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

OUTPUTS = ("server_memory.csv", "server_memory_sites.csv", "server_memory.md")
#: why ``secagg bench server_memory --check`` has nothing to re-run
NO_CHECK = (
    "it reports peak memory, which moves with the allocator and the libraries' versions by "
    "more than a tolerance that would still catch a regression; the tests bound each step's "
    "allocations instead (tests/test_server_memory.py)"
)
PARAMS = 10_000_000
BACKENDS = ("plain", "ckks", "threshold")
#: allocation sites reported per backend
SITES = 8
MB = 1e6


# ---- inside the server process -----------------------------------------------------------
def traced_rounds(
    backend: str, params: int, clients: int, rounds: int, part_values: int = 0
) -> dict[str, Any]:
    """One backend's rounds under tracemalloc: the peak, the RSS and the sites at the peak."""
    import tracemalloc

    from benchmarks.rounds import Workload, initial_params, measure_rounds

    workload = Workload(
        "synthetic", params, clients, backend, protocol="fedavg", part_values=part_values
    )
    # the initial model is the benchmark's, made before tracing starts (zeros the server
    # copies: its pages are never touched, so neither the trace nor the RSS counts them)
    initial = initial_params(workload)
    tracemalloc.start(4)
    largest: dict[str, Any] = {"bytes": 0, "snapshot": None}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            current, _ = tracemalloc.get_traced_memory()
            if current > largest["bytes"] * 1.02:
                largest["bytes"], largest["snapshot"] = current, tracemalloc.take_snapshot()
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        rows = measure_rounds(workload, initial, rounds, 2, False, True, "")
    finally:
        done.set()
        sampler.join()
    _, peak = tracemalloc.get_traced_memory()
    sites = []
    snapshot = largest["snapshot"]
    if snapshot is not None:
        for stat in snapshot.statistics("lineno")[:SITES]:
            frame = stat.traceback[0]
            sites.append(
                {
                    "site": f"{_short(frame.filename)}:{frame.lineno}",
                    "MB": stat.size / MB,
                    "blocks": stat.count,
                }
            )
    tracemalloc.stop()
    return {
        "peak_traced_MB": peak / MB,
        "sampled_MB": largest["bytes"] / MB,
        "server_peak_rss_MB": max(r["server_peak_rss_MB"] for r in rows),
        # the last round (the first is a warm-up), traced as every backend's is
        "round_s": rows[-1]["wall_s"],
        "sites": sites,
    }


def _short(filename: str) -> str:
    """A source path from the package or the standard library's top, not the machine's."""
    parts = Path(filename).parts
    for top in ("secagg", "server", "clients", "protocols", "benchmarks", "multiprocessing"):
        if top in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(top) - 1 :])
    return Path(filename).name


def _one(argv: list[str]) -> None:
    """``--one ARGS RESULT``: run one backend (the parent's arguments in ARGS), write the
    result, or ("failed", traceback), to RESULT."""
    import traceback

    given, result = argv
    with open(given, "rb") as f:
        args = pickle.load(f)
    try:
        out: tuple[str, Any] = ("ok", traced_rounds(*args))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out = ("failed", traceback.format_exc())
    with open(result, "wb") as f:
        pickle.dump(out, f)


def run_backend(
    backend: str, params: int, clients: int, rounds: int, part_values: int = 0
) -> dict[str, Any]:
    """:func:`traced_rounds` in a fresh server process (this one imported pandas)."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="secagg-server-memory-") as folder:
        given, result = Path(folder) / "args.pickle", Path(folder) / "result.pickle"
        given.write_bytes(pickle.dumps((backend, params, clients, rounds, part_values)))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.server_memory", "--one", str(given), str(result)],
            cwd=root,
            env=dict(os.environ),
        )
        if not result.exists():
            raise RuntimeError(f"{backend}: server process exit code {done.returncode}")
        status, payload = pickle.loads(result.read_bytes())
    if status != "ok":
        raise RuntimeError(f"{backend} failed:\n{payload}")
    return payload


# ---- the report ------------------------------------------------------------------------------
def report(table, sites, command: str, params: int, clients: int) -> str:
    from benchmarks.reproduce import made_by
    from benchmarks.stats import markdown_table

    lines = [
        "# Where the server's memory goes in a FedAvg round",
        "",
        made_by(command),
        "",
        f"Synthetic workload (no training), {params:.0e} parameters, {clients} clients in 2 "
        "worker processes, FedAvg with streaming aggregation (`lean` on ckks and "
        "threshold); every allocation of the server process traced (`tracemalloc`). "
        "`bytes_per_param`: the traced peak over the parameters; one whole-model float64 "
        "buffer is 8 (`benchmarks/server_memory.py` says what each column holds). "
        "`part_values`: the round moves the model, the uploads and the releases in parts of "
        "that many values (`secagg.parts`; 0: whole), so the server holds the model and one "
        "part's sum. `round_s`: the last round's wall time, under the same tracing for "
        "every row (the clients share this machine's cores in 2 worker processes: compare "
        "rows of one run only).",
        "",
        markdown_table(table),
        "",
        "## What holds the memory at the peak",
        "",
    ]
    for backend, part_values in zip(table["backend"], table["part_values"]):
        here = sites[(sites["backend"] == backend) & (sites["part_values"] == part_values)]
        title = f"{backend}, parts of {part_values:,}" if part_values else f"{backend}, whole"
        lines += [f"### {title}", "", markdown_table(here), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None):
    given_argv = list(argv if argv is not None else sys.argv[1:])
    if given_argv[:1] == ["--one"]:
        return _one(given_argv[1:])
    import pandas as pd

    from benchmarks.options import output_folder, positive
    from benchmarks.reproduce import shown_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=positive, default=PARAMS)
    parser.add_argument("--clients", type=positive, default=10)
    parser.add_argument("--rounds", type=positive, default=2)
    parser.add_argument(
        "--backends",
        type=lambda text: tuple(b for b in text.split(",") if b),
        default=BACKENDS,
        help=f"comma-separated, of {', '.join(BACKENDS)}",
    )
    parser.add_argument(
        "--part-values",
        type=lambda text: tuple(int(v) for v in text.split(",") if v),
        default=(0,),
        help="comma-separated: each backend runs once per value, its round moving the model "
        "in parts of that many values (secagg.parts; 0: whole). Default 0",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(given_argv)
    if not args.part_values or any(v < 0 for v in args.part_values):
        parser.error("--part-values: whole numbers of values, 0 for the model whole")
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown or not args.backends:
        parser.error(f"--backends: choose from {', '.join(BACKENDS)} (got {unknown or 'none'})")
    if args.clients < 2:
        parser.error("--clients must be at least 2 (a release needs two contributors)")
    out = output_folder(parser, args.out, "server_memory", OUTPUTS, args.overwrite)
    rows, site_rows = [], []
    runs = [(b, p) for b in args.backends for p in args.part_values]
    for step, (backend, part_values) in enumerate(runs, 1):
        print(
            f"[{step}/{len(runs)}] {backend}, parts of {part_values or 'the whole'}",
            file=sys.stderr,
            flush=True,
        )
        got = run_backend(backend, args.params, args.clients, args.rounds, part_values)
        rows.append(
            {
                "backend": backend,
                "params": args.params,
                "part_values": part_values,
                "peak_traced_MB": round(got["peak_traced_MB"], 1),
                "bytes_per_param": round(got["peak_traced_MB"] * MB / args.params, 1),
                "server_peak_rss_MB": round(got["server_peak_rss_MB"], 1),
                "round_s": round(got["round_s"], 2),
            }
        )
        for site in got["sites"]:
            site_rows.append(
                {"backend": backend, "part_values": part_values, **site, "MB": round(site["MB"], 1)}
            )
    table, sites = pd.DataFrame(rows), pd.DataFrame(site_rows)
    if "--out" in given_argv:
        at = given_argv.index("--out") + 1
        given_argv[at] = shown_path(Path(given_argv[at]))
    command = shlex.join(["python", "-m", "benchmarks.server_memory", *given_argv])
    table.to_csv(out / "server_memory.csv", index=False)
    sites.to_csv(out / "server_memory_sites.csv", index=False)
    (out / "server_memory.md").write_text(report(table, sites, command, args.params, args.clients))
    print(f"wrote {out}", file=sys.stderr)
    return table


if __name__ == "__main__":
    main()
