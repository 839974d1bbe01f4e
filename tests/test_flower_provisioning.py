"""Keys made where the nodes run: each node makes its own keys (``secagg flower init``), only
public keys reach the coordinator (``prepare --nodes``), each node takes its public bundle
back (``join``), and the run is the in-process one."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

import secagg
from secagg.errors import ConfigError
from secagg.flower.apps import run_on_flower
from secagg.flower.deployment import init_node, join_node, prepare
from secagg.simulation.cli import main
from secagg.simulation.config import ExperimentConfig
from tests.flower_grid import LoopbackGrid

CONFIG = ExperimentConfig(
    task="tcga-brca", protocol="fedavg", backend="ckks", rounds=2, seeds=[5], local_steps=3
)
CLIENTS = [f"client_{k}" for k in range(6)]


def secrets_of(site: Path) -> list[bytes]:
    """What must never leave a node: its private keys, as stored and as raw bytes."""
    keys = json.loads((site / "keys.json").read_text())
    found = []
    for name in ("x25519_private", "ed25519_private"):
        found += [keys[name].encode(), base64.b64decode(keys[name])]
    auth = site / "auth.key"
    if auth.exists():
        found.append(auth.read_bytes().strip().splitlines()[1])  # a line of the key body
    return found


def sites(tmp_path: Path, *, auth: bool = True) -> dict[str, Path]:
    out = {}
    for cid in CLIENTS:
        site = tmp_path / "sites" / cid
        init_node(site, cid, auth=auth)
        out[cid] = site
    return out


@pytest.mark.slow
def test_nodes_make_their_keys_and_the_coordinator_sees_none_of_them(tmp_path):
    nodes = sites(tmp_path)
    deployment = tmp_path / "deploy"
    bundles = prepare(
        deployment,
        CONFIG,
        tls=True,
        auth=True,
        publics=tuple(site / "public.json" for site in nodes.values()),
    )
    # nothing private anywhere in what the coordinator holds or sends out
    everything = b"".join(p.read_bytes() for p in deployment.rglob("*") if p.is_file())
    for site in nodes.values():
        for secret in secrets_of(site):
            assert secret not in everything
    # the only private keys there are the SuperLink's own (its demo CA and TLS key)
    sent_out = [p for p in deployment.rglob("*") if p.is_file() and "tls" not in p.parts]
    assert not [p for p in sent_out if b"PRIVATE KEY" in p.read_bytes()]
    assert not list(deployment.glob("nodes/*/keys.json")) and not list(
        deployment.glob("nodes/*/identity.json")
    )
    # the SuperLink registers the keys the nodes made
    for cid, site in nodes.items():
        public = json.loads((site / "public.json").read_text())
        assert (deployment / "auth" / f"{cid}.pub").read_text() == public["auth"]
    for cid, site in nodes.items():
        join_node(site, bundles[cid])
    # the run over Flower's messages, each node answering from its own folder, is the
    # in-process run (to lean CKKS's precision, ~1e-5 here: its noise is fresh in every run)
    reference = secagg.run(CONFIG)
    grid = LoopbackGrid({100 + k: nodes[cid] for k, cid in enumerate(CLIENTS)})
    out = tmp_path / "out"
    run_on_flower(grid, deployment=deployment, out=out, timeout=60, connect_timeout=5)
    np.testing.assert_allclose(
        np.load(out / "models" / "seed-5.npy"), reference.final_params[5], rtol=0, atol=1e-4
    )


def test_a_node_makes_its_keys_once_and_shows_only_public_halves(tmp_path):
    site = tmp_path / "site"
    public = init_node(site, "client_0", auth=True)
    shown = json.loads(public.read_text())
    assert set(shown) == {"client", "x25519", "ed25519", "auth"}
    assert "PRIVATE" not in public.read_text()
    assert (site / "keys.json").stat().st_mode & 0o777 == 0o600
    assert (site / "auth.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="made once"):
        init_node(site, "client_0")
    with pytest.raises(ConfigError, match="client id"):
        init_node(tmp_path / "other", "client 0; rm")


def test_the_coordinator_refuses_incomplete_or_doubtful_public_keys(tmp_path):
    nodes = sites(tmp_path, auth=False)
    publics = [nodes[c] / "public.json" for c in CLIENTS]
    with pytest.raises(ConfigError, match="no public.json for client_5"):
        prepare(tmp_path / "d1", CONFIG, publics=tuple(publics[:5]))
    with pytest.raises(ConfigError, match="two public.json files for client_0"):
        prepare(tmp_path / "d2", CONFIG, publics=(*publics, publics[0]))
    with pytest.raises(ConfigError, match="made no SuperNode key"):
        prepare(tmp_path / "d3", CONFIG, tls=True, auth=True, publics=tuple(publics))
    # a node that sent its private keys by mistake: refused, and said why
    leaked = tmp_path / "leaked.json"
    leaked.write_text((nodes["client_1"] / "keys.json").read_text())
    with pytest.raises(ConfigError, match="never keys.json"):
        prepare(tmp_path / "d4", CONFIG, publics=(*publics[:1], leaked, *publics[2:]))
    # one node's public keys shown under two clients
    copied = json.loads(publics[0].read_text())
    copied["client"] = "client_1"
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps(copied))
    with pytest.raises(ConfigError, match="same public key"):
        prepare(tmp_path / "d5", CONFIG, publics=(publics[0], twin, *publics[2:]))


def test_a_node_refuses_a_bundle_whose_roster_lacks_its_own_keys(tmp_path):
    nodes = sites(tmp_path, auth=False)
    bundles = prepare(
        tmp_path / "deploy", CONFIG, publics=tuple(nodes[c] / "public.json" for c in CLIENTS)
    )
    # a node that made new keys after the coordinator assembled the roster (or an
    # impostor's folder): the roster names someone else's keys for this client
    impostor = tmp_path / "impostor"
    init_node(impostor, "client_2")
    with pytest.raises(ConfigError, match="does not hold this node's own public keys"):
        join_node(impostor, bundles["client_2"])
    with pytest.raises(ConfigError, match="bundle of 'client_3'"):
        join_node(nodes["client_2"], bundles["client_3"])
    join_node(nodes["client_2"], bundles["client_2"])


def test_init_prepare_and_join_from_the_command_line(tmp_path, capsys):
    for cid in CLIENTS:
        assert main(["flower", "init", str(tmp_path / cid), "--client", cid]) == 0
    assert "public keys only" in capsys.readouterr().out
    publics = [str(tmp_path / c / "public.json") for c in CLIENTS]
    args = ["flower", "prepare", str(tmp_path / "deploy"), "--rounds", "1", "--nodes", *publics]
    assert main(args) == 0
    assert json.loads((tmp_path / "deploy" / "deployment.json").read_text())["keys"] == "nodes"
    bundle = tmp_path / "deploy" / "nodes" / "client_4"
    assert main(["flower", "join", str(tmp_path / "client_4"), str(bundle)]) == 0
    assert (tmp_path / "client_4" / "roster.json").is_file()
    capsys.readouterr()
    assert main(["flower", "commands", str(tmp_path / "deploy")]) == 0
    printed = capsys.readouterr().out
    assert "secagg flower join . BUNDLE_client_0" in printed
    from secagg.flower.launch import LocalFederation

    with pytest.raises(ConfigError, match="made on its nodes"):
        LocalFederation(tmp_path / "deploy")


@pytest.mark.slow
def test_a_node_brings_its_own_code_and_data_in_its_node_toml(tmp_path):
    """The coordinator's experiment names its copy of the task's module; the node's own
    folder holds the node's copy and only its own site's CSV, named in node.toml. In a
    process of its own (as every message runs), the node builds its client from those."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    coordinator = tmp_path / "coordinator"
    shutil.copytree(root / "examples" / "own_model", coordinator)
    subprocess.run(
        [sys.executable, str(coordinator / "make_sites.py"), str(coordinator / "sites")],
        check=True,
        capture_output=True,
    )
    code = str(coordinator / "sites_task.py")
    env = {**__import__("os").environ, "SITES_DIR": str(coordinator / "sites")}
    config = (
        "from secagg.simulation.config import ExperimentConfig\n"
        "from secagg.flower.deployment import prepare\n"
        f"config = ExperimentConfig(task='sites-mlp', imports=[{code!r}], backend='ckks',"
        " rounds=1, seeds=[0], local_steps=2).validate()\n"
        f"prepare({str(tmp_path / 'deploy')!r}, config)\n"
    )
    made = subprocess.run([sys.executable, "-c", config], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    node = tmp_path / "deploy" / "nodes" / "client_2"
    # the node's own copy of the code and its own data, nothing of the others'
    (node / "code").mkdir()
    shutil.copy(coordinator / "sites_task.py", node / "code" / "sites_task.py")
    (node / "data").mkdir()
    shutil.copy(coordinator / "sites" / "site_2.csv", node / "data" / "site_2.csv")
    shutil.rmtree(coordinator)  # the coordinator's paths do not exist where the node runs
    build = (
        "from secagg.flower.node import NodeClient\n"
        f"node = NodeClient({str(node)!r})\n"
        "client = node._client(0, None)\n"
        "print(len(client.trainer.data))\n"
    )
    (node / "node.toml").write_text(
        f'imports = ["code/sites_task.py"]\n[environment]\nSITES_DIR = "{node / "data"}"\n'
    )
    fresh = subprocess.run(
        [sys.executable, "-c", build], cwd=tmp_path, capture_output=True, text=True
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split() == ["91"]  # site 2's 91 samples (make_sites.py's split)


@pytest.mark.parametrize(
    "text, match",
    [
        ("server = 'x'\n", "unknown settings"),
        ("[environment]\nSITES_DIR = 3\n", "table of strings"),
        ("imports = 'code.py'\n", "list of module names"),
        ("imports = [\n", "not valid TOML"),
    ],
)
def test_a_node_toml_that_is_not_one_is_refused_before_anything_runs(tmp_path, text, match):
    from secagg.flower.node import apply_node_settings

    (tmp_path / "node.toml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        apply_node_settings(tmp_path)
