"""Keys made where the nodes run: each node makes its own keys (``secagg flower init``), only
public keys reach the coordinator (``prepare --nodes``), each node takes its public bundle
back (``join``), and the run is the in-process one."""

from __future__ import annotations

import base64
import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import secagg
from secagg.errors import ConfigError
from secagg.flower.apps import run_on_flower
from secagg.flower.deployment import init_node, join_node, prepare
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.cli import main
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
        "from secagg.runspec.config import ExperimentConfig\n"
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
        "print(len(client.trainer.data), client.backend.commits_ahead)\n"
    )
    (node / "node.toml").write_text(
        f'imports = ["code/sites_task.py"]\n[environment]\nSITES_DIR = "{node / "data"}"\n'
    )
    fresh = subprocess.run(
        [sys.executable, "-c", build], cwd=tmp_path, capture_output=True, text=True
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split()[0] == "91"  # site 2's 91 samples (make_sites.py's split)
    # a process that answers one message commits no seeds it would not live to use
    assert fresh.stdout.split()[1] == "False"


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


def _plain_node(tmp_path: Path) -> Path:
    config = ExperimentConfig(
        task="tcga-brca", protocol="fedavg", backend="plain", rounds=1, seeds=[0], local_steps=1
    )
    return prepare(tmp_path / "deploy", config)["client_1"]


@pytest.mark.parametrize("as_path", [True, False])
def test_a_node_runs_no_module_its_experiment_names_unless_its_own_node_toml_does(
    tmp_path, monkeypatch, as_path
):
    """The coordinator writes the experiment; if a module it names were imported on the
    node, the coordinator would choose code the node runs. The node refuses such an
    experiment before anything of it is imported, and runs its operator's copy instead."""
    from secagg.flower.node import NodeClient

    node = _plain_node(tmp_path)
    marker = tmp_path / "ran"
    name = f"coordinators_code_{int(as_path)}"
    module = tmp_path / "elsewhere" / f"{name}.py"
    module.parent.mkdir()
    module.write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(module.parent))  # importable by name, too
    named = str(module) if as_path else name
    experiment = node / "experiment.toml"
    text = experiment.read_text()
    assert "\nimports = []\n" in text
    experiment.write_text(text.replace("\nimports = []\n", f"\nimports = [{named!r}]\n"))
    with pytest.raises(ConfigError, match="node.toml does not name"):
        NodeClient(node)
    assert not marker.exists() and name not in sys.modules
    assert join_uncovered(node) == [named]
    # the operator's own copy, named in node.toml, is what runs
    own = node / "code" / f"{name}.py"
    own.parent.mkdir()
    own.write_text("OWN = True\n")
    (node / "node.toml").write_text(f'imports = ["code/{name}.py"]\n')
    try:
        NodeClient(node)
        assert sys.modules[name].OWN and not marker.exists()
        assert join_uncovered(node) == []
    finally:
        sys.modules.pop(name, None)


def join_uncovered(node: Path) -> list[str]:
    from secagg.flower.deployment import uncovered_imports

    return uncovered_imports(node)


def test_a_demo_deployment_names_the_experiments_modules_in_each_nodes_node_toml(tmp_path):
    from tests.test_plugins import write_module

    path = write_module(tmp_path, "user_lines_demo")
    config = ExperimentConfig(
        task="user_lines_demo", imports=[str(path)], rounds=1, seeds=[0], local_steps=2
    )
    nodes = prepare(tmp_path / "deployment", config)
    for node in nodes.values():
        assert tomllib.loads((node / "node.toml").read_text())["imports"] == [str(path)]


def _own_ca(folder: Path, *hosts: str) -> dict[str, Path]:
    """A CA and a SuperLink certificate made elsewhere (here: make_tls in another folder)."""
    from secagg.flower.certificates import make_tls

    made = make_tls(folder, ("127.0.0.1", "localhost", *hosts))
    return {"ca": made["ca"], "cert": made["cert"], "key": made["key"]}


def test_a_deployment_takes_its_own_ca_and_superlink_certificate(tmp_path):
    own = _own_ca(tmp_path / "pki", "link.example.org")
    nodes = prepare(
        tmp_path / "deploy", CONFIG, own_tls=own, hosts=("link.example.org",), auth=True
    )
    tls = tmp_path / "deploy" / "tls"
    assert (tls / "ca.crt").read_bytes() == own["ca"].read_bytes()
    assert (tls / "server.pem").read_bytes() == own["cert"].read_bytes()
    assert (tls / "server.key").stat().st_mode & 0o777 == 0o600
    for node in nodes.values():
        assert (node / "ca.crt").read_bytes() == own["ca"].read_bytes()
    spec = json.loads((tmp_path / "deploy" / "deployment.json").read_text())
    assert spec["tls"] and spec["auth"]


def test_certificates_that_would_fail_at_the_first_connection_are_refused_at_prepare(
    tmp_path, capsys
):
    mine, theirs = _own_ca(tmp_path / "mine"), _own_ca(tmp_path / "theirs")
    bad = {
        "was not issued by": {**mine, "ca": theirs["ca"]},
        "is not the private key": {**mine, "key": theirs["key"]},
        "is not a PEM certificate": {**mine, "cert": mine["key"]},
        "is not an unencrypted PEM private key": {**mine, "key": mine["cert"]},
    }
    for k, (match, own) in enumerate(bad.items()):
        with pytest.raises(ConfigError, match=match):
            prepare(tmp_path / f"d{k}", CONFIG, own_tls=own)
        assert not (tmp_path / f"d{k}").exists()  # nothing written
    with pytest.raises(ConfigError, match="does not name link.example.org"):
        prepare(tmp_path / "d9", CONFIG, own_tls=mine, hosts=("link.example.org",))
    # the command line takes all three or none
    args = ["flower", "prepare", str(tmp_path / "cli"), "--ca-cert", str(mine["ca"])]
    assert main(args) != 0
    assert "missing: --server-cert, --server-key" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


def test_a_deployment_folder_can_move(tmp_path, capsys):
    """The App names no path: a moved deployment builds the same App its nodes pinned,
    and the command that submits it names the folder where it is now."""
    import shutil

    from secagg.flower.guard import app_digest, build_app

    prepare(tmp_path / "here", CONFIG)
    shutil.move(tmp_path / "here", tmp_path / "there")
    moved = tmp_path / "there"
    pinned = json.loads((moved / "nodes" / "client_0" / "node.json").read_text())["app"]
    assert app_digest(build_app(moved / "app")) == pinned
    assert str(tmp_path / "here") not in "".join(
        p.read_text(errors="replace") for p in moved.rglob("*") if p.is_file()
    )
    assert main(["flower", "commands", str(moved)]) == 0
    assert f"'deployment=\"{moved}\"'" in capsys.readouterr().out
