"""Auto-FedRL as a protocol: its arithmetic by hand, the engine's validate phase, FedProx."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from secagg.clients.tasks import ClientData, get_task
from secagg.clients.training import LocalTrainer, flat_params
from secagg.errors import ConfigError
from secagg.protocols.autofedrl import AutoFedRL, parse_range, searched_weights
from secagg.protocols.pieces import ValidationFeedback, piece
from secagg.simulation.experiment import ExperimentConfig, hold_out_validation, run_experiment


class FakeRound:
    """Just enough of RoundAPI for the protocol's own arithmetic."""

    def __init__(self, clients, rnd=0):
        self.active, self.round = list(clients), rnd

    def weighted_sum(self, handles, weights):
        return sum(weights[c] * handles[c] for c in handles)


def test_searched_weights_by_hand():
    # n = (1, 3), aw = (ln 3, 0): n·exp(aw) = (3, 3) -> equal weights
    w = searched_weights({"a": 1.0, "b": 3.0}, {"a": math.log(3.0), "b": 0.0})
    assert w == pytest.approx({"a": 0.5, "b": 0.5})
    # equal aw: FedAvg's sample-size weights
    assert searched_weights({"a": 1.0, "b": 3.0}, {"a": 0.7, "b": 0.7}) == pytest.approx(
        {"a": 0.25, "b": 0.75}
    )


def test_one_round_of_the_protocol_by_hand():
    proto = AutoFedRL(agent="cs")
    proto.seed(3)
    clients = ["c0", "c1"]
    proto.observe_validation(FakeRound(clients), {"c0": 2.0, "c1": 2.0})  # L^0 = 2
    server_lr = proto.begin_round(FakeRound(clients))
    plan = proto.plan
    assert set(plan) == {"client_lr", "local_steps", "aw_c0", "aw_c1", "server_lr"}
    assert server_lr == plan["server_lr"] and 0.5 <= server_lr <= 1.5
    assert 5e-4 <= plan["client_lr"] <= 5e-2 and plan["local_steps"] == int(plan["local_steps"])
    settings = proto.train_settings(FakeRound(clients), "c0", {"lr": 0.1, "epochs": 3})
    assert settings == {"lr": plan["client_lr"], "steps": int(plan["local_steps"])}

    from secagg.protocols.base import Upload

    uploads = {"c0": Upload(np.array([1.0, 0.0]), 10.0), "c1": Upload(np.array([0.0, 1.0]), 30.0)}
    g = proto.aggregate(FakeRound(clients), uploads)
    e0, e1 = 10 * math.exp(plan["aw_c0"]), 30 * math.exp(plan["aw_c1"])
    np.testing.assert_allclose(g, [e0 / (e0 + e1), e1 / (e0 + e1)])

    mu_before = proto.agent.mu.copy()
    proto.observe_validation(FakeRound(clients, 0), {"c0": 1.0, "c1": 2.0})  # L^1 = 1.5
    assert proto.trajectory[-1]["reward"] == pytest.approx((2.0 - 1.5) / 2.0)
    assert proto.trajectory[-1]["val_loss"] == pytest.approx(1.5)
    # a window of one reward has baseline = that reward: no update on the first step
    np.testing.assert_allclose(proto.agent.mu, mu_before)


def test_searching_a_subset_leaves_the_rest_to_the_run():
    proto = AutoFedRL(search="server_lr")
    proto.observe_validation(FakeRound(["a"]), {"a": 1.0})
    proto.begin_round(FakeRound(["a"]))
    assert proto.train_settings(FakeRound(["a"]), "a", {"lr": 0.1, "steps": 5}) == {
        "lr": 0.1,
        "steps": 5,
    }


@pytest.mark.parametrize(
    "options, match",
    [
        ({"agent": "ppo"}, "agent"),
        ({"search": "momentum"}, "search"),
        ({"client_lr_range": "0.1"}, "low:high"),
        ({"server_lr_range": "2:1"}, "low < high"),
        ({"grid_points": 1}, "grid_points"),
        ({"init_sigma": 0.0}, "init_sigma"),
        ({"local_steps_range": "0:10"}, "at least 1"),
    ],
)
def test_bad_options_are_config_errors(options, match):
    with pytest.raises(ConfigError, match=match):
        AutoFedRL(**options)


def test_parse_range():
    assert parse_range("5e-4:5e-2", "x") == (5e-4, 5e-2)


