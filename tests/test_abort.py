"""A round left with no usable client ends with one typed error, RoundAborted, whatever the
phase; the driver records it and goes on with the next seed."""

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.errors import RoundAborted
from secagg.protocols import make_protocol
from secagg.protocols.optimizers import SGD
from secagg.server.engine import Server
from secagg.server.plan import TrainingPlan
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope


def uploads_then_garbage(cid: str, g: np.ndarray, bad_phase: str):
    """Trains and uploads honestly; answers ``bad_phase`` with bytes that do not decode."""

    def handle(data: bytes) -> bytes:
        req = Envelope.from_bytes(data)
        if req.phase == bad_phase:
            return b"junk"
        if req.phase == "enroll":
            return Envelope(
                cid, "server", req.round, req.phase, {"n_samples": wire.scalar(10)}
            ).to_bytes()
        fields = {"pseudo_gradient": wire.vector(g), "n_samples": wire.scalar(10)}
        if "loss_ratio" in req.fields:
            fields["loss_ratio"] = wire.scalar(1.0)
        return Envelope(cid, "server", req.round, req.phase, fields).to_bytes()

    return handle


@pytest.mark.parametrize(
    "protocol, phase, options",
    [
        ("larc", "larc_probe", {}),
        ("regagg", "regagg_terms", {}),
        ("simagg", "regagg_terms", {}),
        ("feddisco", "discrepancy", {}),
        ("fedavg", "train", {}),
        ("costwagg", "train", {}),
        ("fedavg", "enroll", {}),
    ],
)
def test_no_usable_client_in_any_phase_is_one_typed_error(protocol, phase, options):
    proto = make_protocol(protocol, **options)
    if protocol == "feddisco":
        proto.use_pretrained(np.zeros(400), {"n_in": 2, "hidden": 3, "latent": 1})
    clients = {
        c: uploads_then_garbage(c, np.full(2, k + 1.0), phase)
        for k, c in enumerate(["a", "b", "c"])
    }
    server = Server(
        proto,
        make_backends("plain", list(clients))[0],
        SGD(2),
        InProcessTransport(clients),
        np.zeros(2),
        plan=TrainingPlan(local_steps=1),
    )
    with pytest.raises(RoundAborted) as info:
        server.setup(rounds=1)
        server.run_round(0)
    assert info.value.phase == phase and info.value.round == 0
    assert set(info.value.exclusions) == {"a", "b", "c"}
    assert all("TruncatedMessage" in r for r in info.value.exclusions.values())


def test_the_driver_records_an_aborted_seed_and_runs_the_next(monkeypatch):
    """Seed 1's clients all fail in round 1 (the second round): the driver keeps the rounds it
    measured, records why in the result and the audit, and runs seed 2 in full."""
    from secagg.clients.runtime import Client
    from secagg.simulation.experiment import ClientFactory, ExperimentConfig, run_experiment

    original = Client.on_train

    def failing(self, env):
        if env.round == 1 and self._seed == 1:
            raise RuntimeError("disk full")
        return original(self, env)

    original_build = ClientFactory._build

    def remember_seed(self, *args, **kwargs):
        client = original_build(self, *args, **kwargs)
        client._seed = self.seed  # the run's seed, which the factory builds for
        return client

    monkeypatch.setattr(ClientFactory, "_build", remember_seed)
    monkeypatch.setattr(Client, "on_train", failing)
    config = ExperimentConfig(
        task="tcga-brca",
        protocol="larc",
        rounds=3,
        seeds=[1, 2],
        local_steps=2,
    )
    result = run_experiment(config)
    assert (
        set(result.aborted) == {1}
        and "no usable client left after phase 'train'" in result.aborted[1]
    )
    rounds = result.metrics.groupby("seed")["round"].max().to_dict()
    assert rounds == {1: 1, 2: 3}  # seed 1: initial model and round 1 measured
    summary = result.audit.summary()
    # the round metrics.csv would have numbered 2 (the audit's numbering is the same)
    assert [(a["run"], a["round"], a["phase"]) for a in summary["aborted_runs"]] == [
        ("1", 2, "train")
    ]


def test_fewer_uploads_than_the_minimum_abort_before_any_second_phase():
    """With min_clients 3 and one client failing, LARC's round is aborted right after the
    uploads: no probe (a decryption of Ĝ) is sent for a round that cannot finish."""
    from secagg.server.plan import RunPolicy
    from tests.conftest import honest_client

    sent: list[str] = []

    class Recording(InProcessTransport):
        def exchange(self, requests):
            def record():
                for peer, data in requests:
                    sent.append(Envelope.from_bytes(data).phase)
                    yield peer, data

            return super().exchange(record())

    clients = {
        "a": honest_client("a", np.ones(2), 10),
        "b": honest_client("b", np.zeros(2), 10),
        "c": lambda data: b"junk",
    }
    server = Server(
        make_protocol("larc"),
        make_backends("plain", list(clients))[0],
        SGD(2),
        Recording(clients),
        np.zeros(2),
        plan=TrainingPlan(local_steps=1),
        policy=RunPolicy(min_clients=3),
    )
    with pytest.raises(RoundAborted, match="2 usable uploads, need 3") as info:
        server.run_round(0)
    assert info.value.phase == "train" and set(info.value.exclusions) == {"c"}
    assert sent == ["train"] * 3


def test_min_clients_all_aborts_at_set_up_before_anything_is_uploaded():
    """``min_clients="all"`` (a pilot that must not lose a site): a client that fails key
    set-up aborts the run at set-up, before any training request, so nothing of any
    client is uploaded or released; with the default the run goes on without it."""
    from secagg.server.plan import RunPolicy
    from tests.conftest import backend_client

    ids = ["a", "b", "c"]
    server_backend, backends = make_backends("ckks", ids)
    honest = {c: backend_client(c, backends[c], np.full(2, 0.1), 10) for c in ids}
    sent: list[str] = []

    def handler(c):
        def handle(data):
            phase = Envelope.from_bytes(data).phase
            sent.append(phase)
            if c == "c" and phase.startswith("key"):
                raise RuntimeError("the site's data does not load")
            return honest[c](data)

        return handle

    for policy, aborts in ((RunPolicy(min_clients="all"), True), (RunPolicy(), False)):
        sent.clear()
        server_backend, backends = make_backends("ckks", ids)
        honest = {c: backend_client(c, backends[c], np.full(2, 0.1), 10) for c in ids}
        server = Server(
            make_protocol("fedavg"),
            server_backend,
            SGD(2),
            InProcessTransport({c: handler(c) for c in ids}),
            np.zeros(2),
            plan=TrainingPlan(local_steps=1),
            policy=policy,
        )
        if aborts:
            with pytest.raises(RoundAborted, match=r"set-up left 2 of 3 clients, need 3") as info:
                server.setup(rounds=1)
            assert info.value.phase == "setup" and set(info.value.exclusions) == {"c"}
            assert "train" not in sent and "consent" not in sent
        else:
            assert set(server.setup(rounds=1)) == {"c"}
            assert server.run_round(0).skipped is None


@pytest.mark.parametrize("bad", [0, -1, "some", 1.5, True])
def test_min_clients_is_a_positive_integer_or_all(bad):
    from secagg.errors import ConfigError
    from secagg.server.plan import RunPolicy

    with pytest.raises(ConfigError, match="positive integer or 'all'"):
        RunPolicy(min_clients=bad)
