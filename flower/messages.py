"""A secagg envelope inside a Flower message, and back.

Every request is one Flower message of type ``query.secagg`` whose content holds one
``ConfigRecord`` named ``secagg``: on requests ``run`` (which experiment, seed and stage the
node answers for; a node refuses a run that is not the one it was configured for), and the
envelope's bytes, exactly what the in-process transport carries, so secagg's byte counts stay
the wire's: up to :data:`LARGE` bytes as ``envelope`` in that record, from there on as the one
``Array`` of an ``ArrayRecord`` named ``secagg.envelope`` (uint8, stype ``bytes``: the bytes
as they are). A reply holds the same without ``run``. A ``hello`` request (no envelope) asks
a node which client it is.

Why two ways: Flower serialises a ``ConfigRecord`` whole every time it needs its object id,
which it does not cache (the ServerApp's push serialised a 10 MB record twice, a reply's
ClientApp four times: 0.1 to 0.5 s each on a loaded 2-core machine), while an ``Array`` is
sliced into 5 MB chunks whose ids are computed once, and pushed in parallel.

What Flower adds around the envelope (its message metadata, object tree, record framing) is
Flower's own overhead: :func:`framing_bytes` measures it per message.

A node whose ClientApp fails answers with Flower's error reply whose reason is a fixed code
(:func:`failure`: ``secagg:<code>``, one of :data:`FAILURE_CODES`), never the exception's
text, which can quote a cell of the site's data; the server reads back only such a code or
the name of Flower's own error code (:func:`failure_code`), whatever the reason says.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from secagg.errors import ERROR_CODES, MalformedMessage

MESSAGE_TYPE = "query.secagg"
RECORD = "secagg"
#: the record of an envelope of :data:`LARGE` bytes or more, its one array, its stype
ENVELOPE_RECORD, ENVELOPE, STYPE = "secagg.envelope", "envelope", "bytes"
#: from this size on an envelope travels as an Array (smaller: bytes in the ConfigRecord,
#: where an Array's own records and chunk would add some 400 bytes of framing)
LARGE = 1 << 20


#: what a node's failed reply may carry: secagg's refusal codes (``secagg.errors.ERROR_CODES``),
#: a request the node's experiment file (or its ledger) does not allow, a new run of a seed
#: whose run budgets the node's privacy ledger has spent (``secagg.flower.ledger``), or
#: anything else
FAILURE_CODES = frozenset(
    {code for _, code in ERROR_CODES}
    | {"request_refused", "privacy_budget_spent", "internal_error"}
)
FAILURE_PREFIX = "secagg:"


def failure(to: Message, code: str) -> Message:
    """The error reply of a node whose ClientApp failed on ``to``: Flower's "ClientApp raised
    an exception" with ``code`` (one of :data:`FAILURE_CODES`) for its only reason."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    if code not in FAILURE_CODES:
        code = "internal_error"
    reason = FAILURE_PREFIX + code
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=to)


def failure_code(message: Message) -> str:
    """What the server may say of an error reply: the node's code if its reason is one
    (:func:`failure`), else the name of Flower's error code (``node_unavailable``,
    ``client_app_raised_exception``, ...): never the reason's own text, which Flower fills
    with the exception's repr where a ClientApp raised past secagg's."""
    from flwr.common.constant import ErrorCode

    error = message.error
    reason = str(error.reason or "")
    if reason.startswith(FAILURE_PREFIX) and reason[len(FAILURE_PREFIX) :] in FAILURE_CODES:
        return reason[len(FAILURE_PREFIX) :]
    names = {v: k.lower() for k, v in vars(ErrorCode).items() if k.isupper() and isinstance(v, int)}
    return names.get(error.code, f"flower_error_{int(error.code)}")


def _content(fields: dict[str, Any], envelope: bytes | None) -> RecordDict:
    if envelope is None:
        return RecordDict({RECORD: ConfigRecord(fields)})
    envelope = bytes(envelope)
    if len(envelope) < LARGE:
        return RecordDict({RECORD: ConfigRecord({**fields, ENVELOPE: envelope})})
    array = Array(dtype="uint8", shape=(len(envelope),), stype=STYPE, data=envelope)
    records = {RECORD: ConfigRecord(fields), ENVELOPE_RECORD: ArrayRecord({ENVELOPE: array})}
    return RecordDict(records)  # type: ignore[arg-type]


