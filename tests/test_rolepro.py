"""RoLePRO aggregators: arithmetic on hand-computed cases, the two-phase RegAgg identity on
plain and ckks, the clients' loss ratios, and the two-phase protocol switch."""

from __future__ import annotations

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.errors import ConfigError
from secagg.protocols import make_client_half, make_protocol
from secagg.protocols.optimizers import SGD
from secagg.protocols.rolepro import (
    cost_weights,
    regagg,
    regagg_terms,
    regcost_weights,
    simagg,
    top_k_keep,
    trimmed_mean,
)
from secagg.server.engine import Server
from secagg.server.plan import TrainingPlan
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope

NU = np.array([0.5, 0.3, 0.2])
R = np.array([1.0, 2.0, 1.0])


def test_cost_weights_hand_computed():
    # α=0.5: 0.5·ν + 0.5·r/Σr with r/Σr = [0.25, 0.5, 0.25]
    np.testing.assert_allclose(cost_weights(NU, R, 0.5), [0.375, 0.4, 0.225])
    assert cost_weights(NU, R, 0.1).sum() == pytest.approx(1.0)


def test_regcost_weights_hand_computed():
    # r·ν = [0.5, 0.6, 0.2] / 1.3
    np.testing.assert_allclose(regcost_weights(NU, R), np.array([0.5, 0.6, 0.2]) / 1.3)


def test_top_k_drops_the_lowest_twenty_percent():
    scores = np.array([0.3, 0.1, 0.5, 0.2, 0.9, 0.4])  # floor(0.2·6) = 1 dropped
    assert top_k_keep(scores, 0.2).tolist() == [0, 2, 3, 4, 5]
    assert top_k_keep(scores[:4], 0.2).tolist() == [0, 1, 2, 3]  # floor(0.8) = 0


def test_regagg_hand_computed_one_coordinate():
    gs = np.array([[1.0], [2.0], [6.0]])  # mean 3: distances 2, 1, 3
    nu = np.array([1 / 3, 1 / 3, 1 / 3])
    u = np.array([1 / 2, 1 / 1, 1 / 3])  # τ = 0
    assert regagg(gs, nu, tau=1e-12)[0] == pytest.approx(np.sum(u * gs[:, 0]) / u.sum())


def test_regagg_favours_updates_near_the_mean():
    gs = np.array([[0.0], [0.1], [10.0]])
    assert abs(regagg(gs, np.ones(3) / 3)[0]) < abs(gs.mean())


def test_simagg_is_half_similarity_half_fedavg():
    gs = np.array([[1.0, -1.0], [2.0, 0.0], [6.0, 4.0]])
    inv = 1 / (np.abs(gs - gs.mean(0)) + 1e-5)
    u = inv / inv.sum(0)
    np.testing.assert_allclose(simagg(gs, NU), 0.5 * (u * gs).sum(0) + 0.5 * NU @ gs)


def test_trimmed_mean_drops_the_farthest_from_the_median():
    gs = np.array([[1.0], [2.0], [3.0], [4.0], [100.0]])  # floor(0.2·5) = 1 dropped: 100
    assert trimmed_mean(gs, 0.2)[0] == pytest.approx(2.5)


def test_scaled_terms_are_bounded_and_their_ratio_is_regagg():
    rng = np.random.default_rng(0)
    gs = rng.normal(0, 0.1, (4, 50))
    nu = np.array([0.1, 0.2, 0.3, 0.4])
    terms = [regagg_terms(g, gs.mean(0), v) for g, v in zip(gs, nu)]
    a = sum(t[0] for t in terms)
    b = sum(t[1] for t in terms)
    assert max(np.abs(t[1]).max() for t in terms) <= 1.0
    np.testing.assert_allclose(a / b, regagg(gs, nu), rtol=1e-12)


# ---- the two-phase identity through the round engine -------------------------------------------

GS = {
    "client_0": np.array([0.10, -0.20, 0.05, 0.00]),
    "client_1": np.array([0.12, 0.30, 0.04, 0.01]),
    "client_2": np.array([-0.50, -0.10, 0.06, 0.02]),
}
NS = {"client_0": 30.0, "client_1": 20.0, "client_2": 50.0}


