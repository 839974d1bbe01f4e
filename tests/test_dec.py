"""DEC's equations (protocols/dec.py): the soft assignment, the target, the KL loss and its
gradients against finite differences, and federated k-means against pooled k-means."""

import numpy as np
import pytest

from secagg.protocols import dec

RNG = np.random.default_rng(3)
Z = RNG.normal(size=(40, 3))
MU = RNG.normal(size=(4, 3))


def test_the_soft_assignment_is_a_distribution_that_prefers_the_nearest_centroid():
    q = dec.soft_assignment(Z, MU)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)
    nearest = np.argmin(((Z[:, None] - MU[None]) ** 2).sum(axis=2), axis=1)
    assert (q.argmax(axis=1) == nearest).all()
    # Student-t with α = 1: q ∝ 1 / (1 + d²), checked on one point by hand
    d2 = ((Z[0] - MU) ** 2).sum(axis=1)
    np.testing.assert_allclose(q[0], (1 / (1 + d2)) / (1 / (1 + d2)).sum())


def test_the_target_sharpens_each_assignment_and_evens_out_the_clusters():
    q = dec.soft_assignment(Z, MU)
    p = dec.target_distribution(q)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    entropy = lambda a: -(a * np.log(a)).sum(axis=1)  # noqa: E731
    assert (entropy(p) < entropy(q)).all()
    # f_j normalisation: a cluster with more soft mass gets less weight per point
    lopsided = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4]])
    p2 = dec.target_distribution(lopsided)
    by_hand = lopsided**2 / lopsided.sum(axis=0)
    np.testing.assert_allclose(p2, by_hand / by_hand.sum(axis=1, keepdims=True))


def test_the_gradients_are_those_of_the_kl_loss_at_fixed_target():
    p = dec.target_distribution(dec.soft_assignment(Z, MU))
    grad_z, grad_mu = dec.kl_gradients(Z, MU, p)

    def loss(z, mu):
        return dec.kl_loss(p, dec.soft_assignment(z, mu))

    eps = 1e-6
    for i, d in [(0, 0), (7, 2), (39, 1)]:
        step = np.zeros_like(Z)
        step[i, d] = eps
        numeric = (loss(Z + step, MU) - loss(Z - step, MU)) / (2 * eps)
        assert grad_z[i, d] == pytest.approx(numeric, rel=1e-5, abs=1e-9)
    for j, d in [(0, 0), (3, 2)]:
        step = np.zeros_like(MU)
        step[j, d] = eps
        numeric = (loss(Z, MU + step) - loss(Z, MU - step)) / (2 * eps)
        assert grad_mu[j, d] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_the_kl_loss_is_zero_only_at_the_target():
    q = dec.soft_assignment(Z, MU)
    assert dec.kl_loss(q, q) == pytest.approx(0.0, abs=1e-12)
    assert dec.kl_loss(dec.target_distribution(q), q) > 0


def test_federated_kmeans_is_pooled_kmeans_step_for_step():
    """Three clients' sums and counts, added, give the pooled Lloyd step exactly."""
    clients = np.array_split(RNG.permutation(Z), [10, 25])
    mu = MU.copy()
    pooled = MU.copy()
    for _ in range(5):
        shares = [dec.kmeans_sums(part, mu) for part in clients]
        mu = dec.kmeans_centroids(sum(s for s, _ in shares), sum(c for _, c in shares), mu)
        nearest = np.argmin(((Z[:, None] - pooled[None]) ** 2).sum(axis=2), axis=1)
        pooled = np.array(
            [
                Z[nearest == j].mean(axis=0) if (nearest == j).any() else pooled[j]
                for j in range(len(pooled))
            ]
        )
        np.testing.assert_allclose(mu, pooled, atol=1e-12)


def test_a_cluster_no_point_chose_keeps_its_centroid():
    far = np.vstack([MU[:3], [[100.0, 100.0, 100.0]]])
    sums, counts = dec.kmeans_sums(Z, far)
    assert counts[3] == 0 and counts.sum() == len(Z)
    np.testing.assert_array_equal(dec.kmeans_centroids(sums, counts, far)[3], far[3])


