"""A SuperNode answers only what its own provisioning allows (issue 31, item 8).

- **A foreign App on a node.** A plain Flower SuperNode accepts any App the SuperLink serves
  and hands its ClientApp the node's ``node_config``, so the App's own code reads
  ``node-dir/identity.json`` (reproduced below through Flower's own SuperNode code). A node
  started as secagg starts it (``secagg flower node``, ``demo``, ``commands``) runs only the
  App whose digest ``prepare`` pinned in its folder: a foreign App's run gets Flower's
  "invalid FAB" reply, and nothing of it is stored (no run, no context, so nothing of it
  ever runs on the node or sees ``node-dir``).
- **Seeds and stages not in the node's experiment file**, and a seed whose runs that
  released spent the node's own ledger, are refused before anything is built: no key, no
  budget, no state. The server gets the refusal's code only (``request_refused``,
  ``privacy_budget_spent``); the detail is the node's log.
- **DP noise seeded from the run's seed** (the server names the seed) is refused by a node.

Everything goes through the real classes: Flower's ``_pull_and_store_message`` with its
NodeState, the ClientApp ``client_app`` with requests captured from an honest run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.cli.build import build_fab_from_files
from flwr.common.constant import ErrorCode
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supernode import start_client_internal as supernode
from flwr.supernode.nodestate import NodeStateFactory

from secagg.errors import ConfigError
from secagg.flower import guard, messages
from secagg.flower.apps import client_app, run_on_flower
from secagg.flower.deployment import prepare
from secagg.flower.launch import LocalFederation
from secagg.flower.node import SeededNoiseRefused
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.settings import from_config, to_toml
from tests.flower_grid import LoopbackGrid, as_server

PLAIN = ExperimentConfig(
    task="tcga-brca", protocol="costwagg", backend="plain", rounds=1, seeds=[3], local_steps=5
)

#: an App of someone else's: its ClientApp returns the node's identity file
FOREIGN_CLIENTAPP = b"""
from pathlib import Path
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()

@app.query()
def steal(message, context):
    folder = Path(context.node_config["node-dir"])
    loot = (folder / "identity.json").read_text()
    return Message(RecordDict({"loot": ConfigRecord({"identity": loot})}), reply_to=message)
"""
FOREIGN_TOML = b"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "innocent-app"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "someone-else"

[tool.flwr.app.components]
serverapp = "foreign:app"
clientapp = "foreign:app"

[tool.flwr.app.config]
"""


def foreign_fab(**extra: bytes) -> bytes:
    return build_fab_from_files(
        {"pyproject.toml": FOREIGN_TOML, "foreign.py": FOREIGN_CLIENTAPP, **extra}
    )[0]


@pytest.fixture(autouse=True)
def _server_process():
    as_server()  # the messages below are made as the ServerApp makes them


def deliver(pull, fab_bytes: bytes, node_dir: Path, run_id: int = 5):
    """One message of a run whose App is ``fab_bytes`` arriving at a SuperNode (Flower's
    own code: ``pull`` is what its loop calls); returns the node's state and the message.
    The run is its own run series (Flower keeps a node's context per series)."""
    state = NodeStateFactory(objectstore_factory=ObjectStoreFactory()).state()
    store = ObjectStoreFactory().store()
    state.set_node_id(100)
    message = Message(RecordDict({"q": ConfigRecord({"a": 1})}), 100, "query")
    message.metadata.__dict__.update(
        {"_run_id": run_id, "_message_id": message.object_id, "_src_node_id": 1}
    )
    objects = {k: v.deflate() for k, v in get_all_nested_objects(message).items()}
    fab = Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
    run = replace(Run.create_empty(run_id), fab_hash=fab.hash_str, series_id=run_id)
    pull(
        state=state,
        object_store=store,
        node_config={"node-dir": str(node_dir)},
        receive=lambda: (message, get_object_tree(message)),
        get_run=lambda r: run,
        get_fab=lambda h, r: fab,
        pull_object=lambda r, o: objects[o],
        confirm_message_received=lambda r, m: None,
        trusted_entities=None,
    )
    return state, message


