"""Error paths not covered elsewhere: each bad input gets its typed error and a clear message."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from secagg import wire
from secagg.backends import Provision, make_backends, resolve_options
from secagg.ckks.presets import get_preset
from secagg.errors import ConfigError, KeySetupError, RoundAborted, SecaggError
from secagg.protocols import make_client_half, make_protocol
from secagg.protocols.optimizers import SGD, make_optimizer, optimizer_fields
from secagg.runspec.settings import read_file
from secagg.secret.ckks_client import CKKSClient
from secagg.server.engine import Server
from secagg.server.plan import RunPolicy, TrainingPlan
from secagg.server.transport import InProcessTransport
from secagg.simulation.experiment import ExperimentConfig
from secagg.wire import Envelope


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"seeds": [1, 1]}, "seeds repeat"),
        ({"seeds": []}, "non-empty list"),
        ({"backend": "ckks", "backend_options": {"preset": "huge"}}, "must be one of"),
        ({"backend": "ckks", "backend_options": {"flooding_bits": -1}}, "flooding_bits"),
        ({"backend": "ckks", "backend_options": {"flooding_bits": 20}}, "design's floor"),
        ({"backend": "ckks", "backend_options": {"min_contributors": 0}}, "min_contributors"),
        ({"backend": "ckks", "backend_options": {"min_weight_share": 1.5}}, "min_weight_share"),
        ({"client_split_count": 10}, "client_split_count needs client_split"),
        ({"task": "mnist"}, "unknown task"),
        ({"protocol": "fedsgd"}, "unknown protocol"),
        ({"backend": "paillier"}, "unknown backend"),
        (
            {"protocol": "larc", "protocol_options": {"q": 19, "temperature": 2}},
            "has no setting .temperature.",
        ),
        ({"backend_options": {"preset": "wide"}}, "backend 'plain' has no option"),
        ({"backend": "ckks", "backend_options": {"flooding_bits": "30"}}, "must be of type int"),
        ({"dp_noise": "urandom"}, "dp_noise must be 'seeded' or 'os'"),
        (
            {"protocol": "feddisco", "backend": "ckks", "server_blind": True},
            "pre-trains a model",
        ),
        ({"server_lr_schedule": "0.1@0,0.2@0"}, "server-lr schedule"),
    ],
)
def test_invalid_experiment_configs(changes, message):
    with pytest.raises(ConfigError, match=message):
        replace(ExperimentConfig(), **changes).validate()


def test_invalid_toml_is_reported(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(SecaggError, match="not valid TOML"):
        read_file(bad)


def test_unknown_preset_name():
    with pytest.raises(ConfigError, match="unknown CKKS preset"):
        get_preset("huge")


def test_a_client_on_other_parameters_is_excluded_at_key_setup():
    ids = ["client_0", "client_1", "client_odd"]
    server_backend, backends = make_backends("ckks", ids)
    backends["client_odd"] = CKKSClient(
        "client_odd", get_preset("wide"), Provision(), resolve_options("ckks", {"preset": "wide"})
    )

    def handler(cid):
        handlers = backends[cid].handlers()

        def handle(data):
            req = Envelope.from_bytes(data)
            return Envelope(
                cid, "server", req.round, req.phase, handlers[req.phase](req)
            ).to_bytes()

        return handle

    server = Server(
        make_protocol("fedavg"),
        server_backend,
        SGD(3),
        InProcessTransport({c: handler(c) for c in ids}),
        np.zeros(3),
        # key setup only
        plan=TrainingPlan(local_steps=1),
        policy=RunPolicy(streaming=False),
    )
    excluded = server.setup(rounds=1)
    assert list(excluded) == ["client_odd"] and "KeySetupError" in excluded["client_odd"]
    assert "wide" in excluded["client_odd"]


def test_key_setup_fails_clearly_when_no_client_answers():
    server_backend, _ = make_backends("ckks", ["client_0"])
    server = Server(
        make_protocol("fedavg"),
        server_backend,
        SGD(3),
        InProcessTransport({"client_0": lambda data: b"junk"}),
        np.zeros(3),
        plan=TrainingPlan(local_steps=1),
    )
    with pytest.raises(RoundAborted, match="no usable client left after phase .key_hello."):
        server.setup(rounds=1)


def test_a_client_without_a_key_refuses_to_encrypt():
    with pytest.raises(KeySetupError, match="no CKKS key yet"):
        CKKSClient(
            "client_0", get_preset("compact"), Provision(), resolve_options("ckks", {})
        ).protect(np.zeros(3))


def _client(task_name="tcga-brca"):
    from secagg.backends.plain import PlainClient
    from secagg.clients.policy import ENGINE_PHASES, ClientPolicy
    from secagg.clients.runtime import Client
    from secagg.clients.tasks import get_task
    from secagg.clients.training import LocalTrainer
    from secagg.protocols.optimizers import StepSchedule

    task = get_task(task_name)
    trainer = LocalTrainer(task.make_model(), task.load().train[5], task.loss, 8, seed=0)
    policy = ClientPolicy(
        phases=frozenset(ENGINE_PHASES),
        rounds=3,
        plan=TrainingPlan(client_lr=StepSchedule.parse("0.1"), local_steps=1),
        scalar_budget=3,
        server_optimizer={"name": "sgd", "dim": 40},
    )
    return Client(
        "client_5", trainer, PlainClient(), policy=policy, protocol=make_client_half("larc")
    )


def refused(client, envelope: Envelope) -> tuple[str, str]:
    """A request the client refuses: (the code the server gets, the client's own detail)."""
    from secagg.errors import ClientRefused

    with pytest.raises(ClientRefused) as info:
        client.handle(envelope.to_bytes())
    assert str(info.value) == f"{client.id} refused {envelope.phase!r}: {info.value.code}"
    return info.value.code, client.refusals[-1][2]


def test_client_rejects_misaddressed_unknown_and_out_of_order_requests():
    client = _client()
    code, detail = refused(client, Envelope("server", "client_9", 0, "train"))
    assert code == "malformed_request" and "for client_9" in detail
    code, detail = refused(client, Envelope("server", "client_5", 0, "dance"))
    assert code == "malformed_request" and "no handler for phase 'dance'" in detail
    probe = Envelope(
        "server",
        "client_5",
        0,
        "larc_probe",
        {
            "g_hat": wire.vector(np.zeros(40)),
            "alpha": wire.scalar(1.0),
            "loss_check": wire.config({"mode": "full"}),
            **optimizer_fields(make_optimizer({"name": "sgd", "dim": 40})),
        },
    )
    code, detail = refused(client, probe)
    assert code == "out_of_order" and "holds no global model" in detail
    train = {"train": wire.config({"lr": 0.1, "steps": 1})}
    code, detail = refused(client, Envelope("server", "client_5", 0, "train", train))
    assert code == "out_of_order" and "no global model" in detail
    code, detail = refused(client, Envelope("server", "client_5", 0, "apply"))
    assert code == "out_of_order" and "cannot apply an update" in detail


def test_larc_probe_without_any_optimizer_state_is_refused():
    client = _client()
    client.handle(
        Envelope(
            "server",
            "client_5",
            0,
            "train",
            {
                "model": wire.vector(np.zeros(40, dtype=np.float32)),
                "train": wire.config({"lr": 0.1, "steps": 1}),
            },
        ).to_bytes()
    )
    probe = Envelope(
        "server",
        "client_5",
        0,
        "larc_probe",
        {
            "g_hat": wire.vector(np.zeros(40)),
            "alpha": wire.scalar(1.0),
            "loss_check": wire.config({"mode": "full"}),
        },
    )
    code, detail = refused(client, probe)
    assert code == "out_of_order" and "without optimizer state" in detail
