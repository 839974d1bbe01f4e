"""secagg over Flower's Message API, in one process (``flower_grid.LoopbackGrid``): the same
model and audit as the in-process transport, clients rebuilt from their node directory for
every message, a missing node excluded (ckks; threshold while t holders answer), a node
of another experiment refused.
The real SuperLink and SuperNodes, in separate processes: ``test_flower_e2e.py``."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography import x509

import secagg
from secagg.errors import ConfigError, RunNotComplete
from secagg.flower.apps import run_on_flower
from secagg.flower.deployment import prepare
from secagg.flower.messages import read_request
from secagg.runspec.config import ExperimentConfig
from secagg.secret import ckks_masks
from secagg.wire import Envelope
from tests.flower_grid import LoopbackGrid, audits_match
from tests.test_plugins import registries  # noqa: F401  (the fixture)

LARC = ExperimentConfig(
    task="tcga-brca", protocol="larc", backend="ckks", rounds=2, seeds=[3], local_steps=5
)
#: deterministic end to end (no DP noise: a node refuses noise seeded from the run's seed,
#: and noise from the OS differs from run to run): over Flower the model is bit for bit
PLAIN = replace(LARC, protocol="costwagg", backend="plain")


def deploy(tmp_path, config):
    nodes = prepare(tmp_path / "deployment", config)
    grid = LoopbackGrid({100 + k: path for k, path in enumerate(nodes.values())})
    return tmp_path / "deployment", grid


def over_flower(tmp_path, config, grid=None, timeout=60.0, expect="complete"):
    """The run over Flower; ``expect``: its status (a run that is not complete fails its
    ServerApp once the folder is written)."""
    folder, made = deploy(tmp_path, config)
    grid = grid or made
    out = tmp_path / "out"
    if expect == "complete":
        run_on_flower(grid, deployment=folder, out=out, timeout=timeout, connect_timeout=5)
    else:
        with pytest.raises(RunNotComplete, match=expect):
            run_on_flower(grid, deployment=folder, out=out, timeout=timeout, connect_timeout=5)
    assert json.loads((out / "run.json").read_text())["status"] == expect
    return out, grid


def final_model(out, seed):
    return np.load(out / "models" / f"seed-{seed}.npy")


#: a round in parts (``--part-values``): every node takes the parts from its own settings
PARTS = replace(LARC, protocol="fedavg", part_values=7)


@pytest.mark.parametrize(
    "config",
    [PLAIN, LARC, replace(PARTS, backend="plain"), PARTS],
    ids=["plain-costwagg", "ckks-larc", "plain-fedavg-parts", "ckks-fedavg-parts"],
)
def test_a_run_over_flower_messages_gives_the_in_process_model_and_audit(
    tmp_path, config, monkeypatch
):
    with monkeypatch.context() as m:
        # the reference commits no seeds, as a node living for one message does: no
        # next_seeds up, no precheck down (LARC's every client), the same bytes as over Flower
        m.setenv(ckks_masks.ENV, "off")
        reference = secagg.run(config, out=tmp_path / "reference")
    out, grid = over_flower(tmp_path, config)
    seed = config.seeds[0]
    # CKKS noise is fresh in every run: compact's flooding leaves 1e-6, lean's (FedAvg's
    # preset, its budget six reveals a round in parts) about 1e-4
    atol = 0.0 if config.backend == "plain" else 1e-4 if config.part_values else 1e-6
    np.testing.assert_allclose(
        final_model(out, seed), reference.final_params[seed], rtol=0, atol=atol
    )
    audits_match(out, tmp_path / "reference")
    # the same envelopes, so the same bytes by phase (SEAL's compressed ciphertexts vary in
    # size with their random content: within 1% on ckks)
    keep = ["round", "phase", "direction", "bytes"]
    a = pd.read_csv(out / "traffic.csv")[keep].groupby(keep[:3]).sum()
    b = pd.read_csv(tmp_path / "reference" / "traffic.csv")[keep].groupby(keep[:3]).sum()
    pd.testing.assert_frame_equal(a, b, check_exact=config.backend == "plain", rtol=0.01)
    # tcga-brca's test sets are the sites' own (no pooled test set): the coordinator holds
    # none, scores nothing, and says so
    scored = [
        c for c in pd.read_csv(out / "metrics.csv").columns if c.startswith(("test_", "train_"))
    ]
    assert scored == []
    assert "holds no test set of tcga-brca" in (tmp_path / "out-progress.log").read_text()
    flower = json.loads((out / "flower.json").read_text())
    assert flower["framing"]["messages_sent"] == grid.delivered - len(grid.nodes)  # + hellos
    assert 0 < flower["framing"]["bytes_sent"] / flower["framing"]["messages_sent"] < 1000


@pytest.mark.usefixtures("registries")
def test_a_pilot_coordinator_scores_its_test_set_and_never_opens_a_sites_file(
    tmp_path, monkeypatch
):
    """Four sites of the walkthrough's task (examples/own_model): each site's CSV lies only
    in its own node's folder, the coordinator's folder holds only test.csv. The ServerApp
    scores every round on that test set, as the in-process run does, and opens nothing
    else; each node opens its own site's file and nothing else."""
    import runpy

    import pandas as pd

    from secagg.plugins import import_user_modules

    root = Path(__file__).resolve().parents[1] / "examples" / "own_model"
    made, coordinator = tmp_path / "made", tmp_path / "coordinator"
    runpy.run_path(str(root / "make_sites.py"), run_name="make_sites")["main"](made)
    config = ExperimentConfig(
        task="sites-mlp",
        imports=[str(root / "sites_task.py")],
        backend="ckks",
        rounds=2,
        seeds=[1],
        local_steps=3,
    )
    import_user_modules(config.imports)
    sites_task = sys.modules["sites_task"]
    monkeypatch.setenv("SITES_DIR", str(made))  # everything in one place: the simulation
    reference = secagg.run(config)
    coordinator.mkdir()
    (made / "test.csv").rename(coordinator / "test.csv")
    monkeypatch.setenv("SITES_DIR", str(coordinator))  # the coordinator's process
    folder, grid = deploy(tmp_path, config)
    for k in range(4):  # each site's file where its node runs, and nowhere else
        (folder / "nodes" / f"client_{k}" / "data").mkdir()
        (made / f"site_{k}.csv").rename(folder / "nodes" / f"client_{k}" / "data" / f"site_{k}.csv")
    assert sorted(p.name for p in coordinator.iterdir()) == ["test.csv"]

    party = ["coordinator"]
    opened: list[tuple[str, str]] = []
    read = sites_task.CsvSite.__init__

    def recorded(self, path):
        opened.append((party[0], Path(path).name))
        if party[0] == "coordinator" and Path(path).name != "test.csv":
            raise AssertionError(f"the coordinator opened {path}")
        read(self, path)

    monkeypatch.setattr(sites_task.CsvSite, "__init__", recorded)
    answer = grid.client_app

    def at_its_node(message, context):
        # what each node's node.toml sets in a process of its own: its own data folder
        node = Path(context.node_config["node-dir"])
        party[0] = node.name
        monkeypatch.setenv("SITES_DIR", str(node / "data"))
        try:
            return answer(message, context)
        finally:
            party[0] = "coordinator"
            monkeypatch.setenv("SITES_DIR", str(coordinator))

    grid.client_app = at_its_node
    out = tmp_path / "out"
    run_on_flower(grid, deployment=folder, out=out, timeout=60, connect_timeout=5)

    served = pd.read_csv(out / "metrics.csv")
    assert list(served["round"]) == [0, 1, 2]
    assert not [c for c in served.columns if c.startswith("train_")]  # nothing of the sites'
    want = reference.metrics
    for column in ("test_pooled", "test_auc", "test_loss"):
        assert served[column].notna().all()
        np.testing.assert_allclose(served[column], want[column], atol=1e-3)
    # CKKS noise is fresh in every run: equal to its precision
    np.testing.assert_allclose(final_model(out, 1), reference.final_params[1], atol=1e-4)
    assert {name for who, name in opened if who == "coordinator"} == {"test.csv"}
    at_nodes = {(who, name) for who, name in opened if who != "coordinator"}
    assert at_nodes == {(f"client_{k}", f"site_{k}.csv") for k in range(4)}


