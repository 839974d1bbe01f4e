"""The wheel installs one import name, ``secagg``, with its data, presets, type marker and
native extension, and works from outside the source tree (scripts/check_wheel.sh, in CI,
runs a threshold round from a clean venv); the sdist carries what building it needs."""

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-v",  # setuptools' warnings reach the log only with -v
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (out / "build.log").write_text(built.stdout + built.stderr)
    (path,) = out.glob("secagg-*.whl")
    return path


@pytest.mark.slow
def test_the_build_leaves_no_folder_unconfigured(wheel):
    """Every folder that ships is a configured package: setuptools warns (about 150 lines
    on each install) for each data folder that is only package data of a parent."""
    log = (wheel.parent / "build.log").read_text()
    assert "Successfully built secagg" in log or wheel.is_file()
    assert "absent from the `packages` configuration" not in log
    assert "Package would be ignored" not in log


@pytest.mark.slow
def test_the_wheel_installs_only_the_secagg_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"secagg", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert "secagg/py.typed" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "secagg/clients/tasks/data/fed_tcga_brca/brca.csv" in names
    assert "secagg/runspec/presets/quickstart.toml" in names
    assert not any("benchmarks" in n for n in names)  # they stay in the repository


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SECAGG_NATIVE") == "off", reason="SECAGG_NATIVE=off")
def test_the_wheel_carries_the_native_extension(wheel):
    """The build backend puts the extension into the wheel: without it an installed secagg
    has no threshold backend and runs ckks on TenSEAL's binding alone."""
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("_seal_native", "_seal_public"):  # both halves
        assert any(n.startswith(f"secagg/ckks/{module}.") and n.endswith(".so") for n in names)
    assert "-none-any" not in wheel.name  # tagged for the interpreter it was built for
    # what it compiles in comes with its notice: SEAL (MIT), pybind11's headers (BSD-3-Clause)
    for notice in ("LICENSE-SEAL", "LICENSE-pybind11"):
        assert any(n.endswith(f"licenses/native/{notice}") for n in names), notice
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: MIT AND BSD-3-Clause" in text


@pytest.mark.slow
def test_the_sdist_carries_what_the_build_needs_and_no_tests(tmp_path):
    """SEAL's sources ride in the sdist (installing it downloads nothing but the build
    requirements); the tests stay in the repository, whose benchmarks/ and docs/ they use."""
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    built = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    sdist = tmp_path / built.stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    for needed in (
        "setup.py",
        "pyproject.toml",
        "native/CMakeLists.txt",
        "native/seal_native.cpp",
        "native/seal_build.py",
        "native/SEAL/CMakeLists.txt",
        "native/SEAL/LICENSE",
        "native/SEAL/native/src/seal/seal.h",
        "secagg/clients/tasks/data/fed_tcga_brca/brca.csv",
    ):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    assert not any(n.endswith(".so") for n in names)


@pytest.mark.slow
def test_the_installed_wheel_loads_its_data_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import secagg, secagg.clients.tasks as t; "
        "print(secagg.__file__); print(len(t.get_task('tcga-brca').load().train))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out[0].startswith(str(target))  # not the checkout's copy
    assert out[1] == "6"


def test_the_links_in_secagg_are_the_top_level_subpackages_the_build_lists():
    """The layout's one convention, kept true: every top-level folder that is a subpackage
    is linked as ``secagg/<name> -> ../<name>`` and listed in pyproject's packages as
    ``secagg.<name>``, and every link is such a folder. Path-reading tools (import graphs,
    ``farm-studio look``) read ``<name>/`` as ``secagg.<name>`` by this rule (the
    architecture page says so)."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    packages = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    links = {p.name: os.readlink(p) for p in (root / "secagg").iterdir() if p.is_symlink()}
    assert links, "no links in secagg/"
    assert all(target == f"../{name}" for name, target in links.items()), links
    assert all((root / name / "__init__.py").is_file() for name in links), links
    listed = {p.split(".")[1] for p in packages if p.count(".") >= 1}
    linked_or_inside = {name for name in listed if (root / "secagg" / name).is_dir()}
    assert listed == linked_or_inside, listed - linked_or_inside
    assert {f"secagg.{name}" for name in links} <= packages
    # and no top-level folder with an __init__.py is left out of the namespace
    top_level_packages = {
        p.name
        for p in root.iterdir()
        if (p / "__init__.py").is_file() and p.name not in {"secagg", "tests", "benchmarks"}
    }
    assert top_level_packages == set(links), top_level_packages ^ set(links)
