"""benchmarks.corrections: Holm's adjusted p-values and the Nadeau–Bengio corrected
resampled t-test, against hand-computed values and the tests they reduce to."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from benchmarks.corrections import holm, nadeau_bengio


def test_holm_on_a_small_known_family():
    # sorted 0.01, 0.02, 0.03, 0.04 (m = 4): 4·0.01, 3·0.02, 2·0.03, 1·0.04
    # = 0.04, 0.06, 0.06, 0.04 → running maximum 0.04, 0.06, 0.06, 0.06
    adjusted = holm([0.03, 0.01, 0.04, 0.02])
    np.testing.assert_allclose(adjusted, [0.06, 0.04, 0.06, 0.06])


def test_holm_caps_at_one_keeps_nan_and_matches_bonferroni_for_the_smallest():
    adjusted = holm([0.5, np.nan, 0.001, 0.9])
    assert np.isnan(adjusted[1])
    # m = 3 (the NaN does not count): 3·0.001, then max(0.003, 2·0.5) = 1, then 1
    np.testing.assert_allclose(adjusted[[2, 0, 3]], [0.003, 1.0, 1.0])
    assert holm([]).size == 0
    with pytest.raises(ValueError):
        holm([1.2])


def test_holm_textbook_example():
    # Holm (1979)-style worked example, as in Wikipedia's: p = 0.01, 0.04, 0.03, 0.005
    # sorted 0.005, 0.01, 0.03, 0.04 → 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])


def test_nadeau_bengio_reduces_to_the_paired_t_test_when_the_test_set_is_tiny():
    rng = np.random.default_rng(0)
    d = rng.normal(0.01, 0.02, size=12)
    corrected = nadeau_bengio(d, n_train=10**12, n_test=1)
    ordinary = stats.ttest_1samp(d, 0.0)
    assert corrected["p"] == pytest.approx(ordinary.pvalue, rel=1e-9)
    interval = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
    assert corrected["ci_low"] == pytest.approx(interval[0], rel=1e-9)
    assert corrected["ci_high"] == pytest.approx(interval[1], rel=1e-9)


def test_nadeau_bengio_by_hand():
    # d = 1, 2, 3, 4, 5 (J = 5): mean 3, s² = 2.5; n_test/n_train = 1/3:
    # var = (1/5 + 1/3)·2.5 = 4/3, se = 1.1547; t = 3/1.1547 = 2.5981 on 4 df
    out = nadeau_bengio([1, 2, 3, 4, 5], n_train=300, n_test=100)
    se = np.sqrt(4 / 3)
    assert out["se"] == pytest.approx(se)
    assert out["t"] == pytest.approx(3 / se)
    assert out["p"] == pytest.approx(2 * stats.t.sf(3 / se, 4))
    assert out["p"] == pytest.approx(0.0602, abs=5e-4)
    half = stats.t.ppf(0.975, 4) * se  # 2.7764 · 1.1547 = 3.2060
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((3 - half, 3 + half))
    assert half == pytest.approx(3.2060, abs=1e-3)
    # wider than the paired interval, which it contains
    assert out["p"] > stats.ttest_1samp([1, 2, 3, 4, 5], 0).pvalue


def test_nadeau_bengio_edge_cases():
    flat = nadeau_bengio([0.0, 0.0, 0.0], n_train=3, n_test=1)
    assert flat["p"] == 1.0 and flat["ci_low"] == flat["ci_high"] == 0.0
    with pytest.raises(ValueError):
        nadeau_bengio([0.1], n_train=3, n_test=1)
