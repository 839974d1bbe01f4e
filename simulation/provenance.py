"""Where a result came from: secagg's version and commit, the libraries, the command, the
machine. Written into every run's config.json; ``secagg --version`` prints the first two.

Library versions come from the installed distributions' metadata, so reading them imports
nothing heavy.
"""

from __future__ import annotations

import hashlib
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


def data_provenance(task: Any) -> dict[str, dict[str, Any]] | None:
    """Where ``task``'s data came from, if it says (``Task.sources``): per source its
    resolved path, size and SHA-256 (a folder's: over its files' relative names and
    contents, in order), or ``"missing": true``. None for a task that declares none."""
    sources = getattr(task, "sources", None)
    if sources is None:
        return None
    return {str(label): describe_path(Path(path)) for label, path in sources().items()}


def describe_path(path: Path) -> dict[str, Any]:
    """A file's or folder's path, size and SHA-256 (what :func:`data_provenance` records)."""
    path = path.expanduser().resolve()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        return {"path": str(path), "missing": True}
    digest, size = hashlib.sha256(), 0
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
    out: dict[str, Any] = {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}
    if path.is_dir():
        out["files"] = len(files)
    return out


def changed_data(recorded: dict[str, Any] | None, now: dict[str, Any] | None) -> list[str]:
    """The sources whose path, size or digest differ between a run's record and now (each
    as "label: what changed"); empty when both agree or neither records any."""
    recorded, now = recorded or {}, now or {}
    out = []
    for label in sorted(set(recorded) | set(now)):
        a, b = recorded.get(label), now.get(label)
        if a is None or b is None:
            out.append(f"{label}: {'not recorded then' if a is None else 'not declared now'}")
        elif a.get("sha256") != b.get("sha256") or a.get("path") != b.get("path"):
            out.append(
                f"{label}: {a.get('path')} ({a.get('sha256', 'missing')[:12]}) then, "
                f"{b.get('path')} ({b.get('sha256', 'missing')[:12]}) now"
            )
    return out


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
