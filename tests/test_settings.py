"""One configuration language: flags and TOML keys are the same names, layers combine in
order, a run's own config reruns it exactly, and bad or contradictory settings fail before
anything trains, with a message that says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import secagg
from benchmarks.protocol_parity import short_run
from secagg.backends import BACKENDS
from secagg.clients.training import flat_params
from secagg.errors import ConfigError
from secagg.protocols import PROTOCOLS
from secagg.runspec import settings as S
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.cli import build_parser, main
from secagg.simulation.outputs import default_folder

TINY = ["--rounds", "2", "--seeds", "1,2", "--local-steps", "5"]

#: a value for every setting, as a flag's text and as what TOML holds
SAMPLES = {
    int: ("7", 7),
    float: ("0.25", 0.25),
    str: ("abc", "abc"),
}
SPECIAL = {
    "task": ("digits-niid1", "digits-niid1"),
    "protocol": ("larc", "larc"),
    "backend": ("ckks", "ckks"),
    "seeds": ("3-5", "3-5"),
    "client_lr": ("0.05@0,0.01@3", "0.05@0,0.01@3"),
    "dp_sgd": ("clip=1.0,noise=0.8", {"clip": 1.0, "noise": 0.8}),
    "client_dp": ("clip=0.5,noise=1.2", {"clip": 0.5, "noise": 1.2}),
    "scalar_dp": ("low=0,high=1,noise=0.1", {"low": 0, "high": 1, "noise": 0.1}),
    "dp_noise": ("os", "os"),
    "server_opt": ("adam", "adam"),
    "server_lr_schedule": ("0.1@0,0.05@2", "0.1@0,0.05@2"),
    "protocol_option": ("alpha=0.5", ["alpha=0.5"]),
    "larc_loss_check": ("weights_only", "weights_only"),
    "admm_problem": ("lasso", "lasso"),
    "plain_dtype": ("float64", "float64"),
    "ckks_preset": ("wide", "wide"),
    "threshold_preset": ("lean", "lean"),
    "threshold_t": ("3", 3),
    "imports": ("json,string", ["json", "string"]),  # importable anywhere, harmless
    "device": ("auto", "auto"),
    "min_clients": ("all", "all"),
    "participation": ("per-round", "per-round"),
}


@pytest.mark.parametrize("key", sorted(S.settings_table()))
def test_every_setting_is_a_flag_and_a_toml_key_with_the_same_value(key, tmp_path):
    setting = S.settings_table()[key]
    if setting.is_bool:
        argv, toml_value = [f"--no-{key.replace('_', '-')}"], False
    else:
        text, toml_value = SPECIAL.get(key) or SAMPLES[setting.parse]  # type: ignore[index]
        argv = [setting.flag, text]
    from_flag = S.flag_values(build_parser().parse_args(["run", *argv]))
    file = tmp_path / "c.toml"
    file.write_text(S.to_toml({key: toml_value}))
    assert S.read_file(file) == from_flag, key


def test_help_shows_real_defaults():
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    text = " ".join(text.split())  # argparse wraps lines
    assert "(default: None)" not in text
    assert "(default: 100)" in text  # local_steps
    assert "(default: compact)" in text and "(default: 30)" in text  # the ckks backend's


def test_layers_preset_then_file_then_flags(tmp_path):
    file = tmp_path / "mine.toml"
    file.write_text("rounds = 3\nlarc_q = 5.0\nserver_lr = 0.2\n")
    args = build_parser().parse_args(
        ["run", "--preset", "idash-larc", "--config", str(file), "--rounds", "4"]
    )
    from secagg.simulation.cli import resolve_settings

    config, _ = S.to_config(resolve_settings(args))
    assert config.task == "tcga-brca-idash"  # from the preset
    assert config.protocol_options["q"] == 5.0  # the file over the preset's 19
    assert config.optimizer_config()["lr"] == 0.2 and config.optimizer_config()["tau"] == 1e-3
    assert config.rounds == 4  # the flag over the file


@pytest.mark.parametrize("name", sorted(p.stem for p in S.PRESETS.glob("*.toml")))
def test_every_preset_loads_and_shows(name, capsys):
    config, _ = S.to_config(S.read_file(S.preset_path(name)))
    assert config.seeds
    assert main(["presets", "--show", name]) == 0
    assert capsys.readouterr().out == S.preset_path(name).read_text()


@pytest.mark.parametrize(
    "config",
    [
        ExperimentConfig(),
        ExperimentConfig(protocol="larc", backend="ckks", protocol_options={"q": 5.0}),
        ExperimentConfig(
            protocol="costwagg",
            protocol_options={"alpha": 0.3},
            client_dp={"clip": 1.0, "noise": 0.5},
            dp_delta=1e-6,
            seeds=[4, 9],
        ),
        ExperimentConfig(
            protocol="feddisco", task="digits-niid2", local_epochs=2, vae_rounds=3, workers=2
        ),
    ],
    ids=["default", "larc-ckks", "costwagg-dp", "feddisco"],
)
def test_settings_round_trip_through_toml(config, tmp_path):
    values = S.from_config(config.validate())
    file = tmp_path / "config.toml"
    file.write_text(S.to_toml(values))
    again, _ = S.to_config(S.read_file(file))
    assert S.from_config(again) == values
    assert again.optimizer_config() == config.optimizer_config()


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_every_protocol_on_every_backend_round_trips(protocol, backend, tmp_path):
    """Each protocol's own kind of run (ADMM's fixed z-update once broke writing config.toml)
    with every backend's resolved options."""
    config = replace(short_run(protocol), backend=backend)
    if backend == "plain":
        config = replace(config, backend_options={})
    test_settings_round_trip_through_toml(config, tmp_path)