# ---- faults -------------------------------------------------------------------------------
@pytest.mark.parametrize("unavailable", [False, True], ids=["silent", "node-unavailable-error"])
def test_a_node_down_for_a_round_is_excluded_and_rejoins_the_next(tmp_path, unavailable):
    """ckks: client_2's node does not answer in round 2 (protocol round 1: killed), then
    answers again (its node restarted with its directory): round 2 ends without it after
    the timeout (or at Flower's content-less "node unavailable" reply) and, participation
    being fixed (the default), releases nothing (skipped: no sum without a contributor of
    the run); round 3 has it back, restored from the state it left on its node, and its
    release goes through."""
    config = replace(LARC, rounds=3)
    folder, grid = deploy(tmp_path, config)
    grid.down_for = lambda node, rnd, phase: node == 102 and rnd == 1  # the protocol's
    grid.unavailable_replies = unavailable
    out = tmp_path / "out"
    # a site missed a round: the run is degraded, and the ServerApp fails (Flower:
    # finished:failed) once its folder is written
    with pytest.raises(RunNotComplete, match="degraded: client_2 missed round 2 of seed 3"):
        run_on_flower(grid, deployment=folder, out=out, timeout=1.0, connect_timeout=5)
    assert json.loads((out / "run.json").read_text())["status"] == "degraded"
    assert json.loads((out / "flower.json").read_text())["problems"] == [
        "client_2 missed round 2 of seed 3",
        "round 2 of seed 3 made no update (skipped)",
    ]
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["clients"].tolist()[1:] == [6, 5, 6]
    assert metrics["skipped"].tolist()[1:] == [0, 1, 0]
    summary = json.loads((out / "audit_summary.json").read_text())
    assert [(e["round"], e["peer"]) for e in summary["exclusions"]] == [(2, "client_2")]
    reason = "the node failed: node_unavailable" if unavailable else "no answer within 1 s"
    assert reason in summary["exclusions"][0]["reason"]
    assert json.loads((out / "flower.json").read_text())["aborted"] == {}


