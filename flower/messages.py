"""A secagg envelope inside a Flower message, and back.

Every request is one Flower message of type ``query.secagg`` whose content holds one
``ConfigRecord`` named ``secagg``: ``envelope`` (the envelope's bytes, exactly what the
in-process transport carries, so secagg's byte counts stay the wire's), and on requests
``run`` (which experiment, seed and stage the node answers for; a node refuses a run that is
not the one it was configured for). A reply holds ``envelope`` alone. A ``hello`` request
(no envelope) asks a node which client it is.

What Flower adds around the envelope (its message metadata, object tree, record framing) is
Flower's own overhead: :func:`framing_bytes` measures it per message.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict

from secagg.errors import MalformedMessage

MESSAGE_TYPE = "query.secagg"
RECORD = "secagg"


def request(node_id: int, envelope: bytes | None, run: dict[str, Any], *, ttl: float) -> Message:
    """A message to ``node_id``: ``envelope`` (None: a hello) for the run ``run`` names."""
    fields: dict[str, Any] = {"run": json.dumps(run, sort_keys=True)}
    if envelope is not None:
        fields["envelope"] = bytes(envelope)
    return Message(RecordDict({RECORD: ConfigRecord(fields)}), node_id, MESSAGE_TYPE, ttl=ttl)


def reply(to: Message, envelope: bytes) -> Message:
    return Message(RecordDict({RECORD: ConfigRecord({"envelope": bytes(envelope)})}), reply_to=to)


def _record(message: Message) -> ConfigRecord:
    if not message.has_content():  # an error reply (e.g. Flower's "node unavailable")
        raise MalformedMessage("a Flower message without content")
    content = message.content
    if RECORD not in content.config_records:
        raise MalformedMessage(f"a Flower message without a {RECORD!r} record")
    return content.config_records[RECORD]


def read_request(message: Message) -> tuple[bytes | None, dict[str, Any]]:
    """(envelope or None for a hello, run) of a request; MalformedMessage otherwise."""
    record = _record(message)
    try:
        run = json.loads(str(record["run"]))
    except (KeyError, ValueError):
        raise MalformedMessage("a secagg request names no run") from None
    envelope = record.get("envelope")
    if envelope is not None and not isinstance(envelope, bytes):
        raise MalformedMessage("a secagg envelope must travel as bytes")
    if not isinstance(run, dict):
        raise MalformedMessage("a secagg request's run must be a table")
    return envelope, run


def read_reply(message: Message) -> bytes:
    """The envelope of a reply (MalformedMessage for anything else)."""
    envelope = _record(message).get("envelope")
    if not isinstance(envelope, bytes):
        raise MalformedMessage("a secagg reply without an envelope")
    return envelope


def framing_bytes(message: Message) -> int:
    """What Flower (1.30 to 1.42) sends besides the envelope: a message travels as a header (the
    message without its content), an object tree and each nested object (message, record
    dict, config record) serialised on its own; this is their total minus the envelope's
    bytes (gRPC's and HTTP/2's own framing not included)."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )

    if not message.has_content():  # an error reply: its header is all there is
        return message_to_proto(message).ByteSize()
    header = message_to_proto(remove_content_from_message(message)).ByteSize()
    tree = get_object_tree(message).ByteSize()
    objects = sum(len(o.deflate()) for o in get_all_nested_objects(message).values())
    try:  # a node may answer with anything: count it, never fail on it
        envelope = _record(message).get("envelope")
    except MalformedMessage:
        envelope = None
    return header + tree + objects - (len(envelope) if isinstance(envelope, bytes) else 0)
