"""Federated XGBoost (protocols/xgboost.py): from summed gradient histograms the trees are
xgboost's own ``hist`` trees on the same bins, on every backend precise enough."""

from __future__ import annotations

import numpy as np
import pytest

import secagg
from benchmarks.xgboost_trees import centralised
from secagg import wire
from secagg.clients.tasks import trees
from secagg.errors import ConfigError, UnexpectedField
from secagg.protocols import xgboost as fed
from secagg.wire import Envelope

TREES = 10


def run(backend="plain", rounds=TREES, split="label", **settings):
    return secagg.run(
        task=f"xgb-breast-cancer-{split}",
        protocol="xgboost",
        backend=backend,
        rounds=rounds,
        seeds=[0],
        **settings,
    )


def reference(n_trees=TREES):
    x, y, _, _ = trees.binned_pooled()
    return centralised(n_trees).fit(x, y)


def test_the_federated_trees_are_xgboosts_hist_trees():
    x, _, x_test, _ = trees.binned_pooled()
    result = run(backend_options={"dtype": "float64"})
    model = reference()
    for data in (x, x_test):  # the same splits: the same margins on unseen data too
        ours = trees.ensemble_margin(result.final_params[0], data)
        np.testing.assert_allclose(ours, model.predict(data, output_margin=True), atol=1e-5)
    summary = result.audit_summary
    assert {"gradient_histograms", "leaf_sums"} <= set(summary["learned_in_plaintext"])


def test_fifty_trees_are_xgboosts_too():
    """At the task's maximum of 50 trees (a 1e-3 tolerance on min_child_weight once let a
    child of H = 0.99904 through from tree 28, which xgboost refuses: margins 0.59 apart)."""
    x, _, x_test, _ = trees.binned_pooled()
    result = run(rounds=50, backend_options={"dtype": "float64"})
    model = reference(50)
    for data in (x, x_test):
        ours = trees.ensemble_margin(result.final_params[0], data)
        np.testing.assert_allclose(ours, model.predict(data, output_margin=True), atol=1e-5)


def test_a_child_below_min_child_weight_is_refused_as_xgboost_refuses_it():
    # one feature, two bins: the left child holds H = h_left, the right the rest (H = 5)
    def gains(h_left):
        hist = np.array([[[1.0, h_left], [-1.0, 5.0]]])
        return fed.split_gains(hist, lam=1.0, min_child_weight=1.0)

    assert np.isfinite(gains(1.0)).all() and np.isfinite(gains(1.0 - 1e-9)).all()
    assert np.isneginf(gains(0.99904)).all()


def test_ckks_builds_the_same_trees_on_its_wide_preset():
    """On compact the noise in the summed histograms (~5e-5) decides near-ties between
    splits, so its trees differ from plain's in a few nodes; wide's (~1e-12) does not."""
    x, _, _, _ = trees.binned_pooled()
    plain = run(backend_options={"dtype": "float64"})
    ckks = run("ckks", backend_options={"preset": "wide"})
    assert ckks.metrics["test_pooled"].round(4).tolist() == (
        plain.metrics["test_pooled"].round(4).tolist()
    )
    margins = [trees.ensemble_margin(r.final_params[0], x) for r in (plain, ckks)]
    assert np.abs(margins[0] - margins[1]).max() < 1e-6  # measured 3.5e-11: only leaf noise
    summary = ckks.audit_summary
    assert summary["undeclared_plaintext_items"] == []
    vectors = {k for k, v in summary["learned_in_plaintext"].items() if "plaintext vector" in v}
    assert vectors == {"gradient_histograms", "leaf_sums"}  # no client's own histogram


def test_threshold_builds_the_same_trees_on_its_wide_preset():
    x, _, _, _ = trees.binned_pooled()
    plain = run(rounds=3, backend_options={"dtype": "float64"})
    threshold = run("threshold", rounds=3, backend_options={"preset": "wide"})
    margins = [trees.ensemble_margin(r.final_params[0], x) for r in (plain, threshold)]
    assert np.abs(margins[0] - margins[1]).max() < 1e-6  # measured 9e-11