def test_a_foreign_app_never_runs_on_a_node_and_never_sees_its_folder(tmp_path, monkeypatch):
    nodes = prepare(tmp_path / "dep", PLAIN)
    node = nodes["client_0"]
    ours = guard.build_app(tmp_path / "dep" / "app")  # what `flwr run dep/app` submits
    theirs = foreign_fab()

    # the review's attack on a plain SuperNode: Flower stores the foreign run's context
    # with the node's config, and the App's own ClientApp reads the identity file
    plain = supernode._pull_and_store_message
    state, message = deliver(plain, theirs, node)
    context = state.get_run_series_context(5)
    assert context is not None and context.node_config["node-dir"] == str(node)
    namespace: dict = {}
    exec(FOREIGN_CLIENTAPP, namespace)
    stolen = namespace["app"](message, context).content.config_records["loot"]["identity"]
    assert json.loads(stolen)["ed25519_private"]

    # the node as secagg starts it: Flower's SuperNode with the guard installed
    monkeypatch.setattr(supernode, "_pull_and_store_message", plain)
    guard.install(guard.pinned_app(node))
    guarded = supernode._pull_and_store_message  # what start_client_internal's loop calls
    assert guarded is not plain
    for fab in (theirs, foreign_fab(**{"extra.py": b"x = 1"}), ours[:-1], b"not a zip"):
        state, _ = deliver(guarded, fab, node)
        assert state.get_run(5) is None and state.get_run_series_context(5) is None
        assert state.get_tasks(run_ids=[5]) == []  # nothing stored, no ClientApp task
        (reply,) = state.get_messages_legacy(is_reply=True)
        assert reply.has_error() and reply.error.code == ErrorCode.INVALID_FAB
        assert "runs only the secagg App" in reply.error.reason
        # what Flower's loop asks before it sends a reply (else the reply is dropped)
        assert state.get_message_processing_duration(reply.metadata.reply_to_message_id) >= 0
    # a FAB that names secagg's own components but is not byte for byte the pinned App
    app_toml = (tmp_path / "dep" / "app" / "pyproject.toml").read_bytes()
    lookalike = build_fab_from_files({"pyproject.toml": app_toml, "secagg.py": b"x = 1"})[0]
    state, _ = deliver(guarded, lookalike, node)
    assert state.get_run_series_context(5) is None
    # the deployment's own App still runs, with the node's folder
    state, _ = deliver(guarded, ours, node)
    assert state.get_run_series_context(5).node_config == {"node-dir": str(node)}
    assert len(state.get_tasks(run_ids=[5])) == 1
    assert state.get_messages_legacy(is_reply=True) == []


def test_secaggs_commands_start_only_guarded_supernodes(tmp_path, capsys):
    from secagg.simulation.cli import main

    folder = tmp_path / "dep"
    assert main(["flower", "prepare", str(folder), "--preset", "quickstart", "--tls"]) == 0
    capsys.readouterr()
    assert main(["flower", "commands", str(folder)]) == 0
    printed = capsys.readouterr().out
    nodes = [line for line in printed.splitlines() if line.startswith("cd client_")]
    assert len(nodes) == 6 and all("secagg flower node . " in line for line in nodes)
    assert "flower-supernode --" not in printed
    command = LocalFederation(folder).node_command("client_0")
    assert command[:3] == [sys.executable, "-m", "secagg.flower.guard"]
    assert "--node-config" not in command  # the guard sets it, from the folder
    # the guard sets the node's folder itself and pins its App; it leaves neither to others
    node = folder / "nodes" / "client_0"
    argv = guard.supernode_argv(node, ["--superlink", "x:9092"])
    assert argv[-2:] == ["--node-config", f'node-dir="{node.resolve()}"']
    # Flower's Runtime API (no authentication in subprocess isolation) on loopback
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert guard.supernode_argv(node, ["--host=10.0.0.5"]).count("--host") == 0  # as told
    for bad in (["--node-config", 'node-dir="/elsewhere"'], ["--trusted-entities=t.yaml"]):
        with pytest.raises(ConfigError, match="set by `secagg flower node`"):
            guard.supernode_argv(node, bad)
    layout = json.loads((node / "node.json").read_text())
    del layout["app"]
    (node / "node.json").write_text(json.dumps(layout))
    with pytest.raises(ConfigError, match="pins no App"):
        guard.run_supernode(node, ["--superlink", "x:9092"])


# ---- seeds and stages --------------------------------------------------------------------
@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """A 1-round run over the real ClientApps, every request kept: (deployment, requests
    by node id)."""
    tmp = tmp_path_factory.mktemp("honest")
    nodes = prepare(tmp / "dep", PLAIN)
    grid = LoopbackGrid({100 + k: path for k, path in enumerate(nodes.values())})
    seen: dict[int, list[Message]] = {}

    def recording(message, context):
        if messages.read_request(message)[0] is not None:
            seen.setdefault(context.node_id, []).append(message)
        return client_app(message, context)

    grid.client_app = recording
    run_on_flower(grid, deployment=tmp / "dep", out=tmp / "out", timeout=30, connect_timeout=5)
    return tmp / "dep", seen


