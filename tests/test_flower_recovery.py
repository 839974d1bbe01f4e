"""Recovering a deployment: ``secagg flower prepare DIR --update`` re-prepares it in place for
changed settings, keeping the CA, the SuperLink's certificate and key, the SuperNode keys,
the nodes' keys and rosters and the experimenter's key, and says which sites must take a
new bundle; a site re-joins with its own keys and answers the new experiment. What it cannot
keep it refuses, before anything is written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from secagg.errors import ConfigError
from secagg.flower.apps import run_on_flower
from secagg.flower.deployment import init_node, join_node, prepare
from secagg.flower.redeploy import reprepare
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.cli import main
from tests.flower_grid import LoopbackGrid

#: deterministic and quick: plaintext FedAvg, one seed, one local step
CONFIG = ExperimentConfig(
    task="tcga-brca", protocol="fedavg", backend="plain", rounds=1, seeds=[0], local_steps=1
)
CLIENTS = [f"client_{k}" for k in range(6)]


def files_under(folder: Path, *names: str) -> dict[str, bytes]:
    """Every file under ``folder``'s ``names`` (files or folders), by relative path."""
    found = {}
    for name in names:
        for path in [folder / name, *(folder / name).rglob("*")]:
            if path.is_file():
                found[str(path.relative_to(folder))] = path.read_bytes()
    return found


def sites(tmp_path: Path) -> dict[str, Path]:
    """Every client's site folder, its keys made there (``secagg flower init --auth``)."""
    made = {}
    for cid in CLIENTS:
        made[cid] = tmp_path / "sites" / cid
        init_node(made[cid], cid, auth=True)
    return made


def site_deployment(tmp_path: Path, made: dict[str, Path]) -> Path:
    folder = tmp_path / "deploy"
    publics = tuple(made[c] / "public.json" for c in CLIENTS)
    bundles = prepare(folder, CONFIG, tls=True, auth=True, publics=publics)
    for cid, site in made.items():
        join_node(site, bundles[cid])
    return folder


def test_reprepared_in_place_the_ca_certificates_and_keys_stay_byte_for_byte(tmp_path):
    """A demo deployment (its nodes' keys made here), server-blind: more rounds rewrite the
    settings and every bundle, and nothing the SuperLink, the nodes or the experimenter
    hold; a node's state and privacy ledger stay too. The same settings again change no
    bundle; a new timeout changes the pinned App."""
    config = replace(CONFIG, backend="ckks", server_blind=True)
    folder = tmp_path / "deploy"
    nodes = prepare(folder, config, tls=True, auth=True)
    (nodes["client_0"] / "state" / "7").mkdir(parents=True)
    (nodes["client_0"] / "state" / "7" / "0-run.bin").write_bytes(b"state")
    (nodes["client_0"] / "privacy-ledger.json").write_text("{}")
    held = ["tls", "auth", "server", "experimenter", "observer.pub"]
    for cid in CLIENTS:
        held += [f"nodes/{cid}/{n}" for n in ("identity.json", "auth.key", "ca.crt")]
    held += ["nodes/client_0/state", "nodes/client_0/privacy-ledger.json"]
    kept = files_under(folder, *held)
    assert len(kept) == 3 + 6 + 1 + 2 + 1 + 6 * 3 + 2

    done = reprepare(folder, replace(config, rounds=3))
    assert files_under(folder, *held) == kept
    assert done.changed == {cid: ["experiment.toml"] for cid in CLIENTS}
    assert done.rejoin == CLIENTS and done.keys == "prepared"
    for cid in CLIENTS:
        assert "rounds = 3" in (folder / "nodes" / cid / "experiment.toml").read_text()
    spec = json.loads((folder / "deployment.json").read_text())
    assert spec["experiment"] == done.experiment != done.previous

    again = reprepare(folder, replace(config, rounds=3))
    assert again.rejoin == [] and again.experiment == done.experiment
    slower = reprepare(folder, replace(config, rounds=3), timeout=30.0)
    assert slower.changed == {cid: ["node.json"] for cid in CLIENTS}  # the App's pin
    assert files_under(folder, *held) == kept


