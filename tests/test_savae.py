"""SAVAE (clients/tasks/savae.py) and its joint pseudo-point prior (protocols/savae_prior.py):
the censored Weibull likelihood and the KL are the densities they claim, the product prior
is the normalised product, the c-index ranks the right way, the two-node split is what it
says, encrypted runs give plain's, and the audit declares exactly what the server learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import secagg
from secagg.clients.tasks import savae
from secagg.clients.training import flat_params, set_flat_params
from secagg.errors import ConfigError
from secagg.protocols import savae_prior
from secagg.runspec.config import ExperimentConfig
from secagg.server.audit import AuditLog
from secagg.simulation.experiment import run_seed

FAST = dict(local_steps=5, batch_size=32, client_lr="0.01", seeds=[0])


def test_the_censored_weibull_likelihood_is_scipys_logpdf_for_events_and_logsf_otherwise():
    time = torch.tensor([0.3, 1.0, 2.5, 0.7, 4.0], dtype=torch.float64)
    event = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    log_shape = torch.log(torch.tensor([0.5, 1.0, 1.7, 3.0, 0.9], dtype=torch.float64))
    log_scale = torch.log(torch.tensor([1.0, 2.0, 0.8, 1.5, 3.0], dtype=torch.float64))
    got = savae.weibull_log_likelihood(time, event, log_shape, log_scale).numpy()
    shape, scale = log_shape.exp().numpy(), log_scale.exp().numpy()
    dist = stats.weibull_min(c=shape, scale=scale)
    expected = np.where(event.numpy() == 1, dist.logpdf(time.numpy()), dist.logsf(time.numpy()))
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    median = savae.weibull_median_log(log_shape, log_scale).exp().numpy()
    np.testing.assert_allclose(median, dist.median(), rtol=1e-12)


def test_the_kl_term_is_the_closed_form_of_torch_distributions():
    rng = torch.Generator().manual_seed(0)
    mean = torch.randn(6, 3, generator=rng, dtype=torch.float64)
    log_var = torch.randn(6, 3, generator=rng, dtype=torch.float64)
    q = torch.distributions.Normal(mean, torch.exp(0.5 * log_var))
    p = torch.distributions.Normal(torch.zeros_like(mean), torch.ones_like(mean))
    expected = torch.distributions.kl_divergence(q, p).sum(1)
    torch.testing.assert_close(savae.gaussian_kl(mean, log_var), expected)


def test_the_loss_is_the_negative_weighted_elbo_of_its_parts():
    torch.manual_seed(1)
    model = savae.SAVAE(5).double()
    x = torch.rand(7, 5, dtype=torch.float64)
    y = torch.tensor([[1, 0.5], [0, 1.2], [1, 2.0], [0, 0.1], [1, 0.9], [1, 3.0], [0, 1.0]])
    y = y.double()
    model.eval()  # z = μ: deterministic
    out = model(x)
    mean, log_var = model.posterior(x)
    z = mean
    x_mean, x_raw = model.feature_decoder(z).chunk(2, 1)
    std = savae.MIN_STD + torch.nn.functional.softplus(x_raw)
    recon = torch.distributions.Normal(x_mean, std).log_prob(x).sum(1)
    shape_raw, log_scale = model.time_decoder(z).unbind(1)
    shape = torch.exp(2 * torch.tanh(shape_raw / 2))
    dist = stats.weibull_min(c=shape.detach().numpy(), scale=log_scale.exp().detach().numpy())
    t, e = y[:, 1].numpy(), y[:, 0].numpy()
    time_ll = np.where(e == 1, dist.logpdf(t), dist.logsf(t))
    kl = savae.gaussian_kl(mean, log_var).detach().numpy()
    expected = np.mean(kl - 3.0 * time_ll - recon.detach().numpy())
    assert float(savae.negative_elbo(out, y, time_weight=3.0).detach()) == pytest.approx(
        expected, rel=1e-9
    )


def test_the_product_of_mixtures_is_the_normalised_product_of_the_densities():
    def mixture(weights, means, variances):
        w = torch.tensor(weights, dtype=torch.float64)
        return (
            torch.log(w / w.sum()),
            torch.tensor(means, dtype=torch.float64)[:, None],
            torch.tensor(variances, dtype=torch.float64)[:, None],
        )

    a = mixture([1, 2], [-1.0, 0.5], [0.3, 1.2])
    b = mixture([1, 1, 3], [0.0, 2.0, -0.7], [0.5, 0.2, 2.0])
    grid = torch.linspace(-12, 12, 200_001, dtype=torch.float64)[:, None]
    unnormalised = torch.exp(
        savae.mixture_log_density(grid, a) + savae.mixture_log_density(grid, b)
    )
    z_const = torch.trapezoid(unnormalised, grid[:, 0])
    product = savae.joint_prior([a, b])
    assert product[0].shape == (6,)
    torch.testing.assert_close(
        savae.mixture_log_density(grid[::1000], product),
        torch.log(unnormalised[::1000] / z_const),
        rtol=1e-7,
        atol=1e-7,
    )


def test_the_mixture_of_experts_is_the_average_of_the_node_densities():
    rng = torch.Generator().manual_seed(3)
    nodes = [
        (
            torch.log_softmax(torch.randn(k, generator=rng, dtype=torch.float64), 0),
            torch.randn(k, 2, generator=rng, dtype=torch.float64),
            torch.rand(k, 2, generator=rng, dtype=torch.float64) + 0.1,
        )
        for k in (3, 4)
    ]
    z = torch.randn(9, 2, generator=rng, dtype=torch.float64)
    average = sum(torch.exp(savae.mixture_log_density(z, m)) for m in nodes) / 2
    pooled = savae.mixture_log_density(z, savae.pooled_prior(nodes))
    torch.testing.assert_close(pooled, torch.log(average))


def test_the_c_index_ranks_long_predicted_times_as_low_risk():
    truth = np.array([[1, 1.0], [1, 2.0], [1, 3.0], [1, 4.0]])
    log_scale = np.log(truth[:, 1])
    output = np.column_stack([np.zeros(4), log_scale, np.zeros(4), np.zeros(4)])
    assert savae.time_c_index(truth, output) == 1.0
    output[:, 1] = -log_scale
    assert savae.time_c_index(truth, output) == 0.0


def test_the_two_nodes_are_a_good_and_a_bad_node_of_the_split_seed():
    data = savae.load("gbsg2", seed=3)
    good, bad = data.train
    assert len(bad) == round(savae.BAD_SHARE * (len(good) + len(bad)))
    assert len(good) > 8 * len(bad)
    assert sum(len(t) for t in data.test) + len(good) + len(bad) == 686
    again, other = savae.load("gbsg2", seed=3), savae.load("gbsg2", seed=4)
    assert torch.equal(again.train[1].x, bad.x)
    assert not torch.equal(other.train[1].x, bad.x)
    alone = savae.load("gbsg2", seed=3, only=1)
    assert len(alone.train) == 1 and torch.equal(alone.train[0].y, bad.y)
    assert len(alone.test) == 2  # the bounds are scored on the same test sets
    assert float(torch.cat([p.y[:, 1] for p in data.train]).mean()) == pytest.approx(1.0, rel=1e-3)


def test_bad_input_is_a_typed_error():
    with pytest.raises(ConfigError, match="node"):
        savae.load("gbsg2", only=2)
    with pytest.raises(ConfigError, match="survival dataset"):
        savae.load("mnist")
    with pytest.raises(ConfigError, match="n × 4"):
        savae.negative_elbo(torch.zeros(3, 5), torch.zeros(3, 2))
    with pytest.raises(ConfigError, match="covariates"):
        savae.SAVAE(8)(torch.zeros(3, 7))
    with pytest.raises(ConfigError, match="combine"):
        savae.SAVAE(8, n_pseudo=2, n_nodes=2, combine="sum")
    with pytest.raises(ConfigError, match="4096"):
        savae.SAVAE(8, n_pseudo=100, n_nodes=2)
    with pytest.raises(ConfigError, match="n_pseudo"):
        savae_prior.SAVAEPrior(n_pseudo=0)
    with pytest.raises(ConfigError, match="savae-prior"):
        savae_prior.pseudo_block(40, 2, 8, 39)


def test_the_block_the_joint_prior_rewrites_is_the_models_pseudo_inputs_and_nothing_else():
    model = savae.make_model("gbsg2", 8)
    params = flat_params(model)
    features = model.n_features
    block = savae_prior.pseudo_block(params.size, len(savae.NODES), 8, features)
    assert model.prior is not None
    points = model.prior.points.detach().double().numpy()
    np.testing.assert_array_equal(params[block], points.ravel())
    own, other = np.split(params[block], 2)  # [own | the other node's], as the protocol sends
    np.testing.assert_array_equal(own, points[0].ravel())
    np.testing.assert_array_equal(other, points[1].ravel())
    networks = [p for name, p in model.named_parameters() if not name.startswith("prior.")]
    assert sum(p.numel() for p in networks) == block.start


def run(task: str, protocol: str, backend: str, rounds: int = 2, **options):
    config = ExperimentConfig(
        task=task, protocol=protocol, backend=backend, rounds=rounds, **FAST, **options
    )
    audit = AuditLog()
    return run_seed(config.validate(), 0, audit), audit


def test_fedavg_on_ckks_is_plains_and_the_server_learns_only_the_average():
    plain, _ = run("savae-gbsg2", "fedavg", "plain")
    encrypted, audit = run("savae-gbsg2", "fedavg", "ckks", backend_options={"preset": "compact"})
    assert (
        np.abs(encrypted.final_params - plain.final_params).max() < 1e-4
    )  # measured 8.5e-7 (compact)
    for column in ("test_pooled", "test_client_1"):
        assert round(encrypted.rows[-1][column], 3) == round(plain.rows[-1][column], 3)
    summary = audit.summary()
    assert summary["undeclared_plaintext_items"] == []
    assert not summary["individual_updates_revealed"]
    vectors = {k for k, v in summary["learned_in_plaintext"].items() if "plaintext vector" in v}
    assert vectors == {"global_update"}


def test_the_joint_prior_declares_the_pseudo_points_and_averages_only_the_networks():
    torch.manual_seed(0)  # the run's seed fixes its initial model
    initial = np.concatenate(
        [p.detach().double().numpy().ravel() for p in savae.make_model("gbsg2", 8).parameters()]
    )
    result, audit = run("savae-prior-gbsg2", "savae_prior", "ckks")
    plain, _ = run("savae-prior-gbsg2", "savae_prior", "plain")
    # the same run as on plain, to CKKS's precision (the lean preset's: fedavg's default)
    # measured over 160 ckks runs: median 1.2e-5, max 3.6e-5 (CKKS noise is fresh per run)
    assert np.abs(result.final_params - plain.final_params).max() < 1e-4
    summary = audit.summary()
    assert summary["undeclared_plaintext_items"] == []
    assert "pseudo_points" in summary["declared_plaintext_items"]
    vectors = {k for k, v in summary["learned_in_plaintext"].items() if "plaintext vector" in v}
    assert vectors == {"global_update", "pseudo_points"}
    assert summary["learned_in_plaintext"]["pseudo_points"]["plaintext vector"] == 4  # 2 × 2
    block = slice(initial.size - 2 * 8 * 8, initial.size)
    # zero in every upload: only the CKKS noise moves them (measured 5e-6)
    np.testing.assert_allclose(result.final_params[block], initial[block], atol=1e-4)
    # and every network tensor is averaged and moves, the time decoder's last layer included
    # (the block once sat there: the protocol overwrote it and the c-index fell to chance)
    model = savae.make_model("gbsg2", 8)
    set_flat_params(model, result.final_params)
    moved = {name: p.detach().double().numpy() for name, p in model.named_parameters()}
    set_flat_params(model, initial)
    for name, p in model.named_parameters():
        if not name.startswith("prior."):
            assert np.abs(moved[name] - p.detach().double().numpy()).max() > 1e-4, name


def test_the_joint_prior_is_refused_where_it_cannot_run(caplog):
    with pytest.raises(ConfigError, match="(?i)dp"):
        ExperimentConfig(
            task="savae-prior-gbsg2",
            protocol="savae_prior",
            client_dp={"clip": 1.0, "noise": 1.0},
            **FAST,
        ).validate()
    # a model without pseudo-inputs: refused at configuration, naming the tasks it trains
    with pytest.raises(ConfigError, match=r"savae-prior-\* or savae-moe-\* task"):
        secagg.run(task="tcga-brca", protocol="savae_prior", rounds=1, **FAST)
