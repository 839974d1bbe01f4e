"""The exact federated Cox model (protocols/coxph.py): the centres' per-event-time sums add up
to the pooled ones, the Efron derivatives are lifelines' model, and the federated Newton
iteration reaches lifelines' centralised fit on every backend."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from lifelines import CoxPHFitter

import secagg
from secagg.clients.tasks import survival
from secagg.errors import ConfigError
from secagg.protocols import coxph
from secagg.server.transport import ClientUnavailable, InProcessTransport
from secagg.wire import Envelope


def pooled_training(dataset: str, scenario: str = "times"):
    centres, _ = survival.split(dataset, scenario, 0)
    return centres, np.vstack([c[0] for c in centres]), np.vstack([c[1] for c in centres])


def lifelines_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(x.shape[1])])
    frame["E"], frame["T"] = y[:, 0], y[:, 1]
    fit = CoxPHFitter().fit(frame, "T", "E", fit_options={"precision": 1e-12, "max_steps": 200})
    return fit.params_.to_numpy()


def central_newton(x, y, penalizer=0.0, steps=30) -> np.ndarray:
    grid = coxph.union_grid([coxph.event_times(y)])
    beta = np.zeros(x.shape[1])
    for _ in range(steps):
        stats = coxph.risk_set_statistics(x, y, beta, grid)
        beta = beta + coxph.newton_step(stats, beta, penalizer, len(y))
    return beta


def test_the_centres_sums_add_up_to_the_pooled_sums():
    """Each centre sees only its diagonal block of the risk-set matrix (§8.2.1), yet its
    per-time sums over the shared grid add up to the pooled patients' exactly."""
    centres, x, y = pooled_training("gbsg2")
    grid = coxph.union_grid([coxph.event_times(c[1]) for c in centres])
    beta = np.random.default_rng(0).normal(scale=0.5, size=x.shape[1])
    federated = sum(coxph.risk_set_statistics(cx, cy, beta, grid) for cx, cy in centres)
    np.testing.assert_allclose(federated, coxph.risk_set_statistics(x, y, beta, grid), rtol=1e-12)
    # a centre's own likelihood is another function: the "times" split keeps risk sets apart
    alone = coxph.risk_set_statistics(*centres[0], beta, grid)
    assert not np.allclose(alone[:, 0], federated[:, 0])


def test_the_efron_derivatives_are_consistent_and_reach_lifelines_fit():
    _, x, y = pooled_training("gbsg2")
    grid = coxph.union_grid([coxph.event_times(y)])
    beta = np.random.default_rng(1).normal(scale=0.3, size=x.shape[1])
    loglik, grad, hess = coxph.efron_derivatives(coxph.risk_set_statistics(x, y, beta, grid), beta)
    eps = 1e-6
    for j in range(x.shape[1]):
        e = np.zeros_like(beta)
        e[j] = eps
        up = coxph.efron_derivatives(coxph.risk_set_statistics(x, y, beta + e, grid), beta + e)
        down = coxph.efron_derivatives(coxph.risk_set_statistics(x, y, beta - e, grid), beta - e)
        assert abs((up[0] - down[0]) / (2 * eps) - grad[j]) < 1e-5 * max(1, abs(grad[j]))
        np.testing.assert_allclose((up[1] - down[1]) / (2 * eps), hess[j], rtol=1e-5, atol=1e-5)
    # GBSG2 has tied event times, so Efron's correction matters here
    assert len(grid) < int(y[:, 0].sum())
    np.testing.assert_allclose(central_newton(x, y), lifelines_fit(x, y), atol=1e-8)  # 1.2e-9


def run(backend, rounds=30, task="coxph-gbsg2-times", **settings):
    return secagg.run(
        task=task, protocol="coxph", backend=backend, rounds=rounds, seeds=[0], **settings
    )


def test_federated_newton_on_plain_equals_lifelines_on_the_pooled_patients():
    _, x, y = pooled_training("gbsg2")
    result = run("plain", backend_options={"dtype": "float64"})
    assert len(result.metrics) - 1 < 30  # the step fell under the tolerance: it stopped
    np.testing.assert_allclose(result.final_params[0], lifelines_fit(x, y), atol=1e-6)
    summary = result.audit_summary
    assert {"event_times", "risk_set_statistics"} <= set(summary["learned_in_plaintext"])


