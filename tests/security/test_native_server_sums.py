"""A server-weighted sum formed natively (``secagg.ckks.server_sums``) is SEAL's own sum.

The server reads each upload without SEAL's loader, expands its seed itself and forms
Σ k_i·ct_i with SEAL's arithmetic on the arrays. Attacked through the real classes: the
bytes it sends are, once inflated, the bytes SEAL's path sends, bit for bit (plain weighted
sums and running sums renormalised for a dropout, on both server-weighted presets); a
decryptor reveals the same sum from either; an upload SEAL's path refuses (a coefficient
above its prime, a second polynomial sent whole, another scale) is refused here too; weights
the SEAL path refuses are refused.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from secagg import wire
from secagg.backends.ckks_server import CKKSHandle, PolynomialsHandle
from secagg.ckks import native
from secagg.ckks.public import CIPHERTEXT_META, SEAL_HEADER, SEED_INFO_BYTES, raw_body
from secagg.errors import ConfigError, MalformedCiphertext, WrongContext
from secagg.wire import Envelope
from tests.harness import BackendRound

pytestmark = pytest.mark.skipif(native.module() is None, reason="needs the native extension")

IDS = [f"client_{i}" for i in range(4)]
WEIGHTS = {"client_0": 0.4, "client_1": 0.3, "client_2": -0.2, "client_3": 1e-9}


def uploads(run: BackendRound, n: int, seed: int = 0) -> dict[str, Envelope]:
    rng = np.random.default_rng(seed)
    out = {}
    for c in IDS:
        field = run.protect(c, rng.normal(0, 0.05, n))
        env = Envelope(c, "server", run.round, "train", {"pseudo_gradient": field})
        out[c] = Envelope.from_bytes(env.to_bytes())
    return out


def loaded(run: BackendRound, envs: dict[str, Envelope], n: int, path: str) -> dict:
    with native.chosen(path):
        return {c: run.server.load(env, "pseudo_gradient", n) for c, env in envs.items()}


def inflated(run: BackendRound, handle) -> list[bytes]:
    parts = run.server.to_field(handle)
    env = Envelope.from_bytes(Envelope("server", "c", 0, "r", {"g": parts}).to_bytes())
    return [raw_body(p, run.server.public.max_raw_bytes, "sum") for p in env.ciphertext_parts("g")]


@pytest.mark.parametrize("preset", ["compact", "wide"])
def test_the_native_weighted_sum_is_seals_bit_for_bit(preset):
    n = 3 * 2048 + 5  # chunks, the last one partial
    run = BackendRound(IDS, n, preset=preset, decryption_budget=4, reveal_length=n)
    envs = uploads(run, n)
    fast = loaded(run, envs, n, "auto")
    slow = loaded(run, envs, n, "off")
    assert all(isinstance(h, PolynomialsHandle) for h in fast.values())
    assert all(isinstance(h, CKKSHandle) for h in slow.values())
    weights = [WEIGHTS[c] for c in IDS]
    ours = run.server.weighted_sum(list(fast.values()), weights)
    seals = run.server.weighted_sum(list(slow.values()), weights)
    assert ours.entries == seals.entries  # client_3's weight rounds to 0: in neither
    assert len(ours.entries) == 3
    assert inflated(run, ours) == inflated(run, seals)
    # a streaming server's running sum, one upload dropped out and renormalised away
    sums = []
    for handles in (loaded(run, envs, n, "auto"), loaded(run, envs, n, "off")):
        total = run.server.running_sum(n)
        for c in IDS[:3]:
            total.add(handles[c], WEIGHTS[c])
        sums.append(total.result(0.9))
    assert sums[0].scale == sums[1].scale == run.server.public.sum_scale * 0.9
    assert inflated(run, sums[0]) == inflated(run, sums[1])


def test_a_decryptor_reveals_the_natively_formed_sum():
    n = 2048 * 2
    run = BackendRound(IDS, n, preset="compact", decryption_budget=4, reveal_length=n)
    rng = np.random.default_rng(3)
    values = {c: rng.normal(0, 0.05, n) for c in IDS}
    handles = run.uploads(values)
    assert all(isinstance(h, PolynomialsHandle) for h in handles.values())
    plan = {c: 0.25 for c in IDS}
    revealed = run.reveal_running_sum(handles, plan)
    np.testing.assert_allclose(revealed, sum(v * 0.25 for v in values.values()), atol=1e-4)


def _edited(env: Envelope, edit) -> Envelope:
    parts = [
        bytearray(raw_body(p, 1 << 30, "upload")) for p in env.ciphertext_parts("pseudo_gradient")
    ]
    edit(parts[0])
    from secagg.ckks.public import uncompressed_blob

    fields = {"pseudo_gradient": wire.ciphertext([uncompressed_blob(bytes(p)) for p in parts])}
    return Envelope.from_bytes(Envelope(env.sender, "server", 0, "train", fields).to_bytes())


def _coefficient_above_its_prime(raw: bytearray) -> None:
    at = CIPHERTEXT_META.size + SEAL_HEADER.size + 8
    struct.pack_into("<Q", raw, at, (1 << 64) - 1)


def _another_scale(raw: bytearray) -> None:
    parms, ntt, size, n, primes, scale, corr = CIPHERTEXT_META.unpack_from(raw)
    CIPHERTEXT_META.pack_into(raw, 0, parms, ntt, size, n, primes, scale * 2, corr)


def _unknown_prng(raw: bytearray) -> None:
    raw[-SEED_INFO_BYTES] = 9  # the seed's PRNG type byte: no such PRNG


@pytest.mark.parametrize(
    "edit, error",
    [
        (_coefficient_above_its_prime, MalformedCiphertext),
        (_another_scale, WrongContext),
        (_unknown_prng, MalformedCiphertext),
    ],
)
def test_an_upload_seals_load_refuses_is_refused_natively_too(edit, error):
    n = 2048
    run = BackendRound(IDS, n, preset="compact", decryption_budget=4, reveal_length=n)
    env = _edited(uploads(run, n)["client_0"], edit)
    for path in ("auto", "off"):
        with native.chosen(path), pytest.raises(error):
            run.server.load(env, "pseudo_gradient", n)


def test_weights_the_seal_path_refuses_are_refused():
    n = 2048
    run = BackendRound(IDS, n, preset="compact", decryption_budget=4, reveal_length=n)
    envs = uploads(run, n)
    for path in ("auto", "off"):
        handles = list(loaded(run, envs, n, path).values())
        with pytest.raises(ConfigError, match="need \\|w\\| <= 1"):
            run.server.weighted_sum(handles, [1.5, 0.1, 0.1, 0.1])
        with pytest.raises(ConfigError, match="rounds to zero"):
            run.server.weighted_sum(handles, [1e-12] * 4)
    mixed = [*loaded(run, envs, n, "auto").values()][:2] + [*loaded(run, envs, n, "off").values()][
        2:
    ]
    with pytest.raises(MalformedCiphertext, match="two paths"):
        run.server.weighted_sum(mixed, [0.25] * 4)


def test_uploads_read_natively_are_not_summed_once_the_native_path_is_off():
    n = 2048
    run = BackendRound(IDS, n, preset="compact", decryption_budget=4, reveal_length=n)
    handles = list(loaded(run, uploads(run, n), n, "auto").values())
    with native.chosen("off"):
        with pytest.raises(ConfigError, match="keep one path for a whole round"):
            run.server.weighted_sum(handles, [0.25] * 4)
        total = run.server.running_sum(n)
        with pytest.raises(ConfigError, match="keep one path"):
            total.add(handles[0], 0.25)
