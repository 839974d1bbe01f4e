"""FedDisco-style weights: the Wasserstein discrepancy and Equation 1, and the pipeline."""

import math

import numpy as np
import pytest
from scipy.special import ndtri

from secagg.errors import ConfigError
from secagg.protocols.feddisco import disco_weights, discrepancy, wasserstein_to_standard_normal


def test_w1_of_a_point_mass_at_zero_is_e_abs_z():
    # W1(δ0, N(0,1)) = E|Z| = sqrt(2/π): the value a collapsed encoder gives
    assert wasserstein_to_standard_normal(np.zeros(10_000)) == pytest.approx(
        math.sqrt(2 / math.pi), rel=1e-3
    )


def test_w1_of_a_shift_is_the_shift():
    z = ndtri((np.arange(1, 5001) - 0.5) / 5000)  # exact normal quantiles
    assert wasserstein_to_standard_normal(z) == pytest.approx(0.0, abs=1e-12)
    assert wasserstein_to_standard_normal(z + 0.3) == pytest.approx(0.3, abs=1e-9)


def test_discrepancy_averages_latent_dimensions():
    z = ndtri((np.arange(1, 1001) - 0.5) / 1000)
    enc = np.stack([z, z + 1.0, z - 0.5], axis=1)
    assert discrepancy(enc) == pytest.approx((0 + 1.0 + 0.5) / 3, abs=1e-9)


def test_equation_1_hand_computed():
    # ReLU(n − α d + b): [0.5 − 0.2 + 0.1, 0.3 − 0.5 + 0.1, 0.2 − 0 + 0.1] = [0.4, 0, 0.3]
    w = disco_weights(np.array([0.5, 0.3, 0.2]), np.array([0.4, 1.0, 0.0]), 0.5, 0.1)
    np.testing.assert_allclose(w, [0.4 / 0.7, 0.0, 0.3 / 0.7])


def test_all_zero_weights_are_a_clear_error():
    with pytest.raises(ConfigError, match="every FedDisco weight is zero"):
        disco_weights(np.array([0.5, 0.5]), np.array([2.0, 2.0]), 1.0, 0.1)


def test_feddisco_pipeline_reports_one_discrepancy_per_client_once():
    from secagg.simulation.experiment import ExperimentConfig, run_experiment

    cfg = ExperimentConfig(
        task="digits-niid2",
        protocol="feddisco",
        seeds=[0],
        rounds=2,
        backend="ckks",
        local_epochs=1,
        batch_size=64,
        client_lr="0.5",
        vae_rounds=2,
        protocol_options={"alpha": 0.0},
    )
    result = run_experiment(cfg)
    values = [
        f["value"]
        for r in result.audit.records
        if r["event"] == "message" and r["direction"] == "received"
        for f in r["fields"]
        if f["name"] == "discrepancy"
    ]
    assert len(values) == 6 and all(v > 0 for v in values)
    assert {r["run"] for r in result.audit.records} == {"0", "0-beta-vae"}
    assert result.audit.summary()["undeclared_plaintext_items"] == []


def test_the_numpy_encoder_is_the_torch_vae_encoder():
    """The client half runs the β-VAE's encoder in numpy from the flat parameters the server
    sends; it must be the torch model's own ``encode`` (the layout of BetaVAE)."""
    import torch

    from secagg.clients.tasks.vae import LATENT, BetaVAE
    from secagg.clients.training import flat_params
    from secagg.protocols.feddisco import vae_encoder_means

    torch.manual_seed(0)
    model = BetaVAE(n_in=7, hidden=5)
    x = torch.randn(11, 7)
    with torch.no_grad():
        expected = model.encode(x).numpy()
    got = vae_encoder_means(flat_params(model), x.numpy().astype(np.float64), 7, 5, LATENT)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got.shape == (11, LATENT) and np.ptp(got) > 0.1  # not a degenerate comparison