def test_sites_that_rejoin_with_their_own_keys_answer_the_new_experiment(tmp_path, capsys):
    """Three steps of a recovery across sites: the coordinator re-prepares for two rounds
    (every site must take its new bundle, and is told so); a site still on the old bundle
    refuses the new experiment; each site joins again, keeping its keys, and the run
    completes its two rounds. Re-preparing with the same settings again asks no site for
    anything."""
    made = sites(tmp_path)
    folder = site_deployment(tmp_path, made)
    site_keys = {cid: files_under(site, "keys.json", "auth.key") for cid, site in made.items()}
    held = files_under(folder, "tls", "auth", "server", "nodes/client_0/roster.json")

    assert main(["flower", "prepare", str(folder), "--update", "--rounds", "2"]) == 0
    said = capsys.readouterr().out
    for cid in CLIENTS:
        assert f"{cid}: new bundle (experiment.toml changed)" in said
    assert "secagg flower join NODE_DIR BUNDLE" in said and "flwr run" in said
    assert files_under(folder, "tls", "auth", "server", "nodes/client_0/roster.json") == held

    grid = LoopbackGrid({100 + k: made[cid] for k, cid in enumerate(CLIENTS)}, run_id=8)
    with pytest.raises(ConfigError, match=r"refused this run \(bad_configuration\)"):
        run_on_flower(grid, deployment=folder, out=tmp_path / "stale", timeout=5, connect_timeout=5)

    for cid, site in made.items():  # each site takes its new bundle, keeping its keys
        assert main(["flower", "join", str(site), str(folder / "nodes" / cid)]) == 0
        assert files_under(site, "keys.json", "auth.key") == site_keys[cid]
    grid = LoopbackGrid({100 + k: made[cid] for k, cid in enumerate(CLIENTS)}, run_id=9)
    out = tmp_path / "out"
    run_on_flower(grid, deployment=folder, out=out, timeout=30, connect_timeout=5)
    assert pd.read_csv(out / "metrics.csv")["round"].max() == 2
    assert json.loads((out / "audit_summary.json").read_text())["exclusions"] == []

    capsys.readouterr()
    assert main(["flower", "prepare", str(folder), "--update"]) == 0
    assert "no site must take a new bundle" in capsys.readouterr().out


def test_what_cannot_be_kept_is_refused_before_anything_is_written(tmp_path):
    from tests.test_flower_provisioning import _own_ca

    made = sites(tmp_path)
    folder = site_deployment(tmp_path, made)
    publics = tuple(made[c] / "public.json" for c in CLIENTS)
    demo = tmp_path / "demo"
    prepare(demo, CONFIG)
    plain_demo = files_under(demo, ".")
    before = files_under(folder, ".")
    renewed = tmp_path / "renewed"  # client_3 made new keys since the roster was made
    init_node(renewed, "client_3", auth=True)
    other_sites = (*publics[:3], renewed / "public.json", *publics[4:])
    refused = {
        "clients would be client_0, client_1, client_2, client_3, the": dict(
            config=replace(CONFIG, task="diabetes-iid")
        ),
        "keeps the deployment's CA": dict(own_tls=_own_ca(tmp_path / "pki")),
        "does not name link.example.org": dict(hosts=("link.example.org",)),
        "not the one the deployment's rosters hold": dict(publics=other_sites),
        "is the experimenter's key of a server-blind run": dict(
            observer=made["client_0"] / "public.json"
        ),
    }
    for match, given in refused.items():
        with pytest.raises(ConfigError, match=match):
            reprepare(folder, given.pop("config", replace(CONFIG, rounds=2)), **given)
        assert files_under(folder, ".") == before, match
    reprepare(folder, replace(CONFIG, rounds=2), publics=publics)  # the same sites: fine

    with pytest.raises(ConfigError, match="has TLS off"):
        reprepare(demo, CONFIG, tls=True)
    with pytest.raises(ConfigError, match="made by prepare, not on its nodes"):
        reprepare(demo, CONFIG, publics=publics)
    assert files_under(demo, ".") == plain_demo
    for not_one in (made["client_0"], tmp_path / "nothing"):
        with pytest.raises(ConfigError, match="is not a prepared deployment"):
            reprepare(not_one, CONFIG)
    (demo / "nodes" / "client_4" / "identity.json").unlink()
    with pytest.raises(ConfigError, match="no nodes/client_4/identity.json"):
        reprepare(demo, CONFIG)


