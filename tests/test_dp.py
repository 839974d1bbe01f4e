"""Differential privacy: clipping, the calibrated noise of a revealed aggregate, accounting
cross-checked against Google's dp-accounting, and the audit with DP on and off."""

from __future__ import annotations

import math
from dataclasses import replace

import dp_accounting
import numpy as np
import pytest
import torch

from secagg.clients.tasks import get_task
from secagg.clients.training import flat_params
from secagg.dp import (
    RDP_ORDERS,
    ClientDP,
    ScalarDP,
    clip_l2,
    noised_update,
    privatize_scalar,
    realised_noise_multiplier,
)
from secagg.errors import ConfigError
from secagg.runspec.settings import parse_numbers
from secagg.simulation.cli import build_parser
from secagg.simulation.experiment import ExperimentConfig, run_experiment
from secagg.simulation.privacy import gaussian_epsilon


def test_clipping_bounds_every_update_and_leaves_short_ones_alone():
    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 1e3):
        for _ in range(20):
            v = rng.normal(0, scale, 50)
            c = clip_l2(v, 0.7)
            assert np.linalg.norm(c) <= 0.7 * (1 + 1e-12)
            if np.linalg.norm(v) <= 0.7:
                np.testing.assert_array_equal(c, v)
            else:  # same direction
                np.testing.assert_allclose(c / np.linalg.norm(c), v / np.linalg.norm(v))


def test_noised_update_has_the_stated_spread():
    rng = np.random.default_rng(1)
    noise = noised_update(np.zeros(200_000), clip=0.5, sigma=0.8, rng=rng)
    assert noise.std() == pytest.approx(0.4, rel=0.01)


def test_realised_noise_multiplier_by_hand():
    dp = ClientDP(clip=1.0, noise_multiplier=2.0, expected_clients=4)
    assert dp.client_sigma == pytest.approx(1.0)
    # four equal weights: z* itself
    assert realised_noise_multiplier({c: 0.25 for c in "abcd"}, dp.client_sigma) == pytest.approx(
        2.0
    )
    # (0.5, 0.25, 0.25): ||w|| = sqrt(0.375), max 0.5 -> 1.2247
    assert realised_noise_multiplier({"a": 0.5, "b": 0.25, "c": 0.25}, 1.0) == pytest.approx(
        math.sqrt(0.375) / 0.5
    )
    # LARC-style unnormalised weights: only the ratios matter
    assert realised_noise_multiplier({"a": 2.0, "b": 1.0, "c": 1.0}, 1.0) == pytest.approx(
        math.sqrt(0.375) / 0.5
    )


def test_privatized_scalars_are_clipped_then_noised():
    rng = np.random.default_rng(2)
    draws = np.array([privatize_scalar(5.0, -1.0, 1.0, 0.5, rng) for _ in range(20_000)])
    assert draws.mean() == pytest.approx(1.0, abs=0.03)  # clipped to the top of the range
    assert draws.std() == pytest.approx(1.0, rel=0.03)  # 0.5 · (1 − (−1))


