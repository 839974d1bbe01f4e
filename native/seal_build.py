"""Build secagg's native extension (``secagg.ckks._seal_native``, native/seal_native.cpp) over
SEAL 4.1.2: the one builder that ``scripts/build_native.sh`` (a checkout, in place) and the
build backend (``setup.py``'s build_ext: ``pip install``, ``pip wheel``) both run.

SEAL's sources: ``native/SEAL`` where present (an sdist carries them), otherwise the SEAL
folder of Pyfhel 3.5.0's sdist, fetched by pip (the package client) into ``.native/`` with
its sha256 pinned (``--require-hashes``: pip checks the archive before it unpacks it) and
checked again here before it is unpacked. CMake, Ninja and pybind11 come from the Python
environment running this (pyproject.toml's build requirements, or the ``native`` extra).
Needs a C++17 compiler. Standard library only: it runs before secagg is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".native"  # downloads and CMake build folders (git ignores it)
CARRIED = ROOT / "native" / "SEAL"  # SEAL's sources where the sdist carries them
PYFHEL = "pyfhel==3.5.0"
PYFHEL_SDIST = "pyfhel-3.5.0.tar.gz"
PYFHEL_SHA256 = "0375b83b5a83026924f59db25c4efa9f27e1e8a66d004658f4d24195986a04b6"
SEAL_IN_SDIST = "pyfhel-3.5.0/Pyfhel/backend/SEAL/"
SOURCES = ("native/seal_native.cpp", "native/CMakeLists.txt", "native/seal_build.py")
#: the two modules built from seal_native.cpp: everything, and the public half alone
#: (no class that takes a key: what a server process loads)
NAME, PUBLIC_NAME = "_seal_native", "_seal_public"
NAMES = (NAME, PUBLIC_NAME)


class BuildError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"secagg native: {message}", file=sys.stderr, flush=True)


def suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX")


def in_place_target(name: str = NAME) -> Path:
    return ROOT / "secagg" / "ckks" / f"{name}{suffix()}"


def fingerprint() -> str:
    """What a build depends on: the sources, this builder, SEAL's pinned archive and the
    interpreter (its ABI). A build stamped with it can be reused as it is."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((ROOT / name).read_bytes())
    digest.update(f"{PYFHEL_SHA256}\n{sys.version}\n{suffix()}\n".encode())
    return digest.hexdigest()


def _stamp() -> Path:
    return WORK / f"stamp-{sys.implementation.cache_tag}"


def current(target: Path) -> bool:
    """The in-place build is there and was built from exactly these sources."""
    stamp = _stamp()
    return target.is_file() and stamp.is_file() and stamp.read_text().strip() == fingerprint()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pyfhel_sdist() -> Path:
    """Pyfhel 3.5.0's sdist, fetched through pip once and checked by its sha256."""
    sdist = WORK / PYFHEL_SDIST
    if sdist.is_file() and _sha256(sdist) == PYFHEL_SHA256:
        return sdist
    WORK.mkdir(parents=True, exist_ok=True)
    log(f"fetching SEAL 4.1.2's sources ({PYFHEL}'s sdist) through pip (about a minute)")
    with tempfile.TemporaryDirectory(dir=WORK) as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(f"{PYFHEL} --hash=sha256:{PYFHEL_SHA256}\n")
        # --no-binary pyfhel: its sdist, not a wheel; its build requirements may be wheels
        # (pip prepares the sdist's metadata, which builds them under ":all:")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            "pyfhel",
            "--require-hashes",
            "-r",
            str(requirements),
            "-d",
            scratch,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        fetched = Path(scratch) / PYFHEL_SDIST
        if done.returncode != 0 or not fetched.is_file():
            raise BuildError(
                f"pip could not fetch {PYFHEL}'s sdist (SEAL's sources):\n"
                + (done.stdout + done.stderr)[-3000:]
            )
        if _sha256(fetched) != PYFHEL_SHA256:
            raise BuildError(f"{PYFHEL}'s sdist is not the pinned one (sha256); refusing it")
        os.replace(fetched, sdist)
    return sdist