def scripted(cid, backend):
    handlers = backend.handlers()
    g = GS[cid]

    def handle(data):
        req = Envelope.from_bytes(data)
        if req.phase in handlers:
            fields = handlers[req.phase](req)
        elif req.phase == "train":
            fields = {"pseudo_gradient": backend.protect(g), "n_samples": wire.scalar(NS[cid])}
        elif req.phase == "regagg_terms":
            centre = backend.open(req, "centre", g.size)
            a, b = regagg_terms(g, centre, 1.0, req.scalar("tau"))  # ν weighs the sums
            fields = {"numerator": backend.protect(a), "denominator": backend.protect(b)}
        return Envelope(cid, "server", req.round, req.phase, fields).to_bytes()

    return handle


@pytest.mark.parametrize("backend", ["plain", "ckks"])
@pytest.mark.parametrize("protocol", ["regagg", "simagg"])
def test_two_phase_result_equals_the_one_shot_formula(backend, protocol):
    # A and B hold τ-scaled entries (~1e-5 here): on compact the flooded reveal's ~1e-10
    # noise is ~1e-5 of them, so the identity is checked on the wide preset (Δ = 2^80)
    server_backend, backends = make_backends(
        backend, list(GS), **({"preset": "wide"} if backend == "ckks" else {})
    )
    server = Server(
        make_protocol(protocol),
        server_backend,
        SGD(4),
        InProcessTransport({c: scripted(c, backends[c]) for c in GS}),
        np.zeros(4),
        plan=TrainingPlan(local_steps=1),
    )
    server.setup(rounds=1)
    server.run_round(0)
    gs = np.stack(list(GS.values()))
    nu = np.array(list(NS.values())) / sum(NS.values())
    expected = regagg(gs, nu) if protocol == "regagg" else simagg(gs, nu)
    np.testing.assert_allclose(server.params, expected, rtol=1e-6)  # float32 on plain


def test_loss_ratios_reported_by_a_real_client():
    from secagg.backends.plain import PlainClient
    from secagg.clients.policy import ClientPolicy
    from secagg.clients.runtime import Client
    from secagg.clients.tasks import tcga_brca
    from secagg.clients.training import LocalTrainer
    from secagg.protocols.optimizers import StepSchedule

    trainer = LocalTrainer(
        tcga_brca.make_model(), tcga_brca.load().train[3], tcga_brca.cox_loss, 8, seed=0
    )
    policy = ClientPolicy(
        rounds=3,
        plan=TrainingPlan(client_lr=StepSchedule.parse("0.05"), local_steps=5),
        scalar_budget=3,
    )
    client = Client(
        "client_3", trainer, PlainClient(), policy=policy, protocol=make_client_half("costwagg")
    )
    w0 = np.zeros(40)

    def train(rnd, w, ratio):
        req = Envelope(
            "server",
            "client_3",
            rnd,
            "train",
            {
                "model": wire.vector(w.astype(np.float32)),
                "train": wire.config({"lr": 0.05, "steps": 5}),
                "loss_ratio": wire.config({"kind": ratio}),
            },
        )
        reply = Envelope.from_bytes(client.handle(req.to_bytes()))
        return reply.scalar("loss_ratio"), reply.vector("pseudo_gradient")

    r0, g0 = train(0, w0, "cost")  # first round: falls back to l(W) / l(W + G)
    assert r0 == pytest.approx(trainer.loss_at(w0) / trainer.loss_at(w0 + g0), rel=1e-5)
    w1 = w0 + 0.5 * g0
    r1, g1 = train(1, w1, "cost")  # l(w^c_0) / l(w^c_1)
    assert r1 == pytest.approx(trainer.loss_at(w0 + g0) / trainer.loss_at(w1 + g1), rel=1e-5)
    r2, g2 = train(2, w1, "round")
    assert r2 == pytest.approx(trainer.loss_at(w1) / trainer.loss_at(w1 + g2), rel=1e-5)


