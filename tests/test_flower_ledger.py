"""A node's privacy ledger (``secagg.flower.ledger``): a seed runs again after a run that
released nothing, a run that released takes one of the node's own ``runs_per_seed``, and a
server that replays, abandons or interleaves runs gets no more releases than that; a charge
is on disk before the reply leaves, and the same data is counted together from another
deployment's folder.

Runs go through the real ClientApp over ``flower_grid.LoopbackGrid``; the attacks send the
requests an honest run's server made, again, under other Flower run ids."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from secagg.errors import ClientRefused, RunNotComplete
from secagg.flower import messages
from secagg.flower import node as node_module
from secagg.flower.apps import client_app, run_on_flower
from secagg.flower.deployment import prepare
from secagg.flower.ledger import (
    BUDGET_SPENT,
    LEDGER_FILE,
    OverBudget,
    PrivacyBudgetSpent,
    RunClosed,
    admitted,
    charged,
    data_fingerprint,
    empty_ledger,
    spent,
)
from secagg.flower.node import NodeClient
from secagg.runspec.config import ExperimentConfig
from tests.flower_grid import LoopbackGrid, as_server

PLAIN = ExperimentConfig(
    task="tcga-brca", protocol="costwagg", backend="plain", rounds=1, seeds=[3], local_steps=5
)
CKKS = replace(PLAIN, protocol="fedavg", backend="ckks")


@pytest.fixture(autouse=True)
def _server_process():
    as_server()


# ---- the accounting ----------------------------------------------------------------------
def test_a_run_is_charged_once_it_released_and_refunded_when_superseded_before():
    ledger = admitted(empty_ledger(), "c|7|3|run", "line", "/n", allowed=1)
    # run 7 released nothing: run 8 supersedes it, and 7 costs nothing from now on
    ledger = admitted(ledger, "c|8|3|run", "line", "/n", allowed=1)
    assert not ledger["runs"]["c|7|3|run"]["open"] and spent(ledger, "line") == []
    with pytest.raises(RunClosed):  # a superseded run releases nothing more
        charged(ledger, "c|7|3|run", {"consents": 1})
    ledger = charged(ledger, "c|8|3|run", {"consents": 1, "scalars": 0})
    assert spent(ledger, "line") == ["c|8|3|run"]
    assert ledger["runs"]["c|8|3|run"]["counts"] == {"consents": 1}
    with pytest.raises(OverBudget) as over:
        admitted(ledger, "c|9|3|run", "line", "/n", allowed=1)
    assert over.value.spent == ["c|8|3|run"] and over.value.allowed == 1
    assert ledger["runs"]["c|8|3|run"]["open"]  # a refused run supersedes nothing
    # another line (another seed, or other data) has its own budget
    assert admitted(ledger, "c|9|4|run", "other", "/n", allowed=1)["runs"]["c|9|4|run"]["open"]


def test_the_data_fingerprint_is_the_partitions_content():
    from secagg.clients.tasks import ClientData

    x, y = torch.arange(6.0).reshape(3, 2), torch.ones(3, 2)
    same = data_fingerprint(ClientData(x.clone(), y.clone()))
    assert same == data_fingerprint(ClientData(x, y))
    assert same != data_fingerprint(ClientData(x + 1, y))


# ---- over the real ClientApp -------------------------------------------------------------
def set_privacy(node_dir: Path, **settings) -> None:
    """``[privacy]`` in a node's own node.toml (what its operator writes)."""
    path = node_dir / "node.toml"
    text = path.read_text() if path.exists() else ""
    table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
    path.write_text(text.split("[privacy]")[0] + "[privacy]\n" + table)


def honest_run(tmp_path: Path, config: ExperimentConfig = PLAIN, **privacy):
    """A deployment, each node's ``[privacy]`` set to ``privacy``, and one honest run as
    Flower run 7, every request kept: (folder, node dirs by node id, requests by node id)."""
    nodes = prepare(tmp_path / "dep", config)
    by_id = {100 + k: path for k, path in enumerate(nodes.values())}
    if privacy:
        for path in by_id.values():
            set_privacy(path, **privacy)
    seen: dict[int, list[Message]] = {}

    def recording(message, context):
        if messages.read_request(message)[0] is not None:
            seen.setdefault(context.node_id, []).append(message)
        return client_app(message, context)

    grid = LoopbackGrid(by_id, run_id=7)
    grid.client_app = recording
    run_on_flower(
        grid, deployment=tmp_path / "dep", out=tmp_path / "out-7", timeout=30, connect_timeout=5
    )
    return tmp_path / "dep", by_id, seen


