"""secagg over Flower's Message API, in one process (``flower_grid.LoopbackGrid``): the same
model and audit as the in-process transport, clients rebuilt from their node directory for
every message, a missing node excluded (ckks) or the round aborted (threshold n-of-n), a node
of another experiment refused.
The real SuperLink and SuperNodes, in separate processes: ``test_flower_e2e.py``."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import secagg
from secagg.errors import ConfigError
from secagg.flower.apps import run_on_flower
from secagg.flower.deployment import prepare
from secagg.simulation.config import ExperimentConfig
from tests.flower_grid import LoopbackGrid

LARC = ExperimentConfig(
    task="tcga-brca", protocol="larc", backend="ckks", rounds=2, seeds=[3], local_steps=5
)
#: deterministic end to end (seeded DP noise): over Flower the model must be bit for bit
PLAIN = replace(
    LARC, protocol="costwagg", backend="plain", client_dp={"clip": 1.0, "noise": 0.5}
)


def deploy(tmp_path, config):
    nodes = prepare(tmp_path / "deployment", config)
    grid = LoopbackGrid({100 + k: path for k, path in enumerate(nodes.values())})
    return tmp_path / "deployment", grid


def over_flower(tmp_path, config, grid=None, timeout=60.0):
    folder, made = deploy(tmp_path, config)
    grid = grid or made
    out = tmp_path / "out"
    run_on_flower(grid, deployment=folder, out=out, timeout=timeout, connect_timeout=5)
    return out, grid


def final_model(out, seed):
    return np.load(out / "models" / f"seed-{seed}.npy")


@pytest.mark.parametrize("config", [PLAIN, LARC], ids=["plain-costwagg-dp", "ckks-larc"])
def test_a_run_over_flower_messages_gives_the_in_process_model_and_audit(tmp_path, config):
    reference = secagg.run(config, out=tmp_path / "reference")
    out, grid = over_flower(tmp_path, config)
    seed = config.seeds[0]
    atol = 0.0 if config.backend == "plain" else 1e-6  # CKKS noise is fresh in every run
    np.testing.assert_allclose(
        final_model(out, seed), reference.final_params[seed], rtol=0, atol=atol
    )
    ours = json.loads((out / "audit_summary.json").read_text())
    theirs = json.loads((tmp_path / "reference" / "audit_summary.json").read_text())
    assert ours == theirs
    # the same envelopes, so the same bytes by phase (SEAL's compressed ciphertexts vary in
    # size with their random content: within 1% on ckks)
    keep = ["round", "phase", "direction", "bytes"]
    a = pd.read_csv(out / "traffic.csv")[keep].groupby(keep[:3]).sum()
    b = pd.read_csv(tmp_path / "reference" / "traffic.csv")[keep].groupby(keep[:3]).sum()
    pd.testing.assert_frame_equal(a, b, check_exact=config.backend == "plain", rtol=0.01)
    flower = json.loads((out / "flower.json").read_text())
    assert flower["framing"]["messages_sent"] == grid.delivered - len(grid.nodes)  # + hellos
    assert 0 < flower["framing"]["bytes_sent"] / flower["framing"]["messages_sent"] < 1000
