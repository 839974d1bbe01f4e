"""Streaming aggregation: uploads folded into a running sum as they arrive.

The streamed round must give the buffered round's model (bit for bit on plain, within CKKS
precision on ckks), renormalise a client that drops out, hold at most one upload at a time,
and exclude a client whose upload disagrees with its enrolment.
"""

import gc
import weakref

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.backends.plain import PlainServer
from secagg.ckks.presets import get_preset
from secagg.ckks.public import PublicCKKS, to_bytes
from secagg.errors import RoundAborted, WrongContext
from secagg.protocols import make_protocol
from secagg.protocols.fedavg import sample_size_weights
from secagg.protocols.optimizers import SGD
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.server.audit import AuditLog
from secagg.server.engine import Server
from secagg.server.plan import RunPolicy, TrainingPlan
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope
from tests.conftest import backend_client

GS = {
    f"client_{k}": (np.linspace(-0.2, 0.3, 6) * (k + 1) - 0.01 * k, 10.0 * (k + 2))
    for k in range(4)
}


def run_one_round(backend, streaming, handlers=None, server_backend=None, protocol="fedavg"):
    if server_backend is None:
        server_backend, backends = make_backends(backend, list(GS))
        handlers = {c: backend_client(c, backends[c], g, n) for c, (g, n) in GS.items()}
    audit = AuditLog()
    server = Server(
        make_protocol(protocol),
        server_backend,
        SGD(6),
        InProcessTransport(handlers),
        np.zeros(6),
        plan=TrainingPlan(local_steps=1),
        audit=audit,
        policy=RunPolicy(streaming=streaming),
    )
    server.setup(rounds=1)
    report = server.run_round(0)
    return server, report, audit


@pytest.mark.parametrize("protocol", ["fedavg", "fedadam"])
def test_streamed_round_is_bit_for_bit_the_buffered_round_on_plain(protocol):
    streamed, _, audit = run_one_round("plain", True, protocol=protocol)
    buffered, _, _ = run_one_round("plain", False, protocol=protocol)
    assert streamed.streaming and not buffered.streaming
    assert np.array_equal(streamed.params, buffered.params)
    assert [
        r["peer"]
        for r in audit.records
        if r.get("phase") == "enroll" and r["direction"] == "received"
    ] == list(GS)  # every client enrolled once


def test_streamed_round_matches_the_buffered_round_on_ckks():
    streamed, _, _ = run_one_round("ckks", True)
    buffered, _, _ = run_one_round("ckks", False)
    w = sample_size_weights({c: n for c, (_, n) in GS.items()})
    exact = sum(w[c] * g for c, (g, _) in GS.items())
    np.testing.assert_allclose(streamed.params, exact, atol=1e-5)
    np.testing.assert_allclose(streamed.params, buffered.params, atol=1e-5)


def client_3_fails_in_training(backends) -> dict:
    """Each client's handler; client_3 raises in training (and answers everything else)."""
    handlers = {c: backend_client(c, backends[c], g, n) for c, (g, n) in GS.items()}

    def fails_in_training(data):
        if Envelope.from_bytes(data).phase == "train":
            raise RuntimeError("out of memory")
        return backend_client("client_3", backends["client_3"], *GS["client_3"])(data)

    handlers["client_3"] = fails_in_training
    return handlers


@pytest.mark.parametrize("backend", ["plain", "ckks", "threshold"])
def test_a_dropped_client_is_renormalised_away(backend):
    """With per-round participation (on the encrypted backends; fixed, their default,
    skips the round: ``test_a_dropped_client_pauses_a_fixed_run``). (On threshold the client
    that failed its training still gives its share; with t = 2 of 4 the three left hide
    each honest upload among two whoever of t − 1 = 1 colludes.)"""
    options = {"threshold_t": 2} if backend == "threshold" else {}
    if backend != "plain":
        options["participation"] = "per-round"
    server_backend, backends = make_backends(backend, list(GS), **options)
    handlers = client_3_fails_in_training(backends)
    server, report, _ = run_one_round(backend, True, handlers, server_backend)
    assert list(report.excluded) == ["client_3"]
    survivors = {c: GS[c] for c in GS if c != "client_3"}
    w = sample_size_weights({c: n for c, (_, n) in survivors.items()})
    np.testing.assert_allclose(
        server.params,
        sum(w[c] * g for c, (g, _) in survivors.items()),
        atol=1e-12 if backend == "plain" else 1e-5,
    )


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_a_dropped_client_pauses_a_fixed_run(backend):
    """Fixed participation (the default): the round without client_3 is skipped before any
    client is asked to consent, and says why; the model stays where it was."""
    options = {"threshold_t": 2} if backend == "threshold" else {}
    server_backend, backends = make_backends(backend, list(GS), **options)
    handlers = client_3_fails_in_training(backends)
    server, report, _ = run_one_round(backend, True, handlers, server_backend)
    assert list(report.excluded) == ["client_3"]
    assert report.skipped is not None and "participation is fixed" in report.skipped
    np.testing.assert_array_equal(server.params, 0.0)
    assert all(c.decryptions == 0 for c in backends.values())