class HalfPushedGrid(LoopbackGrid):
    """Pulls as flwr 1.42's HttpGrid does: a reply is listed once its node has pushed its
    header, marked delivered then (never listed again), and its objects are pulled one
    listed reply after another with ``http_grid.pull_objects``; a message that outlives
    its TTL is deleted, reply and all. ``half_pushed(node, round, phase)``: that node died
    while pushing this reply, whose objects never come (Flower gives up after ``gives_up``
    seconds: its own limits are hours)."""

    def __init__(self, *args, half_pushed, gives_up=30.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.half_pushed, self.gives_up = half_pushed, gives_up
        self.expires: dict[str, float] = {}
        self.sent: dict[str, object] = {}
        self.stuck: set[str] = set()
        self.given_up = 0

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages, strict=True):
            self.expires[mid] = time.monotonic() + msg.metadata.ttl
            self.sent[mid] = msg
            envelope, _ = read_request(msg)
            if envelope is not None:
                env = Envelope.from_bytes(envelope)
                if self.half_pushed(msg.metadata.dst_node_id, env.round, env.phase):
                    self.stuck.add(mid)
        return ids

    def pull_messages(self, message_ids):
        from flwr.app import Error, Message
        from flwr.supercore.inflatable.inflatable_utils import (
            ObjectPullError,
            ObjectUnavailableError,
        )
        from flwr.superlink.grid import http_grid

        listed = sorted(super().pull_messages(message_ids), key=self._listed_first)
        began, pulled = time.monotonic(), []
        for reply in listed:
            mid = reply.metadata.reply_to_message_id

            def pull_object(_object_id, mid=mid):
                if mid not in self.stuck:
                    return b""
                if time.monotonic() - began > self.gives_up:
                    raise ObjectPullError(_object_id, "gave up")
                raise ObjectUnavailableError(_object_id)

            try:
                http_grid.pull_objects(["object"], pull_object)
            except ObjectPullError:
                self.given_up += 1
                error = Error(code=3, reason="objects unavailable")  # MESSAGE_UNAVAILABLE
                pulled.append(Message(error, reply_to=self.sent[mid]))
                continue
            pulled.append(reply)
        now = time.monotonic()  # what expired meanwhile the SuperLink has deleted
        return [m for m in pulled if self.expires[m.metadata.reply_to_message_id] > now]

    def _listed_first(self, reply):  # the half-pushed reply first: the others wait behind it
        return reply.metadata.reply_to_message_id not in self.stuck


def test_a_node_that_dies_while_pushing_its_reply_holds_no_other_reply(tmp_path):
    """client_2's node dies while pushing its round-2 upload: its reply is listed but its
    content never comes. The pull gives it up before the other replies' messages expire
    (Flower alone waits for it up to its own limits, hours, holding every reply listed with
    it until their messages expired: a round lost every client but one), so the round goes
    on with the other five and client_2 is a dropout."""
    config = replace(LARC, rounds=2)
    folder, made = deploy(tmp_path, config)
    grid = HalfPushedGrid(
        made.nodes, half_pushed=lambda node, rnd, phase: (node, rnd, phase) == (102, 1, "train")
    )
    out = tmp_path / "out"
    with pytest.raises(RunNotComplete, match="degraded: client_2 missed round 2 of seed 3"):
        run_on_flower(grid, deployment=folder, out=out, timeout=5.0, connect_timeout=5)
    assert grid.given_up == 1  # the half-pushed reply was pulled, and given up
    assert pd.read_csv(out / "metrics.csv")["clients"].tolist()[1:] == [6, 5]
    summary = json.loads((out / "audit_summary.json").read_text())
    assert [(e["round"], e["peer"]) for e in summary["exclusions"]] == [(2, "client_2")]
    assert "message_unavailable" in summary["exclusions"][0]["reason"]


