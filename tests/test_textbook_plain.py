"""``plain`` is the textbook algorithm: the weight cap the encrypted backends' clients require
(``max_weight_share``) is off there unless asked for, and wherever the cap changes a weight
the round, the audit and the progress line say so, with the numbers."""

import numpy as np
import pytest

from secagg.backends import make_backends
from secagg.protocols import make_protocol
from secagg.protocols.optimizers import SGD
from secagg.runspec.config import ExperimentConfig
from secagg.server.engine import Server
from secagg.server.plan import RunPolicy, TrainingPlan
from secagg.server.transport import InProcessTransport
from tests.conftest import backend_client, honest_client

IDS = ["client_0", "client_1", "client_2"]
SIZES = [57.0, 29.0, 14.0]  # one site holds 57 % of the samples
UPDATES = [np.full(3, 1.0), np.full(3, 2.0), np.full(3, 4.0)]
TEXTBOOK = sum(n * g for n, g in zip(SIZES, UPDATES)) / sum(SIZES)


def one_round(backend: str, policy: RunPolicy):
    server_backend, backends = make_backends(backend, IDS)
    make = honest_client if backend == "plain" else None
    handlers = {
        c: (make(c, g, n) if make is not None else backend_client(c, backends[c], g, n))
        for c, g, n in zip(IDS, UPDATES, SIZES)
    }
    server = Server(
        make_protocol("fedavg"),
        server_backend,
        SGD(3, lr=1.0),
        InProcessTransport(handlers),
        np.zeros(3),
        plan=TrainingPlan(local_steps=1),
        policy=policy,
    )
    server.setup(rounds=1)
    return server, server.run_round(0)


def test_plain_runs_textbook_fedavg_by_default():
    config = ExperimentConfig(backend="plain").validate()
    assert config.policy().max_weight_share == 1.0
    server, report = one_round("plain", config.policy())
    np.testing.assert_allclose(server.params, TEXTBOOK, rtol=1e-6)  # 0.57 / 0.29 / 0.14
    assert report.capped == {}
    assert server.audit.summary()["weights_capped"] == []


@pytest.mark.parametrize("backend", ["plain", "ckks"])
def test_where_the_cap_acts_the_round_and_the_audit_say_so(backend):
    """On ckks the clients require the cap (default 0.5); on plain it can be asked for, to
    measure what it costs: the same capped weights, and each says what it changed."""
    options = {"max_weight_share": 0.5} if backend == "plain" else {}
    config = ExperimentConfig(backend=backend, backend_options=options).validate()
    assert config.policy().max_weight_share == 0.5
    server, report = one_round(backend, config.policy())
    # water-filling: client_0 at 0.5, the others keep their ratio 29:14 in the other half
    used = {"client_0": 0.5, "client_1": 0.5 * 29 / 43, "client_2": 0.5 * 14 / 43}
    capped = sum(used[c] * g for c, g in zip(IDS, UPDATES))
    np.testing.assert_allclose(server.params, capped, atol=1e-3 if backend == "ckks" else 1e-6)
    assert not np.allclose(server.params, TEXTBOOK, atol=1e-2)
    assert set(report.capped) == set(IDS)
    asked, got = report.capped["client_0"]
    assert asked == pytest.approx(0.57) and got == pytest.approx(0.5)
    ((row, *_),) = [
        [r for r in server.audit.summary()["weights_capped"] if r["peer"] == "client_0"]
    ]
    assert row["round"] == 1 and row["max_weight_share"] == 0.5
    assert row["asked_share"] == pytest.approx(0.57) and row["used_share"] == pytest.approx(0.5)


def test_a_capped_round_prints_what_the_cap_changed(tmp_path):
    """tcga-brca's largest site holds 0.286 of the training samples: a cap of 0.25 on plain
    changes the weights, and the round's progress line and metrics.csv say so."""
    import pandas as pd

    import secagg

    said: list[str] = []
    config = ExperimentConfig(
        backend="plain",
        backend_options={"max_weight_share": 0.25},
        rounds=1,
        local_steps=1,
        seeds=[1],
    ).validate()
    secagg.run(config, out=tmp_path / "run", progress=said.append)
    (line,) = [s for s in said if "round 1/1" in s]
    assert "weights capped at 0.25: client_0 0.286->0.250" in line, line
    assert pd.read_csv(tmp_path / "run" / "metrics.csv")["weights_capped"].iloc[-1] > 0