@pytest.mark.parametrize("gone", [["client_3"], ["client_2", "client_3"]])
def test_on_threshold_holders_gone_after_uploading_leave_the_round_to_t_of_n(gone):
    """Four holders, t = 3: one gone after its upload leaves three, whose shares open the sum
    (its upload included); two gone stop the round with a typed error naming them (no hang,
    no model made of too few shares)."""
    server_backend, backends = make_backends("threshold", list(GS))
    handlers = {c: backend_client(c, backends[c], g, n) for c, (g, n) in GS.items()}
    for c in gone:
        alive = handlers[c]

        def gone_after_training(data, alive=alive, c=c):
            if Envelope.from_bytes(data).phase in ("enroll", "train", "consent"):
                return alive(data)
            raise ConnectionError(f"{c} is offline")

        handlers[c] = gone_after_training
    if len(gone) == 2:
        with pytest.raises(RoundAborted, match="2 of 4 holders answered and t = 3"):
            run_one_round("threshold", True, handlers, server_backend)
        return
    server, _, _ = run_one_round("threshold", True, handlers, server_backend)
    w = sample_size_weights({c: n for c, (_, n) in GS.items()})
    np.testing.assert_allclose(server.params, sum(w[c] * g for c, (g, _) in GS.items()), atol=1e-5)


def test_an_upload_whose_count_differs_from_its_enrolment_is_excluded():
    server_backend, backends = make_backends("plain", list(GS))
    handlers = {c: backend_client(c, backends[c], g, n) for c, (g, n) in GS.items()}
    handlers["client_1"] = backend_client(
        "client_1", backends["client_1"], GS["client_1"][0], GS["client_1"][1], train_n=1000.0
    )
    server, report, audit = run_one_round("plain", True, handlers, server_backend)
    assert list(report.excluded) == ["client_1"]
    assert "enrolled with 30 samples but reports 1000" in report.excluded["client_1"]


class CountingPlainServer(PlainServer):
    """Records, at every upload it loads, how many earlier uploads are still alive."""

    def __init__(self):
        self.alive_at_load: list[int] = []
        self._refs: list[weakref.ref] = []

    def load(self, envelope, name, length):
        gc.collect()
        self.alive_at_load.append(sum(r() is not None for r in self._refs))
        handle = super().load(envelope, name, length)
        self._refs.append(weakref.ref(handle))
        return handle


@pytest.mark.parametrize("streaming, most_alive", [(True, 0), (False, len(GS) - 1)])
def test_the_streaming_server_holds_one_upload_at_a_time(streaming, most_alive):
    _, backends = make_backends("plain", list(GS))
    handlers = {c: backend_client(c, backends[c], g, n) for c, (g, n) in GS.items()}
    counting = CountingPlainServer()
    run_one_round("plain", streaming, handlers, counting)
    assert max(counting.alive_at_load) == most_alive


def test_clients_refuse_an_aggregate_scale_outside_the_preset_range():
    preset = get_preset("compact")
    keys, server = SecretKeyHolder(preset), PublicCKKS(preset)
    up = server.load_ciphertexts(keys.encrypt(np.full(8, 0.1), 1.0), 8)
    total = server.weighted_sum([up], [0.5])
    assert np.allclose(keys.decrypt([to_bytes(c) for c in total], 8), 0.05, atol=1e-6)
    total[0].scale = server.sum_scale * 4
    with pytest.raises(WrongContext, match="aggregate"):
        keys.decrypt([to_bytes(c) for c in total], 8)


