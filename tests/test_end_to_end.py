"""Small end-to-end runs through the CLI: outputs, byte accounting, audit, errors."""

import json
import re

import pandas as pd
import pytest

from secagg.simulation.cli import main, parse_seeds

SMALL = ["--rounds", "2", "--seeds", "1,2", "--local-steps", "5", "--quiet"]


@pytest.fixture(scope="module")
def larc_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("larc")
    assert main(["run", "--protocol", "larc", *SMALL, "--out", str(out)]) == 0
    return out


def test_run_writes_every_output(larc_run):
    for name in (
        "metrics.csv",
        "summary.csv",
        "traffic.csv",
        "audit.jsonl",
        "audit_summary.json",
        "config.json",
        "convergence.png",
    ):
        assert (larc_run / name).stat().st_size > 0, name
    metrics = pd.read_csv(larc_run / "metrics.csv")
    assert len(metrics) == 2 * 3  # seeds × (initial + 2 rounds)
    final = metrics[metrics["round"] == 2]
    assert final["test_pooled"].between(0, 1).all() and (final["clients"] == 6).all()
    summary = pd.read_csv(larc_run / "summary.csv")
    assert (summary["n_seeds"] == 2).all()
    assert summary.loc[summary["round"] == 2, "test_pooled_mean"].iloc[0] == pytest.approx(
        final["test_pooled"].mean()
    )


def test_byte_counts_agree_across_tables(larc_run):
    metrics = pd.read_csv(larc_run / "metrics.csv")
    traffic = pd.read_csv(larc_run / "traffic.csv")
    assert traffic.loc[traffic["direction"] == "up", "bytes"].sum() == metrics["bytes_up"].sum()
    assert traffic.loc[traffic["direction"] == "down", "bytes"].sum() == metrics["bytes_down"].sum()
    upload = traffic[(traffic["field"] == "pseudo_gradient") & (traffic["direction"] == "up")]
    # 40 float32 parameters per client, run and round; 6 clients each round
    assert (upload["bytes"] == 40 * 4).all() and (upload["messages"] == 1).all()
    assert (upload.groupby(["run", "round"])["peer"].nunique() == 6).all()


def test_plain_audit_says_individual_updates_were_revealed(larc_run):
    summary = json.loads((larc_run / "audit_summary.json").read_text())
    assert summary["individual_updates_revealed"] is True
    assert summary["undeclared_plaintext_items"] == ["pseudo_gradient"]
    learned = summary["learned_in_plaintext"]
    # per run and round: six ΔL, six n_i, one revealed global update
    assert learned["delta_loss"] == {"plaintext scalar": 2 * 2 * 6}
    assert learned["global_update"] == {"revealed aggregate (plaintext vector)": 2 * 2}
    assert summary["sent_in_plaintext"]["alpha"] == {"plaintext scalar": 2 * 2 * 6}
    records = [json.loads(line) for line in (larc_run / "audit.jsonl").read_text().splitlines()]
    dl = [
        f["value"]
        for r in records
        if r["event"] == "message"
        for f in r["fields"]
        if f["name"] == "delta_loss"
    ]
    assert len(dl) == 24 and all(isinstance(v, float) for v in dl)


def test_same_seed_same_result(tmp_path):
    args = ["run", "--protocol", "fedadam", "--client-lr", "0.01", *SMALL]
    main([*args, "--out", str(tmp_path / "a")])
    main([*args, "--out", str(tmp_path / "b")])
    a = pd.read_csv(tmp_path / "a" / "metrics.csv")
    b = pd.read_csv(tmp_path / "b" / "metrics.csv")
    pd.testing.assert_series_equal(a["test_pooled"], b["test_pooled"])


def test_preset_and_command_line_override(tmp_path):
    assert (
        main(
            [
                "run",
                "--preset",
                "idash-larc",
                "--seeds",
                "3",
                "--rounds",
                "1",
                "--local-steps",
                "2",
                "--quiet",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    settings = json.loads((tmp_path / "config.json").read_text())["settings"]
    assert settings["protocol"] == "larc" and settings["seeds"] == [3] and settings["rounds"] == 1
    assert settings["tau"] == 1e-3 and settings["larc_q"] == 19.0  # from the preset
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert "test_pooled" not in metrics  # the iDASH variant evaluates on training data


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--preset", "nope"], "invalid choice 'nope' (`secagg presets` lists them)"),
        (["run", "--rounds", "0"], "rounds must be a positive integer"),
        (["run", "--client-lr", "fast"], "client-lr schedule"),
        (
            ["run", "--server-opt", "sgd", "--tau", "1e-3"],
            "tau does not apply to server optimizer sgd",
        ),
        (["run", "--larc-b", "-1", "--protocol", "larc"], "b >= 0"),
        (["run", "--client-split", "1.5"], "client_split"),
    ],
)
def test_bad_options_exit_2_with_a_message(argv, message, capsys, tmp_path):
    try:
        status = main([*argv, "--out", str(tmp_path)])
    except SystemExit as stop:  # argparse's own refusals (a choice) exit from the parser
        status = stop.code
    assert status == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "metrics.csv").exists()


def test_config_file_with_unknown_key(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('protocol = "fedavg"\nrouns = 3\n')
    assert main(["run", "--config", str(cfg)]) == 2
    assert "unknown setting 'rouns' (did you mean rounds" in capsys.readouterr().err


def test_seed_lists():
    assert parse_seeds("42") == [42]
    assert parse_seeds("1,3-5") == [1, 3, 4, 5]
    with pytest.raises(Exception, match="cannot read seeds"):
        parse_seeds("a-b")


def test_a_dp_run_writes_its_privacy_report(tmp_path):
    assert (
        main(
            [
                "run",
                "--protocol",
                "larc",
                "--backend",
                "ckks",
                *SMALL,
                "--out",
                str(tmp_path),
                "--client-dp",
                "clip=0.5,noise=1",
                "--scalar-dp",
                "low=-1,high=1,noise=2",
                # Seeded noise, so that which rounds the release rules refuse is fixed: with
                # OS noise, a run could have every round refused and release no update.
                "--dp-noise",
                "seeded",
            ]
        )
        == 4  # degraded: the clients' release rules refuse some round's release (skipped)
    )
    state = json.loads((tmp_path / "run.json").read_text())
    assert state["status"] == "degraded" and state["problems"]
    for problem in state["problems"]:
        assert re.fullmatch(r"rounds? [0-9, -]+ of seed [12] made no update \(skipped\)", problem)
    report = json.loads((tmp_path / "privacy.json").read_text())
    eps = report["client_level"]["epsilon_per_seed"]
    assert set(eps) == {"1", "2"} and all(0 < e < float("inf") for e in eps.values())
    assert report["scalars"]["worst_client_epsilon_per_seed"]["1"] > 0
    assert report["dp_protected_items"] == ["delta_loss", "global_update"]
    assert report["not_dp_protected_items"] == ["n_samples"]
    assert report["assumptions"]
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    # ε only grows round by round
    for _, g in metrics[metrics["round"] > 0].groupby("seed"):
        assert g["eps_client_level"].is_monotonic_increasing
