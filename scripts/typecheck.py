"""Run mypy on the installed layout: the folders protocols/, clients/, server/, simulation/, flower/
are the subpackages secagg.protocols, ... (setuptools' package-dir mapping), which mypy
cannot see from the source tree. Build that layout as a tree of links in a temporary folder
and check it as the package ``secagg``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("protocols", "clients", "server", "simulation", "flower")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="secagg-mypy-") as tmp:
        package = Path(tmp) / "secagg"
        package.mkdir()
        for entry in (ROOT / "secagg").iterdir():
            if entry.name != "__pycache__":
                os.symlink(entry, package / entry.name)
        for name in SUBPACKAGES:
            os.symlink(ROOT / name, package / name)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--config-file",
                str(ROOT / "pyproject.toml"),
                "-p",
                "secagg",
                *sys.argv[1:],
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        # report paths in the repository, not in the temporary tree
        out = done.stdout.replace(f"{package}/", "").replace("secagg/protocols/", "protocols/")
        for name in ("clients", "server", "simulation"):
            out = out.replace(f"secagg/{name}/", f"{name}/")
        print(out, end="")
        print(done.stderr, end="", file=sys.stderr)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