def test_a_client_that_fails_enrolment_is_excluded_then_and_from_the_sum():
    server_backend, backends = make_backends("plain", list(GS))
    handlers = {c: backend_client(c, backends[c], g, n) for c, (g, n) in GS.items()}
    honest = handlers["client_2"]

    def zero_at_enrolment(data):
        if Envelope.from_bytes(data).phase == "enroll":
            return backend_client("client_2", backends["client_2"], GS["client_2"][0], 0.0)(data)
        return honest(data)

    handlers["client_2"] = zero_at_enrolment
    server = Server(
        make_protocol("fedavg"),
        server_backend,
        SGD(6),
        InProcessTransport(handlers),
        np.zeros(6),
        plan=TrainingPlan(local_steps=1),
    )
    excluded = server.setup(rounds=1)
    assert "reports 0.0 samples" in excluded["client_2"]
    # it holds no planned weight, so it leaves the run: it is not asked to train
    assert "client_2" not in server.peers() and "client_2" in server.left
    report = server.run_round(0)
    assert "client_2" not in report.clients
    others = {c: GS[c] for c in GS if c != "client_2"}
    w = sample_size_weights({c: n for c, (_, n) in others.items()})
    np.testing.assert_allclose(server.params, sum(w[c] * g for c, (g, _) in others.items()))


@pytest.mark.parametrize("path", ["auto", "off"])
def test_running_sums_refuse_what_they_cannot_add(path):
    """On either server path (uploads read natively, or through SEAL's loader)."""
    from dataclasses import replace

    from secagg.ckks import native
    from secagg.errors import ConfigError, DuplicateMessage, MalformedCiphertext
    from secagg.server.exchange import Exchange
    from secagg.server.round import RoundContext

    server_backend, backends = make_backends("ckks", ["client_0"])
    ctx = RoundContext(
        Exchange(0, ["client_0"], InProcessTransport({}), AuditLog()), 5, server_backend, None
    )
    total = ctx.running_sum({"client_0": 1.0})
    keys = SecretKeyHolder(get_preset("compact"))

    def upload(n=5):
        field = wire.ciphertext(keys.encrypt(np.full(n, 0.1), 1.0))
        with native.chosen(path):
            return server_backend.load(
                Envelope("client_0", "server", 0, "train", {"g": field}), "g", n
            )

    total.add("client_0", upload())
    with pytest.raises(DuplicateMessage):
        total.add("client_0", upload())
    fresh = upload()
    aggregate = replace(fresh, scale=server_backend.public.sum_scale)
    with pytest.raises(MalformedCiphertext, match="fresh uploads"):
        server_backend.running_sum(5).add(aggregate, 0.5)
    with pytest.raises(MalformedCiphertext, match="fresh uploads"):
        server_backend.running_sum(5).add(upload(5000), 0.5)  # another length
    one = server_backend.running_sum(5)
    with native.chosen(path):
        one.add(upload(), 0.5)
        with pytest.raises(ConfigError, match="normaliser"):
            one.result(1.5)
        with pytest.raises(ConfigError, match="rounds to zero"):
            server_backend.running_sum(5).result()
    if path == "off":  # SEAL's running sum itself refuses another chunk count
        two_chunks = upload(5000)
        ciphertext_sum = server_backend.running_sum(5)._sum
        ciphertext_sum.add(upload().ciphertexts, 0.5)
        with pytest.raises(MalformedCiphertext, match="chunks"):
            ciphertext_sum.add(two_chunks.ciphertexts, 0.5)


def test_a_dropout_that_leaves_too_few_to_hide_an_upload_skips_the_round_on_threshold():
    """At the default t = 3 of 4, the three uploads left after a dropout cannot hide each
    honest one among two others whoever of t − 1 = 2 colludes: the round makes no update,
    says why, and blames nobody (the run goes on)."""
    # per-round participation: fixed would skip the round for the dropout itself
    server_backend, backends = make_backends("threshold", list(GS), participation="per-round")
    handlers = client_3_fails_in_training(backends)
    server, report, _ = run_one_round("threshold", True, handlers, server_backend)
    assert report.skipped is not None and "opens sums of at least 4" in report.skipped
    assert np.array_equal(server.params, np.zeros_like(server.params))