def test_a_server_blind_deployment_keeps_its_experimenter(tmp_path):
    from secagg.flower.experimenter import make_experimenter

    theirs = make_experimenter(tmp_path / "experimenter")
    other = make_experimenter(tmp_path / "other")
    config = replace(CONFIG, backend="ckks", server_blind=True)
    folder = tmp_path / "deploy"
    prepare(folder, config, observer=theirs)
    with pytest.raises(ConfigError, match="not the deployment's experimenter key"):
        reprepare(folder, replace(config, rounds=2), observer=other)
    done = reprepare(folder, replace(config, rounds=2), observer=theirs)
    assert done.changed["client_0"] == ["experiment.toml"]
    node = folder / "nodes" / "client_0"
    assert (node / "observer.pub").read_bytes() == theirs.read_bytes()
    assert not (folder / "experimenter").exists()  # no key made here


def test_a_bundle_that_fails_its_check_leaves_the_nodes_own_in_place(tmp_path):
    made = sites(tmp_path)
    site_deployment(tmp_path, made)
    site = made["client_2"]
    joined = files_under(site, ".")
    impostors = tmp_path / "impostors"
    for cid in CLIENTS:
        init_node(impostors / cid, cid)
    foreign = prepare(
        tmp_path / "foreign", CONFIG, publics=tuple(impostors / c / "public.json" for c in CLIENTS)
    )
    with pytest.raises(ConfigError, match="does not hold this node's own public keys"):
        join_node(site, foreign["client_2"])
    assert files_under(site, ".") == joined


def test_updated_settings_keep_the_deployments_and_drop_another_protocols(tmp_path):
    from secagg.flower.redeploy import updated_settings

    folder = tmp_path / "deploy"
    larc = replace(CONFIG, protocol="larc", backend="ckks", protocol_options={"q": 7.0})
    prepare(folder, larc)
    assert updated_settings(folder, {"rounds": 4})["larc_q"] == 7.0
    fedavg = updated_settings(folder, {"protocol": "fedavg"})
    assert fedavg["rounds"] == 1 and fedavg["backend"] == "ckks" and "larc_q" not in fedavg
    assert "server_opt" not in fedavg  # fedavg's own optimizer, not larc's
    plain = updated_settings(folder, {"backend": "plain"})
    assert "ckks_preset" not in plain and plain["larc_q"] == 7.0


def test_the_printed_commands_say_how_to_recover_and_prepare_nodes_hints_at_them(tmp_path, capsys):
    for cid in CLIENTS:
        assert main(["flower", "init", str(tmp_path / cid), "--client", cid]) == 0
    capsys.readouterr()
    publics = [str(tmp_path / c / "public.json") for c in CLIENTS]
    folder = tmp_path / "deploy"
    assert main(["flower", "prepare", str(folder), "--rounds", "1", "--nodes", *publics]) == 0
    hint = capsys.readouterr().out
    assert "secagg flower demo" not in hint  # it needs every site's keys here
    assert f"secagg flower commands {folder}" in hint and "secagg flower join" in hint
    assert main(["flower", "commands", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "submit the same line again" in printed
    assert "secagg flower prepare DIR --update" in printed
    assert main(["flower", "prepare", str(tmp_path / "demo"), "--rounds", "1"]) == 0
    assert "run it here: secagg flower demo" in capsys.readouterr().out