def test_clustering_accuracy_ignores_the_cluster_names_but_not_the_mistakes():
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    assert dec.clustering_accuracy(labels, np.array([5, 5, 3, 3, 9, 9, 9, 9])) == 1.0
    # one point in the wrong cluster; the best map is still 5->0, 3->1, 9->2
    assert dec.clustering_accuracy(labels, np.array([5, 3, 3, 3, 9, 9, 9, 9])) == 7 / 8
    # two clusters for three labels: at most the two largest groups match
    assert dec.clustering_accuracy(labels, np.array([1, 1, 1, 1, 2, 2, 2, 2])) == 6 / 8


# ---- the encoder, the refinement and the protocol ---------------------------------------------
def test_the_numpy_encoder_and_soft_assignment_are_the_torch_dec_models():
    """The clients refine in numpy from the flat [encoder | centroids] the engine evaluates
    with torch: the parameter order must agree (centroids last, not first)."""
    import torch

    from secagg.clients.tasks import dec as tasks_dec
    from secagg.clients.training import flat_params

    torch.manual_seed(0)
    model = tasks_dec.make_model("breast-cancer").double()
    with torch.no_grad():
        model.clustering.centroids.normal_()
    params, shape = flat_params(model), dec.layout(30, 2)
    x = np.random.default_rng(0).normal(size=(9, 30))
    encoder, mu = dec.split_model(params, shape)
    z, _ = dec.encode(dec.encoder_layers(encoder, shape["sizes"]), x)
    with torch.no_grad():
        q = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(q, dec.soft_assignment(z, mu), atol=1e-12)


def test_the_back_propagated_gradient_is_the_kl_objectives():
    shape = {"sizes": [6, 5, 4, 2], "k": 3, "n_encoder": 6 * 5 + 5 + 5 * 4 + 4 + 4 * 2 + 2}
    rng = np.random.default_rng(1)
    theta, x = rng.normal(size=shape["n_encoder"] + 6), rng.normal(size=(7, 6))
    encoder, mu = dec.split_model(theta, shape)
    z, _ = dec.encode(dec.encoder_layers(encoder, shape["sizes"]), x)
    p = dec.target_distribution(dec.soft_assignment(z, mu))
    _, grad = dec.kl_objective_gradient(theta, shape, x, p)
    eps, step = 1e-6, np.eye(theta.size)
    numeric = [
        (
            dec.kl_objective_gradient(theta + eps * step[i], shape, x, p)[0]
            - dec.kl_objective_gradient(theta - eps * step[i], shape, x, p)[0]
        )
        / (2 * eps)
        for i in range(theta.size)
    ]
    np.testing.assert_allclose(grad, numeric, atol=1e-9)
    assert np.abs(grad[: shape["n_encoder"]]).max() > 1e-4  # the encoder does get a gradient


def test_summed_lloyd_shares_step_every_restart_as_pooled_k_means():
    z = np.concatenate([RNG.normal(c, 0.3, size=(30, 3)) for c in (-2.0, 0.0, 2.0)])
    parts = np.array_split(RNG.permutation(len(z)), 4)
    centroids = dec.starting_centroids(dec.moment_sums(z), 3, 4, np.random.default_rng(0))
    summed = sum(dec.lloyd_shares(z[p], centroids) for p in parts)
    new, inertia = dec.lloyd_step(summed, centroids)
    for r in range(4):
        sums, counts = dec.kmeans_sums(z, centroids[r])
        np.testing.assert_allclose(new[r], dec.kmeans_centroids(sums, counts, centroids[r]))
        dist = ((z[:, None] - centroids[r][None]) ** 2).sum(axis=2).min(axis=1).sum()
        assert inertia[r] == pytest.approx(dist)
    moments = dec.moment_sums(z)
    np.testing.assert_allclose(moments[:3] / moments[-1], z.mean(axis=0))


def test_a_model_of_another_layout_and_bad_settings_are_refused():
    from secagg.errors import ConfigError, ProtocolStateError

    with pytest.raises(ProtocolStateError, match="has .* values"):
        dec.split_model(np.zeros(10), dec.layout(30, 2))
    with pytest.raises(ConfigError, match="two clusters"):
        dec.layout(30, 1)
    with pytest.raises(ConfigError, match="momentum"):
        dec.DEC(momentum=1.0)
    with pytest.raises(ConfigError, match=">= 1"):
        dec.DEC(restarts=0)