def run_again(folder: Path, by_id: dict[int, Path], flower_run: int, out: Path, down=None):
    """Flower run ``flower_run`` of the deployment (``down``: as ``LoopbackGrid``'s; a
    node down is a missing answer after 1 s)."""
    grid = LoopbackGrid(by_id, run_id=flower_run, down=down)
    timeout = 1.0 if down is not None else 30.0
    try:
        run_on_flower(grid, deployment=folder, out=out, timeout=timeout, connect_timeout=5)
    except RunNotComplete as stop:  # an aborted run fails its ServerApp, after its files
        written = json.loads((out / "flower.json").read_text())
        assert (
            written["status"] == stop.status == json.loads((out / "run.json").read_text())["status"]
        )
        return written
    return json.loads((out / "flower.json").read_text())


def send(node_dir: Path, request: Message, flower_run: int, envelope=None) -> Message:
    """``request`` (an honest server's) to its node again, as a request of ``flower_run``
    (with ``envelope`` instead of its own, if given)."""
    own, run = messages.read_request(request)
    envelope = own if envelope is None else envelope
    node = request.metadata.dst_node_id
    again = messages.request(node, envelope, run, ttl=60)
    again.metadata.__dict__.update({"_message_id": f"again-{flower_run}", "_run_id": flower_run})
    return client_app(
        again, Context(flower_run, node, {"node-dir": str(node_dir)}, RecordDict(), {})
    )


def code_of(reply: Message) -> str | None:
    return messages.failure_code(reply) if reply.has_error() else None


def ledger_of(node_dir: Path) -> dict:
    return json.loads((node_dir / LEDGER_FILE).read_text())


def released_runs(node_dir: Path) -> list[int]:
    runs = ledger_of(node_dir)["runs"]
    return sorted(int(k.split("|")[1]) for k, r in runs.items() if r["released"])


def logged_refusal(caplog) -> str:
    logged = [r for r in caplog.records if r.name == "secagg.flower.apps" and r.exc_info]
    return str(logged[-1].exc_info[1])


def test_a_run_that_failed_before_any_release_costs_nothing_and_the_seed_runs_again(tmp_path):
    """ckks: Flower run 7 makes its keys (each node writes its state) and every node is
    down for training, so the run stops before anything is released; run 8 of the same seed
    on the same deployment is admitted and completes. One run per seed refused it (a state
    file of the seed existed from another Flower run)."""
    nodes = prepare(tmp_path / "dep", CKKS)
    by_id = {100 + k: path for k, path in enumerate(nodes.values())}
    first = run_again(
        tmp_path / "dep", by_id, 7, tmp_path / "out-7", down=lambda n, r, p: p == "train"
    )
    assert "3" in first["aborted"]
    for path in by_id.values():
        assert (path / "state" / "7" / "3-run.bin").exists()  # keys were made and kept
        assert released_runs(path) == []
    second = run_again(tmp_path / "dep", by_id, 8, tmp_path / "out-8")
    assert second["aborted"] == {}
    for path in by_id.values():
        assert released_runs(path) == [8]
        assert not ledger_of(path)["runs"]["|".join([path.name, "7", "3", "run"])]["open"]


def test_a_run_that_released_takes_one_of_the_nodes_runs_per_seed(tmp_path, caplog):
    """Run 7 released: run 8 of the same seed is refused by every node with a code the
    coordinator reads, and the node's log says what is spent, what is left and what to do.
    The operators raise runs_per_seed to 2: run 9 runs; run 10 is refused again."""
    folder, by_id, _ = honest_run(tmp_path)
    refused = run_again(folder, by_id, 8, tmp_path / "out-8")
    assert "3" in refused["aborted"]
    summary = json.loads((tmp_path / "out-8" / "audit_summary.json").read_text())
    reasons = {e["peer"]: e["reason"] for e in summary["exclusions"]}
    assert len(reasons) == 6 and all(BUDGET_SPENT in r for r in reasons.values()), reasons
    detail = logged_refusal(caplog)
    assert re.search(r"released in 1 run\(s\) of seed 3 \(Flower run 7 \(", detail)
    assert "0 left, a run needs 1" in detail and "raise runs_per_seed under [privacy]" in detail
    for path in by_id.values():
        set_privacy(path, runs_per_seed=2)
    assert run_again(folder, by_id, 9, tmp_path / "out-9")["aborted"] == {}
    assert "3" in run_again(folder, by_id, 10, tmp_path / "out-10")["aborted"]
    assert all(released_runs(path) == [7, 9] for path in by_id.values())