@pytest.mark.parametrize("backend", ["plain", "ckks"])
def test_revealed_aggregate_carries_the_calibrated_noise(backend):
    """Clients with ~zero updates (client lr 1e-12): the revealed FedAvg update is pure noise
    Σ w_i ν_i with per-coordinate variance (σ_c C)² Σ w_i²; check it with a χ² bound."""
    cfg = ExperimentConfig(
        task="digits-dir8",
        protocol="fedavg",
        backend=backend,
        rounds=1,
        seeds=[3],
        local_steps=1,
        batch_size=32,
        client_lr="1e-12",
        client_dp={"clip": 0.5, "noise": 1.5},
    )
    result = run_experiment(cfg)
    task = get_task(cfg.task)
    torch.manual_seed(3)
    initial = flat_params(task.make_model())
    noise = result.final_params[3] - initial
    sizes = np.array([len(p) for p in task.load().train], dtype=float)
    w = sizes / sizes.sum()
    sigma_c = 1.5 / math.sqrt(len(sizes))
    expected_var = (sigma_c * 0.5) ** 2 * np.sum(w**2)
    n = noise.size
    ratio = np.sum(noise**2) / (n * expected_var)  # χ²_n / n: mean 1, sd sqrt(2/n)
    assert abs(ratio - 1) < 5 * math.sqrt(2 / n), ratio
    assert abs(noise.mean()) < 5 * math.sqrt(expected_var / n)
    # and the accountant was fed the realised multiplier: of these weights for a server that
    # sees the sum (ckks), of each noised upload for one that reads them (plain)
    z = result.metrics["noise_multiplier_realised"].dropna().iloc[-1]
    sums = sigma_c * np.linalg.norm(w) / w.max()
    assert z == pytest.approx(sums if backend == "ckks" else sigma_c, rel=1e-9)


@pytest.mark.parametrize(
    "z, q, steps",
    [
        (1.0, 1.0, 10),
        (0.8, 0.01, 1000),
        (1.5, 0.05, 300),
        (4.0, 1.0, 50),
        (1.1, 0.004, 5000),
        (1.0, 0.2, 10),  # sampling rate 0.2: digits' DP-SGD clients sample at 0.15-0.25
        (1.0, 0.2, 100),
        (2.0, 0.2, 50),
    ],
)
def test_rdp_epsilon_matches_google_dp_accounting_within_2_percent(z, q, steps):
    delta = 1e-5
    ours = gaussian_epsilon([(z, q, steps)], delta)
    google = dp_accounting.rdp.RdpAccountant(orders=RDP_ORDERS)
    event = dp_accounting.GaussianDpEvent(z)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    google.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    theirs = google.get_epsilon(delta)
    assert ours == pytest.approx(theirs, rel=0.02), (ours, theirs)


@pytest.mark.parametrize(
    "z, q, steps", [(1.0, 0.2, 10), (1.0, 0.2, 100), (2.0, 0.2, 50), (0.8, 0.2, 500)]
)
def test_rdp_epsilon_is_a_valid_bound_within_20_percent_of_the_pld_accountant(z, q, steps):
    """At sampling rate 0.2 Google's RDP accountant drops the fractional orders it cannot
    evaluate (13 % above ours at z 0.8, 500 steps); its PLD accountant is the tight reference:
    ours must never be below it, and RDP's known looseness stays under 20 % here."""
    ours = gaussian_epsilon([(z, q, steps)], 1e-5)
    pld = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    pld.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    tight = pld.get_epsilon(1e-5)
    assert tight <= ours <= 1.2 * tight, (ours, tight)


def test_no_noise_means_no_finite_epsilon():
    assert gaussian_epsilon([(0.0, 1.0, 3)], 1e-5) == math.inf
    assert gaussian_epsilon([], 1e-5) == 0.0


@pytest.mark.slow
def test_dp_sgd_reaches_its_target_epsilon_and_reports_it_per_client():
    cfg = ExperimentConfig(
        task="digits-dir8",
        protocol="fedavg",
        rounds=2,
        seeds=[0],
        local_steps=5,
        batch_size=32,
        dp_sgd={"clip": 1.0, "epsilon": 3.0},
    )
    m = run_experiment(cfg).metrics
    per_client = [c for c in m.columns if c.startswith("eps_dp_sgd_client_")]
    assert len(per_client) == 8
    final = m[m["round"] == 2]
    for c in per_client:
        assert final[c].iloc[0] == pytest.approx(3.0, rel=0.02)
    after_one = m[m["round"] == 1]
    assert (after_one[per_client].to_numpy() < final[per_client].to_numpy()).all()
    # the multiplier each client solved for and its sampling rate are recorded, and they
    # give back the target ε over the run's 10 steps
    from secagg.simulation.privacy import gaussian_epsilon

    for k in range(8):
        z = final[f"dp_sgd_noise_multiplier_client_{k}"].iloc[0]
        q = final[f"dp_sgd_sample_rate_client_{k}"].iloc[0]
        assert 0 < q < 1 and z > 0
        assert gaussian_epsilon([(z, q, 10)], 1e-5) == pytest.approx(3.0, rel=0.02)


