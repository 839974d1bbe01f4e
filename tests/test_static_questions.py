"""Static questions (capabilities, pieces, the server optimizer, budgets) are answered from
the protocol's class or from the one protocol the run built, not by building it again, and
no model is built only to count its parameters: a run builds the protocol and the model a
bounded number of times."""

import collections

import pytest

import secagg
import secagg.clients.tasks.tcga_brca as tcga
from secagg.protocols.larc import LARC
from secagg.runspec.config import ExperimentConfig, inapplicable


@pytest.fixture
def built(monkeypatch):
    """How many LARC protocols and TCGA-BRCA models have been built."""
    counts: collections.Counter = collections.Counter()
    init, make_model = LARC.__init__, tcga.make_model

    def counted_init(self, *args, **kwargs):
        counts["protocol"] += 1
        init(self, *args, **kwargs)

    def counted_model(*args, **kwargs):
        counts["model"] += 1
        return make_model(*args, **kwargs)

    monkeypatch.setattr(LARC, "__init__", counted_init)
    monkeypatch.setattr(tcga, "make_model", counted_model)
    return counts


def test_a_run_builds_the_protocol_and_the_model_a_bounded_number_of_times(built):
    seeds, rounds = [1, 2], 2
    result = secagg.run(
        task="tcga-brca",
        protocol="larc",
        backend="plain",
        rounds=rounds,
        seeds=seeds,
        local_steps=1,
    )
    n_clients = 6
    assert list(result.metrics["round"]) == [0, 1, 2] * len(seeds)
    # secagg.run's validation and run_experiment's build one each; every seed builds the
    # protocol that runs and its clients' provisioning one for their policy (which a
    # deployed node computes itself, from its own copy of the settings). (Before: 13 for
    # one seed on ckks, 10 of them for static questions.)
    assert built["protocol"] <= 2 + 2 * len(seeds)
    # every seed: a model per client (its trainer), the initial model, and one per
    # evaluation (round 0 and every round); none only to count parameters
    assert built["model"] <= len(seeds) * (n_clients + 1 + rounds + 1)


def test_static_questions_build_no_protocol(built):
    config = ExperimentConfig(protocol="larc", backend="ckks")
    config.optimizer_config()  # LARC's class cannot fix a server step
    config.resolved_backend_options()
    assert built["protocol"] == 0
    protocol = LARC()
    config.validate()
    assert built["protocol"] == 2  # validate builds it once
    inapplicable(config, protocol)
    assert built["protocol"] == 2