def request(node_id: int, envelope: bytes | None, run: dict[str, Any], *, ttl: float) -> Message:
    """A message to ``node_id``: ``envelope`` (None: a hello) for the run ``run`` names."""
    fields = {"run": json.dumps(run, sort_keys=True)}
    return Message(_content(fields, envelope), node_id, MESSAGE_TYPE, ttl=ttl)


def reply(to: Message, envelope: bytes) -> Message:
    return Message(_content({}, envelope), reply_to=to)


def _record(message: Message) -> ConfigRecord:
    if not message.has_content():  # an error reply (e.g. Flower's "node unavailable")
        raise MalformedMessage("a Flower message without content")
    content = message.content
    if RECORD not in content.config_records:
        raise MalformedMessage(f"a Flower message without a {RECORD!r} record")
    return content.config_records[RECORD]


def _envelope(message: Message) -> Any:
    """The envelope a message carries, either way (None: none; anything else than bytes
    is the caller's to refuse)."""
    record = _record(message)
    arrays = message.content.array_records
    if ENVELOPE_RECORD not in arrays:
        return record.get(ENVELOPE)
    if ENVELOPE in record or list(arrays[ENVELOPE_RECORD]) != [ENVELOPE]:
        raise MalformedMessage("a secagg message with its envelope twice or beside others")
    array = arrays[ENVELOPE_RECORD][ENVELOPE]
    if (array.dtype, array.stype, tuple(array.shape)) != ("uint8", STYPE, (len(array.data),)):
        raise MalformedMessage("a secagg envelope's array must hold its bytes as they are")
    return array.data


def read_request(message: Message) -> tuple[bytes | None, dict[str, Any]]:
    """(envelope or None for a hello, run) of a request; MalformedMessage otherwise."""
    record = _record(message)
    try:
        run = json.loads(str(record["run"]))
    except (KeyError, ValueError):
        raise MalformedMessage("a secagg request names no run") from None
    envelope = _envelope(message)
    if envelope is not None and not isinstance(envelope, bytes):
        raise MalformedMessage("a secagg envelope must travel as bytes")
    if not isinstance(run, dict):
        raise MalformedMessage("a secagg request's run must be a table")
    return envelope, run


def read_reply(message: Message) -> bytes:
    """The envelope of a reply (MalformedMessage for anything else)."""
    envelope = _envelope(message)
    if not isinstance(envelope, bytes):
        raise MalformedMessage("a secagg reply without an envelope")
    return envelope


