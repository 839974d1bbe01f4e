"""Round engine with scripted clients: FedAvg arithmetic, byte counts, and bad input.

Every misbehaving client must be excluded from the round with a typed reason in the audit,
while the round goes on with the others and gives FedAvg over the honest clients only.
"""

import numpy as np
import pytest

from secagg import wire
from secagg.errors import RoundAborted
from secagg.protocols.fedavg import sample_size_weights
from secagg.server.audit import AuditLog
from secagg.wire import Envelope
from tests.conftest import make_server


def fedavg(gs):
    w = sample_size_weights({c: n for c, (_, n) in gs.items()})
    return sum(w[c] * g for c, (g, _) in gs.items())


def test_fedavg_round_is_sample_weighted_mean_added_to_model(honest):
    gs, handlers = honest
    server = make_server(handlers)
    server.run_round(0)
    np.testing.assert_allclose(
        server.params, (10 * gs["client_0"][0] + 30 * gs["client_1"][0]) / 40
    )


def test_bytes_in_audit_are_the_bytes_on_the_wire(honest):
    _, handlers = honest
    sizes = []

    def spy(cid):
        def handle(data):
            reply = handlers[cid](data)
            sizes.append((len(data), len(reply)))
            return reply

        return handle

    audit = AuditLog()
    make_server({c: spy(c) for c in handlers}, audit=audit).run_round(0)
    msgs = [r for r in audit.records if r["event"] == "message"]
    assert sum(r["bytes"] for r in msgs if r["direction"] == "sent") == sum(s for s, _ in sizes)
    assert sum(r["bytes"] for r in msgs if r["direction"] == "received") == sum(r for _, r in sizes)
    up = [
        f
        for r in msgs
        if r["direction"] == "received"
        for f in r["fields"]
        if f["name"] == "pseudo_gradient"
    ]
    assert [f["bytes"] for f in up] == [3 * 8, 3 * 8]  # float64 vectors from the scripted client
    for r in msgs:  # per-field bytes plus framing add up to the message
        assert sum(f["bytes"] for f in r["fields"]) == r["bytes"]


def reply_with(fields, sender="client_bad", rnd=None, phase=None):
    def handle(data):
        req = Envelope.from_bytes(data)
        return Envelope(
            sender, "server", req.round if rnd is None else rnd, phase or req.phase, fields
        ).to_bytes()

    return handle


def raw(payload: bytes):
    return lambda data: payload


def crashing(data):
    raise RuntimeError("out of memory")


GOOD_UPLOAD = {"pseudo_gradient": wire.vector(np.ones(3)), "n_samples": wire.scalar(5)}
NAN = wire.Field(wire.SCALAR, np.float64("nan").tobytes())

BAD_CLIENTS = {
    "garbage bytes": (raw(b"hello"), "TruncatedMessage"),
    "bad magic": (raw(b"XXXX" + b"\0" * 20), "MalformedMessage"),
    "truncated": (lambda d: reply_with(GOOD_UPLOAD)(d)[:-3], "TruncatedMessage"),
    "wrong sender": (reply_with(GOOD_UPLOAD, sender="client_0"), "UnknownSender"),
    "replayed round": (reply_with(GOOD_UPLOAD, rnd=7), "StaleMessage"),
    "wrong phase": (reply_with(GOOD_UPLOAD, phase="larc_probe"), "StaleMessage"),
    "missing field": (reply_with({"n_samples": wire.scalar(5)}), "UnexpectedField"),
    "wrong kind": (
        reply_with({"pseudo_gradient": wire.config({"x": 1}), "n_samples": wire.scalar(5)}),
        "UnexpectedField",
    ),
    "extra field": (reply_with({**GOOD_UPLOAD, "secret": wire.scalar(1)}), "UnexpectedField"),
    "nan scalar": (reply_with({**GOOD_UPLOAD, "n_samples": NAN}), "UnexpectedField"),
    "zero samples": (reply_with({**GOOD_UPLOAD, "n_samples": wire.scalar(0)}), "ClientInputError"),
    "wrong length": (
        reply_with({**GOOD_UPLOAD, "pseudo_gradient": wire.vector(np.ones(4))}),
        "UnexpectedField",
    ),
    "crashes": (crashing, "ClientUnavailable"),
}


@pytest.mark.parametrize("case", list(BAD_CLIENTS))
def test_bad_client_is_excluded_and_the_round_goes_on(honest, case):
    gs, handlers = honest
    bad, error = BAD_CLIENTS[case]
    audit = AuditLog()
    server = make_server({**handlers, "client_bad": bad}, audit=audit)
    report = server.run_round(0)
    assert "client_bad" in report.excluded and sorted(report.clients) == sorted(gs)
    np.testing.assert_allclose(server.params, fedavg(gs))
    (ex,) = [r for r in audit.records if r["event"] == "excluded"]
    assert ex["peer"] == "client_bad" and ex["error"] == error and ex["reason"]
    assert audit.summary()["exclusions"][0]["peer"] == "client_bad"


def test_excluded_client_comes_back_next_round(honest):
    gs, handlers = honest
    calls = {"n": 0}

    def flaky(data):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("network down")
        return reply_with(
            {"pseudo_gradient": wire.vector(np.zeros(3)), "n_samples": wire.scalar(40)},
            sender="client_flaky",
        )(data)

    server = make_server({**handlers, "client_flaky": flaky})
    assert "client_flaky" in server.run_round(0).excluded
    assert "client_flaky" in server.run_round(1).clients


def test_round_fails_clearly_when_nobody_is_left():
    server = make_server({"client_bad": raw(b"junk")})
    with pytest.raises(RoundAborted, match="no usable client left after phase .train."):
        server.run_round(0)


def test_larc_on_scripted_clients_uses_last_rounds_alpha(honest):
    from secagg.protocols.larc import larc_weights

    gs, handlers = honest
    audit = AuditLog()
    server = make_server(handlers, protocol="larc", audit=audit)
    server.run_round(0)
    server.run_round(1)
    alpha_sent = {
        (r["round"], r["peer"]): f["value"]
        for r in audit.records
        if r["event"] == "message" and r["direction"] == "sent"
        for f in r["fields"]
        if f["name"] == "alpha"
    }
    # the audit numbers rounds from 1 (run_round(0) is round 1)
    assert alpha_sent[(1, "client_0")] == alpha_sent[(1, "client_1")] == 1.0  # α^{-1} = 1
    expected = larc_weights(np.array([np.sum(gs[c][0]) for c in ("client_0", "client_1")]))
    assert [alpha_sent[(2, c)] for c in ("client_0", "client_1")] == pytest.approx(expected)


def test_weights_beyond_one_are_refused_on_every_backend(honest):
    """|w| <= 1 is the backend contract (encrypted sums need the headroom); a protocol that
    breaks it is stopped on plain too, not only where CKKS would overflow."""
    from secagg.errors import ProtocolStateError
    from secagg.protocols import Protocol

    class Doubling(Protocol):
        name = "doubling"

        def aggregate(self, ctx, uploads):
            return ctx.weighted_sum(
                {c: u.handle for c, u in uploads.items()}, {c: 2.0 for c in uploads}
            )

    _, handlers = honest
    server = make_server(handlers)
    server.protocol = Doubling()
    with pytest.raises(ProtocolStateError, match=r"\|w\| <= 1"):
        server.run_round(0)