def test_a_non_positive_mean_loss_gives_zero_reward_not_a_crash():
    # noised (scalar DP) validation losses can be negative
    proto = AutoFedRL()
    proto.observe_validation(FakeRound(["a"]), {"a": -0.2})
    proto.begin_round(FakeRound(["a"]))
    proto.observe_validation(FakeRound(["a"]), {"a": 0.5})
    assert proto.trajectory[-1]["reward"] == 0.0


SMALL = ExperimentConfig(
    task="digits-dir8",
    protocol="autofedrl",
    rounds=3,
    seeds=[0],
    local_steps=3,
    batch_size=32,
    validation_split=0.2,
)


def test_autofedrl_needs_validation_samples():
    with pytest.raises(ConfigError, match="--validation-split"):
        run_experiment(replace(SMALL, validation_split=None))


@pytest.mark.parametrize(
    "options", [{"agent": "cs"}, {"agent": "ds", "grid_points": 2}, {"agent": "mlp"}]
)
def test_a_run_validates_every_round_and_sends_the_model_once_per_round(options):
    result = run_experiment(replace(SMALL, protocol_options=options))
    records = [r for r in result.audit.records if r["event"] == "message"]
    validate = [r for r in records if r["phase"] == "validate" and r["direction"] == "received"]
    assert len(validate) == 8 * (SMALL.rounds + 1)  # before round 0 and after each round
    # the model travels in the validate requests; training requests then omit it
    model_sends = [
        r
        for r in records
        if r["direction"] == "sent" and any(f["name"] == "model" for f in r["fields"])
    ]
    assert {r["phase"] for r in model_sends} == {"validate"}
    assert len(model_sends) == 8 * (SMALL.rounds + 1)
    m = result.metrics[result.metrics["round"] > 0]
    assert m["client_lr"].between(5e-4, 5e-2).all()
    assert m["local_steps"].between(2, 40).all() and m["server_lr"].between(0.5, 1.5).all()
    assert np.isfinite(m["reward"]).all()


def test_hold_out_validation_is_a_fixed_disjoint_split():
    data = get_task("digits-dir8").load()
    train, val = hold_out_validation(data, 0.2)
    again, val_again = hold_out_validation(data, 0.2)
    for full, tr, va, va2 in zip(data.train, train.train, val, val_again):
        assert len(tr) + len(va) == len(full)
        assert abs(len(va) - 0.2 * len(full)) <= 1
        assert torch.equal(va.x, va2.x)
        rows = {tuple(r) for r in tr.x.numpy().round(4).tolist()}
        # digits has a few duplicate images; nearly all validation rows are unseen
        assert sum(tuple(r) in rows for r in va.x.numpy().round(4).tolist()) <= 1


def _trainer(seed=0):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    g = torch.Generator().manual_seed(1)
    data = ClientData(torch.randn(12, 3, generator=g), torch.randn(12, 1, generator=g))
    return LocalTrainer(model, data, torch.nn.functional.mse_loss, batch_size=4, seed=seed)


def test_fedprox_adds_mu_times_the_drift_to_every_step():
    """Step 1 starts at w (no proximal pull); step 2 differs from plain SGD by exactly
    −lr·μ·(θ1 − w), with θ1 − w the one-step pseudo-gradient."""
    w = np.zeros(4)
    lr, mu = 0.1, 0.5
    one_step = _trainer().train(w, lr=lr, steps=1)
    plain = _trainer().train(w, lr=lr, steps=2)
    prox = _trainer().train(w, lr=lr, steps=2, prox_mu=mu)
    np.testing.assert_allclose(prox - plain, -lr * mu * one_step, rtol=1e-5, atol=1e-7)


def test_fedprox_option_reaches_the_clients():
    base = ExperimentConfig(
        task="digits-dir8", rounds=2, seeds=[0], local_steps=10, batch_size=32, client_lr="0.5"
    )
    plain = run_experiment(base)
    prox = run_experiment(replace(base, fedprox_mu=5.0))
    assert not np.allclose(plain.final_params[0], prox.final_params[0])
    with pytest.raises(ConfigError, match="fedprox_mu"):
        run_experiment(replace(base, fedprox_mu=-1.0))


@pytest.mark.parametrize("share", [0.0, 1.0, 1.5])
def test_validation_split_outside_zero_one_is_a_config_error(share):
    with pytest.raises(ConfigError, match="validation_split"):
        replace(SMALL, validation_split=share).validate()


def test_a_split_that_leaves_a_client_nothing_to_train_on_is_refused():
    data = get_task("digits-dir8").load()
    tiny = replace(data, train=[ClientData(p.x[:1], p.y[:1]) for p in data.train])
    with pytest.raises(ConfigError, match="nothing to train on"):
        hold_out_validation(tiny, 0.2)


