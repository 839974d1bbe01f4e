"""Fed-TCGA-BRCA: data shapes as FLamby has them, Cox loss and c-index on hand-computed cases."""

import math

import numpy as np
import pytest
import torch

from secagg.clients.tasks import tcga_brca
from secagg.clients.tasks.tcga_brca import c_index, cox_loss
from secagg.errors import ConfigError


def test_flamby_split_sizes():
    data = tcga_brca.load("flamby")
    assert [len(p) for p in data.train] == [248, 156, 164, 129, 129, 40]
    assert [len(p) for p in data.test] == [63, 40, 42, 33, 33, 11]
    assert data.train[0].x.shape[1] == 39 and data.train[0].y.shape[1] == 2
    assert set(torch.unique(data.train[0].y[:, 0]).tolist()) <= {0.0, 1.0}


def test_idash_variant_has_900_training_patients_and_no_test_set():
    data = tcga_brca.load("idash2024")
    assert [len(p) for p in data.train] == [279, 165, 174, 131, 131, 20]
    assert data.test is None


def test_random_client_splits_are_5_to_1_and_reproducible():
    data = tcga_brca.load("idash2024")
    a = tcga_brca.random_client_splits(data, seed=3)
    b = tcga_brca.random_client_splits(data, seed=3)
    assert [len(p) for p in a.test] == [round(n / 6) for n in (279, 165, 174, 131, 131, 20)]
    assert all(len(tr) + len(te) == len(orig) for tr, te, orig in zip(a.train, a.test, data.train))
    assert torch.equal(a.test[0].x, b.test[0].x)
    c = tcga_brca.random_client_splits(data, seed=4)
    assert not torch.equal(a.test[0].x, c.test[0].x)


def test_unknown_variant_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown TCGA-BRCA variant"):
        tcga_brca.load("nope")


def _truth(E, T):
    return torch.tensor(np.stack([E, T], axis=1), dtype=torch.float64)


def test_cox_loss_all_events_hand_computed():
    # times already descending: risk set of sample j is samples 0..j
    s = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    loss = cox_loss(s, _truth([1, 1, 1], [30.0, 20.0, 10.0]))
    expected = (
        0.0 + (math.log(math.e + math.e**2) - 2) + (math.log(math.e + math.e**2 + math.e**3) - 3)
    ) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_cox_loss_sorts_by_time_and_skips_censored_terms_but_averages_over_batch():
    # unsorted input; sample with T=20 is censored (E=0)
    s = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    truth = _truth([1, 1, 0], [10.0, 30.0, 20.0])
    # sorted by T desc: (s=1,E=1), (s=2,E=0), (s=3,E=1)
    expected = (0.0 + 0.0 + (math.log(math.e + math.e**2 + math.e**3) - 3)) / 3
    assert cox_loss(s, truth).item() == pytest.approx(expected, rel=1e-12)


def test_cox_loss_ignores_a_common_shift_of_scores():
    rng = np.random.default_rng(0)
    s = torch.tensor(rng.normal(size=20))
    truth = _truth(rng.integers(0, 2, 20), rng.uniform(1, 100, 20))
    assert cox_loss(s + 7.5, truth).item() == pytest.approx(cox_loss(s, truth).item(), abs=1e-12)


def test_c_index_hand_computed():
    truth = np.array([[1, 1.0], [1, 2.0], [1, 3.0]])  # columns (E, T)
    assert c_index(truth, [3.0, 2.0, 1.0]) == 1.0  # highest risk dies first: concordant
    assert c_index(truth, [1.0, 2.0, 3.0]) == 0.0
    # pairs (1,2),(1,3),(2,3): risk 3,1,2 -> (1,2) ok, (1,3) ok, (2,3) wrong -> 2/3
    assert c_index(truth, [3.0, 1.0, 2.0]) == pytest.approx(2 / 3)


def test_c_index_counts_only_pairs_whose_earlier_time_is_an_event():
    # first patient censored at T=1: only the pair (T=2 event, T=3) is admissible
    truth = np.array([[0, 1.0], [1, 2.0], [1, 3.0]])
    assert c_index(truth, [0.0, 5.0, 1.0]) == 1.0
    assert c_index(truth, [9.0, 1.0, 5.0]) == 0.0
