"""The wheel installs one import name, ``secagg``, with its data, presets and type marker,
and works from outside the source tree."""

import os
import subprocess
import sys
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
    assert "secagg/simulation/presets/quickstart.toml" in names
    assert not any("benchmarks" in n for n in names)  # they stay in the repository


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
