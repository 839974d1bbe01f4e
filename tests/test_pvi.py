"""Partitioned variational inference (protocols/pvi.py): the local ELBO's quadrature is the
expectation it claims, the federated fixed point is the centralised variational posterior,
and encrypted runs give plain's."""

from __future__ import annotations

import numpy as np
import pytest

import secagg
from secagg.clients.tasks import tabular
from secagg.errors import ProtocolStateError
from secagg.protocols import pvi
from secagg.server.audit import AuditLog
from secagg.simulation.config import ExperimentConfig
from secagg.simulation.experiment import run_seed

PRIOR = pvi.prior_natural(31, 1.0)


def pooled():
    v, y, v_test, y_test = tabular.pooled("breast-cancer")
    return np.hstack([v, np.ones((len(v), 1))]), y, v_test, y_test


def centralised() -> np.ndarray:
    u, y, _, _ = pooled()
    return pvi.fit_gaussian(u, y, PRIOR, PRIOR, max_iter=1000)


def test_the_quadrature_is_the_expected_log_likelihood_and_the_gradients_are_its_own():
    rng = np.random.default_rng(0)
    u, y = rng.normal(size=(5, 3)), np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    mean, log_std = rng.normal(size=3), np.log(rng.uniform(0.2, 1.0, size=3))
    flat = np.concatenate([np.zeros(3), np.full(3, 1e-12)])  # a (nearly) flat prior
    elbo, d_mean, d_log_std = pvi.local_elbo(u, y, mean, log_std, flat)
    w = mean + np.exp(log_std) * rng.standard_normal((400_000, 3))
    sampled = -np.logaddexp(0.0, -y * (w @ u.T)).sum(1)
    expected = elbo - log_std.sum()  # the entropy's non-constant part
    assert abs(expected - sampled.mean()) < 4 * sampled.std() / np.sqrt(len(sampled))
    prior = np.concatenate([rng.normal(size=3), rng.uniform(0.5, 2, size=3)])
    elbo, d_mean, d_log_std = pvi.local_elbo(u, y, mean, log_std, prior)
    eps = 1e-6
    for j in range(3):
        e = np.eye(3)[j] * eps
        up, down = (pvi.local_elbo(u, y, mean + k * e, log_std, prior)[0] for k in (1, -1))
        assert (up - down) / (2 * eps) == pytest.approx(d_mean[j], rel=1e-6, abs=1e-8)
        up, down = (pvi.local_elbo(u, y, mean, log_std + k * e, prior)[0] for k in (1, -1))
        assert (up - down) / (2 * eps) == pytest.approx(d_log_std[j], rel=1e-6, abs=1e-8)


def test_the_centralised_fit_is_a_stationary_point_of_the_elbo():
    reference = centralised()
    u, y, _, _ = pooled()
    np.testing.assert_allclose(pvi.fit_gaussian(u, y, PRIOR, reference), reference, atol=1e-8)
    mean, var = pvi.to_moments(reference)
    _, d_mean, d_log_std = pvi.local_elbo(u, y, mean, 0.5 * np.log(var), PRIOR)
    assert max(np.abs(d_mean).max(), np.abs(d_log_std).max()) < 1e-5


def trace(backend: str, rounds: int, **options):
    models: dict[int, np.ndarray] = {}
    config = ExperimentConfig(
        task="bayes-breast-cancer-iid",
        protocol="pvi",
        backend=backend,
        rounds=rounds,
        seeds=[0],
        **options,
    )
    run = run_seed(config, 0, AuditLog(), on_model=lambda s, k, z: models.__setitem__(k, z))
    return run, models


def test_federated_pvi_converges_to_the_centralised_posterior():
    mean_ref, var_ref = pvi.to_moments(centralised())
    run, models = trace("plain", 40, backend_options={"dtype": "float64"})
    errors = [np.abs(pvi.to_moments(models[k])[0] - mean_ref).max() for k in sorted(models)]
    assert errors[-1] < 1e-2  # measured 5.1e-3 (linear, about ×0.9 per round)
    assert errors[-1] < errors[19] / 4 < errors[0] / 16
    mean, var = pvi.to_moments(models[40])
    assert np.abs(var / var_ref - 1).max() < 0.05
    # the predictive of q against the reference's, on the held-out set
    _, _, v_test, y_test = pooled()
    u_test = np.hstack([v_test, np.ones((len(v_test), 1))])
    assert np.mean(np.sign(u_test @ mean) == y_test) == np.mean(
        np.sign(u_test @ mean_ref) == y_test
    )


def test_encrypted_pvi_gives_plains_posterior():
    plain, _ = trace("plain", 6)
    encrypted, _ = trace("ckks", 6)
    mean_plain = pvi.to_moments(plain.final_params)[0]
    mean_ckks = pvi.to_moments(encrypted.final_params)[0]
    assert np.abs(mean_ckks - mean_plain).max() < 1e-3  # measured 2.6e-5
    assert [round(r["test_pooled"], 4) for r in encrypted.rows] == [
        round(r["test_pooled"], 4) for r in plain.rows
    ]


def test_the_server_learns_only_the_summed_change():
    result = secagg.run(task="bayes-breast-cancer-label", protocol="pvi", backend="ckks", rounds=2)
    summary = result.audit_summary
    assert summary["undeclared_plaintext_items"] == []
    vectors = {k for k, v in summary["learned_in_plaintext"].items() if "plaintext vector" in v}
    assert vectors == {"global_update"}


def test_an_improper_global_posterior_is_a_typed_error_that_says_what_to_do():
    with pytest.raises(ProtocolStateError, match="damp the updates"):
        pvi.to_moments(np.array([0.0, 1.0, 1.0, -0.5]))
