"""The versioned byte envelope every client <-> server message travels in.

Even the in-process simulation serialises every message, so byte counts are what a network
would carry and the same code can later run over sockets.

Layout (all integers big-endian)::

    0      4  magic  b"SAGG"
    4      2  wire-format version
    6      4  header length H
    10     H  header: UTF-8 JSON {sender, recipient, round, phase, fields: [...]}
    10+H   .. payload: the field blobs, concatenated in header order

Each field has a *kind* that says what the receiver learns from it:

- ``ciphertext``: opaque encrypted bytes (possibly several parts, e.g. CKKS chunks);
- ``scalar``: one plaintext float64;
- ``vector``: a plaintext float32/float64 array;
- ``config``: plaintext JSON control data (hyperparameters, optimizer settings).

Decoding checks everything before trusting anything and raises a typed
:class:`~secagg.errors.WireError` otherwise. JSON (the header, config fields) is bounded in
size and nesting depth before it is parsed: Python's parser recurses once per level.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg.errors import (
    MalformedMessage,
    OversizedMessage,
    TruncatedMessage,
    UnexpectedField,
    UnsupportedVersion,
)

MAGIC = b"SAGG"
WIRE_VERSION = 1
_PREFIX = struct.Struct(">4sHI")
#: Largest envelope a receiver accepts by default (1 GiB); callers may lower it.
DEFAULT_MAX_BYTES = 1 << 30
_MAX_HEADER_BYTES = 1 << 20
#: Largest config field a receiver parses: a config holds settings, not data.
MAX_CONFIG_BYTES = 1 << 20
#: Deepest JSON nesting accepted (what secagg writes is a few levels deep; json's C parser
#: raises RecursionError near a thousand, less when called deep in a stack).
MAX_JSON_DEPTH = 32
# In valid JSON a backslash only starts a two-character escape, inside a string; once escapes
# are gone, a string is a quote, non-quotes, a quote. Two linear passes (a single regex with
# escapes inside strings backtracks quadratically on an unterminated string of \" pairs).
_JSON_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_JSON_STRING = re.compile(rb'"[^"]*"')
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1

CIPHERTEXT = "ciphertext"
SCALAR = "scalar"
VECTOR = "vector"
CONFIG = "config"
KINDS = (CIPHERTEXT, SCALAR, VECTOR, CONFIG)
_VECTOR_DTYPES: dict[str, np.dtype[np.floating[Any]]] = {
    "<f4": np.dtype("<f4"),
    "<f8": np.dtype("<f8"),
}


@dataclass(frozen=True)
class Field:
    """One named value of an envelope, already encoded to bytes."""

    kind: str
    data: bytes | memoryview  # a view into a received message for ciphertexts and vectors
    dtype: str | None = None  # vectors only
    parts: tuple[int, ...] | None = None  # ciphertexts only: byte length of each part

    @property
    def nbytes(self) -> int:
        return len(self.data)


def scalar(value: float) -> Field:
    value = float(value)
    if not math.isfinite(value):
        raise UnexpectedField(f"refusing to send a non-finite scalar ({value})")
    return Field(SCALAR, struct.pack("<d", value))


def vector(values: Any) -> Field:
    arr = np.asarray(values)
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    arr = np.ascontiguousarray(arr.ravel(), dtype=arr.dtype.newbyteorder("<"))
    if not np.all(np.isfinite(arr)):
        raise UnexpectedField("refusing to send a vector with non-finite entries")
    return Field(VECTOR, arr.tobytes(), dtype=arr.dtype.str)


def ciphertext(parts: bytes | list[bytes] | tuple[bytes, ...]) -> Field:
    if isinstance(parts, (bytes, bytearray)):
        parts = [bytes(parts)]
    parts = [bytes(p) for p in parts]
    return Field(CIPHERTEXT, b"".join(parts), parts=tuple(len(p) for p in parts))


def ciphertext_rows(rows: np.ndarray) -> Field:
    """A ciphertext field whose parts are the rows of one (parts, bytes) uint8 array, sent
    from that array as it is (a model-sized release is not copied into a second buffer)."""
    rows = np.ascontiguousarray(rows)
    if rows.dtype != np.uint8 or rows.ndim != 2:
        raise UnexpectedField(
            f"ciphertext rows are a 2-D uint8 array, not {rows.dtype} {rows.shape}"
        )
    return Field(CIPHERTEXT, memoryview(rows.reshape(-1)), parts=(rows.shape[1],) * rows.shape[0])


def config(values: Mapping[str, Any]) -> Field:
    return Field(CONFIG, json.dumps(values, sort_keys=True, allow_nan=False).encode())


@dataclass(frozen=True)
class Envelope:
    sender: str
    recipient: str
    round: int
    phase: str
    fields: dict[str, Field] = field(default_factory=dict)

    # ---- encoding -------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        header = {
            "sender": self.sender,
            "recipient": self.recipient,
            "round": int(self.round),
            "phase": self.phase,
            "fields": [_field_header(name, f) for name, f in self.fields.items()],
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        # one join: a model-sized payload is copied once, not once per concatenation
        return b"".join(
            [
                _PREFIX.pack(MAGIC, WIRE_VERSION, len(head)),
                head,
                *(f.data for f in self.fields.values()),
            ]
        )

    @property
    def header_nbytes(self) -> int:
        """Bytes of framing and header: the envelope's cost beyond its field payloads."""
        return len(self.to_bytes()) - sum(f.nbytes for f in self.fields.values())

    # ---- typed accessors ------------------------------------------------------------
    def get(self, name: str, kind: str) -> Field:
        f = self.fields.get(name)
        if f is None:
            raise UnexpectedField(f"{self.phase} message from {self.sender} lacks field {name!r}")
        if f.kind != kind:
            raise UnexpectedField(
                f"field {name!r} from {self.sender} is a {f.kind}, expected a {kind}"
            )
        return f

    def scalar(self, name: str) -> float:
        (value,) = struct.unpack("<d", self.get(name, SCALAR).data)
        if not math.isfinite(value):
            raise UnexpectedField(f"scalar {name!r} from {self.sender} is not finite ({value})")
        return value

    def vector(self, name: str, length: int | None = None) -> np.ndarray:
        """The vector as a float64 array of its own (the reader may change it)."""
        return self.vector_view(name, length).astype(np.float64)

    def vector_view(self, name: str, length: int | None = None) -> np.ndarray:
        """As :meth:`vector`, checked the same way, but a read-only view into the message in
        the sender's dtype (float32 or float64) rather than a float64 copy: for a reader
        that only reads it, so that a model-sized field is not held twice."""
        f = self.get(name, VECTOR)
        assert f.dtype is not None
        arr = np.frombuffer(f.data, dtype=_VECTOR_DTYPES[f.dtype])
        if length is not None and arr.size != length:
            raise UnexpectedField(
                f"vector {name!r} from {self.sender} has {arr.size} entries, expected {length}"
            )
        if not np.all(np.isfinite(arr)):
            raise UnexpectedField(f"vector {name!r} from {self.sender} has non-finite entries")
        arr.flags.writeable = False
        return arr

    def ciphertext_parts(self, name: str) -> list[memoryview]:
        """The parts as views into the message (no copy: a model's worth of ciphertext)."""
        f = self.get(name, CIPHERTEXT)
        view, out, pos = memoryview(f.data), [], 0
        for n in f.parts or (len(f.data),):
            out.append(view[pos : pos + n])
            pos += n
        return out

    def config(self, name: str) -> dict[str, Any]:
        # config fields are small and decoded as bytes (bytes() of bytes is not a copy)
        what = f"config {name!r} from {self.sender}"
        value = parse_json(bytes(self.get(name, CONFIG).data), what, MAX_CONFIG_BYTES)
        if not isinstance(value, dict):
            raise UnexpectedField(f"{what} is a JSON {type(value).__name__}, not an object")
        return value

    # ---- decoding -------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Envelope:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MalformedMessage(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > max_bytes:
            raise OversizedMessage(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
        if len(data) < _PREFIX.size:
            raise TruncatedMessage(f"message of {len(data)} bytes is shorter than the frame")
        magic, version, head_len = _PREFIX.unpack_from(data)
        if magic != MAGIC:
            raise MalformedMessage("not a secagg envelope (bad magic bytes)")
        if version != WIRE_VERSION:
            raise UnsupportedVersion(
                f"wire-format version {version}; this build reads version {WIRE_VERSION}"
            )
        if head_len > _MAX_HEADER_BYTES:
            raise OversizedMessage(f"header of {head_len} bytes exceeds {_MAX_HEADER_BYTES}")
        start = _PREFIX.size
        if len(data) < start + head_len:
            raise TruncatedMessage("message ends inside its header")
        header = parse_json(data[start : start + head_len], "header", _MAX_HEADER_BYTES)
        sender, recipient, round_number, phase, specs = _check_header(header)
        fields: dict[str, Field] = {}
        pos = start + head_len
        view = memoryview(data)  # large fields stay views into the message: no copy
        for spec in specs:
            name, f_kind, nbytes = spec["name"], spec["kind"], spec["nbytes"]
            if pos + nbytes > len(data):
                raise TruncatedMessage(f"message ends inside field {name!r}")
            blob = view[pos : pos + nbytes]
            fields[name] = _check_field(
                name, f_kind, blob if f_kind in (CIPHERTEXT, VECTOR) else bytes(blob), spec
            )
            pos += nbytes
        if pos != len(data):
            raise MalformedMessage(f"{len(data) - pos} trailing bytes after the last field")
        return cls(sender, recipient, round_number, phase, fields)


def _field_header(name: str, f: Field) -> dict[str, Any]:
    h: dict[str, Any] = {"name": name, "kind": f.kind, "nbytes": f.nbytes}
    if f.dtype is not None:
        h["dtype"] = f.dtype
    if f.parts is not None:
        h["parts"] = list(f.parts)
    return h


def _check_header(header: Any):
    if not isinstance(header, dict):
        raise MalformedMessage("header is not a JSON object")
    try:
        sender, recipient = header["sender"], header["recipient"]
        round_number, phase, specs = header["round"], header["phase"], header["fields"]
    except KeyError as exc:
        raise MalformedMessage(f"header lacks {exc.args[0]!r}") from None
    if not (isinstance(sender, str) and isinstance(recipient, str) and isinstance(phase, str)):
        raise MalformedMessage("sender, recipient and phase must be strings")
    if not isinstance(round_number, int) or isinstance(round_number, bool) or round_number < 0:
        raise MalformedMessage(f"round must be a non-negative integer, got {round_number!r}")
    if not isinstance(specs, list):
        raise MalformedMessage("fields must be a list")
    seen = set()
    for spec in specs:
        if not isinstance(spec, dict):
            raise MalformedMessage("each field header must be an object")
        name, f_kind, nbytes = spec.get("name"), spec.get("kind"), spec.get("nbytes")
        if not isinstance(name, str) or name in seen:
            raise MalformedMessage(f"field name {name!r} is missing or repeated")
        seen.add(name)
        if f_kind not in KINDS:
            raise MalformedMessage(f"field {name!r} has unknown kind {f_kind!r}")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise MalformedMessage(f"field {name!r} has an invalid length {nbytes!r}")
    return sender, recipient, round_number, phase, specs


def _check_field(name: str, f_kind: str, blob: bytes | memoryview, spec: dict[str, Any]) -> Field:
    if f_kind == SCALAR:
        if len(blob) != 8:
            raise MalformedMessage(f"scalar {name!r} has {len(blob)} bytes, expected 8")
        return Field(SCALAR, blob)
    if f_kind == VECTOR:
        dtype = spec.get("dtype")
        if not isinstance(dtype, str) or dtype not in _VECTOR_DTYPES:  # a list is unhashable
            raise MalformedMessage(f"vector {name!r} has unsupported dtype {dtype!r}")
        if len(blob) % _VECTOR_DTYPES[dtype].itemsize:
            raise MalformedMessage(f"vector {name!r} length is not a whole number of {dtype}")
        return Field(VECTOR, blob, dtype=dtype)
    if f_kind == CIPHERTEXT:
        parts = spec.get("parts", [len(blob)])
        if (
            not isinstance(parts, list)
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)
            or sum(parts) != len(blob)
        ):
            raise MalformedMessage(f"ciphertext {name!r} part lengths do not add up")
        return Field(CIPHERTEXT, blob, parts=tuple(parts))
    parse_json(bytes(blob), f"config {name!r}", MAX_CONFIG_BYTES)
    return Field(CONFIG, blob)


def json_depth(text: bytes) -> int:
    """Deepest nesting of brackets in JSON text, outside strings, without parsing it.

    Invalid JSON may get a wrong depth; the parser refuses it anyway."""
    bare = _JSON_STRING.sub(b"", _JSON_ESCAPE.sub(b"", text))
    steps = _OPEN[np.frombuffer(bare, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max()) if steps.size else 0


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")  # NaN, Infinity: json.dumps never writes


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} overflows a float")
    return value


def parse_json(text: bytes, what: str, max_bytes: int) -> Any:
    """JSON from another party: bounded in size and depth before parsing, finite numbers
    only; every failure is a :class:`MalformedMessage` (or :class:`OversizedMessage`)."""
    if len(text) > max_bytes:
        raise OversizedMessage(f"{what} has {len(text)} bytes, more than the {max_bytes} allowed")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise MalformedMessage(
            f"{what} nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted"
        )
    try:
        return json.loads(
            text.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float
        )
    # ValueError covers JSONDecodeError and ints past Python's digit limit; RecursionError
    # cannot happen within the depth bound unless the caller's stack is already deep
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedMessage(f"{what} is not valid JSON: {exc}") from None
