"""How a committed result was made, and whether the current code still makes it.

- :func:`made_by` is the line a results file opens with: the command that made it, the commit
  (and whether the checkout had uncommitted changes), the libraries' versions, the machine
  and the date, so that a reader can tell which code a number came from.
- :class:`Check` is what ``secagg bench NAME --check`` re-runs: a declared subset of the
  benchmark (a few seeds or splits, its own arguments), written to a scratch folder, and the
  committed CSV's columns it must reproduce, joined on the rows' keys, each within its
  stated tolerance. A benchmark declares its ``CHECK`` next to its ``main``.
- :func:`run_check` runs one and returns a table of every compared value; the full test lane
  runs every benchmark's check (``tests/test_reproduce.py``).

A check compares numbers the benchmark computes (models, metrics, iteration counts, bytes),
never seconds: timings move with the machine's load and are reported, not reproduced.
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results"
#: the two machines whose runs set the cross-CPU tolerances of the checks (the committed
#: results were made on the first; the second re-ran every check, 2026-11-27)
CROSS_CPU = "an Intel Xeon (the committed run) and an AMD EPYC"
#: another CPU's kernels on one machine: torch's and OpenBLAS's kernel sets chosen by
#: environment (AVX2, and SSE only, in place of AVX-512), under which every check was run
#: again (``scripts/check_other_kernels.sh``)
OTHER_KERNELS = (
    "torch's and OpenBLAS's SSE kernels in place of AVX-512 (ATEN_CPU_CAPABILITY=default "
    "OPENBLAS_CORETYPE=Prescott)"
)


def made_by(command: str) -> str:
    """One Markdown paragraph: how this result was made (command, commit, versions, machine,
    date), for the top of a results file."""
    from secagg.simulation.provenance import git_commit, library_versions, machine
    from secagg.simulation.provenance import provenance as now

    # the benchmark is rewriting committed results files: those are its outputs, not changes
    # to the code that made them
    git = git_commit(ignore=("benchmarks/results",))
    commit = "not a git checkout" if git is None else git["commit"][:12]
    if git is not None and git["dirty"]:
        commit += " with uncommitted changes"
    libraries = ", ".join(f"{k} {v}" for k, v in library_versions().items() if v is not None)
    host = machine()
    cpu = host.get("processor") or host.get("machine")
    return (
        f"Made by `{command}` at commit {commit}, {now()['started_utc']}; "
        f"{cpu}, {host['cpus']} CPUs, Python {host['python']}; {libraries}."
    )


def shown_path(path: Path) -> str:
    """``path`` as a command in a results file shows it: relative to the working directory
    where it lies below it (``benchmarks/results``), else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def seeds_text(seeds: Sequence[int]) -> str:
    """``parse_seeds``' inverse, for a command line: [0, 1, 2, 5] -> "0-2,5"."""
    parts: list[list[int]] = []
    for s in seeds:
        if parts and s == parts[-1][1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


@dataclass(frozen=True)
class Check:
    """A subset of a benchmark that must reproduce its committed CSV.

    ``args``: the benchmark's own arguments for the subset (``--out`` is added); ``csv``:
    the file it writes and the committed one it is compared with; ``keys``: the columns that
    identify a row (the subset's rows must all be among the committed ones); ``columns``:
    each compared column and its tolerance: absolute (0: equal; strings compare equal), or
    (absolute, relative), within if |fresh − committed| ≤ absolute + relative·|committed|
    (for values that move with fresh encryption noise across orders of magnitude).

    ``spread_over`` (a key, e.g. "seed") is for results whose trajectories are chaotic, so
    that another CPU or BLAS gives another value for the same seed as another seed would
    (float32 training of SAVAE's VAEs, DEC's clustering): each fresh value is then compared
    with the committed values of its row over every ``spread_over`` (the other keys equal),
    and is within if it lies within ``tolerance`` of their standard deviations of their
    mean (a deterministic column, of standard deviation 0, must equal it)."""

    args: Sequence[str]
    csv: str
    keys: Sequence[str]
    columns: Mapping[str, float | tuple[float, float]]
    #: rows of the subset to compare (a pandas query on the subset's CSV), "" for all
    rows: str = ""
    #: why the tolerances are what they are (shown with the result)
    why: str = ""
    #: a key over which the committed rows give each value's spread (chaotic results)
    spread_over: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


def compare(check: Check, fresh: pd.DataFrame, committed: pd.DataFrame) -> pd.DataFrame:
    """One row per compared value: keys, column, committed, fresh, difference, tolerance,
    within. A subset row missing from the committed CSV is a mismatch (``committed`` NaN)."""
    if check.rows:
        fresh = fresh.query(check.rows)
    missing = [c for c in (*check.keys, *check.columns) if c not in fresh or c not in committed]
    if missing:
        raise ValueError(f"{check.csv}: no column {missing} in the fresh or the committed CSV")
    joined = fresh.merge(
        committed, on=list(check.keys), how="left", suffixes=("_fresh", "_committed")
    )
    others = [k for k in check.keys if k != check.spread_over]
    rows = []
    for _, row in joined.iterrows():
        key = {k: row[k] for k in check.keys}
        for column, tolerance in check.columns.items():
            new, old = row[f"{column}_fresh"], row[f"{column}_committed"]
            if isinstance(new, str) or isinstance(old, str):
                within = bool(new == old)
                difference: float | None = None
            elif check.spread_over:
                peers = committed
                for k in others:
                    peers = peers[peers[k] == row[k]]
                values = peers[column].astype(float)
                if pd.isna(new) and values.isna().all():  # e.g. never aborted
                    difference, within = 0.0, True
                else:
                    centre, spread = float(values.mean()), float(values.std(ddof=1))
                    difference = abs(float(new) - centre)
                    k_sd = tolerance[0] if isinstance(tolerance, tuple) else tolerance
                    within = bool(len(values) > 1 and difference <= k_sd * spread + 1e-12)
            else:
                absolute, relative = tolerance if isinstance(tolerance, tuple) else (tolerance, 0.0)
                same = float(new) == float(old) or (pd.isna(new) and pd.isna(old))  # ∞ too
                difference = 0.0 if same else abs(float(new) - float(old))
                allowed = absolute + relative * abs(float(old))
                within = same or bool(difference <= allowed)
            rows.append(
                {
                    **key,
                    "column": column,
                    "committed": old,
                    "fresh": new,
                    "difference": difference,
                    "tolerance": tolerance,
                    "within": within,
                }
            )
    return pd.DataFrame(rows)


def run_check(
    name: str,
    check: Check,
    main: Callable[[list[str]], Any],
    committed: Path = RESULTS,
) -> pd.DataFrame:
    """Run ``check``'s subset of benchmark ``name`` (its ``main``) in a scratch folder and
    compare it with the committed CSV in ``committed``."""
    reference = committed / check.csv
    if not reference.is_file():
        raise FileNotFoundError(
            f"{reference} does not exist: run the benchmark with --out {committed} first"
        )
    with tempfile.TemporaryDirectory(prefix=f"secagg-check-{name}-") as scratch:
        main([*check.args, "--out", scratch])
        fresh = pd.read_csv(Path(scratch) / check.csv)
    return compare(check, fresh, pd.read_csv(reference))


def report(name: str, check: Check, table: pd.DataFrame) -> str:
    """What ``--check`` prints: the command it re-ran, every compared value, the verdict."""
    lines = [
        f"secagg bench {name} --check: re-ran `secagg bench {name} {shlex.join(check.args)}` "
        f"and compared {check.csv} with the committed one ({len(table)} values"
        + (f"; {check.why}" if check.why else "")
        + ")",
        table.to_string(index=False),
    ]
    if reproduces(table):
        lines.append(f"{name}: all {len(table)} values reproduce")
    elif table.empty:
        lines.append(f"{name}: nothing compared (no row of the subset is in the committed CSV)")
    else:
        lines.append(f"{name}: {int((~table['within']).sum())} of {len(table)} values differ")
    return "\n".join(lines)


def reproduces(table: pd.DataFrame) -> bool:
    """Whether a check passed: something was compared, and every value within tolerance."""
    return not table.empty and bool(table["within"].all())