def extract_seal(sdist: Path, into: Path) -> None:
    """SEAL's folder of Pyfhel's sdist into ``into`` (regular files and folders only)."""
    if _sha256(sdist) != PYFHEL_SHA256:
        raise BuildError(f"{sdist} is not the pinned {PYFHEL} sdist (sha256); refusing it")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if not member.name.startswith(SEAL_IN_SDIST) or member.name == SEAL_IN_SDIST:
                continue
            if not (member.isfile() or member.isdir()):
                raise BuildError(f"unexpected entry in {sdist.name}: {member.name}")
            member.name = member.name[len(SEAL_IN_SDIST) :]
            archive.extract(member, into, filter="data")


def seal_sources() -> Path:
    if (CARRIED / "CMakeLists.txt").is_file():
        return CARRIED
    unpacked = WORK / "SEAL"
    sdist = pyfhel_sdist()
    if not (unpacked / "CMakeLists.txt").is_file():
        extract_seal(sdist, unpacked)
    return unpacked


def _tools() -> tuple[str, str, str]:
    try:
        import cmake
        import ninja
        import pybind11
    except ImportError as exc:
        raise BuildError(
            f"building the native extension needs cmake, ninja and pybind11 from PyPI in "
            f"this environment ({exc}): the `native` extra, or pyproject.toml's build "
            f"requirements"
        ) from None
    bin_dir = Path(cmake.CMAKE_BIN_DIR)
    return str(bin_dir / "cmake"), str(Path(ninja.BIN_DIR) / "ninja"), pybind11.get_cmake_dir()


def build(targets: dict[str, Path], build_dir: Path) -> None:
    """Configure and build the extension's modules in ``build_dir`` (Ninja rebuilds only
    what changed) and copy each module named in ``targets`` to its path there."""
    seal = seal_sources()
    cmake, ninja, pybind11_dir = _tools()
    # one CMake cache per toolchain: CMake keeps the paths it found in the first run
    key = hashlib.sha256(f"{sys.executable}\n{cmake}\n{pybind11_dir}\n{seal}".encode())
    build_dir = build_dir / key.hexdigest()[:12]
    build_dir.mkdir(parents=True, exist_ok=True)
    log("building SEAL 4.1.2 and the extension (about a minute the first time)")
    # release flags as SEAL's own; no -march=native: GCC 12 vectorises SEAL's BLAKE2b for
    # AVX-512 into code more than twice as slow as the portable build (measured here)
    steps = {
        "configure": [
            cmake,
            "-S",
            str(ROOT / "native"),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={ninja}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DSEAL_SOURCE_DIR={seal}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11_dir}",
        ],
        "build": [ninja, "-C", str(build_dir), *NAMES],
    }
    for step, command in steps.items():
        done = subprocess.run(command, capture_output=True, text=True)
        (build_dir / f"{step}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise BuildError(f"{step} failed ({build_dir / f'{step}.log'}):\n{tail}")
    for name, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        # a fresh file, renamed into place: a process that has the old one loaded keeps it
        fresh = target.with_name(target.name + ".new")
        shutil.copyfile(build_dir / f"{name}{suffix()}", fresh)
        os.chmod(fresh, 0o755)
        os.replace(fresh, target)


def build_in_place() -> None:
    """The checkout's build (scripts/build_native.sh): into secagg/ckks/, skipped when the
    stamp says it is current."""
    targets = {name: in_place_target(name) for name in NAMES}
    if all(current(target) for target in targets.values()):
        return
    build(targets, WORK / f"build-{sys.implementation.cache_tag}")
    _stamp().write_text(fingerprint() + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch-only", action="store_true", help="only fetch SEAL's sources")
    arguments = parser.parse_args()
    try:
        if arguments.fetch_only:
            print(seal_sources())
        else:
            build_in_place()
    except BuildError as exc:
        log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
