"""A round in parts (``part_values``, ``secagg.parts``): the same model as the round whole (bit
for bit on plain, within the flooding on the encrypted backends), one release per part, and
a clear ConfigError where a run cannot move in parts."""

from __future__ import annotations

import gc
import weakref
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import secagg.simulation.experiment as experiment
from secagg import wire
from secagg.backends.plain import PlainRunningSum, PlainServer
from secagg.clients.policy import ClientPolicy, PolicyGuard, upload_basis
from secagg.errors import ConfigError, PolicyRefused
from secagg.parts import PART_FIELD, part_bounds, part_lengths
from secagg.protocols.optimizers import make_optimizer
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.experiment import run_experiment

SMALL = ExperimentConfig(
    task="tcga-brca", protocol="fedavg", backend="plain", rounds=2, seeds=[3], local_steps=3
)
PARTS = 7  # tcga-brca's Cox model has 40 parameters: parts of 7, 7, 7, 7, 7, 5


def final(result) -> np.ndarray:
    params = result.final_params
    return np.asarray(params[3] if isinstance(params, dict) else params)


def phases(result) -> Counter:
    return Counter(r.get("phase") for r in result.audit.records if r.get("direction") == "received")


def test_bounds_cover_every_coordinate_once():
    assert part_bounds(40, 7) == [(0, 7), (7, 14), (14, 21), (21, 28), (28, 35), (35, 40)]
    assert part_lengths(40, 7) == (7, 5)
    assert part_bounds(40, 0) == part_bounds(40, 40) == part_bounds(40, 99) == [(0, 40)]
    for n, p in [(1, 1), (10, 3), (4096, 1000), (1000567, 100000)]:
        covered = np.concatenate([np.arange(lo, hi) for lo, hi in part_bounds(n, p)])
        assert np.array_equal(covered, np.arange(n))
    for bad in (-1, 1.5, True, "7"):
        with pytest.raises(ConfigError):
            part_bounds(40, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", ["fedavg", "fedadam"])
def test_a_round_in_parts_is_bit_for_bit_the_round_whole_on_plain(protocol):
    whole = run_experiment(replace(SMALL, protocol=protocol).validate())
    parts = run_experiment(replace(SMALL, protocol=protocol, part_values=PARTS).validate())
    assert not whole.aborted and not parts.aborted
    assert np.array_equal(final(whole), final(parts))
    seen = phases(parts)
    # 6 clients, 2 rounds: the model in 6 parts, part 0 with training, 5 more each
    assert seen["model_part"] == 6 * 2 * 6 and seen["upload_part"] == 6 * 2 * 5
    assert seen["train"] == 6 * 2 and "model_part" not in phases(whole)


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_a_round_in_parts_releases_each_part_once_within_the_flooding(backend):
    plain = final(run_experiment(SMALL.validate()))
    result = run_experiment(replace(SMALL, backend=backend, part_values=PARTS).validate())
    assert not result.aborted and not result.audit.summary()["exclusions"]
    np.testing.assert_allclose(final(result), plain, atol=1e-4)
    learned = result.audit.summary()["learned_in_plaintext"]["global_update"]
    reveals = 2 if backend == "ckks" else 1  # ckks checks each reveal with a second decryptor
    assert sum(learned.values()) == 2 * 6 * reveals  # one release per part and round


@pytest.mark.parametrize(
    "change, why",
    [
        ({"protocol": "larc"}, "does not stream"),
        ({"streaming": False}, "does not stream"),
        ({"protocol": "fedadam", "backend": "ckks", "server_blind": True}, "server-blind"),
        ({"client_dp": {"clip": 1.0, "noise": 1.0}}, "client-level DP"),
        ({"protocol": "autofedrl", "validation_split": 0.2}, "more than one streamed sum"),
    ],
)
def test_a_run_that_cannot_move_in_parts_is_refused_with_what_to_do(change, why):
    with pytest.raises(ConfigError) as info:
        replace(SMALL, part_values=PARTS, **change).validate()
    assert why in str(info.value) and "part_values 0" in str(info.value)


def test_negative_part_values_is_a_config_error():
    with pytest.raises(ConfigError, match="part_values"):
        replace(SMALL, part_values=-1).validate()


def test_the_guard_lets_each_part_leave_once_after_training_and_keeps_it_in_its_state():
    guard = PolicyGuard(ClientPolicy(rounds=3, part_values=PARTS))
    with pytest.raises(PolicyRefused, match="before its training"):
        guard.upload_part(0, 1, 6)
    guard.train(0)
    guard.upload_part(0, 0, 6)
    guard.upload_part(0, 3, 6)
    for index in (3, 6, -1):
        with pytest.raises(PolicyRefused):
            guard.upload_part(0, index, 6)
    restored = PolicyGuard(guard.policy)
    restored.load_state_dict(guard.state_dict())
    with pytest.raises(PolicyRefused, match="already left"):
        restored.upload_part(0, 3, 6)
    restored.upload_part(0, 4, 6)
    restored.train(1)
    restored.upload_part(1, 3, 6)  # a new round's update: every part again


def test_a_part_names_its_index_in_the_basis_of_its_upload():
    fields = {"train": wire.config({"lr": 0.1})}
    bases = {
        upload_basis(0, "upload_part", {**fields, PART_FIELD: wire.config({"index": i})}, "m")
        for i in range(3)
    }
    assert len(bases) == 3  # no release mixes two parts: the clients consent to one basis


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "yogi", "adagrad"])
def test_stepping_the_parts_is_the_whole_step(name):
    rng = np.random.default_rng(0)
    whole, parts = (make_optimizer({"name": name, "dim": 40}) for _ in range(2))
    params = rng.normal(size=40)
    for _ in range(3):
        g = rng.normal(size=40)
        expected = whole.step(g, params)
        got = np.concatenate(
            [parts.step_part(g[lo:hi], params[lo:hi], lo, hi) for lo, hi in part_bounds(40, 7)]
        )
        assert np.array_equal(got, expected)
    for k in whole.state:
        assert np.array_equal(whole.state[k], parts.state[k])
    with pytest.raises(ValueError):
        parts.step_part(np.zeros(5), None, 38, 43)


