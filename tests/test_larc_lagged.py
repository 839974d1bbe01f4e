"""larc-lagged: LARC whose probe sum Ĝ is the global update, its weights fixed a round ahead.

Its weights are known before the uploads, so the server folds them as they arrive (on the
FedAvg family's client-weighted presets too); each client checks that the weight the probe
names for it is the one the sum lists before it opens Ĝ, and a server that names another is
refused; a client that drops out is missing from Ĝ, not renormalised away.
"""

import numpy as np
import pytest

import secagg
from secagg import wire
from secagg.backends import make_backends
from secagg.errors import ProtocolStateError, ReleaseRefused
from secagg.protocols import make_protocol
from secagg.protocols.larc import lagged_weights, larc_weights
from secagg.protocols.optimizers import SGD
from secagg.server.audit import AuditLog
from secagg.server.engine import Server
from secagg.server.plan import RunPolicy, TrainingPlan
from secagg.server.round import RoundContext
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope
from tests.conftest import backend_client

GS = {
    f"client_{k}": (np.linspace(-0.2, 0.3, 6) * (k + 1) - 0.01 * k, 10.0 * (k + 2))
    for k in range(4)
}
#: the scripted clients' ΔL: a loss change of their own that differs between them
DELTA_LOSS = {c: 0.01 * k for k, c in enumerate(GS)}


def lagged_client(cid, backend, opened, fails_training=False):
    """A client with a real backend half that answers the probe with its ΔL after checking
    the weight the probe names for it and opening Ĝ (``opened[cid]``: that weight and Ĝ)."""
    g, n = GS[cid]

    def probe(req: Envelope) -> dict:
        alpha = req.scalar("alpha")
        backend.check_own_weight(req, "g_hat", alpha)
        opened[cid] = (alpha, backend.open(req, "g_hat", g.size))
        return {"delta_loss": wire.scalar(DELTA_LOSS[cid])}

    def out_of_memory(req: Envelope) -> dict:
        raise RuntimeError("out of memory")

    phases = {"larc_probe": probe, **({"train": out_of_memory} if fails_training else {})}
    return backend_client(cid, backend, g, n, phases=phases)


def lagged_server(backend, rounds=2, failing=(), **options):
    server_backend, backends = make_backends(backend, list(GS), **options)
    opened: dict = {}
    handlers = {c: lagged_client(c, backends[c], opened, fails_training=c in failing) for c in GS}
    server = Server(
        make_protocol("larc-lagged"),
        server_backend,
        SGD(6),
        InProcessTransport(handlers),
        np.zeros(6),
        plan=TrainingPlan(local_steps=1),
        audit=AuditLog(),
        policy=RunPolicy(streaming=True),
    )
    server.setup(rounds=rounds)
    return server, opened


def test_lagged_weights_sum_to_one_and_refuse_a_sum_that_is_not_positive():
    assert lagged_weights({"a": 1.0, "b": 1 / 3}) == pytest.approx({"a": 0.75, "b": 0.25})
    with pytest.raises(ProtocolStateError, match="positive sum"):
        lagged_weights({"a": 0.0})


@pytest.mark.parametrize(
    "backend, options, atol",
    [
        ("plain", {}, 1e-12),
        # the clients weight, the server only adds: lean's flooding leaves about 1e-5 here
        ("ckks", {"preset": "lean"}, 1e-4),
        ("ckks", {"preset": "compact"}, 1e-5),  # the server weights
        ("threshold", {"threshold_t": 2}, 1e-4),
    ],
)
def test_each_round_releases_g_hat_weighted_by_the_last_rounds_alpha(backend, options, atol):
    server, opened = lagged_server(backend, **options)
    assert server.streaming  # its weights are planned: the server folds the uploads
    first = server.run_round(0)
    assert not first.excluded
    uniform = sum(g for g, _ in GS.values()) / len(GS)  # α^{-1} = 1 for every client
    np.testing.assert_allclose(server.params, uniform, atol=atol)
    for c in GS:  # each probe named the weight the sum lists, and opened Ĝ itself
        assert opened[c][0] == pytest.approx(0.25)
        np.testing.assert_allclose(opened[c][1], uniform, atol=atol)
    before = server.params.copy()
    server.run_round(1)
    alpha = larc_weights(np.array([DELTA_LOSS[c] for c in GS]))
    planned = lagged_weights(dict(zip(GS, alpha.tolist())))
    g_hat = sum(planned[c] * GS[c][0] for c in GS)
    np.testing.assert_allclose(server.params - before, g_hat, atol=atol)
    assert [opened[c][0] for c in GS] == pytest.approx([planned[c] for c in GS], abs=1e-4)