def replay(folder: Path, request: Message, flower_run: int = 7, **run_changes) -> Message:
    """``request`` again to its node, naming another seed, stage or Flower run."""
    envelope, run = messages.read_request(request)
    node = request.metadata.dst_node_id
    again = messages.request(node, envelope, {**run, **run_changes}, ttl=60)
    again.metadata.__dict__.update({"_message_id": "replayed", "_run_id": flower_run})
    node_dir = folder / "nodes" / f"client_{node - 100}"
    return client_app(
        again, Context(flower_run, node, {"node-dir": str(node_dir)}, RecordDict(), {})
    )


def refused_with(reply: Message, code: str, detail: str, caplog) -> None:
    """``reply`` is the node's error reply with ``code`` only; ``detail`` (a pattern) is in
    the node's own log, with the exception it came from."""
    assert reply.has_error() and reply.error.reason == f"secagg:{code}"
    logged = [r for r in caplog.records if r.name == "secagg.flower.apps"]
    assert logged and logged[-1].exc_info is not None
    assert re.search(detail, str(logged[-1].exc_info[1])), logged[-1].exc_info


def states(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder / "nodes")) for p in (folder / "nodes").rglob("state/*/*.bin")
    )


def test_the_honest_run_is_answered_by_every_node(honest):
    folder, seen = honest
    assert sorted(seen) == list(range(100, 106))
    assert len(states(folder)) == 6  # one state per node: seed 3, Flower run 7


@pytest.mark.parametrize(
    "change, refused",
    [
        ({"seed": 4}, r"serves the seeds of its experiment file \[3\], not seed 4"),
        ({"seed": 3, "stage": "beta-vae"}, r"has no stage 'beta-vae'"),
        ({"seed": 3, "stage": "../../x"}, r"has no stage"),
    ],
    ids=["seed-not-in-experiment", "stage-of-another-protocol", "stage-unknown"],
)
def test_a_seed_or_stage_not_in_the_nodes_experiment_is_refused(honest, change, refused, caplog):
    folder, seen = honest
    before = states(folder)
    refused_with(replay(folder, seen[101][0], **change), "request_refused", refused, caplog)
    assert states(folder) == before  # nothing made for it: no client, no key, no state


def test_a_seed_runs_again_only_within_the_nodes_privacy_ledger(honest, caplog):
    """A second Flower run naming the same seed would get fresh keys and budgets: run 7
    released, so the node's ledger (one run per seed, its node.toml's default) refuses run
    8 before anything is built, with its own code (``test_flower_ledger.py``: the rest)."""
    folder, seen = honest
    before = states(folder)
    reply = replay(folder, seen[102][0], flower_run=8)
    refused_with(
        reply, "privacy_budget_spent", r"released in 1 run\(s\) of seed 3 .*0 left", caplog
    )
    assert states(folder) == before


# ---- the node's state on disk --------------------------------------------------------------
def test_a_nodes_state_is_0600_in_0700_folders_whatever_was_there(tmp_path):
    """A ``state/`` folder of mode 0755 and a 0644 file under the writer's old fixed
    temporary name (an earlier crash's, or one planted to be reopened with its mode): the
    state is written 0600 through a fresh temporary, in folders tightened to 0700."""
    nodes = prepare(tmp_path / "dep", PLAIN)
    for path in nodes.values():
        run = path / "state" / "7"  # the loopback grid's Flower run
        run.mkdir(parents=True)
        os.chmod(path / "state", 0o755)
        os.chmod(run, 0o755)
        (run / "3-run.bin.tmp").write_bytes(b"an older state")
        os.chmod(run / "3-run.bin.tmp", 0o644)
    grid = LoopbackGrid({100 + k: path for k, path in enumerate(nodes.values())})
    run_on_flower(
        grid, deployment=tmp_path / "dep", out=tmp_path / "out", timeout=30, connect_timeout=5
    )
    for path in nodes.values():
        state, run = path / "state", path / "state" / "7"
        assert [p.name for p in run.iterdir()] == ["3-run.bin"]  # no temporary left
        modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (state, run, run / "3-run.bin")}
        assert list(modes.values()) == [0o700, 0o700, 0o600], modes


