"""Where a result came from: secagg's version and commit, the libraries, the command, the
machine. Written into every run's config.json; ``secagg --version`` prints the first two.

Library versions come from the installed distributions' metadata, so reading them imports
nothing heavy.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import secagg

#: the libraries a result depends on (None when not installed)
LIBRARIES = (
    "numpy",
    "scipy",
    "pandas",
    "torch",
    "opacus",
    "tenseal",
    "lifelines",
    "scikit-learn",
    "cryptography",
    "flwr",
)


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(ignore: Sequence[str] = (), source: Path | None = None) -> dict[str, Any] | None:
    """The commit of the checkout secagg runs from (and whether it has uncommitted
    changes, outside the folders ``ignore`` names: a benchmark's own committed results,
    which it is rewriting), or None for an installed wheel or when git is unavailable.
    ``source``: the checkout (default: the one secagg is imported from)."""
    source = source or Path(secagg.__file__).resolve().parents[1]
    if not (source / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            [
                "git",
                "-C",
                str(source),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                *(f":(exclude){path}" for path in ignore),
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": bool(status.strip())}


def version_line() -> str:
    """``secagg 0.1.0 (commit 1a2b3c4d, uncommitted changes)``."""
    git = git_commit()
    where = ""
    if git is not None:
        where = f" (commit {git['commit'][:12]}{', uncommitted changes' if git['dirty'] else ''})"
    return f"secagg {secagg.__version__}{where}"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not on every platform
        pass
    return info


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """Everything above, with the command line and the start time (UTC)."""
    return {
        "secagg_version": secagg.__version__,
        "git": git_commit(),
        "libraries": library_versions(),
        "command_line": shlex.join(sys.argv if argv is None else argv),
        "working_directory": os.getcwd(),
        "machine": machine(),
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }
