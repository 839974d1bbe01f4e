"""The byte envelope: round trips, and typed rejection of every kind of bad bytes."""

import json
import struct

import numpy as np
import pytest

from secagg import wire
from secagg.errors import (
    MalformedMessage,
    OversizedMessage,
    TruncatedMessage,
    UnexpectedField,
    UnsupportedVersion,
    WireError,
)
from secagg.wire import Envelope


def sample() -> Envelope:
    return Envelope(
        "client_1",
        "server",
        3,
        "train",
        {
            "pseudo_gradient": wire.vector(np.arange(5, dtype=np.float32)),
            "n_samples": wire.scalar(129),
            "blob": wire.ciphertext([b"abc", b"", b"defgh"]),
            "train": wire.config({"lr": 0.1, "steps": 100}),
        },
    )


def test_round_trip_preserves_every_kind():
    env = sample()
    back = Envelope.from_bytes(env.to_bytes())
    assert (back.sender, back.recipient, back.round, back.phase) == (
        "client_1",
        "server",
        3,
        "train",
    )
    np.testing.assert_array_equal(back.vector("pseudo_gradient", 5), np.arange(5))
    assert back.fields["pseudo_gradient"].dtype == "<f4"
    assert back.scalar("n_samples") == 129.0
    assert back.ciphertext_parts("blob") == [b"abc", b"", b"defgh"]
    assert back.config("train") == {"lr": 0.1, "steps": 100}
    assert back.to_bytes() == env.to_bytes()


def test_payload_bytes_are_exactly_the_field_sizes():
    env = sample()
    data = env.to_bytes()
    assert env.fields["pseudo_gradient"].nbytes == 5 * 4
    assert env.fields["n_samples"].nbytes == 8
    assert len(data) == env.header_nbytes + sum(f.nbytes for f in env.fields.values())


def test_every_truncation_is_rejected_with_a_typed_error():
    data = sample().to_bytes()
    for cut in range(len(data)):
        with pytest.raises(WireError):
            Envelope.from_bytes(data[:cut])
    with pytest.raises(TruncatedMessage):
        Envelope.from_bytes(data[:-1])
    with pytest.raises(TruncatedMessage):
        Envelope.from_bytes(data[:5])


def test_oversized_is_rejected_before_parsing():
    data = sample().to_bytes()
    with pytest.raises(OversizedMessage):
        Envelope.from_bytes(data, max_bytes=len(data) - 1)
    Envelope.from_bytes(data, max_bytes=len(data))


def test_wrong_version_and_magic():
    data = bytearray(sample().to_bytes())
    data[4:6] = struct.pack(">H", wire.WIRE_VERSION + 1)
    with pytest.raises(UnsupportedVersion, match="version"):
        Envelope.from_bytes(bytes(data))
    with pytest.raises(MalformedMessage, match="magic"):
        Envelope.from_bytes(b"XXXX" + sample().to_bytes()[4:])


def test_trailing_bytes_are_rejected():
    with pytest.raises(MalformedMessage, match="trailing"):
        Envelope.from_bytes(sample().to_bytes() + b"\0")


def _with_header(header: dict, payload: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">4sHI", wire.MAGIC, wire.WIRE_VERSION, len(head)) + head + payload


BASE = {"sender": "a", "recipient": "server", "round": 0, "phase": "train"}


@pytest.mark.parametrize(
    "header,payload,match",
    [
        ({**BASE, "fields": [{"name": "x", "kind": "rot13", "nbytes": 0}]}, b"", "unknown kind"),
        ({**BASE, "fields": [{"name": "x", "kind": "scalar", "nbytes": 4}]}, b"1234", "expected 8"),
        (
            {**BASE, "fields": [{"name": "x", "kind": "vector", "nbytes": 8, "dtype": "<i8"}]},
            b"12345678",
            "dtype",
        ),
        (
            {**BASE, "fields": [{"name": "x", "kind": "vector", "nbytes": 6, "dtype": "<f4"}]},
            b"123456",
            "whole number",
        ),
        (
            {**BASE, "fields": [{"name": "x", "kind": "ciphertext", "nbytes": 3, "parts": [1, 1]}]},
            b"abc",
            "add up",
        ),
        (
            {**BASE, "fields": [{"name": "x", "kind": "scalar", "nbytes": -8}]},
            b"",
            "invalid length",
        ),
        ({**BASE, "fields": [{"name": "x", "kind": "config", "nbytes": 2}]}, b"{x", "JSON"),
        (
            {
                **BASE,
                "fields": [
                    {"name": "x", "kind": "scalar", "nbytes": 0},
                    {"name": "x", "kind": "scalar", "nbytes": 0},
                ],
            },
            b"",
            "repeated",
        ),
        ({**BASE, "round": -1, "fields": []}, b"", "round"),
        ({**BASE, "round": True, "fields": []}, b"", "round"),
        ({"sender": "a", "fields": []}, b"", "lacks"),
    ],
)
def test_inconsistent_headers_are_malformed(header, payload, match):
    with pytest.raises(MalformedMessage, match=match):
        Envelope.from_bytes(_with_header(header, payload))


def test_header_that_is_not_json_is_malformed():
    head = b"\xff\xfe not json"
    data = struct.pack(">4sHI", wire.MAGIC, wire.WIRE_VERSION, len(head)) + head
    with pytest.raises(MalformedMessage, match="JSON"):
        Envelope.from_bytes(data)