@pytest.mark.parametrize("backend", ["plain", "ckks", "ckks fixed"])
def test_a_client_that_drops_out_is_missing_from_g_hat_not_renormalised_away(backend):
    """Per-round participation: the three that came keep their planned weights. Fixed
    participation (the default on ckks): the round is skipped, nothing opened, the model
    where it was (the run's one contributor set is not complete)."""
    options = {"preset": "lean", "participation": "per-round"} if backend == "ckks" else {}
    if backend == "ckks fixed":
        options, backend = {"preset": "lean"}, "ckks"
        server, opened = lagged_server(backend, rounds=1, failing=("client_3",), **options)
        report = server.run_round(0)
        assert report.skipped is not None and "participation is fixed" in report.skipped
        np.testing.assert_array_equal(server.params, 0.0)
        assert opened == {}
        return
    server, opened = lagged_server(backend, rounds=1, failing=("client_3",), **options)
    report = server.run_round(0)
    assert list(report.excluded) == ["client_3"]
    # the weights were planned over four: the three that came keep 1/4 each (Σ = 3/4)
    expected = sum(GS[c][0] for c in GS if c != "client_3") / 4
    np.testing.assert_allclose(server.params, expected, atol=1e-12 if backend == "plain" else 1e-4)
    assert sorted(opened) == ["client_0", "client_1", "client_2"]


def test_a_server_that_names_another_weight_in_the_probe_is_refused(monkeypatch):
    """A server could otherwise have a client evaluate its loss at any multiple of its own
    update: every client checks the probe's α against the weight the signed sum lists (the
    weight it applied itself on lean), refuses, and no ΔL reaches the server."""
    weights_of = RoundContext.weights_of
    monkeypatch.setattr(
        RoundContext,
        "weights_of",
        lambda self, handle: {c: 2 * w for c, w in weights_of(self, handle).items()},
    )
    result = secagg.run(protocol="larc-lagged", backend="ckks", rounds=1, local_steps=2)
    assert result.aborted
    records = result.audit.records
    refused = {
        r["peer"]
        for r in records
        if r["event"] == "excluded"
        and r["phase"] == "larc_probe"
        and r["reason"].endswith("refused 'larc_probe': release_refused")
    }
    assert len(refused) == 6
    assert not [
        r
        for r in records
        if r["event"] == "message"
        and r["direction"] == "received"
        and any(f["name"] == "delta_loss" for f in r["fields"])
    ]


def test_a_wrong_weight_is_refused_by_the_clients_own_check_on_lean():
    """The check itself, on a client-weighted preset (the unit of an applied weight, not the
    server's weight bits): the listed weight passes, one unit off does not."""
    server, opened = lagged_server("ckks", rounds=1, preset="lean")
    server.run_round(0)
    assert opened  # the honest probe passed every client's check
    backend = make_backends("ckks", list(GS), preset="lean")[1]["client_0"]
    unit = backend.preset.max_weight
    descriptor = {
        "basis": "",
        "kind": "open",
        "name": "g_hat",
        "round": 0,
        "n_values": 6,
        "chunks": 1,
        "entries": [["client_0", unit // 4, "d0"], ["client_1", unit // 4, "d1"]],
    }
    env = Envelope(
        "server",
        "client_0",
        0,
        "larc_probe",
        {
            "g_hat.release": wire.config({"descriptor": descriptor}),
        },
    )
    backend.check_own_weight(env, "g_hat", 0.25)
    with pytest.raises(ReleaseRefused, match="not the one the release"):
        backend.check_own_weight(env, "g_hat", 0.25 + 1 / unit)


def test_larc_lagged_on_every_backend_gives_the_plain_model():
    settings = dict(protocol="larc-lagged", rounds=3, seeds=[1], local_steps=5)
    plain = secagg.run(backend="plain", **settings)
    for backend, tolerance in (("ckks", 5e-4), ("threshold", 5e-4)):  # server Adam amplifies
        result = secagg.run(backend=backend, **settings)
        assert not result.aborted
        assert np.abs(plain.final_params[1] - result.final_params[1]).max() < tolerance
        summary = result.audit_summary
        assert not summary["individual_updates_revealed"]
        assert summary["undeclared_plaintext_items"] == []


def test_client_level_dp_accounts_the_two_releases_of_one_sum_as_one(tmp_path):
    """Ĝ is opened for the probe and revealed for the update: both are recorded, and their
    joint accounting is that of one release (the same weights release nothing more)."""
    import json

    from secagg.runspec.config import ExperimentConfig

    config = ExperimentConfig(
        protocol="larc-lagged",
        backend="ckks",
        rounds=2,
        seeds=[1],
        local_steps=2,
        client_dp={"clip": 1.0, "noise": 1.0},
        dp_noise="seeded",
    )
    secagg.run(config, out=tmp_path)
    events = json.loads((tmp_path / "run.json").read_text())["finished"]["1"]["privacy_events"]
    assert len(events) == 2
    for event in events:
        assert event["release"] == "g_hat+global_update"
        first, second = event["per_release_multipliers"]
        assert first == second
        assert event["sums_multiplier"] == pytest.approx(first, rel=1e-12)
