"""The server's transport over Flower: each request a message to its client's SuperNode.

``FlowerNodes`` knows which SuperNode is which client: it asks every node it has not met a
``hello`` (the node answers with the client id of its own configuration, after checking that
it is configured for this experiment, signed with that client's Ed25519 key over the
server's fresh nonce and the node's id) and remaps a client whose node came back under a
new node id. ``FlowerTransport`` is the engine's transport for one seed (or pre-stage): it pushes
requests as the engine makes them (at most ``in_flight`` outstanding), pulls replies and
yields them as they arrive, so a streaming server folds one upload while others are still
being computed. A node that does not answer within ``timeout`` seconds is a missing answer
(the engine excludes it for the round, or, below a threshold's t, aborts the round); its
message expires in the SuperLink at the same time, so a node that restarts never answers a
stale request. A node that dies while pushing its reply costs no more: the pull gives its
reply up before the deadline, instead of holding every reply pulled with it for as long as
Flower would wait (``process.bound_object_pulls``).

The bytes the engine counts are the envelopes; what Flower adds around them is counted
apart (``framing``).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from flwr.app import Message

from secagg.errors import ConfigError, MalformedMessage
from secagg.flower import messages
from secagg.flower.process import (
    bound_object_pulls,
    objects_due,
    profile_process,
    shorten_object_pulls,
)
from secagg.server.transport import ClientUnavailable, Reply, check_reply

LOG = logging.getLogger(__name__)

HELLO_CONTEXT = b"secagg flower hello v1"
#: seconds before the earliest outstanding request's deadline by which a pull gives up a
#: reply still arriving: the other replies of the same pull are then taken before their
#: messages expire in the SuperLink (``process.bound_object_pulls``)
OBJECTS_MARGIN = 2.0

#: a diagnostic (``SECAGG_WARM_LOG``, as secagg.flower.warm and .guard): the ServerApp logs
#: when it pushed each request and pulled its reply (wall-clock times)
TRACE = bool(os.environ.get("SECAGG_WARM_LOG"))


def _trace(event: str, message_id: str, peer: str, **times: float) -> None:
    """One line to stderr, or, where ``SECAGG_WARM_LOG`` names a folder, to a file there
    (Flower discards a ServerApp's output)."""
    line = {"event": event, "message": message_id, "peer": peer, "at": time.time(), **times}
    where = os.environ.get("SECAGG_WARM_LOG", "")
    if os.path.isdir(where):
        with open(os.path.join(where, f"transport-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
    else:
        LOG.info("secagg.flower.transport: trace %s", json.dumps(line))


def hello_message(experiment: str, nonce: str, node_id: int, client: str) -> bytes:
    """What a node signs to say it is ``client``: bound to the experiment, the server's
    fresh nonce and the node id the hello was sent to (no replay to another node)."""
    body = json.dumps([experiment, nonce, int(node_id), client], separators=(",", ":"))
    return HELLO_CONTEXT + body.encode()


def hello_signed(
    said: Any, signers: Mapping[str, bytes], experiment: str, nonce: str, node_id: int
) -> bool:
    """Whether a hello answer is signed by the key of the client it names."""
    if not isinstance(said, dict) or said.get("client") not in signers:
        return False
    client = str(said["client"])
    try:
        signature = base64.b64decode(str(said.get("signature", "")), validate=True)
        Ed25519PublicKey.from_public_bytes(signers[client]).verify(
            signature, hello_message(experiment, nonce, node_id, client)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


#: what a node's answer to a hello means when it will not serve the run, and what to do:
#: a final answer (waiting would not change it), unlike a node that is down or late
REFUSAL_REMEDIES = {
    "invalid_fab": "the App submitted is not the one pinned in the node's node.json (a node "
    "runs only the App its deployment was prepared with): submit the deployment's own App "
    "(`secagg flower commands DIR` prints the command)",
    "bad_configuration": "the node's own settings are for another experiment (or its "
    "bundle is incomplete; its log says which): give every site the bundle of this "
    "deployment (`secagg flower join`)",
    "request_refused": "the node's own experiment file does not allow this request (its "
    "log says why)",
}


class FlowerNodes:
    """Which SuperNode holds which client; ``grid``: the ServerApp's ``Grid``; ``signers``:
    every client's Ed25519 public key (a node proves which client it is by signing the
    server's nonce: Flower's node authentication says a node may connect, not whose keys
    it holds)."""

    def __init__(
        self,
        grid: Any,
        clients: list[str],
        experiment: str,
        signers: Mapping[str, bytes],
        *,
        hello_timeout: float = 30.0,
        poll: float = 0.05,
        log: Callable[[str], None] | None = None,
    ):
        self.grid, self.clients, self.experiment = grid, list(clients), experiment
        self.signers = dict(signers)
        self.hello_timeout, self.poll, self.log = hello_timeout, poll, log
        self.node_of: dict[str, int] = {}
        #: listed nodes that are no client of this run, and what each said instead: a
        #: refusal's code (``refused``) or why its hello was not taken (``said``)
        self.refused: dict[int, str] = {}
        self.said: dict[int, str] = {}
        self._seen: frozenset[int] = frozenset()
        # a reply is often listed before its node has pushed all of it: ask again after
        # 50 ms rather than Flower's 1 s (the ServerApp's own process)
        shorten_object_pulls()
        bound_object_pulls()
        profile_process("serverapp")

    def wait_for_all(self, timeout: float) -> None:
        """Until every client's node has said hello; ConfigError naming the missing ones,
        at once where as many listed nodes refused this run as clients are missing (a
        foreign App, another experiment: waiting would not change their answer), else
        after ``timeout`` seconds, with what each listed node said."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh(force=True)  # a node whose hello timed out (still starting) is asked again
            missing = [c for c in self.clients if c not in self.node_of]
            if not missing:
                return
            if self.refused and len(self.refused) >= len(missing):
                raise ConfigError(
                    f"no node serves {missing}: "
                    + "; ".join(
                        f"node {n} refused this run ({code}): {REFUSAL_REMEDIES.get(code, '')}"
                        for n, code in sorted(self.refused.items())
                    )
                )
            if time.monotonic() > deadline:
                others = {**self.said, **{n: f"refused ({c})" for n, c in self.refused.items()}}
                raise ConfigError(
                    f"after {timeout:.0f} s no SuperNode answered for {missing}; start one "
                    "per client with its node folder (`secagg flower commands DIR` prints "
                    "how) and check that each points at this SuperLink with this "
                    "experiment's configuration and keys"
                    + (
                        "; the SuperLink's other nodes: "
                        + "; ".join(f"node {n}: {why}" for n, why in sorted(others.items()))
                        if others
                        else ""
                    )
                )
            time.sleep(0.5)

    def refresh(self, *, force: bool = False) -> None:
        """Say hello to nodes the SuperLink lists that have not been met (once per change of
        the list unless ``force``: a node that stays listed after it died is not asked again
        and again during a run)."""
        listed = frozenset(int(n) for n in self.grid.get_node_ids())
        if listed == self._seen and not force:
            return
        self._seen = listed
        unknown = listed - set(self.node_of.values())
        if not unknown:
            return
        nonce = secrets.token_hex(16)
        run = {"experiment": self.experiment, "hello": nonce}
        sent = {
            mid: node
            for node in sorted(unknown)
            for mid in self.grid.push_messages(
                [messages.request(node, None, run, ttl=self.hello_timeout)]
            )
        }
        for mid, answer in pull(self.grid, sent, self.hello_timeout, self.poll):
            node = sent[mid]
            self.refused.pop(node, None)
            self.said.pop(node, None)
            if isinstance(answer, NodeFailed) and answer.code in REFUSAL_REMEDIES:
                self.refused[node] = answer.code
                self._say(f"node {node} refused this run: {answer.code}")
                continue
            if isinstance(answer, Exception):
                self._say(f"node {node} did not say which client it is: {answer}")
                continue
            try:
                said = json.loads(messages.read_reply(answer))
            except (MalformedMessage, ValueError):
                self._ignore(node, "answered hello with something else")
                continue
            if not hello_signed(said, self.signers, self.experiment, nonce, node):
                self._ignore(node, "cannot sign as the client it names")
                continue
            client = str(said["client"])
            if client not in self.clients:
                self._ignore(node, f"says it is {client!r}, who is not in this run")
                continue
            if self.node_of.get(client) not in (None, node):
                self._say(f"{client} is back as node {node} (was {self.node_of[client]})")
            self.node_of[client] = node

    def _ignore(self, node: int, why: str) -> None:
        self.said[node] = why
        self._say(f"node {node} {why}; ignored")

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)


def pull_before(grid: Any, message_ids: list[str], earliest: float) -> list[Message]:
    """``grid.pull_messages(message_ids)``, giving up a reply still arriving
    :data:`OBJECTS_MARGIN` seconds before ``earliest`` (the earliest of their deadlines,
    ``time.monotonic``): a reply whose node died while pushing it must not hold the others
    pulled with it until their messages expire in the SuperLink."""
    with objects_due(earliest - OBJECTS_MARGIN):
        return list(grid.pull_messages(message_ids))


def pull(
    grid: Any, sent: dict[str, Any], timeout: float, poll: float
) -> Iterator[tuple[str, Message | Exception]]:
    """(message id, reply or why none) for every id in ``sent``, as replies arrive; an id
    still unanswered after ``timeout`` seconds gets a ClientUnavailable."""
    deadline = {mid: time.monotonic() + timeout for mid in sent}
    while deadline:
        for answer in pull_before(grid, list(deadline), min(deadline.values())):
            mid = answer.metadata.reply_to_message_id
            if mid in deadline:
                del deadline[mid]
                yield mid, _error(answer) or answer
        now = time.monotonic()
        for mid in [m for m, t in deadline.items() if t < now]:
            del deadline[mid]
            yield mid, ClientUnavailable(f"no answer within {timeout:g} s")
        if deadline:
            time.sleep(poll)


class NodeFailed(ClientUnavailable):
    """A node answered with an error: ``code`` is all the server learns of why (the node's
    fixed code, or Flower's error code by name: ``messages.failure_code``); the detail is
    in the node's own log."""

    def __init__(self, code: str, peer: str | None = None):
        self.refused = code in REFUSALS
        verb = "refused" if self.refused else "failed"
        super().__init__(f"{peer + ': ' if peer else ''}the node {verb}: {code}")
        self.code, self.peer = code, peer


#: codes by which a node says it would not answer (the rest: it could not)
REFUSALS = messages.FAILURE_CODES - {"internal_error"}


def _error(answer: Message) -> NodeFailed | None:
    if answer.has_error():
        return NodeFailed(messages.failure_code(answer))
    return None


class FlowerTransport:
    """The engine's transport for one seed (or pre-stage) of a run over Flower.

    Parameters:
        nodes: who is where (shared by the run's transports).
        run: what every request names: the experiment, the Flower run, the seed, the stage.
        timeout: seconds a node has to answer one request.
        in_flight: requests outstanding at once (each may carry a model); default: one
            per client (Flower answers each in a process of its own, seconds apiece, so
            holding some back would make a phase take several of those).
    """

    def __init__(
        self,
        nodes: FlowerNodes,
        *,
        run: dict[str, Any],
        timeout: float = 120.0,
        in_flight: int | None = None,
        poll: float = 0.05,
    ):
        self.nodes, self.run, self.timeout = nodes, dict(run), timeout
        self.in_flight = in_flight if in_flight is not None else len(nodes.clients)
        self.poll = poll
        #: what Flower adds around the envelopes: messages and bytes, each way
        self.framing = {
            "messages_sent": 0,
            "bytes_sent": 0,
            "messages_received": 0,
            "bytes_received": 0,
        }

    @property
    def peers(self) -> list[str]:
        return list(self.nodes.clients)

    def exchange(self, requests: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, Reply]]:
        self.nodes.refresh()  # a restarted node rejoins at the next exchange
        grid = self.nodes.grid
        requests = iter(requests)
        waiting: dict[str, tuple[str, float]] = {}  # message id -> (peer, deadline)
        exhausted = False
        while True:
            while not exhausted and len(waiting) < self.in_flight:
                try:
                    peer, data = next(requests)
                except StopIteration:
                    exhausted = True
                    break
                node = self.nodes.node_of.get(peer)
                if node is None:
                    yield peer, ClientUnavailable(f"{peer}: no SuperNode of this run holds it")
                    continue
                message = messages.request(node, data, self.run, ttl=self.timeout)
                pushing = time.time()
                (mid,) = grid.push_messages([message])
                if TRACE:
                    _trace("pushed", mid, peer, asked=pushing)
                self._count("sent", message)  # after the push, which fills in the metadata
                waiting[mid] = (peer, time.monotonic() + self.timeout)
            if not waiting:
                if exhausted:
                    return
                continue
            pulling = time.time()
            earliest = min(t for _, t in waiting.values())
            for answer in pull_before(grid, list(waiting), earliest):
                mid = answer.metadata.reply_to_message_id
                if mid not in waiting:
                    continue
                peer, _ = waiting.pop(mid)
                if TRACE:
                    _trace("pulled", mid, peer, asked=pulling)
                self._count("received", answer)
                yield peer, self._reply(peer, answer)
            now = time.monotonic()
            for mid in [m for m, (_, t) in waiting.items() if t < now]:
                peer, _ = waiting.pop(mid)
                yield peer, ClientUnavailable(f"{peer}: no answer within {self.timeout:g} s")
            if waiting:
                time.sleep(self.poll)

    @staticmethod
    def _reply(peer: str, answer: Message) -> Reply:
        if answer.has_error():
            return NodeFailed(messages.failure_code(answer), peer)
        try:
            return check_reply(peer, messages.read_reply(answer))
        except (MalformedMessage, ClientUnavailable) as exc:
            return ClientUnavailable(f"{peer}: {exc}")

    def _count(self, direction: str, message: Message) -> None:
        self.framing[f"messages_{direction}"] += 1
        self.framing[f"bytes_{direction}"] += messages.framing_bytes(message)