def test_dp_on_and_off_under_ckks_show_the_server_the_same_items():
    base = ExperimentConfig(
        task="tcga-brca", protocol="larc", backend="ckks", rounds=2, seeds=[1], local_steps=3
    )
    off = run_experiment(base).audit.summary()
    on = run_experiment(
        replace(
            base,
            client_dp={"clip": 1.0, "noise": 1.0},
            scalar_dp={"low": -1.0, "high": 1.0, "noise": 1.0},
            dp_sgd={"clip": 1.0, "noise": 1.0},
            # fixed noise, so that some round's release is allowed (with OS noise the release
            # rules could refuse every round's, and the server would learn no global_update)
            dp_noise="seeded",
        )
    ).audit.summary()
    # DP-SGD adds four items: each client's ε so far, its noise multiplier, sampling rate
    # and the steps its accountant counted, functions of public settings and n_i
    assert set(on["learned_in_plaintext"]) == set(off["learned_in_plaintext"]) | {
        "dp_sgd_epsilon",
        "dp_sgd_noise_multiplier",
        "dp_sgd_sample_rate",
        "dp_sgd_steps",
    }
    assert on["undeclared_plaintext_items"] == off["undeclared_plaintext_items"] == []
    assert on["individual_updates_revealed"] is False
    assert on["dp_protected_items"] == ["delta_loss", "global_update"]
    assert off["dp_protected_items"] == []
    assert "delta_loss" in off["not_dp_protected_items"]
    assert on["not_dp_protected_items"] == ["n_samples"]
    # each protected item says by what, and how far that goes
    assert set(on["dp_coverage"]) == {"delta_loss", "global_update"}
    assert "client-level DP" in on["dp_coverage"]["global_update"]
    assert "sample-level DP-SGD" in on["dp_coverage"]["global_update"]
    assert on["dp_coverage"]["delta_loss"].startswith("scalar DP")


def test_dp_sgd_alone_covers_the_update_at_sample_level_and_says_so():
    """With DP-SGD only, the revealed update is a function of DP-SGD-trained models: it is
    covered at sample level (not client level), and the audit says which and how far,
    instead of listing it among the items learned without DP noise."""
    base = ExperimentConfig(
        task="tcga-brca", protocol="fedavg", backend="ckks", rounds=1, seeds=[1], local_steps=2
    )
    summary = run_experiment(replace(base, dp_sgd={"clip": 1.0, "noise": 1.0})).audit.summary()
    assert "global_update" in summary["dp_protected_items"]
    assert "global_update" not in summary["not_dp_protected_items"]
    coverage = summary["dp_coverage"]["global_update"]
    assert coverage.startswith("sample-level DP-SGD") and "not client-level" in coverage


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"protocol": "regagg", "client_dp": {"clip": 1.0, "noise": 1.0}}, "weighted sum"),
        ({"dp_sgd": {"clip": 1.0, "noise": 1.0, "epsilon": 2.0}}, "exactly one"),
        ({"dp_sgd": {"noise": 1.0}}, "clip"),
        ({"dp_sgd": {"epsilon": 3.0}}, r"write clip=C,epsilon=E .*e\.g\. clip=1\.0,epsilon=3"),
        ({"client_dp": {"clip": -1.0, "noise": 1.0}}, "clip norm"),
        ({"scalar_dp": {"low": 1.0, "high": 0.0, "noise": 1.0}}, "low < high"),
        ({"dp_delta": 2.0}, "dp_delta"),
    ],
)
def test_bad_dp_settings_are_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig(**changes).validate()