def test_a_server_that_replays_abandons_or_interleaves_runs_gets_no_more_releases(tmp_path):
    """client_1 allows 2 runs of seed 3; run 7 (honest) released. The server sends its
    training request again under other run ids: run 8 is started and fails before any
    release (a garbled request, refused by the client after admission), run 9 supersedes it
    (8 released nothing: refunded) and releases, 8's and 7's requests replayed then are
    refused, and run 10 finds the budget spent. Two runs released in all, as many as the
    node allows."""
    folder, by_id, seen = honest_run(tmp_path, runs_per_seed=2)
    node, (train,) = by_id[101], seen[101]  # plain costwagg: one request a round
    assert code_of(send(node, train, 8, envelope=b"garbled")) == "malformed_request"
    assert ledger_of(node)["runs"]["client_1|8|3|run"]["open"]  # admitted, released nothing
    assert code_of(send(node, train, 9)) is None  # 8 released nothing: 9 supersedes it
    assert code_of(send(node, train, 8)) == "request_refused"  # 8 answers no more
    assert code_of(send(node, train, 7)) == "request_refused"  # a replay of run 7
    assert code_of(send(node, train, 10)) == BUDGET_SPENT
    assert released_runs(node) == [7, 9]


def test_a_node_killed_between_the_charge_and_the_reply_keeps_the_charge(tmp_path, monkeypatch):
    """The node dies after the ledger charged run 8's training reply and before its state
    is written or the reply leaves: run 8 stays charged (over-counted, never under-), its
    next request is refused (its state is gone: a fresh client would have fresh budgets),
    and run 9 finds both runs of the node's two spent."""
    folder, by_id, seen = honest_run(tmp_path, runs_per_seed=2)
    node_dir, (train,) = by_id[101], seen[101]
    node = NodeClient(node_dir)
    envelope, run = messages.read_request(train)

    class Killed(BaseException):
        pass

    def killed(*args, **kwargs):
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(node_module, "write_private_bytes", killed)  # the state's writer
        with pytest.raises(Killed):
            node.answer(envelope, run, 8, 101)
    assert released_runs(node_dir) == [7, 8]
    assert not (node_dir / "state" / "8" / "3-run.bin").exists()
    with pytest.raises(RunClosed, match="its state is gone"):
        node.answer(envelope, run, 8, 101)
    with pytest.raises(PrivacyBudgetSpent, match=r"released in 2 run\(s\)"):
        node.answer(envelope, run, 9, 101)


def test_the_same_data_is_counted_from_a_new_deployments_folder(tmp_path):
    """Both deployments' node folders name one ledger folder (``[privacy] ledger``): a new
    deployment of the same experiment (new folders, new identities) finds what the first
    one's run released, for the same data: run 8 is refused, and run 7's id answered from
    another folder too."""
    shared = tmp_path / "ledger"
    _, _, seen = honest_run(tmp_path / "a", ledger=str(shared))
    again = prepare(tmp_path / "b" / "dep", PLAIN)
    node_dir = again["client_1"]
    set_privacy(node_dir, ledger=str(shared))
    (train,) = seen[101]
    assert code_of(send(node_dir, train, 8)) == BUDGET_SPENT
    assert code_of(send(node_dir, train, 7)) == "request_refused"
    assert not (node_dir / "state").exists()  # nothing was built for either
    assert not (node_dir / LEDGER_FILE).exists()  # the ledger is the shared one
    assert isinstance(PrivacyBudgetSpent("c", "x"), ClientRefused)


def test_a_rolled_back_state_file_gets_no_second_release(tmp_path):
    """The node's state of run 7 is copied just before a consent (what a backup holds, or a
    lost last write leaves), the run goes on and ends, and the copy is put back: the next
    request of run 7 is refused, since the state is behind what the ledger charged (a
    rolled-back client would sign again what it signed: a second weighting of its upload
    over the run). The ledger, written before each reply, is the monotonic record."""
    from secagg.wire import Envelope

    nodes = prepare(tmp_path / "dep", CKKS)
    by_id = {100 + k: path for k, path in enumerate(nodes.values())}
    node_dir = by_id[101]
    state = node_dir / "state" / "7" / "3-run.bin"
    kept: dict[str, bytes] = {}
    seen: list[Message] = []

    def recording(message, context):
        envelope, _ = messages.read_request(message)
        if context.node_id == 101 and envelope is not None:
            seen.append(message)
            if Envelope.from_bytes(envelope).phase == "consent" and "before" not in kept:
                kept["before"] = state.read_bytes()
        return client_app(message, context)

    grid = LoopbackGrid(by_id, run_id=7)
    grid.client_app = recording
    run_on_flower(
        grid, deployment=tmp_path / "dep", out=tmp_path / "out", timeout=30, connect_timeout=5
    )
    assert "before" in kept and ledger_of(node_dir)["runs"]
    state.write_bytes(kept["before"])  # the rollback
    envelope, run = messages.read_request(seen[-1])
    with pytest.raises(RunClosed, match="is behind what this node's ledger charged"):
        NodeClient(node_dir).answer(envelope, run, 7, 101)