def test_encrypted_newton_reaches_the_same_fit():
    _, x, y = pooled_training("gbsg2")
    reference = lifelines_fit(x, y)
    plain = run("plain", rounds=10)
    compact = run("ckks", rounds=10)
    # compact's noise moves β by ~1e-3 (its flooding, amplified by H⁻¹) but not the ranking
    assert compact.metrics["test_pooled"].round(4).tolist() == (
        plain.metrics["test_pooled"].round(4).tolist()
    )
    assert np.abs(compact.final_params[0] - reference).max() < 1e-2  # measured 1.6e-3
    wide = run("ckks", rounds=10, backend_options={"preset": "wide"})
    assert np.abs(wide.final_params[0] - reference).max() < 1e-6
    summary = wide.audit_summary
    assert summary["undeclared_plaintext_items"] == []
    vectors = {k for k, v in summary["learned_in_plaintext"].items() if "plaintext vector" in v}
    assert vectors == {"event_times", "risk_set_statistics"}  # no centre's own sums
    assert "statistics" in summary["ciphertext_fields_received"]


def test_threshold_newton_ranks_as_plain_on_the_wide_preset():
    """Newton's gradient cancels near the optimum and amplifies a backend's error by N and
    H⁻¹: on ``wide`` (1e-11 per value) the ranking is plain's."""
    plain = run("plain", rounds=6)
    threshold = run("threshold", rounds=6, backend_options={"preset": "wide"})
    assert threshold.metrics["test_pooled"].round(4).tolist() == (
        plain.metrics["test_pooled"].round(4).tolist()
    )


def test_a_penalised_fit_where_the_unpenalised_one_does_not_exist():
    """TCGA-BRCA's 39 features are collinear: lifelines' unpenalised fit halts; with a ridge
    the federated iteration equals the centralised one."""
    centres, x, y = pooled_training("tcga")
    with pytest.raises(Exception, match="collinearity|Convergence"):
        lifelines_fit(x, y)
    result = run(
        "plain",
        task="coxph-tcga-times",
        backend_options={"dtype": "float64"},
        protocol_options={"penalizer": 1e-3},
    )
    np.testing.assert_allclose(result.final_params[0], central_newton(x, y, 1e-3), atol=1e-6)


def test_a_centre_missing_from_the_sums_stops_the_round():
    """Its patients would be missing from every risk set: the step would not be exact."""

    class Dropping(InProcessTransport):
        def request(self, peer, data):
            if peer == "client_3" and Envelope.from_bytes(data).phase == "cox_statistics":
                raise ClientUnavailable("client_3 went offline")
            return super().request(peer, data)

    def transport(factory, ids):
        return Dropping({c: client.handle for c, client in factory(ids).items()})

    result = run("plain", rounds=2, transport=transport)
    assert "needs the sums of every centre" in result.aborted[0]


def test_coxph_refuses_a_model_that_is_not_linear():
    # at configuration: the protocol trains coxph-* tasks only (its registry entry)
    with pytest.raises(ConfigError, match=r"cannot train task 'deepcox-gbsg2-times'.*coxph-\*"):
        run("plain", rounds=1, task="deepcox-gbsg2-times")


def test_a_singular_hessian_stops_with_the_fix_named_and_the_penalty_converges():
    """TCGA-BRCA's collinear features make the unpenalised Newton step explode (the run once
    aborted a round later with "missing ['client_6']", the cause only in the audit): now the
    first step says what to do, and --cox-penalizer 1e-3 converges."""
    import secagg

    settings = dict(protocol="coxph", task="coxph-tcga-balanced", rounds=3)
    stopped = secagg.run(**settings)
    assert "--cox-penalizer 1e-3" in stopped.aborted[42] and "singular" in stopped.aborted[42]
    fitted = secagg.run(**settings, protocol_options={"penalizer": 1e-3})
    assert not fitted.aborted and fitted.metrics["test_pooled"].iloc[-1] > 0.8