@pytest.mark.slow
def test_a_runs_config_reruns_it_exactly(tmp_path):
    first = tmp_path / "first"
    assert main(["run", "--protocol", "costwagg", *TINY, "--quiet", "--out", str(first)]) == 0
    config = json.loads((first / "config.json").read_text())
    assert config["provenance"]["secagg_version"] == secagg.__version__
    assert torch.__version__.startswith(config["provenance"]["libraries"]["torch"])
    assert "costwagg" in config["provenance"]["command_line"]
    for i, source in enumerate(("config.toml", "config.json", "")):
        again = tmp_path / f"again{i}"
        assert main(["run", "--config", str(first / source), "--quiet", "--out", str(again)]) == 0
        metrics = [pd.read_csv(f / "metrics.csv") for f in (first, again)]
        timing = [c for c in metrics[0] if c.startswith("seconds_")]
        pd.testing.assert_frame_equal(*(m.drop(columns=timing) for m in metrics))
    model = secagg.load_model(first, seed=2)
    saved = np.load(first / "models" / "seed-2.npy")  # the server's float64 parameters
    np.testing.assert_array_equal(flat_params(model), saved.astype(np.float32))
    loaded = torch.load(first / "models" / "seed-2.pt")
    assert set(loaded) == set(model.state_dict())


