"""Where `secagg bench crypto` and `secagg bench overhead` write: never into the package or
over earlier results by default, and a bad --out fails before anything is measured."""

import re
from datetime import datetime
from pathlib import Path

import pytest

from benchmarks import crypto, options, overhead
from tests.test_plugins import registries  # noqa: F401  (the fixture)

BENCHES = {"crypto": crypto, "overhead": overhead}


@pytest.fixture(autouse=True)
def nothing_is_measured(monkeypatch):
    """Every test here stops at the arguments: measuring anything is a failure."""

    def refuse(*args, **kwargs):
        raise AssertionError("a benchmark started measuring")

    for name in ("bench_preset", "bench_nvflare"):
        monkeypatch.setattr(crypto, name, refuse)
    monkeypatch.setattr(overhead, "run_config", refuse)


@pytest.mark.parametrize("name", BENCHES)
def test_the_default_folder_is_new_and_under_the_working_directory(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = BENCHES[name].parse_args([]).out
    second = BENCHES[name].parse_args([]).out
    for out in (first, second):
        assert out.parent == tmp_path / "results" / "bench"
        assert re.fullmatch(rf"{name}-\d{{8}}-\d{{6}}(-\d+)?", out.name)
        assert out.is_dir() and not any(out.iterdir())
    assert first != second
    package = Path(BENCHES[name].__file__).parent
    assert not first.is_relative_to(package)


def test_runs_started_in_the_same_second_get_numbered_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = datetime(2025, 3, 4, 5, 6, 7)
    names = [options.fresh_folder("crypto", now).name for _ in range(3)]
    assert names == [
        "crypto-20250304-050607",
        "crypto-20250304-050607-2",
        "crypto-20250304-050607-3",
    ]


@pytest.mark.parametrize("name", BENCHES)
def test_an_out_that_is_a_file_is_refused_before_measuring(name, tmp_path, capsys):
    target = tmp_path / "results.csv"
    target.write_text("keep me")
    with pytest.raises(SystemExit) as exc:
        BENCHES[name].main(["--out", str(target)])
    assert exc.value.code == 2
    assert f"--out {target} is a file, not a folder" in capsys.readouterr().err
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("name", BENCHES)
def test_an_out_that_cannot_be_created_is_refused_before_measuring(name, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        BENCHES[name].main(["--out", str(tmp_path / "file" / "sub")])
    assert exc.value.code == 2
    assert f"cannot write results to {tmp_path / 'file' / 'sub'}" in capsys.readouterr().err


@pytest.mark.parametrize("name", BENCHES)
def test_earlier_outputs_are_replaced_only_with_overwrite(name, tmp_path, capsys):
    bench = BENCHES[name]
    earlier = tmp_path / bench.OUTPUTS[1]
    earlier.write_text("an earlier run")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"already holds this benchmark's output ({bench.OUTPUTS[1]})" in err
    assert "--overwrite" in err
    assert earlier.read_text() == "an earlier run"
    assert bench.parse_args(["--out", str(tmp_path), "--overwrite"]).out == tmp_path


@pytest.mark.parametrize("name", BENCHES)
def test_a_folder_without_this_benchmarks_outputs_is_used_and_a_missing_one_made(name, tmp_path):
    (tmp_path / "notes.txt").write_text("")
    assert BENCHES[name].parse_args(["--out", str(tmp_path)]).out == tmp_path
    missing = tmp_path / "a" / "b"
    assert BENCHES[name].parse_args(["--out", str(missing)]).out == missing
    assert missing.is_dir()


def test_the_secagg_command_fails_the_same_way(tmp_path, capsys):
    from secagg.simulation.cli import main

    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "crypto", "--out", str(target)])
    assert exc.value.code == 2
    assert "secagg bench crypto: error: --out" in capsys.readouterr().err


def test_reuse_needs_an_earlier_runs_folder_and_may_rewrite_its_report(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        overhead.parse_args(["--reuse"])
    assert "--reuse reads an earlier run's overhead_rounds.csv" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()  # no fresh folder left behind
    (tmp_path / "overhead_rounds.csv").write_text("")
    assert overhead.parse_args(["--reuse", "--out", str(tmp_path)]).out == tmp_path


def test_argument_errors_leave_no_output_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for bench, argv in ((overhead, ["--rounds", "0"]), (crypto, ["--sizes", "1000,x"])):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert not (tmp_path / "results").exists()


def test_quick_fills_in_smaller_defaults_but_keeps_given_values(tmp_path):
    args = overhead.parse_args(["--quick", "--out", str(tmp_path)])
    assert (args.rounds, args.local_steps, args.repeats) == (2, 10, 1)
    args = overhead.parse_args(["--quick", "--rounds", "3", "--out", str(tmp_path)])
    assert (args.rounds, args.local_steps, args.repeats) == (3, 10, 1)
    args = overhead.parse_args(["--out", str(tmp_path)])
    assert (args.rounds, args.local_steps, args.repeats) == (3, 100, 3)


@pytest.mark.usefixtures("registries")  # autofedrl_digits registers a task when imported
@pytest.mark.parametrize(
    "module", ["flamby_tcga", "rolepro_tcga", "autofedrl_digits", "feddisco_digits"]
)
@pytest.mark.parametrize("seeds", ["9-3", "one"])
def test_bad_seeds_end_the_run_with_what_is_wrong(module, seeds, tmp_path, capsys):
    # the command-line parser raised an argparse type error these benchmarks did not catch:
    # a traceback instead of a message
    import importlib

    bench = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--seeds", seeds, "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "seed" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("dirty", [True, False])
def test_the_committed_results_are_written_only_from_a_clean_checkout(dirty, capsys, monkeypatch):
    """``--out benchmarks/results`` from a checkout with uncommitted changes is refused
    before anything is measured (a results file's commit line must be one anyone can check
    out); from a clean one it is the folder used."""
    from secagg.simulation import provenance

    monkeypatch.setattr(
        provenance, "git_commit", lambda ignore=(): {"commit": "0" * 40, "dirty": dirty}
    )
    committed = Path(options.__file__).resolve().parent / "results"
    if dirty:
        with pytest.raises(SystemExit) as stop:
            crypto.parse_args(["--out", str(committed), "--overwrite"])
        assert stop.value.code == 2
        assert "written only from a clean checkout" in capsys.readouterr().err
    else:
        assert crypto.parse_args(["--out", str(committed), "--overwrite"]).out == committed