@pytest.mark.parametrize("down", [{102}, {101, 102, 103}], ids=["one", "beyond-n-minus-t"])
def test_threshold_runs_on_with_t_holders_and_stops_cleanly_below(tmp_path, down):
    """Six holders, t = 4: one node down in round 1 leaves the round to the other five;
    three down when the shares are asked for (after every upload) leave three shares, below
    t, and the seed stops with a typed abort."""
    config = replace(LARC, protocol="fedavg", backend="threshold", rounds=2)
    folder, grid = deploy(tmp_path, config)
    phases = None if len(down) == 1 else {"decrypt_share"}
    grid.down_for = lambda node, rnd, phase: (
        node in down and rnd == 1 and (phases is None or phase in phases)
    )
    out = tmp_path / "out"
    status = "degraded" if len(down) == 1 else "aborted"
    with pytest.raises(RunNotComplete, match=status):
        run_on_flower(grid, deployment=folder, out=out, timeout=1.0, connect_timeout=5)
    flower = json.loads((out / "flower.json").read_text())
    assert flower["status"] == json.loads((out / "run.json").read_text())["status"] == status
    summary = json.loads((out / "audit_summary.json").read_text())
    assert any(e["peer"] == "client_2" for e in summary["exclusions"])
    if len(down) == 1:
        assert flower["aborted"] == {}
        assert pd.read_csv(out / "metrics.csv")["round"].max() == 2
    else:
        assert "t = 4" in flower["aborted"]["3"]
        assert pd.read_csv(out / "metrics.csv")["round"].max() == 1  # round 1 made no model


@pytest.mark.parametrize("down", ["off the committee", "committee"])
def test_a_threshold_committee_over_flower_asks_only_its_members(tmp_path, down):
    """Six nodes, a committee of four key holders (t = 3), as each node's own configuration
    says: the two nodes off the committee down when the shares are asked for cost the round
    nothing (they hold none); two members down leave two shares, below t, and the seed stops
    with a typed abort."""
    from secagg.threshold.params import holders_of

    config = replace(
        LARC, protocol="fedavg", backend="threshold", rounds=2, backend_options={"committee": 4}
    )
    folder, grid = deploy(tmp_path, config)
    committee = holders_of([f"client_{k}" for k in range(6)], 4)
    nodes = {100 + k for k in range(6) if (f"client_{k}" in committee) == (down == "committee")}
    nodes = set(sorted(nodes)[:2])
    grid.down_for = lambda node, rnd, phase: node in nodes and rnd == 1 and phase == "decrypt_share"
    out = tmp_path / "out"
    if down == "committee":
        with pytest.raises(RunNotComplete, match="aborted"):
            run_on_flower(grid, deployment=folder, out=out, timeout=1.0, connect_timeout=5)
        flower = json.loads((out / "flower.json").read_text())
        assert "2 of 4 holders answered and t = 3" in flower["aborted"]["3"]
        return
    run_on_flower(grid, deployment=folder, out=out, timeout=1.0, connect_timeout=5)
    reveals = [
        json.loads(line)
        for line in (out / "audit.jsonl").read_text().splitlines()
        if '"reveal"' in line
    ]
    assert [r["by"] for r in reveals if r.get("event") == "reveal"] == [
        f"holders {','.join(committee)} (4 of 4, t = 3)"
    ] * 2


def test_a_node_configured_for_another_experiment_is_refused(tmp_path):
    folder, grid = deploy(tmp_path, PLAIN)
    other = tmp_path / "other"
    prepare(other, replace(PLAIN, rounds=5))
    grid.nodes[102] = other / "nodes" / "client_2"  # this node runs 5 rounds, the server 2
    # its refusal is final: the coordinator says so at the first answer, not after the wait
    with pytest.raises(ConfigError, match=r"node 102 refused this run \(bad_configuration\)"):
        run_on_flower(grid, deployment=folder, out=tmp_path / "out", timeout=1, connect_timeout=600)