def test_two_phase_switches_aggregator():
    from tests.conftest import honest_client

    # five clients: the 20 % trimmed mean drops the farthest from the median per coordinate
    # (client_4), so it differs from the mean in both coordinates
    gs = {
        "client_0": (np.array([0.0, 1.0]), 10.0),
        "client_1": (np.array([0.1, 0.9]), 10.0),
        "client_2": (np.array([0.2, 1.1]), 10.0),
        "client_3": (np.array([0.3, 0.8]), 10.0),
        "client_4": (np.array([3.0, -2.0]), 10.0),
    }
    stacked = np.stack([g for g, _ in gs.values()])
    mean, trimmed = stacked.mean(axis=0), stacked[:4].mean(axis=0)
    assert np.all(np.abs(mean - trimmed) > 0.1)  # the wrong phase would show

    def run(switch_round):
        server = Server(
            make_protocol("rolepro", then="trimmedmean", switch_round=switch_round),
            make_backends("plain", list(gs))[0],
            SGD(2),
            InProcessTransport({c: honest_client(c, g, n) for c, (g, n) in gs.items()}),
            np.zeros(2),
            plan=TrainingPlan(local_steps=1),
        )
        steps = []
        for number in range(3):
            before = server.params.copy()
            server.run_round(number)
            steps.append(server.params - before)
        return steps

    for switch_round in (0, 1, 2, 3):
        steps = run(switch_round)
        for number, step in enumerate(steps):
            np.testing.assert_allclose(
                step,
                mean if number < switch_round else trimmed,
                err_msg=f"switch {switch_round}, round {number}",
            )


def _ratio_client(cid, g, ratio):
    def handle(data):
        req = Envelope.from_bytes(data)
        if req.phase == "enroll":
            return Envelope(
                cid, "server", req.round, req.phase, {"n_samples": wire.scalar(10)}
            ).to_bytes()
        fields = {"pseudo_gradient": wire.vector(g), "n_samples": wire.scalar(10)}
        if "loss_ratio" in req.fields:  # only when the round's protocol asks for it
            fields["loss_ratio"] = wire.scalar(ratio)
        return Envelope(cid, "server", req.round, req.phase, fields).to_bytes()

    return handle


@pytest.mark.parametrize(
    "protocol, options",
    [("regcostagg", {}), ("rolepro", {"then": "regcostagg", "switch_round": 0})],
)
def test_a_non_positive_loss_ratio_excludes_only_that_client(protocol, options):
    """Alone or as RoLePRO's second phase, RegCostAgg excludes a client reporting a ratio of
    −1: with it, the weights r ν / Σ r ν would be 1.2/−1.2 ... and the model would move by
    (1.2 − 9·1.0)/(1.2 + 0.9 − 1.0) = −7.09 instead of 1.2/2.1 = 0.571."""
    handlers = {
        "client_0": _ratio_client("client_0", np.ones(2), 1.2),
        "client_1": _ratio_client("client_1", np.zeros(2), 0.9),
        "client_bad": _ratio_client("client_bad", np.full(2, 9.0), -1.0),
    }
    server_backend, _ = make_backends("plain", list(handlers))
    server = Server(
        make_protocol(protocol, **options),
        server_backend,
        SGD(2),
        InProcessTransport(handlers),
        np.zeros(2),
        plan=TrainingPlan(local_steps=1),
    )
    server.setup(rounds=1)
    report = server.run_round(0)
    assert "loss ratio of -1.0" in report.excluded["client_bad"]
    np.testing.assert_allclose(server.params, 1.2 / (1.2 + 0.9))


def test_bad_rolepro_options():
    with pytest.raises(ConfigError):
        make_protocol("costwagg", alpha=2.0)
    with pytest.raises(ConfigError):
        make_protocol("rolepro", then="fedavg")
    with pytest.raises(ConfigError):
        make_protocol("regagg", tau=0.0)
    with pytest.raises(ConfigError):
        make_protocol("topkregcost", drop_fraction=1.0)
    with pytest.raises(ConfigError):
        make_protocol("trimmedmean", drop_fraction=-0.1)
    with pytest.raises(ConfigError):
        make_protocol("regmedagg", tau=-1.0)
