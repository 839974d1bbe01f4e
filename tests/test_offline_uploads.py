"""Offline/online uploads (``secagg.secret.ckks_masks``): an upload's masks, the encryptions of zero
made while the client trains, give the bytes and the sums a fresh encryption gives, and are
key material: fresh for every upload, used once, never kept past their request or in the
client's state, wiped when anything fails."""

from __future__ import annotations

import os
import pickle
from dataclasses import replace

import numpy as np
import pytest

from secagg.ckks import native
from secagg.ckks.presets import get_preset
from secagg.ckks.public import SEED_INFO_BYTES
from secagg.errors import ConfigError, ValueRangeError
from secagg.runspec.config import ExperimentConfig
from secagg.secret import ckks_masks
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.simulation.experiment import run_experiment
from tests.harness import PLAN, BackendRound, planned_sum, planned_values

pytestmark = pytest.mark.skipif(
    os.environ.get(native.ENV, "").lower() == "off", reason="SECAGG_NATIVE=off: not built"
)
VALUES = np.random.default_rng(11).uniform(-1, 1, 9000)  # several chunks, the last partial


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    return SecretKeyHolder(get_preset("lean"))


def made(keys, n_values=VALUES.size):
    pending = ckks_masks.start(keys, n_values)
    assert pending is not None
    return pending.take(n_values)


@pytest.mark.parametrize("preset_name", ["lean", "compact", "wide"])
def test_masked_uploads_decrypt_to_the_values_and_look_like_fresh_ones(monkeypatch, preset_name):
    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset(preset_name))
    fresh = keys.encrypt(VALUES, bound=1.0)
    masked = keys.encrypt(VALUES, bound=1.0, masks=made(keys))
    assert len(masked) == len(fresh)
    if preset_name == "lean":  # uncompressed: every byte count is the format's
        assert [len(p) for p in masked] == [len(p) for p in fresh]
    atol = 1e-6 if preset_name != "wide" else 1e-9
    np.testing.assert_allclose(
        keys.decrypt(masked, VALUES.size, keys.public.scale), VALUES, atol=atol
    )


def test_a_server_sums_masked_and_fresh_uploads_alike(monkeypatch):
    """Two clients upload with masks made beside training, one without: the revealed
    weighted sum is theirs, through the real server and client halves."""
    monkeypatch.setenv(native.ENV, "on")
    values = planned_values()
    run = BackendRound(list(PLAN), 5000, decryption_budget=4, reveal_length=5000, preset="lean")
    for c in ("client_0", "client_1"):
        run.clients[c].prepare_upload(5000)
    handles = run.uploads(values, PLAN)
    assert all(run.clients[c].offline_seconds > 0 for c in ("client_0", "client_1"))
    revealed = run.reveal_running_sum(handles, PLAN)
    np.testing.assert_allclose(revealed, planned_sum(values), atol=2e-3)


def test_masks_are_used_once(keys):
    masks = made(keys)
    keys.encrypt(VALUES, bound=1.0, masks=masks)
    assert masks.used and masks.chunks == 0
    with pytest.raises(ValueError, match="used already"):
        keys.encrypt(VALUES, bound=1.0, masks=masks)


def test_every_upload_gets_fresh_seeds_and_noise(keys):
    """Masks made twice, or one set against a fresh encryption, share no seed: a reused mask
    would let the server subtract two uploads."""
    first = keys.encrypt(VALUES, 1.0, masks=made(keys))
    second = keys.encrypt(VALUES, 1.0, masks=made(keys))
    third = keys.encrypt(VALUES, 1.0)
    seeds = [p[-SEED_INFO_BYTES:] for p in first + second + third]
    assert len(set(seeds)) == len(seeds) == 3 * len(first)
    assert all(a[:-SEED_INFO_BYTES] != b[:-SEED_INFO_BYTES] for a, b in zip(first, second))


def test_a_refused_encryption_wipes_its_masks(keys):
    masks = made(keys)
    bad = VALUES.copy()
    bad[3] = np.nan
    with pytest.raises(ValueRangeError):
        keys.encrypt(bad, bound=1.0, masks=masks)
    assert masks.used and masks.chunks == 0
    masks = made(keys)
    with pytest.raises(ValueRangeError):
        keys.encrypt(VALUES * 10, bound=1.0, masks=masks)  # beyond the preset's bound
    assert masks.used


