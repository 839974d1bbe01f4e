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