BAD = [
    (
        ["--backend", "plain", "--ckks-preset", "wide", "--flooding-bits", "0"],
        "setting of backend ckks",
    ),
    (["--local-steps", "5", "--local-epochs", "1"], "give one of them"),
    (["--seeds", "61-42"], "runs backwards; write 42-61"),
    (["--protocol", "fedavg", "--protocol-option", "alpha=0.5"], "has no setting 'alpha'"),
    (["--protocol", "larc", "--vae-rounds", "3"], "feddisco"),
    (
        ["--protocol", "dec", "--task", "dec-breast-cancer-iid", "--vae-rounds", "3"],
        "--dec-pretrain-rounds",
    ),
    (
        ["--protocol", "dec", "--task", "breast-cancer-iid"],
        "protocol 'dec' cannot train task 'breast-cancer-iid': it needs a dec-* task (dec-digits",
    ),
    (["--dp-delta", "1e-6"], "apply only with differential privacy"),
    (["--protocol", "larc", "--no-streaming"], "changes nothing for larc"),
    (["--protocol", "fedavg", "--larc-q", "3"], "setting of protocol larc"),
    (["--protocol", "feddisco"], "features in [0, 1]"),
    (["--protocol", "fedavg", "--tau", "0.1"], "tau does not apply to server optimizer sgd"),
    (["--protocol", "larc", "--validation-split", "0.2"], "larc would only train on fewer"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[a[0][1] for a in BAD])
def test_contradictions_fail_before_training(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    seeds = [] if "--seeds" in argv else ["--seeds", "1"]
    try:
        code = main(["run", *argv, *seeds, "--rounds", "1", "--out", str(out)])
    except SystemExit as stop:  # argparse's own errors (a flag's value) exit 2 too
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "round 1/" not in err  # nothing trained
    assert not (out / "metrics.csv").exists()


def test_bad_files_and_folders(tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text('[server_opt]\nname = "adam"\n')
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('rounds = "five"\n')
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (["--config", str(old)], "no longer a table"),
        (["--config", str(wrong)], "rounds: invalid literal"),
        (["--out", str(afile)], "is a file, not a folder"),
        (["--overwrite", "--resume", str(tmp_path)], "contradict"),
    ]
    for argv, message in cases:
        assert main(["run", *argv, "--quiet"]) == 2
        assert message in capsys.readouterr().err, argv


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_fails_at_once(tmp_path, capsys):  # pragma: no cover - as root
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["run", "--out", str(locked / "run"), "--quiet"]) == 2
    assert "cannot write results" in capsys.readouterr().err


def test_a_folder_with_results_needs_overwrite_which_removes_only_ours(tmp_path, capsys):
    folder = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--rounds",
                "1",
                "--seeds",
                "1",
                "--local-steps",
                "2",
                "--quiet",
                "--out",
                str(folder),
            ]
        )
        == 0
    )
    assert main(["run", "--rounds", "1", "--seeds", "1", "--quiet", "--out", str(folder)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    args = ["run", "--rounds", "1", "--seeds", "2", "--local-steps", "2", "--quiet"]
    assert main([*args, "--overwrite", "--out", str(folder)]) == 0
    assert set(pd.read_csv(folder / "metrics.csv")["seed"]) == {2}
    assert sorted(p.name for p in (folder / "models").iterdir()) == ["seed-2.npy", "seed-2.pt"]
    (folder / "notes.txt").write_text("mine")
    assert main([*args, "--overwrite", "--out", str(folder)]) == 2
    assert "files secagg did not write (notes.txt)" in capsys.readouterr().err
    assert (folder / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_what_trackers_and_flower_wrote_into_a_run_folder(tmp_path):
    folder = tmp_path / "run"
    args = ["run", "--rounds", "1", "--seeds", "1", "--local-steps", "2", "--quiet"]
    assert main([*args, "--tracker", "tensorboard", "--out", str(folder)]) == 0
    assert (folder / "tensorboard").is_dir()
    (folder / "flower.json").write_text("{}")  # what a run over Flower adds
    (folder / "mlruns").mkdir()
    assert main([*args, "--overwrite", "--out", str(folder)]) == 0
    assert not any((folder / name).exists() for name in ("tensorboard", "mlruns", "flower.json"))


def test_default_folders_are_new_for_every_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = ExperimentConfig(protocol="larc")
    first = default_folder(config)
    first.mkdir(parents=True)
    second = default_folder(config)
    assert first != second and not second.exists()
    assert first.parts[0] == "results" and first.name.startswith("tcga-brca-larc-plain-")


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["presets"],
        ["presets", "--show", "quickstart"],
        ["run", "--help"],
        ["compare", "--help"],
        ["bench", "--help"],
        ["protocols"],
    ],
)
def test_the_cli_answers_without_importing_torch(argv):
    code = (
        "import sys\nfrom secagg.simulation.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('torch loaded:', 'torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path.cwd()
    )
    assert done.stderr.strip().endswith("torch loaded: False"), done.stderr
    assert done.stdout.strip(), "it printed something"


def test_version_names_the_release(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"secagg {secagg.__version__}")


def test_seed_parsing():
    assert S.parse_seeds("1,3-5, 9") == [1, 3, 4, 5, 9]
    for bad in ("", "a", "5-3", "1-"):
        with pytest.raises(ValueError):
            S.parse_seeds(bad)
    with pytest.raises(ConfigError, match="seeds must be integers"):
        S.coerce(S.settings_table()["seeds"], [1, "2"], "x.toml")


def test_a_mistyped_flag_gets_the_closest_flags_of_its_command(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--rounsd", "3"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --rounsd 3" in err and "did you mean --rounds?" in err
    with pytest.raises(SystemExit):
        main(["compare", "x", "--rounds", "2"])
    assert "did you mean --round?" in capsys.readouterr().err  # compare's own flag


def test_secagg_tasks_lists_every_registered_task(capsys):
    from secagg.clients.tasks import TASKS

    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in TASKS) and "c_index" in out
