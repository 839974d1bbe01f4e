"""A site's node holds its own partition of the task's data and nothing of another site's
(``held_by_site``): invariants over what a node opens and what it makes of its part.

- a node opens only its own lazy part (a loader that records every call shows it), and
  builds the same client, hold-out split included, as the simulation builds from every part;
- no client's hold-out split depends on another client's data;
- what needs other sites' data on a node (client_split, a protocol's release lengths read
  from every client) is refused with a typed error that says what to do, before anything
  is built; a protocol that needs only the node's own part (XGBoost's features) is sized
  from it.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from secagg.clients.tasks import ClientData, FederatedData, get_task
from secagg.clients.tasks.tcga_brca import held_by_site
from secagg.errors import ConfigError, DataNotHeld
from secagg.protocols import make_protocol
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.provisioning import (
    ClientFactory,
    hold_out_validation,
    release_budgets,
    seed_data,
)

#: every part a lazy loader opened in this process, in order
OPENED: list[int] = []


class Rows(Dataset):
    def __init__(self, part: ClientData):
        self.x, self.y = part.x, part.y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def open_site(data: FederatedData, k: int) -> Dataset:
    OPENED.append(k)
    return Rows(data.train[k])


def as_sites(data: FederatedData) -> FederatedData:
    """``data`` as a task declares one file per site: lazy parts of unknown length (a site's
    CSV is counted only once opened), the pooled test set lazy too."""
    pooled = ClientData.concat(data.test) if data.test else data.pooled_test
    return FederatedData(
        data.name,
        [ClientData.lazy(functools.partial(open_site, data, k)) for k in range(data.n_clients)],
        None,
        pooled_test=None if pooled is None else ClientData.lazy(functools.partial(Rows, pooled)),
    )


@functools.cache
def tcga() -> FederatedData:
    return get_task("tcga-brca").load()


def test_a_site_holds_its_own_lazy_part_and_nothing_of_another_sites():
    OPENED.clear()
    sites = as_sites(tcga())
    view = held_by_site(sites, 2)
    assert view.n_clients == 6 and [p.held for p in view.train] == [k == 2 for k in range(6)]
    assert view.pooled_test is not None and not view.pooled_test.held  # the coordinator's
    with pytest.raises(DataNotHeld, match="client_4's data is not held here"):
        len(view.train[4])
    assert len(view.train[2]) == len(tcga().train[2]) and OPENED == [2]
    # a task that holds every part in memory (a bundled one) keeps them: nothing is opened
    memory = held_by_site(tcga(), 2)
    assert all(p.held for p in memory.train) and memory.train[4] is tcga().train[4]
    with pytest.raises(ConfigError, match="not client 6"):
        held_by_site(sites, 6)


def test_a_node_builds_the_simulations_client_opening_only_its_own_part(monkeypatch):
    """Client 3 of a seed, hold-out split included, built on its node from its own lazy
    part equals the one the simulation builds from every part in memory."""
    from secagg.clients.tasks import TASKS

    monkeypatch.setitem(
        TASKS, "tcga-sites-test", replace(get_task("tcga-brca"), name="tcga-sites-test")
    )
    config = ExperimentConfig(
        task="tcga-sites-test", backend="plain", rounds=1, seeds=[5], validation_split=0.25
    )
    OPENED.clear()
    simulated = ClientFactory(config, 5)(["client_3"], loaded=tcga())["client_3"]
    on_node = ClientFactory(config, 5)(["client_3"], loaded=held_by_site(as_sites(tcga()), 3))
    node_client = on_node["client_3"]
    assert torch.equal(node_client.trainer.data.x, simulated.trainer.data.x)
    assert torch.equal(node_client.validation.y, simulated.validation.y)
    assert len(node_client.validation) == round(0.25 * len(tcga().train[3]))
    w = np.zeros(40)
    assert np.array_equal(node_client.trainer.train(w, 0.1, 3), simulated.trainer.train(w, 0.1, 3))
    assert set(OPENED) == {3}


def test_no_clients_hold_out_depends_on_another_clients_data():
    data = tcga()
    shrunk = replace(
        data, train=[*data.train[:2], data.train[2].subset(range(40)), *data.train[3:]]
    )
    _, want = hold_out_validation(data, 0.2)
    _, got = hold_out_validation(shrunk, 0.2)
    for k in (0, 1, 3, 4, 5):
        assert torch.equal(got[k].x, want[k].x)
    assert len(got[2]) == 8 and len(want[2]) != 8


def test_what_needs_other_sites_data_is_refused_on_a_node_and_what_needs_its_own_is_not():
    view = held_by_site(as_sites(tcga()), 1)
    split = ExperimentConfig(task="tcga-brca", client_split=0.2)
    with pytest.raises(DataNotHeld, match="client_split .* run client_split studies in simulation"):
        seed_data(split, 0, view)
    # exact Cox sizes its statistics by the union of every centre's event times
    cox = ExperimentConfig(task="coxph-gbsg2-times", protocol="coxph", backend="ckks")
    gbsg2 = get_task("coxph-gbsg2-times").load()
    with pytest.raises(DataNotHeld, match="coxph sizes its releases from every client's data"):
        release_budgets(cox, make_protocol("coxph"), 10, held_by_site(as_sites(gbsg2), 0))
    assert release_budgets(cox, make_protocol("coxph"), 10, held_by_site(gbsg2, 0))  # memory
    # XGBoost's histograms are sized by the features, which the node's own part has
    xgb = ExperimentConfig(task="xgb-breast-cancer-label", protocol="xgboost", backend="ckks")
    trees = get_task("xgb-breast-cancer-label").load()
    want = release_budgets(xgb, make_protocol("xgboost"), 2, trees)
    OPENED.clear()
    got = release_budgets(xgb, make_protocol("xgboost"), 2, held_by_site(as_sites(trees), 2))
    assert got == want and OPENED == [2]
