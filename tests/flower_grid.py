"""A stand-in for Flower's Grid that delivers messages to ClientApps in this process, through
the real ``client_app`` (routing by message type, a fresh NodeClient per message, state in
each node's directory): the transport, the messages and the nodes without the network.
The end-to-end tests in ``test_flower_e2e.py`` run the real SuperLink and SuperNodes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from secagg.flower.apps import client_app
from secagg.flower.messages import read_request
from secagg.wire import Envelope


def as_server(run_id: int = 7) -> None:
    """This process sends as the ServerApp of Flower run ``run_id``: Flower sets who sends
    in the ServerApp's process, and a new Message reads it (flwr 1.42: TaskIdentity)."""
    TaskIdentity.task_id, TaskIdentity.run_id = 1, run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID


class LoopbackGrid:
    """``nodes``: node id -> node directory. ``down``: node ids that never answer (their
    messages stay unanswered, as for a killed SuperNode)."""

    def __init__(self, nodes: dict[int, Path], run_id: int = 7, down=None):
        self.nodes, self.run_id = dict(nodes), run_id
        as_server(run_id)
        self.down: set[int] = set()
        #: (node id, round, phase) -> whether the node is down for that message
        self.down_for = down
        #: a down node's messages get Flower's content-less error reply (the SuperLink's
        #: "node unavailable" once the node missed its heartbeats) instead of no reply
        self.unavailable_replies = False
        self._replies: dict[str, Message] = {}
        self._ids = itertools.count()
        self.delivered = 0
        self.client_app = client_app  # what answers (a test may put a deviating node here)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = f"m{next(self._ids)}"
            msg.metadata.__dict__["_message_id"] = mid
            msg.metadata.__dict__["_run_id"] = self.run_id
            msg.metadata.__dict__["_src_node_id"] = 1
            ids.append(mid)
            node = msg.metadata.dst_node_id
            if node in self.down or node not in self.nodes or self._down_for(node, msg):
                if self.unavailable_replies:
                    self._replies[mid] = Message(
                        Error(code=5, reason="Node Unavailable"), reply_to=msg
                    )
                continue
            context = Context(
                self.run_id, node, {"node-dir": str(self.nodes[node])}, RecordDict(), {}
            )
            try:
                answer = self.client_app(msg, context)
            except Exception as exc:  # noqa: BLE001 - Flower turns it into an error reply,
                # its reason the exception's type and text (flwr 1.42's run_clientapp)
                reason = str(type(exc)) + ":<'" + str(exc) + "'>"
                answer = Message(Error(code=2, reason=reason), reply_to=msg)
            self._replies[mid] = answer
            self.delivered += 1
        return ids

    def _down_for(self, node: int, msg: Message) -> bool:
        envelope, _ = read_request(msg)
        if self.down_for is None or envelope is None:
            return False
        env = Envelope.from_bytes(envelope)
        return bool(self.down_for(node, env.round, env.phase))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(m) for m in list(message_ids) if m in self._replies]


def audits_match(over_flower: Path, in_process: Path) -> None:
    """The audit a run over Flower writes is the in-process run's, but for what follows from
    one difference: a node answers each message in a fresh process, so its clients commit no
    seeds for their next upload (``flower/node.py``), where in-process ckks clients do
    (``next_seeds``), and so the server relays no committed seeds ahead to them either
    (``precheck``: a planned decryptor's, or every client's where a protocol opens a sum of
    planned weights, LARC's Ĝ)."""
    ours, theirs = (
        json.loads((f / "audit_summary.json").read_text()) for f in (over_flower, in_process)
    )
    fields = theirs["ciphertext_fields_received"]
    assert "next_seeds" not in ours["ciphertext_fields_received"]
    if "next_seeds" in fields:
        fields.remove("next_seeds")
    assert "precheck" not in ours["sent_in_plaintext"]
    theirs["sent_in_plaintext"].pop("precheck", None)
    # the run view's weakest shares follow the weights, which LARC derives from decryptions
    # flooded afresh in every run: the same to the weights' quantisation, not to the bit
    view, other = ours.pop("run_view"), theirs.pop("run_view")
    assert set(view) == set(other) and view.get("guarantee") == other.get("guarantee")
    for key in ("weakest_share", "weakest_share_by_client"):
        assert view.get(key) == pytest.approx(other.get(key), abs=1e-3), key
    assert ours == theirs
