"""The command line's papercuts: "did you mean" for every choice and command, no
abbreviated flags, a run refused before training leaves nothing that blocks its folder, and
``--device auto`` says what it picked. (SIGTERM's exit status 143 is in test_resume.py,
with a real signal to a real run.)"""

from __future__ import annotations

import argparse
import json
import signal

import pytest
import torch

from secagg.simulation.cli import SuggestingParser, build_parser, main
from tests.test_plugins import registries, write_module  # noqa: F401 - a fixture

MISTYPED = [
    (["run", "--task", "tcga-brcaa"], "did you mean tcga-brca", "`secagg tasks` lists them"),
    (["run", "--backend", "ckk"], "did you mean ckks?", "choose from plain, ckks, threshold"),
    (["run", "--protocol", "fedavgg"], "did you mean fedavg", "`secagg protocols` lists them"),
    (["run", "--ckks-preset", "lean2"], "did you mean lean?", "choose from lean, compact, wide"),
    (["run", "--preset", "quickstrat"], "did you mean quickstart?", "`secagg presets`"),
    (["presets", "--show", "quickstrt"], "did you mean quickstart?", "`secagg presets`"),
    (["rnu"], "unknown command 'rnu'; did you mean run?", "`secagg --help` lists them"),
    (["protocls"], "did you mean protocols?", "`secagg --help`"),
    (["flower", "prepar"], "did you mean prepare?", "`secagg flower --help` lists them"),
    (["flower", "prepare", "DIR", "--task", "tcga-brcaa"], "did you mean tcga-brca", "tasks`"),
    (["bench", "crypt"], "did you mean crypto?", "`secagg bench --help` lists them"),
    (["run", "--local-step", "5"], "--local-step: did you mean --local-steps", "unrecognized"),
    (["flower", "prepare", "DIR", "--round", "5"], "did you mean --rounds", "unrecognized"),
]


@pytest.mark.parametrize(
    "argv, suggestion, listing", MISTYPED, ids=[" ".join(a[0]) for a in MISTYPED]
)
def test_a_mistyped_name_gets_a_short_error_naming_the_closest(argv, suggestion, listing, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert suggestion in err and listing in err, err
    # a few lines, not the whole usage and every choice
    assert len(err.strip().splitlines()) <= 3, err
    assert "deepcox-gbsg2-feature" not in err and "xgboost," not in err, err


def test_the_closest_names_include_what_an_import_registers(registries, tmp_path, capsys):  # noqa: F811
    module = write_module(tmp_path, "user_lines_papercut")
    with pytest.raises(SystemExit) as stop:
        main(["run", "--import", str(module), "--task", "user_lines_papercutt"])
    assert stop.value.code == 2
    assert "did you mean user_lines_papercut?" in capsys.readouterr().err


def test_a_name_in_a_settings_file_gets_the_closest_names_too(tmp_path, capsys):
    config = tmp_path / "mine.toml"
    config.write_text('task = "tcga-brcaa"\nprotocol = "fedavg"\n')
    assert main(["run", "--config", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'tcga-brcaa'; did you mean tcga-brca" in err, err
    assert "`secagg tasks` lists them" in err and "deepcox-gbsg2-feature" not in err, err


def parsers(parser: argparse.ArgumentParser):
    """``parser`` and every parser under it (sub-commands, flower's verbs)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from parsers(sub)


def test_no_parser_takes_an_abbreviated_flag():
    every = list(parsers(build_parser()))
    names = {p.prog for p in every}
    assert {"secagg", "secagg run", "secagg flower", "secagg flower prepare"} <= names
    for parser in every:
        assert isinstance(parser, SuggestingParser) and parser.allow_abbrev is False, parser.prog
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--local-step", "5"])


def test_the_exit_status_of_a_stop_signal_is_the_shells():
    from secagg.simulation.api import RunInterrupted

    assert RunInterrupted("x", 1, 3).exit_code == 130  # type: ignore[arg-type]
    assert RunInterrupted("x", 1, 3, signal.SIGTERM).exit_code == 143  # type: ignore[arg-type]


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


@NO_GPU
def test_a_refused_device_leaves_no_folder_and_the_same_out_is_refused_the_same(tmp_path, capsys):
    out = tmp_path / "new" / "run"
    argv = ["run", "--device", "cuda", "--rounds", "1", "--seeds", "1", "--out", str(out)]
    for _ in range(2):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "device 'cuda': torch sees no CUDA GPU" in err, err
        assert "already holds files" not in err, err
        assert not (tmp_path / "new").exists()  # nor the parent it would have made


def test_a_refusal_after_the_folder_started_removes_only_this_runs_files(tmp_path, capsys):
    # feddisco's data check runs once the data is loaded, after config.json is written
    made = tmp_path / "made" / "run"
    there = tmp_path / "there"
    there.mkdir()
    for out in (made, there):
        argv = ["run", "--protocol", "feddisco", "--rounds", "1", "--seeds", "1"]
        for _ in range(2):
            assert main([*argv, "--quiet", "--out", str(out)]) == 2
            err = capsys.readouterr().err
            assert "features in [0, 1]" in err and "already holds files" not in err, err
    assert not (tmp_path / "made").exists()
    assert there.is_dir() and not [p for p in there.iterdir() if not p.name.startswith(".")]


def test_device_auto_names_the_device_it_picked(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", "--device", "auto", "--rounds", "1", "--seeds", "1", "--local-steps", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    device = json.loads((out / "config.json").read_text())["provenance"]["device"]
    assert device["setting"] == "auto" and device["used"] in ("cpu", "cuda:0"), device
    assert f"device auto: {device['used']} ({device['why']})" in err, err
    if not torch.cuda.is_available():
        assert device["used"] == "cpu" and "torch sees no CUDA GPU" in device["why"]
