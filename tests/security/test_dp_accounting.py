"""DP accounting that holds against what the server actually receives.

Sums released in one round from the same noised uploads share their noise and are one
mechanism; LARC's two sums can expose one client's noised upload outright. On plain the server
reads every noised upload, so that is what ε is accounted against. The noise itself comes
from the OS CSPRNG unless a run asks for reproducible ("seeded") noise, which a server that
knows the seed removes.
"""

import math

import numpy as np
import pytest
import torch

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


def _noise_removed_by_a_server_that_knows_the_seed(dp_noise: str) -> tuple[float, float]:
    """Review finding (issue 31, item 6): each client's DP noise came from the run's seed,
    which the server knows (it names it over Flower). The server redraws every client's noise
    from the seed and subtracts it from the revealed FedAvg update of clients whose own
    updates are ~0 (client lr 1e-12). Returns (‖what is left‖, ‖the noise‖)."""
    from secagg.clients.tasks import get_task
    from secagg.clients.training import flat_params
    from secagg.simulation.experiment import ExperimentConfig, run_experiment

    seed, clip, z = 3, 0.5, 1.5
    config = ExperimentConfig(
        task="digits-dir8",
        protocol="fedavg",
        rounds=1,
        seeds=[seed],
        local_steps=1,
        batch_size=32,
        client_lr="1e-12",
        client_dp={"clip": clip, "noise": z},
        dp_noise=dp_noise,
    )
    result = run_experiment(config)
    task = get_task(config.task)
    torch.manual_seed(seed)
    revealed = result.final_params[seed] - flat_params(task.make_model())
    sizes = np.array([len(p) for p in task.load().train], dtype=float)
    weights, sigma_c = sizes / sizes.sum(), z / math.sqrt(len(sizes))
    predicted = sum(  # each client's generator as the driver seeds it from the run's seed
        w * np.random.default_rng(seed * 1000 + k + 500).normal(0.0, sigma_c * clip, revealed.size)
        for k, w in enumerate(weights)
    )
    return float(np.linalg.norm(revealed - predicted)), float(np.linalg.norm(revealed))


def test_a_server_that_knows_the_seed_cannot_remove_the_default_dp_noise():
    """By default (dp_noise "os") the clients' noise comes from the OS CSPRNG: redrawing it
    from the seed leaves all of it (√2 times, two independent draws). Only a run that asks
    for "seeded" noise (a reproducible simulation) gives it away."""
    left, noise = _noise_removed_by_a_server_that_knows_the_seed("os")
    assert left > 1.2 * noise, (left, noise)
    left, noise = _noise_removed_by_a_server_that_knows_the_seed("seeded")
    assert left < 1e-6 * noise, (left, noise)  # the attack works on seeded noise
