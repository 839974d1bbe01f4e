"""RadialGAN federated data augmentation (protocols/radialgan.py): the bad node's noise is
what the report says, the losses are Eq. 5.5 and 5.6 with gradients that are their own, and
the hand-over of latent codes runs on plain with an audit that declares exactly the codes, and
is refused on encrypted backends with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import radialgan as bench
from benchmarks import radialgan_training as training
from secagg import wire
from secagg.errors import ConfigError, MalformedMessage
from secagg.protocols import radialgan as rg
from secagg.server.plan import RunPolicy, check_run
from secagg.wire import Envelope

P, K, H, Z = 5, 3, 4, 2  # tiny networks for the gradient checks


def tiny(rng: np.random.Generator) -> rg.NodeNetworks:
    w = P + K
    return rg.NodeNetworks(
        training.init_network((w, H, Z), rng),
        training.init_network((Z, H, w), rng),
        training.init_network((w, H, 1), rng),
        P,
        K,
        H,
        Z,
    )


def numeric_gradient(f, arr: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        keep = arr[idx]
        arr[idx] = keep + eps
        up = f()
        arr[idx] = keep - eps
        down = f()
        arr[idx] = keep
        out[idx] = (up - down) / (2 * eps)
    return out


def test_the_noise_replaces_exactly_the_stated_share_of_every_images_pixels():
    rng = np.random.default_rng(0)
    x = np.full((40, 64), 0.5)  # no clean pixel equals a noise value, so changes show
    for share in (0.5, 0.7, 0.9):
        noisy, mask = training.corrupt_with_noise(x, share, rng)
        assert (mask.sum(1) == round(share * 64)).all()
        assert ((noisy != x) == mask).all()
        assert set(np.unique(noisy[mask])) == {0.0, 1.0}
    _, mask = training.corrupt_with_noise(x, 0.5, rng)
    assert len({row.tobytes() for row in mask}) > 1  # chosen per image, not one pattern
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        training.corrupt_with_noise(x, 1.2, rng)


def test_every_gradient_is_the_derivative_of_its_objective():
    rng = np.random.default_rng(1)
    nets = tiny(rng)
    xy = rg.joint(rng.random((6, P)), rng.integers(0, K, 6), K)
    received = [rng.normal(size=(4, Z)), rng.normal(size=(3, Z))]
    alpha = [0.6, 0.4]

    def objective():
        return training.translator_objective(nets, xy, received, alpha, 0.7, 0.3)[0]

    _, d_enc, d_gen, d_received = training.translator_objective(nets, xy, received, alpha, 0.7, 0.3)
    for analytic, params in ((d_enc, nets.encoder), (d_gen, nets.generator)):
        np.testing.assert_allclose(numeric_gradient(objective, params), analytic, atol=1e-7)
    for analytic, code in zip(d_received, received):
        np.testing.assert_allclose(numeric_gradient(objective, code), analytic, atol=1e-7)
    fakes = [rg.decode(nets, z) for z in received]
    _, d_disc = training.discriminator_objective(nets, xy, fakes, alpha)
    numeric = numeric_gradient(
        lambda: training.discriminator_objective(nets, xy, fakes, alpha)[0], nets.discriminator
    )
    np.testing.assert_allclose(numeric, d_disc, atol=1e-7)
    pull = rng.normal(size=(6, Z))
    numeric = numeric_gradient(lambda: float((rg.encode(nets, xy) * pull).sum()), nets.encoder)
    np.testing.assert_allclose(numeric, training.encoder_backward(nets, xy, pull), atol=1e-7)


def test_the_objectives_are_the_reports_losses():
    rng = np.random.default_rng(2)
    nets = tiny(rng)
    xy = rg.joint(rng.random((6, P)), rng.integers(0, K, 6), K)
    received, alpha, lam = [rng.normal(size=(4, Z))], [1.0], 0.7
    fake = rg.decode(nets, received[0])
    real_logits = rg.network(nets.discriminator, xy, nets.discriminator_shape)[0]
    fake_logits = rg.network(nets.discriminator, fake, nets.discriminator_shape)[0]
    adv, _ = training.discriminator_objective(nets, xy, [fake], alpha)
    expected = np.mean(np.log(1 / (1 + np.exp(-real_logits)))) + np.mean(
        np.log(1 - 1 / (1 + np.exp(-fake_logits)))
    )
    assert adv == pytest.approx(expected, rel=1e-12)  # Eq. 5.5
    cyc = training.cycle_loss(
        xy, rg.translate(nets, nets, xy), received, [rg.encode(nets, fake)], alpha
    )
    value = training.translator_objective(nets, xy, received, alpha, lam)[0]
    non_saturating = -np.mean(np.log(1 / (1 + np.exp(-fake_logits))))
    assert value == pytest.approx(non_saturating + lam * cyc, rel=1e-12)  # Eq. 5.6, 5.7


def test_the_cycle_loss_is_zero_for_inverse_maps_and_the_mean_distance_otherwise():
    rng = np.random.default_rng(3)
    xy, codes = rng.normal(size=(5, 8)), [rng.normal(size=(4, 2)), rng.normal(size=(3, 2))]
    assert training.cycle_loss(xy, xy.copy(), codes, [c.copy() for c in codes], [0.5, 0.5]) == 0.0
    shifted = xy.copy()
    shifted[:, 0] += 3.0  # every reconstruction 3 away
    assert training.cycle_loss(xy, shifted, codes, codes, [0.5, 0.5]) == pytest.approx(3.0)
    back = [codes[0] + np.array([0.0, 4.0]), codes[1]]  # the first node's codes 4 away
    assert training.cycle_loss(xy, xy, codes, back, [0.25, 0.75]) == pytest.approx(1.0)


def two_trained_nodes(steps: int = 20):
    x, y = bench.digits()
    nodes = bench.two_nodes(x, y, 0.5, seed=0)
    trained, log = training.train_radialgan(
        [rg.joint(*nodes["good"], 10), rg.joint(*nodes["bad"], 10)],
        n_features=64,
        n_classes=10,
        hidden=16,
        latent=4,
        warmup=5,
        steps=steps,
        seed=0,
    )
    return nodes, {"good": trained[0], "bad": trained[1]}, log


def test_training_sends_only_codes_out_and_their_gradients_back():
    _, _, log = two_trained_nodes(steps=20)
    per_step = 2 * 50 * 4 * 8  # a 50-sample batch of 4-dim float64 codes, each way
    assert (log.steps, log.codes_bytes, log.gradient_bytes) == (20, 20 * per_step, 20 * per_step)


def test_a_nodes_own_autoencoding_learns_in_the_warm_up():
    x, y = bench.digits()
    xy = rg.joint(x[:200], y[:200], 10)
    other = rg.joint(x[200:250], y[200:250], 10)
    before, _ = training.train_radialgan([xy, other], n_features=64, n_classes=10, steps=0, seed=0)
    after, log = training.train_radialgan(
        [xy, other], n_features=64, n_classes=10, warmup=150, steps=0, seed=0
    )
    assert log.codes_bytes == 0  # nothing crosses while a node fits its own data
    error = [training.row_norms_mean(xy - rg.translate(n[0], n[0], xy)) for n in (before, after)]
    assert error[1] < 0.6 * error[0]


def test_the_hand_over_gives_the_target_its_own_domains_samples_and_the_audit_says_what_crossed():
    nodes, nets, _ = two_trained_nodes()
    half, audit = bench.hand_over(nets, {c: nodes[c] for c in nets}, "good", "bad")
    x_aug, y_aug = half.translated_samples()
    x_good, y_good = nodes["good"]
    assert x_aug.shape == (len(x_good), 64) and y_aug.shape == (len(x_good),)
    assert x_aug.min() >= 0.0 and x_aug.max() <= 1.0 and set(y_aug) <= set(range(10))
    expected = rg.translate(nets["good"], nets["bad"], rg.joint(x_good, y_good, 10))
    np.testing.assert_array_equal(x_aug, expected[:, :64])  # the engine's path is Eq. 5.8's
    assert audit["undeclared_plaintext_items"] == []
    assert set(audit["learned_in_plaintext"]) == set(rg.CAPABILITIES.reveals)
    vectors = {k for k, v in audit["learned_in_plaintext"].items() if "plaintext vector" in v}
    assert vectors == {"latent_codes"}


@pytest.mark.parametrize("backend", ["ckks"])
def test_encrypted_backends_refuse_the_hand_over_and_say_why(backend):
    nodes, nets, _ = two_trained_nodes(steps=0)
    with pytest.raises(ConfigError, match="not a weighted sum"):
        bench.hand_over(nets, {c: nodes[c] for c in nets}, "good", "bad", backend=backend)
    with pytest.raises(ConfigError, match="not a sum"):  # the run planner refuses it too
        check_run(
            "radialgan",
            rg.CAPABILITIES,
            backend=backend,
            backend_can_read=False,
            policy=RunPolicy(),
            client_dp=False,
        )


def test_codes_that_do_not_fit_the_latent_space_are_a_typed_error():
    _, nets, _ = two_trained_nodes(steps=0)
    half = rg.RadialGANNode.holding(nets["bad"])
    fields = {"latent_codes": wire.vector(np.zeros(10)), "latent_dim": wire.scalar(4)}
    env = Envelope.from_bytes(Envelope("server", "bad", 0, rg.TRANSLATE_PHASE, fields).to_bytes())
    with pytest.raises(MalformedMessage, match="do not fit"):
        half.translate(bench.NodeView("bad", np.zeros((1, 64)), np.zeros(1)), env)
