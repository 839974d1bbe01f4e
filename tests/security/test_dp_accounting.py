"""DP accounting that holds against what the server actually receives.

Sums released in one round from the same noised uploads share their noise and are one
mechanism; LARC's two sums can expose one client's noised upload outright. On plain the server
reads every noised upload, so that is what ε is accounted against.
"""

import math

import numpy as np
import pytest

from secagg.backends import make_backends
from secagg.dp import ClientDP, joint_noise_multiplier, realised_noise_multiplier
from secagg.protocols import make_protocol
from secagg.protocols.optimizers import SGD
from secagg.server.engine import Server
from secagg.server.plan import TrainingPlan
from secagg.server.transport import InProcessTransport
from secagg.simulation.privacy import client_level_epsilon
from tests.conftest import honest_client

IDS = [f"c{i}" for i in range(6)]
EXPOSING = ({c: (1 / 3 if c == "c0" else 1.0) for c in IDS}, {c: 1.0 for c in IDS})


def test_joint_multiplier_by_hand():
    one = {"a": 2.0, "b": 1.0, "c": 1.0}
    assert joint_noise_multiplier([one], 0.7) == pytest.approx(realised_noise_multiplier(one, 0.7))
    assert joint_noise_multiplier([one, one], 0.7) == pytest.approx(
        realised_noise_multiplier(one, 0.7)
    )  # the same sum twice tells nothing more
    # the exposing LARC pair: their difference is (2/3)·c0's noised upload, so z = σ_c
    assert joint_noise_multiplier(list(EXPOSING), 0.7) == pytest.approx(0.7, rel=1e-9)
    per_release = [realised_noise_multiplier(w, 0.7) for w in EXPOSING]
    assert per_release == pytest.approx([0.7 * math.sqrt(1 / 9 + 5), 0.7 * math.sqrt(6)])


def test_larc_round_is_accounted_jointly_through_the_engine():
    """A LARC round whose ΔL make α = (≈1/3, 1, …, 1) after Ĝ's weights (1, …, 1): the
    engine accounts the round at ≈ σ_c, not as two releases at 2.3 σ_c and 2.4 σ_c, and the
    ε it reports is the larger one a joint analysis gives."""
    gs = {c: (np.array([4.0, 0.0]) if c == "c0" else np.array([1.0, -1.0]), 10.0) for c in IDS}
    dp = ClientDP(clip=1.0, noise_multiplier=2.0, expected_clients=6)
    server = Server(
        make_protocol("larc"),
        make_backends("plain", IDS)[0],
        SGD(2),
        InProcessTransport({c: honest_client(c, g, n) for c, (g, n) in gs.items()}),
        np.zeros(2),
        plan=TrainingPlan(local_steps=1, client_dp=dp),
    )
    server.run_round(0)
    (event,) = server.privacy_events
    alpha = server.protocol.alpha_prev
    assert alpha["c0"] == pytest.approx(1 / 3, abs=1e-6) and alpha["c1"] == pytest.approx(1)
    sigma = dp.client_sigma
    assert event["release"] == "g_hat+global_update"
    assert event["sums_multiplier"] == pytest.approx(sigma, rel=1e-4)
    old = [realised_noise_multiplier(w, sigma) for w in ({c: 1.0 for c in IDS}, alpha)]
    eps_joint = client_level_epsilon([event], 1e-5)
    eps_old = client_level_epsilon([{"noise_multiplier": z} for z in old], 1e-5)
    assert eps_joint > 1.5 * eps_old, (eps_joint, eps_old)


@pytest.mark.slow
def test_on_plain_epsilon_is_against_each_noised_upload():
    from secagg.simulation.experiment import ExperimentConfig, run_experiment

    config = ExperimentConfig(
        task="tcga-brca",
        protocol="fedavg",
        rounds=2,
        seeds=[1],
        local_steps=2,
        client_dp={"clip": 1.0, "noise": 1.0},
    )
    plain = run_experiment(config).metrics.iloc[-1]
    assert plain["noise_multiplier_realised"] == pytest.approx(1.0 / math.sqrt(6))
    assert plain["eps_client_level"] > 1.5 * plain["eps_client_level_sums"]