def _dec_run(backend: str):
    from secagg.runspec.config import ExperimentConfig
    from secagg.server.audit import AuditLog
    from secagg.simulation.experiment import run_seed

    config = ExperimentConfig(
        task="dec-breast-cancer-iid",
        protocol="dec",
        backend=backend,
        rounds=2,
        local_steps=5,
        batch_size=32,
        protocol_options={"pretrain_rounds": 2, "kmeans_iters": 3, "restarts": 2},
    )
    audit = AuditLog()
    return run_seed(config.validate(), 0, audit), audit


def test_dec_on_ckks_is_dec_on_plain_and_reveals_only_sums():
    """The whole pipeline (autoencoder FedAvg, federated k-means, refinement) on ckks gives
    plain's model; the server learns what DEC declares, each sum the stated number of times."""
    plain, _ = _dec_run("plain")
    ckks, audit = _dec_run("ckks")
    assert plain.aborted is None and ckks.aborted is None
    np.testing.assert_allclose(ckks.final_params, plain.final_params, atol=1e-5)
    assert [r["train_pooled"] for r in ckks.rows] == [r["train_pooled"] for r in plain.rows]
    summary = audit.summary()
    assert summary["undeclared_plaintext_items"] == []
    learned = {
        name: kinds["plaintext vector"]
        for name, kinds in summary["learned_in_plaintext"].items()
        if "plaintext vector" in kinds
    }
    # two rounds of the autoencoder's FedAvg and two of DEC's refinement; each reveal is
    # decrypted by two clients whose flooded results must agree (a checked reveal)
    assert learned == {
        "embedding_moments": 2,
        "kmeans_sums": 6,
        "cluster_frequencies": 4,
        "global_update": 8,
    }, learned


def test_the_dec_task_registry_matches_the_data():
    from secagg.clients.tasks import DEC_SPLITS, get_task
    from secagg.clients.tasks import dec as tasks_dec
    from secagg.protocols.dec import data_layout

    assert {d: tuple(s for dd, s in DEC_SPLITS if dd == d) for d, _ in DEC_SPLITS} == (
        tasks_dec.DATASETS
    )
    for dataset, split in DEC_SPLITS:
        data = get_task(f"dec-{dataset}-{split}").load()
        shape = data_layout(data)
        assert (shape["sizes"][0], shape["k"]) == tasks_dec.SHAPES[dataset]
    pooled = tasks_dec.load("breast-cancer", "label", only=-1)
    alone = tasks_dec.load("breast-cancer", "label", only=1)
    assert pooled.n_clients == alone.n_clients == 1
    parts = tasks_dec.load("breast-cancer", "label").train
    assert len(pooled.train[0]) == sum(len(p) for p in parts)


def test_a_server_that_reveals_one_clients_k_means_share_is_refused(monkeypatch):
    """A deviating DEC server asks every client for its embedding statistics, then has only
    client_0's decrypted: the server backend, holding the clients' rules, does not even ask
    (a release of one upload; the clients would refuse it, tests/security/test_reveals.py),
    the seed stops in its initialisation and the server has learned none of it."""
    from secagg.protocols import PROTOCOLS, register_protocol
    from secagg.protocols.base import RoundAPI

    class SpyingDEC(dec.DEC):
        def _summed(self, ctx: RoundAPI, phase, fields, name, n):
            asked = dict.fromkeys(ctx.active, fields)
            loaded = ctx.load(ctx.ask(phase, asked, expect={name: ctx.upload_kind}), name, length=n)
            one = sorted(loaded)[0]
            return ctx.reveal(ctx.weighted_sum({one: loaded[one]}, {one: 1.0}), phase)

    monkeypatch.setitem(PROTOCOLS, "dec", PROTOCOLS["dec"])  # restored after the test
    register_protocol("dec", SpyingDEC, replace=True)
    run, audit = _dec_run("ckks")
    assert "the clients' release rules refuse it" in (run.aborted or "")
    assert "embedding_moments" in (run.aborted or "")
    learned = audit.summary()["learned_in_plaintext"]
    assert "embedding_moments" not in learned and "kmeans_sums" not in learned
    assert len(run.rows) == 1  # round 0 only: no refinement ran