def test_cli_reads_dp_settings():
    args = build_parser().parse_args(
        ["run", "--client-dp", "clip=0.5,noise=1.2", "--dp-sgd", "clip=1,epsilon=8"]
    )
    assert args.client_dp == {"clip": 0.5, "noise": 1.2}
    assert args.dp_sgd == {"clip": 1.0, "epsilon": 8.0}
    with pytest.raises(Exception):
        parse_numbers("clip:0.5")
    with pytest.raises(ConfigError):
        ScalarDP(0.0, 1.0, 0.0)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"dp_sgd": {"clip": 1.0, "noise": 0.0}}, "must be > 0"),
        ({"dp_sgd": {"clip": 1.0, "epsilon": -2.0}}, "must be > 0"),
        ({"dp_sgd": {"clip": 0.0, "noise": 1.0}}, "clip must be > 0"),
        ({"dp_sgd": {"clip": 1.0, "noise": 1.0}, "fedprox_mu": 0.1}, "FedProx"),
        ({"scalar_dp": {"low": 0.0, "high": 1.0, "noise": "lots"}}, "must be a number"),
        ({"client_dp": {"clip": 1.0}}, "client_dp takes"),
        ({"scalar_dp": {"low": 0.0, "high": 1.0, "noise": 0.0}}, "noise multiplier > 0"),
    ],
)
def test_more_bad_dp_settings_are_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig(**changes).validate()


def test_the_engine_itself_refuses_client_dp_for_protocols_that_are_not_sums():
    from secagg.backends import make_backends
    from secagg.protocols import make_protocol
    from secagg.protocols.optimizers import SGD
    from secagg.server.engine import Server
    from secagg.server.plan import TrainingPlan
    from secagg.server.transport import InProcessTransport

    server_backend, _ = make_backends("plain", ["c0"])
    with pytest.raises(ConfigError, match="not one weighted sum"):
        Server(
            make_protocol("regagg"),
            server_backend,
            SGD(dim=3),
            InProcessTransport({}),
            np.zeros(3),
            plan=TrainingPlan(local_steps=1, client_dp=ClientDP(1.0, 1.0, 1)),
        )


def test_make_private_needs_exactly_one_noise_setting():
    from secagg.clients.privacy import make_private
    from secagg.clients.training import LocalTrainer

    task = get_task("digits-dir8")
    trainer = LocalTrainer(task.make_model(), task.load().train[0], task.loss, 32, seed=0)
    with pytest.raises(ConfigError, match="exactly one"):
        make_private(trainer, max_grad_norm=1.0, total_steps=10)
    with pytest.raises(ConfigError, match="noise_multiplier > 0"):
        make_private(trainer, max_grad_norm=1.0, total_steps=10, noise_multiplier=0.0)


def test_dp_noise_is_from_the_os_by_default_and_seeded_only_when_asked(tmp_path):
    """OS-seeded noise is the default and differs between identical runs; seeded noise
    (asked for explicitly) repeats exactly, a reproducible simulation, and privacy.json
    says which one a run used, and that seeded noise is insecure."""
    import json

    from secagg.simulation.api import run

    assert ExperimentConfig().dp_noise == "os"
    base = dict(
        task="tcga-brca",
        protocol="fedavg",
        rounds=1,
        seeds=[2],
        local_steps=1,
        client_dp={"clip": 1.0, "noise": 1.0},
    )
    seeded = [
        run(**base, dp_noise="seeded", out=tmp_path / f"seeded{i}").final_params[2]
        for i in range(2)
    ]
    np.testing.assert_array_equal(seeded[0], seeded[1])
    fresh = [run(**base, out=tmp_path / str(i)) for i in range(2)]
    assert np.abs(fresh[0].final_params[2] - fresh[1].final_params[2]).max() > 1e-6
    report = json.loads((tmp_path / "0" / "privacy.json").read_text())
    assert "OS CSPRNG" in report["noise_source"]
    report = json.loads((tmp_path / "seeded0" / "privacy.json").read_text())
    assert "INSECURE" in report["noise_source"]