def test_nodes_that_refuse_the_app_are_reported_as_such_at_once(tmp_path):
    """Every node answers a hello with Flower's "invalid FAB" error (what ``secagg flower
    node`` answers a run of an App other than the one pinned in its node.json): the
    coordinator is told that, at the first answers (one hello per node), not, after its
    wait, that no SuperNode answered."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode

    folder, grid = deploy(tmp_path, PLAIN)
    hellos = []

    def guarded(message, context):
        hellos.append(message.metadata.dst_node_id)
        return Message(Error(ErrorCode.INVALID_FAB, "not the pinned App"), reply_to=message)

    grid.client_app = guarded
    with pytest.raises(ConfigError, match=r"not the one pinned in the node's node.json") as err:
        run_on_flower(grid, deployment=folder, out=tmp_path / "out", timeout=1, connect_timeout=600)
    assert all(f"node {n} refused this run (invalid_fab)" in str(err.value) for n in grid.nodes)
    assert sorted(hellos) == sorted(grid.nodes)  # asked once each: nothing waited for


# ---- what a node's failure tells the coordinator (issue 47, item 4) ----------------------
#: what a site's parser might say: its path, a column, a cell of patient data
LEAK = "/srv/site2/data/hospital_2.csv: missing columns ['x05'] near patient P-0042-HOLMES"


def test_a_nodes_failure_reaches_the_coordinator_as_a_code_its_text_the_nodes_log(
    tmp_path, monkeypatch, caplog, capsys
):
    """client_2's node fails to load its data (a ValueError quoting a patient): the
    coordinator excludes it with ``internal_error`` in the audit, its progress log and its
    stderr, and nothing of the text or the exception's type; the node's log has both, with
    the traceback."""
    from secagg.flower.node import NodeClient

    built = NodeClient._client

    def loading(self, seed, stage):
        if self.client_id == "client_2":
            raise ValueError(LEAK)
        return built(self, seed, stage)

    monkeypatch.setattr(NodeClient, "_client", loading)
    out, _ = over_flower(tmp_path, replace(PLAIN, rounds=1), timeout=5, expect="degraded")
    summary = json.loads((out / "audit_summary.json").read_text())
    assert [(e["peer"], e["reason"]) for e in summary["exclusions"]] == [
        ("client_2", "client_2: the node failed: internal_error")
    ]
    said = capsys.readouterr()
    coordinator = [said.out, said.err] + [
        p.read_text(errors="replace")
        for p in [*out.rglob("*"), tmp_path / "out-progress.log"]
        if p.is_file()
    ]
    assert any("internal_error" in text for text in coordinator)
    for text in coordinator:
        for secret in ("P-0042", "missing columns", "hospital_2.csv", "ValueError"):
            assert secret not in text
    logged = [r for r in caplog.records if r.name == "secagg.flower.apps"]
    assert logged and all("internal_error" in r.getMessage() for r in logged)
    assert str(logged[0].exc_info[1]) == LEAK
    assert "P-0042" in caplog.text and "Traceback" in caplog.text


def test_whatever_fails_in_the_client_app_leaves_it_as_a_code(tmp_path, caplog):
    """Flower's own routing failing inside the ClientApp (no handler for the message's
    type) leaves as ``internal_error``; a refusal as its code; and the server reads no more
    than a code from any error reply: Flower's own repr of an exception that escaped the
    ClientApp, or a reason that only looks like a code, becomes Flower's error code's name."""
    from flwr.app import Context, Error, Message, RecordDict

    from secagg.errors import ClientRefused
    from secagg.flower import messages
    from secagg.flower.apps import client_app, failure_code
    from secagg.flower.transport import NodeFailed

    folder, _ = deploy(tmp_path, PLAIN)
    other = Message(RecordDict(), 100, "query.other", ttl=60)
    other.metadata.__dict__.update({"_message_id": "m0", "_run_id": 7})
    node = {"node-dir": str(folder / "nodes" / "client_0")}
    reply = client_app(other, Context(7, 100, node, RecordDict(), {}))
    assert reply.has_error() and reply.error.reason == "secagg:internal_error"
    assert "No query function registered" in caplog.text  # in the node's log only
    assert failure_code(ClientRefused("client_0", "train", "out_of_order")) == "out_of_order"

    def read(code: int, reason: str) -> NodeFailed:
        return NodeFailed(messages.failure_code(Message(Error(code, reason), reply_to=other)))

    assert str(read(2, "secagg:out_of_order")) == "the node refused: out_of_order"
    assert str(read(2, "secagg:internal_error")) == "the node failed: internal_error"
    for reason in (f"<class 'ValueError'>:<'{LEAK}'>", f"secagg:{LEAK}"):
        assert str(read(2, reason)) == "the node failed: client_app_raised_exception"
    assert read(5, "Error: Node Unavailable - ...").code == "node_unavailable"
    assert read(99, LEAK).code == "flower_error_99"


# ---- the deployment folder and the command line -------------------------------------------
def test_prepare_writes_private_node_folders_and_commands_name_them(tmp_path, capsys):
    from secagg.simulation.cli import main

    folder = tmp_path / "dep"
    args = ["flower", "prepare", str(folder), "--preset", "quickstart", "--rounds", "2"]
    assert main([*args, "--tls", "--auth", "--host", "fl.example.org"]) == 0
    node = folder / "nodes" / "client_0"
    for secret in ("identity.json", "auth.key"):
        assert (node / secret).stat().st_mode & 0o077 == 0
    assert (node / "ca.crt").read_bytes() == (folder / "tls" / "ca.crt").read_bytes()
    cert = x509.load_pem_x509_certificate((folder / "tls" / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "fl.example.org" in names.get_values_for_type(x509.DNSName)
    signers = json.loads((folder / "server" / "signers.json").read_text())
    identity = json.loads((node / "identity.json").read_text())
    assert signers == identity["signers"] and "ed25519_private" not in signers
    capsys.readouterr()
    assert main(["flower", "commands", str(folder), "--superlink", "fl.example.org"]) == 0
    printed = capsys.readouterr().out
    assert "--enable-supernode-auth" in printed and "fl.example.org:9092" in printed
    assert printed.count("flwr supernode register") == 6
    # bad input: a clear error, exit status 2, nothing written
    for bad, message in (
        ([*args], "is not empty"),
        (["flower", "prepare", str(tmp_path / "b"), "--auth"], "needs TLS"),
        (["flower", "prepare", str(tmp_path / "c"), "--server-blind"], "server-blind"),
        (["flower", "demo", str(tmp_path / "nothing")], "not a prepared deployment"),
    ):
        assert main(bad) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_commands_give_each_node_a_port_of_its_own_and_take_the_superlinks(tmp_path, capsys):
    """Issue 47, item 5: nodes on one machine each get their own Runtime API port (Flower's
    default, 9094, for all of them made two of three die), and the SuperLink's port is the
    one given (--superlink HOST:PORT or --superlink-port) in every command that names it."""
    import re

    from secagg.simulation.cli import main

    folder, _ = deploy(tmp_path, PLAIN)
    clients = json.loads((folder / "deployment.json").read_text())["clients"]
    for given in (
        ["--superlink", "fl.example.org:9443"],
        ["--superlink", "fl.example.org", "--superlink-port", "9443"],
    ):
        assert main(["flower", "commands", str(folder), *given]) == 0
        printed = capsys.readouterr().out
        nodes = [line for line in printed.splitlines() if "secagg flower node" in line]
        assert len(nodes) == len(clients) >= 3
        ports = [int(re.search(r" --port (\d+)", line).group(1)) for line in nodes]
        assert ports == list(range(9094, 9094 + len(clients)))  # each its own
        assert all("--superlink fl.example.org:9443 " in line for line in nodes)
        assert "flower-superlink --host 0.0.0.0 --port 9443 " in printed
        assert 'address = "fl.example.org:9443"' in printed and "9092" not in printed
        assert "port of its own" in printed  # and it says why
    assert main(["flower", "commands", str(folder), "--node-port", "10000"]) == 0
    printed = capsys.readouterr().out
    assert "SUPERLINK_HOST:9092 --port 10000 " in printed
    assert f"--port {10000 + len(clients) - 1} " in printed
    for bad in (["--superlink", "h:9443", "--superlink-port", "9092"], ["--node-port", "65534"]):
        assert main(["flower", "commands", str(folder), *bad]) == 2
        assert "port" in capsys.readouterr().err


def test_a_node_that_cannot_sign_as_the_client_it_claims_is_not_taken_for_it(tmp_path):
    """A node's hello is signed with the client's Ed25519 key over the server's nonce and
    its node id: a node holding another deployment's keys for client_2 is ignored, and so is
    a signed hello replayed from another node."""
    folder, grid = deploy(tmp_path, PLAIN)
    impostor = tmp_path / "impostor"
    prepare(impostor, PLAIN)  # the same settings, other keys
    grid.nodes[102] = impostor / "nodes" / "client_2"
    with pytest.raises(ConfigError, match=r"no SuperNode answered for \['client_2'\]"):
        run_on_flower(grid, deployment=folder, out=tmp_path / "out", timeout=1, connect_timeout=1)


def test_a_signed_hello_does_not_pass_for_another_node_or_nonce(tmp_path):
    from secagg.flower.keystore import read_signers
    from secagg.flower.node import NodeClient
    from secagg.flower.transport import hello_signed

    folder, _ = deploy(tmp_path, PLAIN)
    node = NodeClient(folder / "nodes" / "client_2")
    signers = read_signers(folder / "server" / "signers.json")
    run = {"experiment": node.experiment, "hello": "ab" * 16}
    said = json.loads(node.answer(None, run, flower_run=7, node_id=102))
    assert hello_signed(said, signers, node.experiment, "ab" * 16, 102)
    assert not hello_signed(said, signers, node.experiment, "ab" * 16, 103)  # another node
    assert not hello_signed(said, signers, node.experiment, "cd" * 16, 102)  # another nonce
    assert not hello_signed(
        {**said, "client": "client_3"}, signers, node.experiment, "ab" * 16, 102
    )


def test_a_reply_that_is_not_a_secagg_envelope_is_a_missing_answer(tmp_path):
    """A node answering with other content (or bytes that are not an envelope) is excluded
    for the round; the ServerApp does not fail on it."""
    from flwr.app import ConfigRecord, Message, RecordDict

    import secagg.flower.apps as apps

    folder, grid = deploy(tmp_path, replace(PLAIN, rounds=1))
    honest = apps.client_app

    class Odd:  # client_2's node answers train requests with something else
        def __call__(self, msg, context):
            if context.node_id == 102 and read_request(msg)[0] is not None:
                return Message(RecordDict({"other": ConfigRecord({"x": 1})}), reply_to=msg)
            return honest(msg, context)

    grid.client_app = Odd()
    out = tmp_path / "out"
    with pytest.raises(RunNotComplete, match="degraded: client_2 missed round 1"):
        run_on_flower(grid, deployment=folder, out=out, timeout=5, connect_timeout=5)
    summary = json.loads((out / "audit_summary.json").read_text())
    assert [(e["round"], e["peer"]) for e in summary["exclusions"]] == [(1, "client_2")]
    assert "without a 'secagg' record" in summary["exclusions"][0]["reason"]


def test_a_node_that_misses_its_first_hello_is_asked_again(tmp_path):
    """A SuperNode still starting when the ServerApp says hello is asked again while the
    ServerApp waits for every client, though the SuperLink's list did not change."""
    from secagg.flower.keystore import experiment_name, read_signers
    from secagg.flower.node import load_experiment
    from secagg.flower.transport import FlowerNodes

    folder, grid = deploy(tmp_path, PLAIN)
    experiment = experiment_name(load_experiment(folder / "experiment.toml"))
    grid.down = {102}
    listed, listing = [0], grid.get_node_ids

    def nodes_listed():  # the node comes up after the first round of hellos
        listed[0] += 1
        if listed[0] == 2:
            grid.down.clear()
        return listing()

    grid.get_node_ids = nodes_listed
    ids = [f"client_{k}" for k in range(6)]
    signers = read_signers(folder / "server" / "signers.json")
    nodes = FlowerNodes(grid, ids, experiment, signers, hello_timeout=0.5)
    nodes.wait_for_all(timeout=10)
    assert nodes.node_of == {f"client_{k}": 100 + k for k in range(6)}
    assert listed[0] >= 2


