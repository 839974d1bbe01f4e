"""Committed results regenerate: every benchmark that declares a ``CHECK`` re-runs its subset
and matches its committed CSV (the full lane); the comparison itself is checked on small
frames (the gating lane)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pandas as pd
import pytest

import benchmarks
from benchmarks import reproduce
from benchmarks.reproduce import Check, compare
from tests.test_plugins import registries  # noqa: F401  (the fixture)


def declares_check(name: str, constant: str = "CHECK") -> bool:
    """Whether benchmark ``name`` assigns ``constant`` (CHECK, or NO_CHECK: why it has none)
    at its top level, read from its source: importing every benchmark here would import
    torch and Flower, and register what some of them register (a task), for every later
    test."""
    source = Path(benchmarks.__path__[0]) / f"{name}.py"
    return any(
        isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == constant for t in node.targets)
        for node in ast.parse(source.read_text()).body
    )


CHECKED = sorted(
    m.name for m in pkgutil.iter_modules(benchmarks.__path__) if declares_check(m.name)
)

CHECK = Check(args=(), csv="x.csv", keys=("split", "seed"), columns={"auc": 1e-6, "trees": 0})
COMMITTED = pd.DataFrame(
    {"split": ["a", "a", "b"], "seed": [0, 1, 0], "auc": [0.9, 0.8, 0.7], "trees": [3, 3, 4]}
)


def test_a_fresh_subset_that_matches_the_committed_rows_reproduces():
    fresh = COMMITTED.iloc[[0, 2]].assign(auc=[0.9 + 1e-9, 0.7])
    table = compare(CHECK, fresh, COMMITTED)
    assert len(table) == 4 and reproduce.reproduces(table)


def test_a_value_beyond_its_tolerance_or_a_row_not_committed_does_not():
    drifted = COMMITTED.iloc[[0]].assign(auc=[0.9 + 1e-3])
    assert not reproduce.reproduces(compare(CHECK, drifted, COMMITTED))
    changed_count = COMMITTED.iloc[[1]].assign(trees=[4])
    assert not reproduce.reproduces(compare(CHECK, changed_count, COMMITTED))
    new_row = pd.DataFrame({"split": ["c"], "seed": [0], "auc": [0.9], "trees": [3]})
    assert not reproduce.reproduces(compare(CHECK, new_row, COMMITTED))
    # nothing compared is no pass
    assert not reproduce.reproduces(compare(CHECK, COMMITTED.iloc[:0], COMMITTED))


def test_a_chaotic_value_is_held_to_the_committed_seeds_spread():
    """``spread_over``: another CPU moves a chaotic result as another seed would, so a fresh
    value must lie within k standard deviations of the committed seeds' mean for its row;
    a deterministic column (no spread) must equal it, and a row with one seed cannot pass."""
    check = Check(
        args=(),
        csv="x.csv",
        keys=("split", "seed"),
        columns={"auc": 4.0, "trees": 0},
        spread_over="seed",
    )
    seeds = pd.DataFrame(
        {
            "split": ["a"] * 4 + ["b"],
            "seed": [0, 1, 2, 3, 0],
            "auc": [0.80, 0.82, 0.78, 0.80, 0.7],
            "trees": [3, 3, 3, 3, 4],
        }
    )
    sd = seeds.auc[:4].std(ddof=1)
    near = seeds.iloc[[1]].assign(auc=[0.80 + 3.9 * sd])  # seed 1 on another CPU
    assert reproduce.reproduces(compare(check, near, seeds))
    assert not reproduce.reproduces(compare(check, near.assign(auc=[0.80 + 4.1 * sd]), seeds))
    assert not reproduce.reproduces(compare(check, near.assign(trees=[4]), seeds))
    assert not reproduce.reproduces(compare(check, seeds.iloc[[4]], seeds))  # one seed


def test_the_results_files_say_how_they_were_made():
    line = reproduce.made_by("python -m benchmarks.admm --rounds 3")
    assert "`python -m benchmarks.admm --rounds 3`" in line and "commit" in line
    assert "numpy" in line and "CPUs" in line


def test_a_benchmark_rewriting_its_results_leaves_the_checkout_clean(tmp_path):
    """A benchmark writes its CSV, then the Markdown that says how it was made: its own
    results files are not uncommitted changes to the code; a changed module is."""
    import subprocess

    from secagg.simulation.provenance import git_commit

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "x.csv").write_text("a\n1\n")
    (tmp_path / "benchmarks" / "x.py").write_text("A = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    (tmp_path / "benchmarks" / "results" / "x.csv").write_text("a\n2\n")
    ignore = ("benchmarks/results",)
    assert git_commit(ignore, tmp_path)["dirty"] is False
    assert git_commit((), tmp_path)["dirty"] is True
    (tmp_path / "benchmarks" / "x.py").write_text("A = 2\n")
    assert git_commit(ignore, tmp_path)["dirty"] is True


def test_some_benchmarks_declare_a_check():
    assert "admm" in CHECKED


@pytest.mark.slow
@pytest.mark.usefixtures("registries")  # what a benchmark registers goes with the test
@pytest.mark.parametrize("name", CHECKED)
def test_each_declared_check_reproduces_the_committed_results(name):
    module = importlib.import_module(f"benchmarks.{name}")
    table = reproduce.run_check(name, module.CHECK, module.main)
    assert reproduce.reproduces(table), reproduce.report(name, module.CHECK, table)


def test_infinite_values_that_agree_reproduce():
    check = Check(args=(), csv="x.csv", keys=("arm",), columns={"epsilon": 1e-3})
    frame = pd.DataFrame({"arm": ["none", "dp"], "epsilon": [float("inf"), 4.0]})
    assert reproduce.reproduces(compare(check, frame, frame))
    assert not reproduce.reproduces(compare(check, frame.assign(epsilon=[4.0, 4.0]), frame))


def test_every_checked_benchmark_is_one_secagg_bench_runs():
    from secagg.simulation.cli import BENCHMARKS

    assert set(CHECKED) <= set(BENCHMARKS)


def test_every_benchmark_declares_a_check_or_why_it_has_none():
    from secagg.simulation.cli import BENCHMARKS

    for name in BENCHMARKS:
        has, why_not = declares_check(name), declares_check(name, "NO_CHECK")
        assert has != why_not, f"{name}: declare CHECK, or NO_CHECK saying why there is none"
