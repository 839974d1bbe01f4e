"""Argument helpers the benchmarks share: output folders that are new by default and checked
before anything is measured, and positive integers."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path


def fresh_folder(name: str, now: datetime | None = None) -> Path:
    """A new, empty folder ``results/bench/<name>-<YYYYmmdd-HHMMSS>`` under the working
    directory (``-2``, ``-3``... if that one exists), created here so no two runs share it."""
    base = Path.cwd() / "results" / "bench"
    stamp = f"{name}-{now or datetime.now():%Y%m%d-%H%M%S}"
    base.mkdir(parents=True, exist_ok=True)
    folder, k = base / stamp, 1
    while True:
        try:
            folder.mkdir()  # fails if it exists: two runs started in one second differ
            return folder
        except FileExistsError:
            k += 1
            folder = base / f"{stamp}-{k}"


def output_folder(
    parser: argparse.ArgumentParser,
    out: Path | None,
    name: str,
    outputs: Iterable[str],
    overwrite: bool,
) -> Path:
    """The folder a run writes to, checked and created before anything is measured.

    No ``out``: a fresh folder (:func:`fresh_folder`). An explicit ``out`` must be a folder
    (created if missing) that can be written and holds none of ``outputs`` unless
    ``overwrite``. A bad one ends the run through ``parser.error`` (exit status 2)."""

    if out is None:
        try:
            return fresh_folder(name)
        except OSError as exc:
            parser.error(
                f"cannot create an output folder under {Path.cwd() / 'results' / 'bench'} "
                f"({exc.strerror or exc}); choose one with --out"
            )
    # imported here, not above: the measured processes import this module
    from secagg.errors import ConfigError
    from secagg.simulation.outputs import check_writable

    try:
        check_writable(out)  # the same check as `secagg run --out`: a folder, writable
    except ConfigError as exc:
        parser.error(str(exc))
    committed = Path(__file__).resolve().parent / "results"
    if Path(out).resolve() == committed:
        from secagg.simulation.provenance import git_commit

        git = git_commit(ignore=("benchmarks/results",))
        if git is not None and git["dirty"]:
            # a results file names the commit that made it: anyone must be able to check
            # that commit out and get the same code
            parser.error(
                f"--out {out} holds the committed results, which are written only from a "
                "clean checkout (their commit line must be one anyone can check out): "
                "commit or stash your changes first, or write elsewhere (no --out)"
            )
    present = [f for f in outputs if (out / f).exists()]
    if present and not overwrite:
        parser.error(
            f"--out {out} already holds this benchmark's output ({', '.join(present)}); "
            "pass --overwrite to replace it, or choose another folder"
        )
    return out


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seed_list(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """The seeds ``text`` names ("0-9", "0,2,5-7"), or the run ends through ``parser.error``
    with what is wrong (exit status 2). The text itself stays the option's value, so the
    results can show the command as given."""
    from secagg.runspec.settings import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        parser.error(str(exc))
