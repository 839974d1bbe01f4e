"""benchmarks.dp_epsilon_joint's composition over seeds: one accountant fed every seed's
rounds, as privacy.json composes a study (the seeds train on the same clients' data)."""

import pytest

from benchmarks.dp_epsilon_joint import DELTA, composed_over_seeds, epsilons
from secagg.simulation.privacy import client_level_epsilon


def event(sums: float, upload: float) -> dict:
    return {"sums_multiplier": sums, "noise_multiplier": upload, "per_release_multipliers": [sums]}


def test_the_seeds_compose_into_one_accounting_above_each_seeds_own():
    per_seed = {0: [event(1.2, 1.0), event(1.3, 1.0)], 1: [event(1.1, 1.0), event(1.4, 1.0)]}
    composed = composed_over_seeds(per_seed)
    every_round = [{"noise_multiplier": z} for z in (1.2, 1.3, 1.1, 1.4)]
    assert composed["eps_joint_composed"] == pytest.approx(
        client_level_epsilon(every_round, DELTA), rel=1e-12
    )
    assert composed["eps_per_upload_composed"] == pytest.approx(
        client_level_epsilon([{"noise_multiplier": 1.0}] * 4, DELTA), rel=1e-12
    )
    for events in per_seed.values():
        alone = epsilons(events)
        assert composed["eps_joint_composed"] > alone["eps_joint"]
        assert composed["eps_per_upload_composed"] > alone["eps_per_upload"]
