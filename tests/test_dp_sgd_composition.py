"""DP-SGD's ε composed over a run's seeds comes from the steps each client's accountant
counted (it reports them, ``dp_sgd_steps``), not from the ε it reported: checked against
Opacus' accountant fed those steps, against Google's dp-accounting, against an independent
count of the noised optimizer steps, in process and over Flower messages."""

from __future__ import annotations

import json
import logging
import math
import warnings

import dp_accounting
import numpy as np
import pandas as pd
import pytest
import torch
from opacus.optimizers import DPOptimizer
from torch import nn

import secagg
from secagg.clients.privacy import make_private
from secagg.clients.tasks import ClientData
from secagg.clients.training import LocalTrainer
from secagg.dp import RDP_ORDERS
from secagg.errors import StateError
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.report import dp_sgd_histories

DELTA = 1e-5
SEEDS, ROUNDS, STEPS = [1, 2, 3], 2, 3
STUDY = ExperimentConfig(
    task="tcga-brca",
    protocol="fedavg",
    rounds=ROUNDS,
    seeds=SEEDS,
    local_steps=STEPS,
    dp_sgd={"clip": 1.0, "noise": 1.0},
)


def opacus_epsilon(history, orders=RDP_ORDERS) -> float:
    """ε straight from Opacus' RDP accountant fed ``history`` [(z, q, steps), ...]."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(z), float(q), int(n)) for z, q, n in history]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return accountant.get_epsilon(DELTA, alphas=list(orders))


def google_epsilon(history, orders=None) -> float:
    """ε from dp-accounting's RDP accountant: PoissonSampled(q, Gaussian(z)) composed
    ``steps`` times for every (z, q, steps) of every seed."""
    accountant = (
        dp_accounting.rdp.RdpAccountant()
        if orders is None
        else dp_accounting.rdp.RdpAccountant(orders=list(orders))
    )
    for z, q, n in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        accountant.compose(event, int(n))
    logging.disable(logging.WARNING)  # its fractional orders that do not converge, dropped
    try:
        return accountant.get_epsilon(DELTA)
    finally:
        logging.disable(logging.NOTSET)


def inverted_steps(z: float, q: float, epsilon: float) -> int | None:
    """What privacy.json composed from before clients reported their steps: the steps at
    (z, q) whose ε gives back the ε a client reported (a search over ε(n))."""
    from secagg.simulation.privacy import _rdp_epsilon, _unit_rdp

    unit = np.asarray(_unit_rdp(z, q))
    lo, hi = 0, 1
    while _rdp_epsilon(unit * hi, DELTA) < epsilon:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _rdp_epsilon(unit * mid, DELTA) < epsilon else (lo, mid)
    best = min((lo, hi), key=lambda n: abs(_rdp_epsilon(unit * n, DELTA) - epsilon))
    return best if abs(_rdp_epsilon(unit * best, DELTA) - epsilon) <= 1e-9 * epsilon else None


class NoiseCount:
    """Every noised DP-SGD step in this process: Opacus' optimizer adds noise once a step,
    whatever the batch (an empty Poisson batch too)."""

    def __init__(self, monkeypatch):
        self.calls: dict[int, int] = {}
        add_noise = DPOptimizer.add_noise

        def counting(optimizer):
            self.calls[id(optimizer)] = self.calls.get(id(optimizer), 0) + 1
            return add_noise(optimizer)

        monkeypatch.setattr(DPOptimizer, "add_noise", counting)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def tiny_private_trainer(n: int = 4, batch_size: int = 1):
    torch.manual_seed(0)
    data = ClientData(torch.randn(n, 3), torch.randn(n, 1))
    model = nn.Linear(3, 1)
    trainer = LocalTrainer(model, data, nn.functional.mse_loss, batch_size=batch_size, seed=7)
    return make_private(trainer, max_grad_norm=1.0, total_steps=10, noise_multiplier=1.0, seed=3)


def test_a_clients_counted_steps_are_the_noised_steps_it_took_empty_batches_included(
    monkeypatch,
):
    """Sampling rate 1/4 on 4 samples: about a third of the batches are empty. Each is a
    noise-only step, and the accountant counts it like any other."""
    noised = NoiseCount(monkeypatch)
    private = tiny_private_trainer()
    sizes: list[int] = []
    draw = private._next_batch

    def drawn():
        batch = draw()
        sizes.append(len(batch[0]))
        return batch

    monkeypatch.setattr(private, "_next_batch", drawn)
    w = np.zeros(private.n_params)
    for steps in (7, 5, 8):
        private.train(w, lr=0.1, steps=steps)
    assert private.sample_rate == 0.25
    assert sizes.count(0) >= 2  # seeded sampler: 6 of the 20 batches are empty
    assert private.steps_taken() == len(sizes) == 20 == noised.total
    assert private.engine.accountant.history == [(1.0, 0.25, 20)]
    # its ε is the ε of (z, q, the counted steps)
    assert private.epsilon(DELTA) == opacus_epsilon([(1.0, 0.25, 20)])


def test_a_history_at_another_multiplier_or_rate_is_not_reported_as_the_clients_steps():
    private = tiny_private_trainer()
    private.engine.accountant.history = [(1.0, 0.25, 3), (2.0, 0.25, 4)]
    with pytest.raises(StateError, match="cannot be reported as its own"):
        private.steps_taken()
    private.engine.accountant.history = []
    assert private.steps_taken() == 0


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study over 3 seeds, with every noised optimizer step counted on the side."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        noised = NoiseCount(monkeypatch)
        out = tmp_path_factory.mktemp("study")
        result = secagg.run(STUDY, out=out)
    finally:
        monkeypatch.undo()
    return result, json.loads((out / "privacy.json").read_text()), noised, out


def client_history(report: dict, client: str) -> list[tuple[float, float, int]]:
    d = report["dp_sgd"]
    return [
        (
            d["noise_multiplier_per_seed_and_client"][str(s)][client],
            d["sample_rate_per_seed_and_client"][str(s)][client],
            ROUNDS * STEPS,  # counted here: each round is STEPS noised steps (fedavg)
        )
        for s in SEEDS
    ]


def test_each_client_reports_the_steps_it_took_in_every_round_and_seed(study):
    result, report, noised, out = study
    metrics = pd.read_csv(out / "metrics.csv")
    clients = sorted(c[len("dp_sgd_steps_") :] for c in metrics if c.startswith("dp_sgd_steps_"))
    assert clients == [f"client_{k}" for k in range(6)]
    trained = metrics[metrics["round"] > 0]
    for c in clients:
        # after round r, r × STEPS steps in this seed (a fresh client, accountant, per seed)
        assert (trained[f"dp_sgd_steps_{c}"] == trained["round"] * STEPS).all()
    # and the noised steps of the whole study, counted in Opacus' optimizer
    assert noised.total == len(SEEDS) * len(clients) * ROUNDS * STEPS
    steps = report["dp_sgd"]["steps_per_seed_and_client"]
    assert steps == {str(s): {c: ROUNDS * STEPS for c in clients} for s in SEEDS}
    # a plaintext item the server learns, declared (a function of public settings and n_i)
    audit = json.loads((out / "audit_summary.json").read_text())
    assert "dp_sgd_steps" in audit["learned_in_plaintext"]
    assert "dp_sgd_steps" in audit["declared_plaintext_items"]
    assert "dp_sgd_steps" not in audit["undeclared_plaintext_items"]
    assert "dp_sgd_steps" not in audit["not_dp_protected_items"]


def test_composed_epsilon_is_opacus_fed_every_counted_step_exactly(study):
    _, report, _, _ = study
    composed = report["dp_sgd"]["epsilon_composed_over_seeds_per_client"]
    assert len(composed) == 6 and report["dp_sgd"]["not_composed"] == {}
    for client, eps in composed.items():
        history = client_history(report, client)
        # the same RDP curves added in the same order: equal to rounding
        assert eps == pytest.approx(opacus_epsilon(history), rel=1e-12)
        # one accountant fed every step one by one merges equal (z, q): the same again
        merged = [(history[0][0], history[0][1], sum(n for *_, n in history))]
        assert {(z, q) for z, q, _ in history} == {merged[0][:2]}
        assert eps == pytest.approx(opacus_epsilon(merged), rel=1e-12)
        per_seed = report["dp_sgd"]["epsilon_per_seed_and_client"]
        assert all(eps > per_seed[str(s)][client] for s in SEEDS)
    assert report["dp_sgd"]["worst_client_epsilon_composed_over_seeds"] == max(composed.values())


def test_composed_epsilon_agrees_with_google_dp_accounting(study):
    """Both are RDP accountants of the Poisson-subsampled Gaussian. At integer orders both
    evaluate its RDP exactly (measured: equal to 6e-16): on the integer orders of our grid
    Opacus and dp-accounting fed the same counted steps agree to 1e-12. At fractional orders
    dp-accounting's values run above the exact integral (α 3.2, q 0.2: 9.0e-4 above, where
    Opacus is within 2.3e-13 of it: ``test_opacus_fractional_order_rdp_is_the_exact_
    integral``) and it drops those it cannot evaluate (α < 1.8 at q 0.2), so its ε on its
    default grid is at or above ours, by at most 3.6e-4 on this study (q 0.2, 18 steps;
    3.4e-6 to 2.0e-5 at q 0.03-0.06): the tolerance is 1e-3."""
    _, report, _, _ = study
    integer_orders = [a for a in RDP_ORDERS if float(a).is_integer()]
    for client, eps in report["dp_sgd"]["epsilon_composed_over_seeds_per_client"].items():
        history = client_history(report, client)
        on_integers = opacus_epsilon(history, integer_orders)
        assert on_integers == pytest.approx(google_epsilon(history, integer_orders), rel=1e-12)
        # our grid is the integer one and finer: never above it
        assert eps <= on_integers
        google = google_epsilon(history)
        assert google * (1 - 1e-3) <= eps <= google * (1 + 1e-12), (client, eps, google)


def test_opacus_fractional_order_rdp_is_the_exact_integral():
    """Where dp-accounting's ε is above ours the optimal order is fractional: there Opacus'
    RDP of one step of the Poisson-subsampled Gaussian equals log E_{N(0,z²)}[(1 − q + q
    exp((2x − 1) / 2z²))^α] / (α − 1) (Mironov et al. 2019's A_α, which bounds its RDP),
    integrated numerically, to 1e-9."""
    from opacus.accountants.analysis.rdp import compute_rdp
    from scipy import integrate

    z, q = 1.0, 0.2
    for alpha in (1.5, 2.5, 3.2, 4.5):

        def integrand(x, alpha=alpha):  # the tails beyond ±40 z are below 1e-300
            ratio = math.log1p(q * math.expm1((2 * x - 1) / (2 * z**2)))
            return math.exp(alpha * ratio - x**2 / (2 * z**2)) / math.sqrt(2 * math.pi * z**2)

        a, _ = integrate.quad(
            integrand, -40 * z, 40 * z, points=[0.0, 0.5], epsabs=0, epsrel=1e-13, limit=200
        )
        exact = math.log(a) / (alpha - 1)
        ours = compute_rdp(q=q, noise_multiplier=z, steps=1, orders=[alpha])[0]
        assert ours == pytest.approx(exact, rel=1e-9), alpha


def test_composed_epsilon_is_at_least_what_the_inverted_epsilon_gave(study):
    """Before, the steps were recovered from each seed's reported ε: on this study that
    search finds the counted steps, so both compose to the same ε; from counted steps it is
    never below."""
    _, report, _, _ = study
    d = report["dp_sgd"]
    for client, eps in d["epsilon_composed_over_seeds_per_client"].items():
        old = []
        for s in SEEDS:
            z = d["noise_multiplier_per_seed_and_client"][str(s)][client]
            q = d["sample_rate_per_seed_and_client"][str(s)][client]
            n = inverted_steps(z, q, d["epsilon_per_seed_and_client"][str(s)][client])
            old.append((z, q, n))
        assert all(n == ROUNDS * STEPS for *_, n in old)
        assert eps >= opacus_epsilon(old)


def test_privacy_json_gives_per_seed_and_composed_epsilon_for_dp_sgd(study):
    _, report, _, _ = study
    d = report["dp_sgd"]
    assert set(d["worst_client_epsilon_per_seed"]) == {str(s) for s in SEEDS}
    for s in SEEDS:
        worst = d["worst_client_epsilon_per_seed"][str(s)]
        assert worst == max(d["epsilon_per_seed_and_client"][str(s)].values())
        assert d["worst_client_epsilon_composed_over_seeds"] > worst
    assert "counted steps" in d["composed_from"]
    assert "each seed alone" in d["per_seed_figures"]


def test_metrics_without_counted_steps_compose_no_epsilon_and_say_why(study):
    """A run folder written before clients reported their steps (resumed, or read again)
    has no counted steps: no composed ε for its clients, no worst client, and why."""
    from secagg.simulation.report import privacy_report

    result, report, _, _ = study
    old = result.metrics.drop(columns=[c for c in result.metrics if c.startswith("dp_sgd_steps_")])
    histories, missing = dp_sgd_histories(old, SEEDS)
    assert histories == {} and sorted(missing) == [f"client_{k}" for k in range(6)]
    assert all("no counted steps" in why for why in missing.values())
    d = privacy_report(STUDY, old, result.audit)["dp_sgd"]
    assert d["epsilon_composed_over_seeds_per_client"] == {}
    assert d["worst_client_epsilon_composed_over_seeds"] is None
    assert d["not_composed"] == missing
    # one client's steps missing in one seed: the others compose, the worst does not
    partial = result.metrics.copy()
    partial.loc[partial["seed"] == SEEDS[1], "dp_sgd_steps_client_2"] = float("nan")
    d = privacy_report(STUDY, partial, result.audit)["dp_sgd"]
    assert sorted(d["not_composed"]) == ["client_2"]
    assert "client_2" not in d["epsilon_composed_over_seeds_per_client"]
    assert d["worst_client_epsilon_composed_over_seeds"] is None
    assert (
        d["epsilon_composed_over_seeds_per_client"]["client_5"]
        == report["dp_sgd"]["epsilon_composed_over_seeds_per_client"]["client_5"]
    )


def test_over_flower_messages_clients_report_their_steps_and_epsilon_composes_alike(
    tmp_path, monkeypatch
):
    """Over Flower's Message API each message rebuilds a client from its node's folder (its
    accountant from its state): the counted steps reach metrics.csv, and the ε composed from
    them, as in process (on plain, two seeds)."""
    from dataclasses import replace

    from secagg.flower.apps import run_on_flower
    from secagg.flower.deployment import prepare
    from tests.flower_grid import LoopbackGrid

    config = replace(STUDY, backend="plain", seeds=[1, 2], rounds=2, local_steps=2)
    noised = NoiseCount(monkeypatch)
    nodes = prepare(tmp_path / "deployment", config)
    grid = LoopbackGrid({100 + k: path for k, path in enumerate(nodes.values())})
    out = tmp_path / "out"
    run_on_flower(grid, deployment=tmp_path / "deployment", out=out, timeout=60, connect_timeout=5)
    metrics = pd.read_csv(out / "metrics.csv")
    trained = metrics[metrics["round"] > 0]
    columns = [c for c in metrics if c.startswith("dp_sgd_steps_")]
    assert len(columns) == 6
    for c in columns:
        assert (trained[c] == trained["round"] * 2).all()
    assert noised.total == 2 * 6 * 2 * 2
    report = json.loads((out / "privacy.json").read_text())["dp_sgd"]
    assert report["not_composed"] == {}
    for client, eps in report["epsilon_composed_over_seeds_per_client"].items():
        q = {report["sample_rate_per_seed_and_client"][str(s)][client] for s in (1, 2)}
        assert len(q) == 1
        assert eps == pytest.approx(opacus_epsilon([(1.0, q.pop(), 4)] * 2), rel=1e-12)
