"""The Ensemble strategy (GenoMed4All D6.2 §8.2.4): every centre trains its own model and the
server reveals only the n-weighted average of their scores of the evaluation set."""

from __future__ import annotations

import numpy as np
import pytest

import secagg
from secagg import wire
from secagg.ckks.release import Descriptor, ReleasePolicy
from secagg.errors import ConfigError, MalformedMessage, ReleaseRefused, StateError
from secagg.protocols import make_protocol
from secagg.protocols.ensemble import EnsembleClient, evaluation_set
from secagg.runspec.config import ExperimentConfig
from secagg.server.audit import AuditLog
from secagg.simulation.experiment import run_seed
from secagg.wire import Envelope
from tests.harness import RecordingTransport

SETTINGS = dict(
    task="deepcox-gbsg2-balanced",
    protocol="ensemble",
    rounds=3,
    local_epochs=1,
    batch_size=32,
    client_lr="0.01",
    seeds=[0],
)


def test_on_plain_the_ensemble_is_the_sample_weighted_mean_of_the_centres_scores():
    made = []

    def transport(factory, ids):
        made.append(RecordingTransport(factory, ids))
        return made[-1]

    result = secagg.run(**SETTINGS, backend="plain", transport=transport)
    log = made[0].log

    def replies(phase: str, round_number: int) -> dict[str, Envelope]:
        return {p: rep for p, req, rep in log if req.phase == phase and req.round == round_number}

    n = {p: rep.scalar("n_samples") for p, rep in replies("train", 0).items()}
    last = replies("ensemble_scores", SETTINGS["rounds"] - 1)
    scores = {p: rep.vector("scores") for p, rep in last.items()}
    assert len(scores) == 8 and len({tuple(np.round(s, 6)) for s in scores.values()}) == 8
    expected = sum(n[c] * scores[c] for c in scores) / sum(n.values())
    run = run_seed(ExperimentConfig(**SETTINGS, backend="plain"), 0, AuditLog())
    np.testing.assert_allclose(run.final_predictions, expected, rtol=1e-6)
    # the centres' models never leave them: the uploads are zeros and W never moves
    uploads = [rep.vector("pseudo_gradient") for _, req, rep in log if req.phase == "train"]
    assert all(not u.any() for u in uploads)
    sent = [req.vector("model") for _, req, _ in log if "model" in req.fields]
    np.testing.assert_allclose(result.final_params[0], sent[0], atol=1e-6)
    # each centre goes on training its own model: its scores change from round to round
    earlier = {p: rep.vector("scores") for p, rep in replies("ensemble_scores", 0).items()}
    assert all(not np.allclose(earlier[c], scores[c]) for c in scores)


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_encrypted_ensemble_equals_plain_and_reveals_only_the_averaged_scores(backend):
    plain = secagg.run(**SETTINGS, backend="plain")
    # threshold on wide (8 bytes a value, ~1e-11): lean's ~1e-6 could swap near-equal scores
    options = {"preset": "wide"} if backend == "threshold" else {}
    encrypted = secagg.run(**SETTINGS, backend=backend, backend_options=options)
    assert encrypted.metrics["test_pooled"].round(4).tolist() == (
        plain.metrics["test_pooled"].round(4).tolist()
    )  # measured: identical
    summary = encrypted.audit_summary
    assert summary["undeclared_plaintext_items"] == []
    vectors = {
        k for k, v in summary["learned_in_plaintext"].items() if any("vector" in kind for kind in v)
    }
    assert vectors == {"ensemble_scores"}
    assert "scores" in summary["ciphertext_fields_received"]


def test_clients_open_only_the_lengths_their_provisioning_names():
    """The model's size and the evaluation set's (113 and 172 here): a server asking to
    reveal a sum of any other length is refused."""
    policy = ReleasePolicy(min_contributors=2, n_values=(113, 172))
    entries = (("a", 1, "d1"), ("b", 1, "d2"))
    for n in (113, 172):
        policy.check(Descriptor("reveal", "x", 0, n, 1, entries))
    with pytest.raises(ReleaseRefused, match="opens 113 or 172 values"):
        policy.check(Descriptor("reveal", "x", 0, 171, 1, entries))


def test_evaluation_features_that_do_not_make_rows_are_a_typed_error():
    env = Envelope(
        "server",
        "c",
        0,
        "ensemble_scores",
        {"evaluation_features": wire.vector(np.ones(10)), "evaluation_columns": wire.scalar(3)},
    )
    with pytest.raises(MalformedMessage, match="rows of 3"):
        evaluation_set(Envelope.from_bytes(env.to_bytes()))


@pytest.mark.parametrize(
    "protocol, options, match",
    [
        ("coxph", {"penalizer": -1.0}, "penalizer >= 0"),
        ("xgboost", {"eta": 0.0}, "eta > 0"),
        ("xgboost", {"top_s": -1}, "top_s must be >= 0"),
        ("pvi", {"damping": 0.0}, "0 < damping <= 1"),
        ("pvi", {"samples": 0}, "samples >= 1"),
        ("admm", {"problem": "elastic"}, "unknown ADMM problem"),
    ],
)
def test_the_new_protocols_refuse_bad_settings_with_what_they_need(protocol, options, match):
    with pytest.raises(ConfigError, match=match):
        make_protocol(protocol, **options)


def test_a_client_state_of_another_shape_is_refused_and_changes_nothing():
    half = EnsembleClient()
    half.own = np.ones(3)
    with pytest.raises(StateError, match="holds \\['own'\\]"):
        half.load_state_dict({"factor": np.ones(3)})
    with pytest.raises(StateError, match="not vectors"):
        half.load_state_dict({"own": np.ones((2, 2))})
    np.testing.assert_array_equal(half.own, np.ones(3))