def framing_bytes(message: Message) -> int:
    """What Flower (1.30 to 1.42) sends besides the envelope: a message travels as a header (the
    message without its content), an object tree and each nested object (message, record
    dict, records, arrays and their chunks) serialised on its own; this is their total minus
    the envelope's bytes (gRPC's and HTTP/2's own framing not included).

    Counted without serialising or hashing the envelope: Flower's framing depends on a bytes
    value's length, never on its content (object ids are fixed-length digests), so it is
    counted on a copy of the message whose bytes and arrays are empty, plus what their
    lengths add (an array's chunks assumed distinct: Flower sends a repeated chunk once).
    Counting the message itself made Flower serialise a config record 21 times (its object
    ids are recomputed, not cached): 3.5 s per 10 MB message in the ServerApp, most of a
    round of large messages."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.message_pb2 import ObjectTree
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )

    if not message.has_content():  # an error reply: its header is all there is
        return message_to_proto(message).ByteSize()
    header = message_to_proto(remove_content_from_message(message)).ByteSize()
    skeleton, added, chunked = _without_bytes(message)
    tree = get_object_tree(skeleton)
    nodes = [tree]
    while nodes:  # each emptied array's node gets its chunks back (any 64-character ids)
        node = nodes.pop()
        nodes.extend(node.children)
        for i in range(chunked.get(node.object_id, 0)):
            node.children.append(ObjectTree(object_id=f"{i:064x}"))
    objects = sum(len(o.deflate()) for o in get_all_nested_objects(skeleton).values())
    try:  # a node may answer with anything: count it, never fail on it
        envelope = _envelope(message)
    except MalformedMessage:
        envelope = None
    size = len(envelope) if isinstance(envelope, bytes) else 0
    return header + tree.ByteSize() + objects + added - size


def _without_bytes(message: Message) -> tuple[Message, int, dict[str, int]]:
    """(a copy of ``message`` whose config records' bytes values and arrays are empty, the
    bytes the real values add to the serialisation of its objects, and for each emptied
    array's object id in the copy how many chunks the real one has)."""
    from flwr.app.message import make_message

    content, added, chunked = RecordDict(), 0, {}
    for name, record in message.content.items():
        if isinstance(record, ConfigRecord):
            lengths = {k: len(v) for k, v in record.items() if isinstance(v, bytes)}
            if lengths:
                record = ConfigRecord({k: b"" if k in lengths else v for k, v in record.items()})
                added += _bytes_added(record, lengths)
        elif isinstance(record, ArrayRecord):
            arrays = {}
            for key, array in record.items():
                empty, more, chunks = _empty_array(array)
                arrays[key], added = empty, added + more
                if chunks:
                    chunked[empty.object_id] = chunks
            record = ArrayRecord(arrays)
        content[name] = record
    return make_message(metadata=message.metadata, content=content), added, chunked


def _empty_array(array: Array) -> tuple[Array, int, int]:
    """(``array`` without its data, what its data adds to the serialisation of the array and
    of its chunks, how many chunks Flower slices it into)."""
    from flwr.app.message.arraychunk import ArrayChunk
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE as CHUNK
    from flwr.supercore.inflatable.inflatable_object import add_header_to_object_body

    def emptied() -> Array:
        return Array(dtype=array.dtype, shape=tuple(array.shape), stype=array.stype, data=b"")

    n = len(array.data)
    sizes = [min(CHUNK, n - start) for start in range(0, n, CHUNK)]
    empty, sliced = emptied(), emptied()
    placeholder = ArrayChunk(memoryview(b""))
    sliced.__dict__["_chunks"] = [(f"{i:064x}", placeholder) for i in range(len(sizes))]
    head = len(add_header_to_object_body(b"", placeholder))  # "ArrayChunk  0" and the divider
    chunks = sum(head - 1 + len(str(size)) + size for size in sizes)
    return empty, len(sliced.deflate()) - len(empty.deflate()) + chunks, len(sizes)


def _varint(n: int) -> int:
    """Bytes of protobuf's varint of ``n`` (a length prefix)."""
    return max(1, (n.bit_length() + 6) // 7)


def _bytes_added(empty: ConfigRecord, lengths: dict[str, int]) -> int:
    """What giving the (empty) bytes values of ``empty`` these ``lengths`` adds to its
    serialisation (``ConfigRecord.deflate``: a protobuf body, a config record's items, each
    a key and a value holding the bytes, after a header that names the body's length),
    counted on the empty record's protobuf without building the real one: each length-
    delimited field grows by what it holds plus its longer length prefix."""
    from flwr.common.serde_utils import record_value_dict_to_proto
    from flwr.proto.recorddict_pb2 import ConfigRecord as ProtoConfigRecord
    from flwr.proto.recorddict_pb2 import ConfigRecordValue

    values = record_value_dict_to_proto(empty, [bool, int, float, str, bytes], ConfigRecordValue)
    items = {k: ProtoConfigRecord.Item(key=k, value=v) for k, v in values.items()}
    body = ProtoConfigRecord(items=list(items.values())).ByteSize()
    grown = body
    for key, n in lengths.items():
        value, item = values[key].ByteSize(), items[key].ByteSize()
        inner = n + _varint(n) - _varint(0)  # the bytes, in the value
        outer = inner + _varint(value + inner) - _varint(value)  # the value, in its item
        grown += outer + _varint(item + outer) - _varint(item)  # the item, in the record
    return grown - body + len(str(grown)) - len(str(body))  # and the header's digits