def _accountant_epsilon(history, delta=1e-5):
    """ε straight from Opacus' RDP accountant fed ``history`` [(z, q, steps), ...]."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(z), float(q), int(n)) for z, q, n in history]
    return accountant.get_epsilon(1e-5, alphas=RDP_ORDERS)


@pytest.mark.slow
def test_privacy_json_composes_epsilon_over_every_seed(tmp_path):
    """Every seed trains on the same clients' data, so privacy.json gives each mechanism's ε
    composed over all of them (the accountant fed every seed's steps), beside each seed's
    own ε, labelled so."""
    import json

    import secagg

    seeds, rounds, steps = [1, 2, 3], 2, 2
    sigma_s = 2.0
    config = ExperimentConfig(
        task="tcga-brca",
        protocol="larc",
        rounds=rounds,
        seeds=seeds,
        local_steps=steps,
        client_dp={"clip": 1.0, "noise": 1.0},
        scalar_dp={"low": -1.0, "high": 1.0, "noise": sigma_s},
        dp_sgd={"clip": 1.0, "noise": 1.0},
    )
    result = secagg.run(config, out=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    assert report["seeds_composed"]["seeds"] == seeds
    # the engine's own record of every round's releases, per seed (run.json)
    events = json.loads((tmp_path / "run.json").read_text())["finished"]
    assert sorted(int(s) for s in events) == seeds

    client = report["client_level"]
    for key, per_seed, multiplier in [
        ("epsilon_composed_over_seeds", "epsilon_per_seed", "noise_multiplier"),
        (
            "epsilon_against_sums_only_composed_over_seeds",
            "epsilon_against_sums_only_per_seed",
            "sums_multiplier",
        ),
    ]:
        each = {
            s: [(e[multiplier], 1.0, 1) for e in events[str(s)]["privacy_events"]] for s in seeds
        }
        assert sum(len(h) for h in each.values()) == rounds * len(seeds)
        expected = _accountant_epsilon([step for s in seeds for step in each[s]])
        assert client[key] == pytest.approx(expected, rel=1e-12)
        assert set(client[per_seed]) == {str(s) for s in seeds}
        for s in seeds:
            assert client[per_seed][str(s)] == pytest.approx(_accountant_epsilon(each[s]))
            assert client[key] > 1.2 * client[per_seed][str(s)]
    assert "each seed alone" in client["per_seed_figures"]

    # DP-SGD: each client's accountant took rounds × steps steps in every seed
    dp_sgd = report["dp_sgd"]
    final = result.metrics[result.metrics["round"] == rounds].set_index("seed")
    composed = dp_sgd["epsilon_composed_over_seeds_per_client"]
    assert sorted(composed) == [f"client_{k}" for k in range(6)]
    for cid, eps in composed.items():
        rates = [final.loc[s, f"dp_sgd_sample_rate_{cid}"] for s in seeds]
        assert [final.loc[s, f"dp_sgd_steps_{cid}"] for s in seeds] == [rounds * steps] * 3
        assert [dp_sgd["steps_per_seed_and_client"][str(s)][cid] for s in seeds] == [
            rounds * steps
        ] * 3
        expected = _accountant_epsilon([(1.0, q, rounds * steps) for q in rates])
        assert eps == pytest.approx(expected, rel=1e-12)
        assert all(eps > dp_sgd["epsilon_per_seed_and_client"][str(s)][cid] for s in seeds)
    assert dp_sgd["worst_client_epsilon_composed_over_seeds"] == max(composed.values())
    assert "each seed alone" in dp_sgd["per_seed_figures"]

    # scalar DP: LARC's ΔL, one per client per round, in every seed
    scalars = report["scalars"]
    expected = _accountant_epsilon([(sigma_s, 1.0, rounds * len(seeds))])
    assert scalars["worst_client_epsilon_composed_over_seeds"] == pytest.approx(expected)
    each = _accountant_epsilon([(sigma_s, 1.0, rounds)])
    assert scalars["epsilon_composed_over_seeds_per_client"] == pytest.approx(
        {f"client_{k}": expected for k in range(6)}
    )
    for s in seeds:
        eps = scalars["worst_client_epsilon_per_seed"][str(s)]
        assert eps == pytest.approx(each)
        assert scalars["epsilon_per_seed_and_client"][str(s)] == pytest.approx(
            {f"client_{k}": each for k in range(6)}
        )
        assert scalars["worst_client_epsilon_composed_over_seeds"] > eps


def test_a_client_split_per_seed_still_composes_over_every_seed():
    """client_split gives each seed its own split, but a split only holds out a share of
    each client's samples for testing: the same clients, and most of the same samples,
    train in every seed, so ε composes over all of them."""
    from secagg.simulation.report import privacy_report

    seeds = [1, 2, 3]
    config = ExperimentConfig(
        task="tcga-brca",
        protocol="fedavg",
        rounds=1,
        seeds=seeds,
        local_steps=1,
        client_split=0.25,
        client_dp={"clip": 1.0, "noise": 1.0},
    )
    result = run_experiment(config)
    report = privacy_report(config, result.metrics, result.audit)
    assert report["seeds_composed"]["seeds"] == seeds
    history = [(e["noise_multiplier"], 1.0, 1) for s in seeds for e in result.privacy_events[s]]
    assert len(history) == len(seeds)
    composed = report["client_level"]["epsilon_composed_over_seeds"]
    assert composed == pytest.approx(_accountant_epsilon(history), rel=1e-12)
    assert all(composed > e for e in report["client_level"]["epsilon_per_seed"].values())
    # a run folder written after its first seed covers that seed only
    first = result.metrics[result.metrics["seed"] == seeds[0]]
    partial = privacy_report(config, first, result.audit)
    assert partial["seeds_composed"]["seeds"] == seeds[:1]
    assert partial["client_level"]["epsilon_composed_over_seeds"] == pytest.approx(
        report["client_level"]["epsilon_per_seed"][seeds[0]]
    )


def test_a_run_without_dp_reports_no_delta_nor_noise_and_one_seed_no_spread(tmp_path):
    """privacy.json of a run without DP names no δ and no noise source (it once listed
    both), and the closing line of one seed shows no "± 0.0000"."""
    import json

    from secagg.simulation.api import run
    from secagg.simulation.cli import final_line

    result = run(
        task="tcga-brca", protocol="fedavg", rounds=1, seeds=[2], local_steps=1, out=tmp_path / "r"
    )
    report = json.loads((tmp_path / "r" / "privacy.json").read_text())
    assert report["delta"] is None and report["noise_source"] is None
    assert report["seeds_composed"] is None
    assert "±" not in final_line(result)
    two = run(task="tcga-brca", protocol="fedavg", rounds=1, seeds=[2, 3], local_steps=1)
    assert "±" in final_line(two)


def test_dp_sgd_by_epsilon_solves_once_per_sampling_rate_and_says_so():
    """Clients whose batch counts are equal share one RDP solve (they once solved each), and
    the calibration announces itself (it sat silent for tens of seconds)."""
    from secagg.clients.privacy import noise_for_epsilon
    from secagg.simulation.api import run

    noise_for_epsilon.cache_clear()
    lines: list[str] = []
    config = dict(task="tcga-brca", protocol="fedavg", rounds=1, local_steps=2, batch_size=8)
    run(**config, dp_sgd={"clip": 1.0, "epsilon": 5.0}, progress=lines.append)
    data = get_task("tcga-brca").load()
    batches = {-(-len(c.y) // 8) for c in data.train}
    info = noise_for_epsilon.cache_info()
    assert info.misses == len(batches) < data.n_clients
    assert info.hits == data.n_clients - len(batches)
    assert any("calibrating DP-SGD noise to epsilon 5.0" in line for line in lines)