def test_server_blind_over_flower_leaves_the_model_to_the_experimenter(tmp_path):
    """The ServerApp keeps sealed copies it cannot open and evaluates nothing after round
    0; the experimenter, with the key the nodes took from their own bundles, opens them
    into the model and the metrics of the in-process server-blind run, scored on the
    task's pooled test set (what a deployment's coordinator holds)."""
    from secagg.errors import SecaggError
    from secagg.flower.experimenter import make_experimenter, open_sealed

    config = replace(LARC, task="breast-cancer-iid", protocol="fedavg", server_blind=True)
    folder, grid = deploy(tmp_path, config)
    key = folder / "experimenter" / "observer.key"
    for node in (folder / "nodes").iterdir():  # the nodes' copy of the public key only
        assert (node / "observer.pub").read_bytes() == (folder / "observer.pub").read_bytes()
        assert not (node / "observer.key").exists()
    out = tmp_path / "out"
    run_on_flower(grid, deployment=folder, out=out, timeout=60, connect_timeout=5)
    served = pd.read_csv(out / "metrics.csv")
    assert served.loc[served["round"] > 0, "test_pooled"].isna().all()
    assert served.loc[served["round"] == 0, "test_pooled"].notna().all()  # the initial model
    assert not [c for c in served.columns if c.startswith("train_")]  # the sites' data
    assert sorted(p.name for p in (out / "sealed" / "seed-3").iterdir())[0].startswith("round-0")
    # whoever lacks the experimenter's key (the server) opens nothing
    make_experimenter(tmp_path / "server")
    with pytest.raises(SecaggError):
        open_sealed(out, tmp_path / "server" / "observer.key")
    opened = pd.read_csv(open_sealed(out, key))
    assert list(opened["round"]) == [1, 2]
    reference = secagg.run(config)
    expected = reference.metrics.set_index("round").loc[[1, 2], "test_pooled"].to_numpy()
    # the models agree to CKKS's precision (below), far from moving a prediction
    np.testing.assert_allclose(opened["test_pooled"], expected, atol=5e-3)
    assert not [c for c in opened.columns if c.startswith("train_")]
    np.testing.assert_allclose(
        np.load(out / "experimenter" / "models" / "seed-3.npy"),
        reference.final_params[3],
        atol=1e-4,
    )