def test_the_top_s_proposal_reveals_splits_and_gains_instead_of_histograms():
    result = run("ckks", protocol_options={"top_s": 5})
    learned = result.audit_summary["learned_in_plaintext"]
    assert "top_s_splits" in learned and "gradient_histograms" not in learned
    assert result.audit_summary["undeclared_plaintext_items"] == []
    assert result.metrics["test_pooled"].iloc[-1] > 0.9  # measured 0.91 (histograms: 0.96)


def test_the_server_picks_the_split_with_the_largest_weighted_gain():
    replies = {
        "a": {"splits": [[[0, 3, 2.0], [1, 1, 1.0]]], "n": [10]},
        "b": {"splits": [[[1, 1, 5.0]]], "n": [4]},
    }

    protocol = fed.XGBoost(top_s=2)
    checked = {c: fed.checked_proposal(c, v, 1) for c, v in replies.items()}
    choice = protocol._top_s_choice(checked, 0)
    # Σ_p N_p L: (0, 3) → 20, (1, 1) → 10 + 20 = 30
    assert choice[:2] == (1, 1) and choice[2] == pytest.approx(30.0)
    # a proposal of another layout excludes its sender (read inside ``ask``)
    for bad in ({"splits": [[[0, 3]]], "n": [1]}, {"splits": "x", "n": [1]}, {"n": [1, 2]}):
        with pytest.raises(UnexpectedField):
            fed.checked_proposal("c", bad, 1)


def test_best_split_is_the_brute_force_best():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, size=(40, 3))
    g, h = rng.normal(size=40), rng.uniform(0.1, 1, size=40)
    hist = fed.histograms(x, g, h, np.zeros(40, dtype=int), 0, 1, 6)[0]
    feature, threshold, gain = fed.best_split(hist, lam=1.0, min_child_weight=0.0)

    def score(rows):
        return g[rows].sum() ** 2 / (h[rows].sum() + 1.0)

    best = max(
        (score(x[:, j] <= k) + score(x[:, j] > k) - score(np.ones(40, bool)), j, k)
        for j in range(3)
        for k in range(5)
    )
    assert (feature, threshold) == best[1:] and gain == pytest.approx(best[0])


def test_xgboost_refuses_a_model_or_features_that_are_not_trees_and_bins():
    with pytest.raises(ConfigError, match="needs a xgb-\\* task"):  # a linear model
        secagg.run(task="breast-cancer-iid", protocol="xgboost", backend="plain", rounds=1)

    class Client:  # a tree-sized model over features that are not bin indices
        id, n_params = "c", 22
        model = np.zeros(22)

        def features(self):
            return np.array([[0.5, 3.0]])

        def labels(self):
            return np.array([1.0])

    request = Envelope(
        "server",
        "c",
        0,
        "xgb_histograms",
        {
            "xgb": wire.config({"depth": 3, "bins": 16, "top_s": 0, "scale": 1.0}),
            "tree": wire.vector(np.zeros(22)),
            "level": wire.scalar(0),
        },
    )
    with pytest.raises(ConfigError, match="features as bin indices"):
        fed.XGBoostClient.level(Client(), Envelope.from_bytes(request.to_bytes()))


def test_the_reveals_per_tree_follow_the_depth_and_the_proposal():
    assert fed.XGBoost().capabilities == fed.XGBoost.capabilities  # the class shows defaults
    assert fed.XGBoost(depth=5).capabilities.reveals_per_round == 6
    top_s = fed.XGBoost(top_s=3).capabilities
    assert top_s.reveals_per_round == 1 and "gradient_histograms" not in top_s.reveals


def test_a_depth_the_tasks_model_does_not_hold_is_refused_before_any_tree():
    with pytest.raises(ConfigError, match="with --xgb-depth at its tree depth"):
        run(rounds=1, protocol_options={"depth": 4})
    with pytest.raises(ConfigError, match="the model holds 50 trees of depth 3"):
        run(rounds=51)