class CountingPlainServer(PlainServer):
    """Records, whenever a part's running sum is made, how many earlier parts' sums live."""

    def __init__(self):
        super().__init__()
        self.sums: list[weakref.ref] = []
        self.alive: list[int] = []

    def running_sum(self, length):
        gc.collect()
        self.alive.append(sum(r() is not None for r in self.sums))
        sums = self.sums

        class Counted(PlainRunningSum):
            def _result(self, normaliser):
                out = super()._result(normaliser)
                sums.append(weakref.ref(out))
                return out

        return Counted(length)


def test_a_round_in_parts_holds_one_parts_sum_at_a_time(monkeypatch):
    counting = CountingPlainServer()
    monkeypatch.setattr(experiment, "make_server_backend", lambda *args: counting)
    result = run_experiment(replace(SMALL, part_values=PARTS).validate())
    assert not result.aborted and len(counting.alive) == 2 * 6
    # the part just stepped may linger until the next is made; none before it
    assert max(counting.alive) <= 1


def test_a_subclass_that_finishes_its_sum_its_own_way_cannot_move_in_parts():
    """It inherits FedAvg's capabilities, parts included, but its round is not one streamed
    sum any more: refused, as a built-in protocol that says so is."""
    from secagg.protocols.fedavg import FedAvg
    from secagg.server.plan import RunPolicy, check_protocol_run

    class Halved(FedAvg):
        name = "halved"

        def finish_sum(self, ctx, total):
            return total.result(renormalise=False)

    run = {"backend": "plain", "backend_can_read": True, "client_dp": False}
    check_protocol_run(FedAvg(), policy=RunPolicy(part_values=PARTS), **run)
    with pytest.raises(ConfigError, match="finish_sum"):
        check_protocol_run(Halved(), policy=RunPolicy(part_values=PARTS), **run)
