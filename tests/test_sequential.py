"""The Sequential strategy (GenoMed4All D6.2 §8.2.2): one model visits every centre in a fresh
random order each round; between centres it travels as a release to the next centre alone,
so the server sees only the end-of-round model."""

from __future__ import annotations

import numpy as np
import pytest

import secagg
from secagg.clients.tasks import get_task
from secagg.errors import ConfigError
from secagg.protocols import make_protocol
from secagg.simulation.experiment import ExperimentConfig, release_budgets
from tests.harness import RecordingTransport

SETTINGS = dict(
    task="deepcox-gbsg2-balanced",
    protocol="sequential",
    rounds=3,
    local_epochs=1,
    batch_size=32,
    client_lr="0.01",
    seeds=[0],
)
ENCRYPTED = {"backend_options": {"min_contributors": 1}}
N_PARAMS = 8 * 8 + 8 + 8 * 4 + 4 + 4 + 1  # DeepCox 8-4 on GBSG2's 8 features


def test_on_plain_each_centre_trains_from_its_predecessors_model():
    """Every hop starts from exactly what the previous centre returned, each centre is
    visited once a round in a new order, and W moves to the last centre's model."""
    made = []

    def transport(factory, ids):
        made.append(RecordingTransport(factory, ids))
        return made[-1]

    result = secagg.run(**SETTINGS, backend="plain", transport=transport)
    log, n = made[0].log, 8
    orders = []
    for r in range(SETTINGS["rounds"]):
        train = {p: rep for p, req, rep in log if req.round == r and req.phase == "train"}
        hops = [
            (p, req, rep) for p, req, rep in log if req.round == r and req.phase == "sequential_hop"
        ]
        first = [p for p, rep in train.items() if np.any(rep.vector("pseudo_gradient", N_PARAMS))]
        assert len(first) == 1 and len(hops) == n - 1  # one trains in the train phase
        previous = train[first[0]].vector("pseudo_gradient", N_PARAMS)
        for _, request, reply in hops:
            np.testing.assert_array_equal(request.vector("model_so_far", N_PARAMS), previous)
            previous = reply.vector("pseudo_gradient", N_PARAMS)
        orders.append(first + [p for p, _, _ in hops])
        assert sorted(orders[-1]) == [f"client_{k}" for k in range(n)]
    assert len({tuple(o) for o in orders}) == len(orders)  # a fresh order every round
    # W after the last round is W before it plus the last hop's model change
    models = [
        req.vector("model", N_PARAMS)
        for _, req, _ in log
        if req.phase == "train" and "model" in req.fields
    ]
    np.testing.assert_allclose(result.final_params[0], models[-1] + previous, atol=1e-6)


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_encrypted_sequential_equals_plain_and_shows_the_server_no_centres_model(backend):
    plain = secagg.run(**SETTINGS, backend="plain")
    options = dict(ENCRYPTED["backend_options"])
    if backend == "threshold":  # wide: lean's clients weight, a hop is a one-upload release
        options["preset"] = "wide"
    encrypted = secagg.run(**SETTINGS, backend=backend, backend_options=options)
    assert not encrypted.aborted
    # the c-index per round equal to the fourth decimal (measured: identical)
    assert encrypted.metrics["test_pooled"].round(4).tolist() == (
        plain.metrics["test_pooled"].round(4).tolist()
    )
    summary = encrypted.audit_summary
    assert summary["undeclared_plaintext_items"] == []
    learned_vectors = {
        k for k, v in summary["learned_in_plaintext"].items() if any("vector" in kind for kind in v)
    }
    assert learned_vectors == {"global_update"}  # no centre's model, only W each round
    assert summary["opened_by_clients"] == {"model_so_far": SETTINGS["rounds"] * 7}


def test_encrypted_sequential_needs_the_clients_to_accept_one_contributor_releases():
    with pytest.raises(ConfigError, match="--min-contributors 1"):
        secagg.run(**SETTINGS, backend="ckks")


def test_threshold_holders_give_a_share_for_every_hop_and_no_more():
    config = ExperimentConfig(**{**SETTINGS, "backend": "threshold", **ENCRYPTED})
    data = get_task(SETTINGS["task"]).load()
    budgets = release_budgets(config, make_protocol("sequential"), N_PARAMS, data)
    assert budgets["share_budget"] == 3 * 8 and budgets["open_budget"] == 3
    larc = release_budgets(config, make_protocol("larc"), N_PARAMS, data)
    assert larc["share_budget"] is None  # one shared aggregate: the open budget bounds it