def test_a_client_without_validation_samples_is_excluded_with_the_reason():
    from secagg.backends import make_backends
    from secagg.clients.policy import ENGINE_PHASES, ClientPolicy
    from secagg.clients.runtime import Client
    from secagg.protocols.optimizers import SGD, StepSchedule
    from secagg.server.audit import AuditLog
    from secagg.server.engine import Server
    from secagg.server.plan import TrainingPlan
    from secagg.server.transport import InProcessTransport

    data = get_task("digits-dir8").load()
    task = get_task("digits-dir8")
    ids = ["c0", "c1"]
    _, backends = make_backends("plain", ids)
    server_backend, _ = make_backends("plain", ids)
    clients = {
        cid: Client(
            cid,
            LocalTrainer(task.make_model(), data.train[k], task.loss, 32, seed=k),
            backends[cid],
            policy=ClientPolicy(
                phases=frozenset(ENGINE_PHASES),
                plan=TrainingPlan(client_lr=StepSchedule.parse("0.1"), local_steps=2),
                varies=AutoFedRL().varied_settings(),
                scalar_budget=4,
                max_validations=2,
            ),
            validation=data.train[k] if cid == "c0" else None,
        )
        for k, cid in enumerate(ids)
    }
    w = flat_params(task.make_model())
    server = Server(
        AutoFedRL(),
        server_backend,
        SGD(dim=w.size, lr=1.0),
        InProcessTransport({c: cl.handle for c, cl in clients.items()}),
        w,
        plan=TrainingPlan(client_lr=StepSchedule.parse("0.1"), local_steps=2),
        audit=AuditLog(),
    )
    report = server.run_round(0)
    # the server gets a fixed code; the reason stays in the client's own log
    assert "c1" in report.excluded and "out_of_order" in report.excluded["c1"]
    assert "no validation samples" in clients["c1"].refusals[-1][2]
    assert report.clients == ["c0"]


def test_autofedrl_as_rolepro_second_phase_runs_its_agent():
    """Delegation: as RoLePRO's second phase Auto-FedRL draws the clients' learning rate,
    gets the validation phase it needs, and is rewarded; the FedAvg phase keeps the run's."""
    from secagg import wire
    from secagg.backends import make_backends
    from secagg.protocols import make_protocol
    from secagg.protocols.optimizers import SGD, StepSchedule
    from secagg.server.engine import Server
    from secagg.server.plan import TrainingPlan
    from secagg.server.transport import InProcessTransport
    from secagg.wire import Envelope

    seen: dict[int, list[float]] = {}
    phases: list[tuple[int, str]] = []

    def client(cid, g, loss):
        def handle(data):
            req = Envelope.from_bytes(data)
            phases.append((req.round, req.phase))
            if req.phase == "enroll":
                fields = {"n_samples": wire.scalar(10)}
            elif req.phase == "validate":
                fields = {"val_loss": wire.scalar(loss / (1 + req.round))}
            else:
                seen.setdefault(req.round, []).append(req.config("train")["lr"])
                fields = {"pseudo_gradient": wire.vector(g), "n_samples": wire.scalar(10)}
            return Envelope(cid, "server", req.round, req.phase, fields).to_bytes()

        return handle

    protocol = make_protocol("rolepro", then="autofedrl", switch_round=1, search="client_lr")
    assert piece(protocol, ValidationFeedback) is not None and protocol.capabilities.streams
    server = Server(
        protocol,
        make_backends("plain", ["a", "b"])[0],
        SGD(2),
        InProcessTransport({"a": client("a", np.ones(2), 2.0), "b": client("b", np.zeros(2), 1.0)}),
        np.zeros(2),
        plan=TrainingPlan(client_lr=StepSchedule.parse("0.1"), local_steps=1),
    )
    server.setup(rounds=2)
    for number in range(2):
        server.run_round(number)
    assert seen[0] == [0.1, 0.1]  # FedAvg phase: the run's rate
    assert len(set(seen[1])) == 1 and 5e-4 <= seen[1][0] <= 5e-2  # drawn by the agent
    assert [p for p in phases if p[1] == "validate"] == [(0, "validate")] * 4 + [
        (1, "validate")
    ] * 2
    assert len(protocol.then.trajectory) == 1  # rewarded once, for its own round
    assert protocol.then.trajectory[0]["client_lr"] == seen[1][0]