def test_non_bytes_input_is_malformed():
    with pytest.raises(MalformedMessage):
        Envelope.from_bytes("a string")  # type: ignore[arg-type]


def test_accessors_check_kind_length_and_finiteness():
    env = Envelope.from_bytes(sample().to_bytes())
    with pytest.raises(UnexpectedField, match="lacks"):
        env.scalar("delta_loss")
    with pytest.raises(UnexpectedField, match="expected a scalar"):
        env.scalar("pseudo_gradient")
    with pytest.raises(UnexpectedField, match="expected 6"):
        env.vector("pseudo_gradient", 6)
    nan_scalar = _with_header(
        {**BASE, "fields": [{"name": "x", "kind": "scalar", "nbytes": 8}]},
        struct.pack("<d", float("nan")),
    )
    with pytest.raises(UnexpectedField, match="not finite"):
        Envelope.from_bytes(nan_scalar).scalar("x")
    inf_vec = _with_header(
        {**BASE, "fields": [{"name": "v", "kind": "vector", "nbytes": 8, "dtype": "<f4"}]},
        np.array([1.0, np.inf], dtype="<f4").tobytes(),
    )
    with pytest.raises(UnexpectedField, match="non-finite"):
        Envelope.from_bytes(inf_vec).vector("v")


def test_senders_refuse_to_encode_non_finite_values():
    with pytest.raises(UnexpectedField):
        wire.scalar(float("inf"))
    with pytest.raises(UnexpectedField):
        wire.vector([1.0, float("nan")])


# ---- JSON from another party: bounded depth and size, finite numbers, typed errors -----------
def _with_raw_header(head: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">4sHI", wire.MAGIC, wire.WIRE_VERSION, len(head)) + head + payload


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_json_depth_counts_brackets_outside_strings_only():
    assert wire.json_depth(b"") == wire.json_depth(b"1") == 0
    assert wire.json_depth(b'{"a": [1, {"b": []}]}') == 4
    assert wire.json_depth(b'["[[[", "\\"]]]", "\\\\", ["{"]]') == 2
    assert wire.json_depth(b'[{"k": "\\u005b\\u005b"}]') == 2


@pytest.mark.parametrize("where", ["header", "config"])
def test_nesting_deeper_than_the_limit_is_malformed_in_header_and_config(where):
    for depth, ok in ((wire.MAX_JSON_DEPTH, True), (wire.MAX_JSON_DEPTH + 1, False)):
        if where == "header":  # the header object is one level
            data = _with_header({**BASE, "fields": [], "x": _nested(depth - 1)})
        else:
            body = json.dumps({"x": _nested(depth - 1)}).encode()
            fields = [{"name": "c", "kind": "config", "nbytes": len(body)}]
            data = _with_header({**BASE, "fields": fields}, body)
        if ok:
            Envelope.from_bytes(data)
        else:
            with pytest.raises(MalformedMessage, match=f"nests {depth} levels deep"):
                Envelope.from_bytes(data)


@pytest.mark.parametrize(
    "number", [b"1" * 5000, b"1e999", b"-1e999", b"NaN", b"Infinity", b"-Infinity"]
)
def test_numbers_python_cannot_hold_or_json_does_not_allow_are_malformed(number):
    head = b'{"sender":"a","recipient":"server","round":' + number + b',"phase":"p","fields":[]}'
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        Envelope.from_bytes(_with_raw_header(head))
    fields = b'[{"name":"c","kind":"config","nbytes":%d}]' % (len(number) + 6)
    head = b'{"sender":"a","recipient":"server","round":0,"phase":"p","fields":' + fields + b"}"
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        Envelope.from_bytes(_with_raw_header(head, b'{"x":' + number + b"}"))


def test_a_huge_but_representable_round_is_just_a_number():
    env = Envelope.from_bytes(_with_header({**BASE, "round": 10**4000, "fields": []}))
    assert env.round == 10**4000  # Exchange refuses it as stale, typed


def test_unhashable_dtype_is_malformed_not_a_type_error():
    header = {**BASE, "fields": [{"name": "v", "kind": "vector", "nbytes": 0, "dtype": []}]}
    with pytest.raises(MalformedMessage, match="dtype"):
        Envelope.from_bytes(_with_header(header))


def test_config_fields_are_bounded_and_must_be_objects():
    big = json.dumps({"x": "a" * wire.MAX_CONFIG_BYTES}).encode()
    fields = [{"name": "c", "kind": "config", "nbytes": len(big)}]
    with pytest.raises(OversizedMessage, match="config 'c'"):
        Envelope.from_bytes(_with_header({**BASE, "fields": fields}, big))
    fields = [{"name": "c", "kind": "config", "nbytes": 6}]
    env = Envelope.from_bytes(_with_header({**BASE, "fields": fields}, b"[1, 2]"))
    with pytest.raises(UnexpectedField, match="not an object"):
        env.config("c")


def test_the_depth_scan_stays_linear_on_unterminated_escaped_strings():
    import signal

    def hung(*_):
        raise TimeoutError("the depth scan is not linear")

    head = b'"' + b'\\"' * (wire._MAX_HEADER_BYTES // 2 - 1)
    # a one-regex string scan is quadratic here: 0.65 s at 16 KB, ~45 min extrapolated at
    # 1 MiB; the linear one takes milliseconds. The alarm stops a quadratic scan (no timing
    # is asserted: 120 s fails only the quadratic one, on any machine)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with pytest.raises(MalformedMessage):
            Envelope.from_bytes(_with_raw_header(head))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