def test_a_server_blind_node_without_the_experimenters_key_refuses_to_run(tmp_path):
    from secagg.flower.node import NodeClient

    folder, _ = deploy(tmp_path, replace(LARC, protocol="fedavg", server_blind=True))
    node = folder / "nodes" / "client_0"
    NodeClient(node)
    (node / "observer.pub").unlink()
    with pytest.raises(ConfigError, match="holds no observer.pub"):
        NodeClient(node)


def test_the_experimenter_makes_its_key_where_it_works_and_prepare_takes_the_public_half(
    tmp_path, capsys
):
    from secagg.simulation.cli import main

    assert main(["flower", "experimenter", str(tmp_path / "me")]) == 0
    public = tmp_path / "me" / "observer.pub"
    assert (tmp_path / "me" / "observer.key").stat().st_mode & 0o777 == 0o600
    args = ["flower", "prepare", str(tmp_path / "d"), "--backend", "ckks", "--rounds", "1"]
    assert main([*args, "--server-blind", "--observer", str(public)]) == 0
    deployment = tmp_path / "d"
    assert not (deployment / "experimenter").exists()  # no private key on the server's side
    assert not list(deployment.rglob("observer.key"))
    assert (deployment / "nodes" / "client_0" / "observer.pub").read_bytes() == public.read_bytes()
    # an experimenter key for a run that is not server-blind, or one that is not a key
    assert main([*args[:2], str(tmp_path / "e"), *args[3:], "--observer", str(public)]) != 0
    assert "server-blind" in capsys.readouterr().err
    bad = tmp_path / "bad.pub"
    bad.write_text("{}")
    assert (
        main([*args[:2], str(tmp_path / "f"), *args[3:], "--server-blind", "--observer", str(bad)])
        != 0
    )
    assert "not an experimenter's public key" in capsys.readouterr().err
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()