def test_masks_for_another_size_are_wiped_and_the_upload_encrypts_afresh(keys):
    pending = ckks_masks.start(keys, 10)  # one chunk
    pending._thread.join()
    masks = pending._masks
    assert pending.take(VALUES.size) is None  # several chunks: not these masks
    assert masks.used
    parts = keys.encrypt(VALUES, 1.0)
    np.testing.assert_allclose(
        keys.decrypt(parts, VALUES.size, keys.public.scale), VALUES, atol=1e-6
    )


def test_masks_cannot_be_pickled_or_reach_a_state_file(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    run = BackendRound(["client_0", "client_1"], 9000, preset="lean")
    client = run.clients["client_0"]
    client.prepare_upload(VALUES.size)
    masks = client._pending.take(VALUES.size)
    with pytest.raises(TypeError):
        pickle.dumps(masks)
    client.prepare_upload(VALUES.size)
    state = pickle.dumps(client.state_dict())
    client.discard_prepared()
    assert client._pending is None
    masks.wipe()
    assert b"UploadMasks" not in state and len(state) < 3 * 2**20


def test_one_request_one_set_of_masks(monkeypatch):
    """An upload made without a new prepare (a second protect in the same request, as
    RoLePRO's numerator and denominator) encrypts afresh: no mask serves two uploads."""
    monkeypatch.setenv(native.ENV, "on")
    run = BackendRound(["client_0", "client_1"], 9000, preset="lean")
    client = run.clients["client_0"]
    client.prepare_upload(VALUES.size)
    first = client.protect(VALUES, 0.5)
    assert client._pending is None
    second = client.protect(VALUES, 0.5)
    seeds = set()
    for field in (first, second):
        ends = np.cumsum(field.parts)
        seeds |= {field.data[end - SEED_INFO_BYTES : end] for end in ends}
    assert len(seeds) == 2 * len(first.parts) == 6


def _recording(monkeypatch):
    """Every set of masks the clients make, kept to look at after the run."""
    made: list = []
    original = ckks_masks.PendingMasks._make

    def make(self, encryptor, seeds):
        original(self, encryptor, seeds)
        made.append(self._masks)

    monkeypatch.setattr(ckks_masks.PendingMasks, "_make", make)
    return made


RUN = ExperimentConfig(
    task="tcga-brca",
    protocol="fedavg",
    backend="ckks",
    rounds=2,
    seeds=[3],
    backend_options={"preset": "lean"},
)


def test_a_run_uses_every_mask_it_makes_once(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    masks = _recording(monkeypatch)
    result = run_experiment(RUN)
    assert not result.aborted
    assert len(masks) == 2 * 6 and all(m is not None and m.used for m in masks)


def test_a_client_whose_training_fails_wipes_its_masks(monkeypatch):
    """The masks are made before training; a training that raises ends the request with a
    refusal, and the masks with it."""
    monkeypatch.setenv(native.ENV, "on")
    masks = _recording(monkeypatch)
    from secagg.clients.runtime import Client

    original = Client.train

    def failing(self, start, settings):
        if self.id == "client_1":
            raise RuntimeError("the GPU fell over")
        return original(self, start, settings)

    monkeypatch.setattr(Client, "train", failing)
    result = run_experiment(replace(RUN, rounds=1))
    refused = [e for e in result.audit.summary()["exclusions"] if e["peer"] == "client_1"]
    assert refused and len(masks) == 6
    assert all(m is not None and m.used for m in masks)


def test_the_switch_turns_the_masks_off_and_is_checked(monkeypatch, keys):
    monkeypatch.setenv(ckks_masks.ENV, "off")
    assert ckks_masks.start(keys, VALUES.size) is None
    monkeypatch.setenv(ckks_masks.ENV, "sometimes")
    with pytest.raises(ConfigError, match="on or off"):
        ckks_masks.start(keys, VALUES.size)