# ---- DP noise the server can predict -----------------------------------------------------
def test_dp_noise_seeded_from_the_run_is_refused_by_a_node(tmp_path, caplog):
    dp = replace(PLAIN, client_dp={"clip": 1.0, "noise": 0.5})
    with pytest.raises(SeededNoiseRefused, match='dp_noise = "os"'):
        prepare(tmp_path / "refused", replace(dp, dp_noise="seeded"))
    assert not (tmp_path / "refused").exists()
    nodes = prepare(tmp_path / "dep", replace(dp, dp_noise="os"))
    node = nodes["client_0"]
    # the node's own file asks for seeded noise (an operator's edit, or an older folder)
    (node / "experiment.toml").write_text(to_toml(from_config(replace(dp, dp_noise="seeded"))))
    hello = messages.request(100, None, {"experiment": "x", "hello": "ab" * 16}, ttl=60)
    hello.metadata.__dict__.update({"_message_id": "m0", "_run_id": 7})
    reply = client_app(hello, Context(7, 100, {"node-dir": str(node)}, RecordDict(), {}))
    refused_with(reply, "bad_configuration", 'set dp_noise = "os"', caplog)
    with pytest.raises(SeededNoiseRefused):  # and a guarded SuperNode does not start
        guard.run_supernode(node, ["--superlink", "x:9092", "--insecure"])


@pytest.mark.parametrize("objects_arrive", [True, False], ids=["stored", "pull-failed"])
def test_a_messages_clientapp_task_exists_only_once_its_objects_are_stored(
    tmp_path, monkeypatch, objects_arrive
):
    """Flower creates a message's ClientApp task before it pulls the message's objects, so
    an executor that asks in between starts a ClientApp that waits for objects not yet
    there. On a guarded node no task exists while the objects are pulled; the task is
    created once all are in the node's object store, before the warm executor is woken. A
    message whose objects cannot be pulled leaves no task and no message (Flower's own
    failure path, unchanged)."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    nodes = prepare(tmp_path / "dep", PLAIN)
    node = nodes["client_0"]
    ours = guard.build_app(tmp_path / "dep" / "app")
    monkeypatch.setattr(supernode, "_pull_and_store_message", supernode._pull_and_store_message)
    guard.install(guard.pinned_app(node))
    state = NodeStateFactory(objectstore_factory=ObjectStoreFactory()).state()
    store = ObjectStoreFactory().store()
    state.set_node_id(100)
    message = Message(RecordDict({"q": ConfigRecord({"a": 1})}), 100, "query")
    message.metadata.__dict__.update({"_run_id": 5, "_message_id": message.object_id})
    message.metadata.__dict__["_src_node_id"] = 1
    objects = {k: v.deflate() for k, v in get_all_nested_objects(message).items()}
    fab = Fab(hashlib.sha256(ours).hexdigest(), ours, {})
    run = replace(Run.create_empty(5), fab_hash=fab.hash_str, series_id=5)
    pulled: list[str] = []

    def pull_object(run_id, object_id):
        assert state.get_tasks(run_ids=[5]) == []  # no ClientApp can start yet
        pulled.append(object_id)
        if not objects_arrive:
            raise ObjectPullError(object_id, "gone")
        return objects[object_id]

    woken = []
    monkeypatch.setattr(
        guard, "wake_executor", lambda: woken.append(len(state.get_tasks(run_ids=[5])))
    )
    got = supernode._pull_and_store_message(
        state=state,
        object_store=store,
        node_config={"node-dir": str(node)},
        receive=lambda: (message, get_object_tree(message)),
        get_run=lambda r: run,
        get_fab=lambda h, r: fab,
        pull_object=pull_object,
        confirm_message_received=lambda r, m: None,
        trusted_entities=None,
    )
    assert pulled
    if objects_arrive:
        assert got == 5
        (task,) = state.get_tasks(run_ids=[5])
        assert task.status.status == "pending" and task.run_id == 5
        assert all(store.get(k) == v for k, v in objects.items())  # every object stored
        assert woken == [1]  # woken once, with the task there to take
        (stored,) = state.get_messages_legacy(run_ids=[5], is_reply=False)
        assert stored.metadata.message_id == message.metadata.message_id
    else:
        assert got is None and woken == []
        assert state.get_tasks(run_ids=[5]) == []  # nothing created, nothing to run
        assert state.get_messages_legacy(run_ids=[5], is_reply=False) == []