def test_status_shows_flowers_record_of_each_run_beside_the_serverapps_progress(
    tmp_path, monkeypatch
):
    import subprocess

    from secagg.errors import SecaggError
    from secagg.flower import operations
    from secagg.flower.launch import DeploymentError

    folder, _ = deploy(tmp_path, PLAIN)
    (folder / "results-progress.log").write_text(
        "Flower run 5: waiting for 6 SuperNodes\n  seed 3 round 1/2: c_index 0.61\n"
    )
    (folder / "results").mkdir()
    (folder / "results" / "run.json").write_text(  # secagg's status of run 5, beside Flower's
        json.dumps({"status": "degraded", "problems": ["client_2 missed round 2 of seed 3"]})
    )
    listed = {
        "runs": [
            {"run-id": "5", "status": "running", "elapsed": "00:00:09",
             "network-traffic": {"inbound-bytes": 2_000_000, "outbound-bytes": 500_000}},
            {"run-id": "4", "status": "finished:stopped", "elapsed": "00:00:01",
             "network-traffic": {"inbound-bytes": 0, "outbound-bytes": 0}},
        ]
    }  # fmt: skip
    answers = {"ls": json.dumps(listed), "stop": "", "fail": "connection refused"}
    asked = []

    def fake(where, *args, timeout=60.0):
        asked.append(args)
        code = 1 if args[0] == "stop" and args[1] == "9" else 0
        return subprocess.CompletedProcess(args, code, answers[args[0]], "")

    monkeypatch.setattr(operations, "flwr", fake)
    runs = operations.runs(folder)
    assert [r["progress"] for r in runs] == ["seed 3 round 1/2: c_index 0.61", None]
    shown = operations.format_runs(runs)
    assert "Flower run 5: running, 00:00:09 elapsed, traffic in 2.00 MB, out 0.50 MB" in shown
    assert "no progress log here" in shown  # run 4's log is not this one
    assert (
        "  secagg: degraded (client_2 missed round 2 of seed 3); seed 3 round 1/2: c_index 0.61"
        in shown
    )
    assert runs[0]["secagg"]["status"] == "degraded" and runs[1]["secagg"] is None
    operations.stop(folder, 5)
    assert asked[-1] == ("stop", "5", "secagg")
    with pytest.raises(SecaggError, match="flwr stop 9"):
        operations.stop(folder, 9)
    answers["ls"] = "connection refused"
    with pytest.raises(DeploymentError, match="secagg flower commands"):
        operations.runs(folder)
    with pytest.raises(ConfigError, match="not a prepared deployment"):
        operations.runs(tmp_path)


def test_a_node_reuses_its_parsed_settings_until_a_file_it_read_changes(tmp_path):
    from secagg.flower.node import node_client

    folder, _ = deploy(tmp_path, PLAIN)
    node = folder / "nodes" / "client_0"
    first = node_client(node)
    assert node_client(node) is first  # what the warm zygote built, each message reuses
    (node / "node.toml").write_text("[environment]\nSECAGG_TEST_NODE = '1'\n")
    assert node_client(node) is not first  # its operator changed its settings: read again


def test_what_the_experimenter_and_the_serverapp_refuse_says_what_to_do(tmp_path):
    from secagg.flower.apps import main as server_main
    from secagg.flower.experimenter import make_experimenter, open_sealed

    make_experimenter(tmp_path / "me")
    with pytest.raises(ConfigError, match="made once"):
        make_experimenter(tmp_path / "me")
    # a run folder that holds no sealed models (not a server-blind run's)
    reference = tmp_path / "run"
    secagg.run(PLAIN, out=reference)
    with pytest.raises(ConfigError, match="holds no sealed models"):
        open_sealed(reference, tmp_path / "me" / "observer.key")
    with pytest.raises(ConfigError, match="not an experimenter's private key"):
        open_sealed(reference, tmp_path / "me" / "observer.pub")

    class Context:  # a run submitted without the deployment folder
        run_config = {"deployment": ""}
        run_id = 1

    with pytest.raises(ConfigError, match="--run-config 'deployment="):
        server_main(None, Context())  # type: ignore[arg-type]
