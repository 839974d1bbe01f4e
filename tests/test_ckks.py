"""CKKS backend: correctness, the server's inability to decrypt, keys, flooding, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as seal

from secagg.backends.ckks_server import CKKSServer
from secagg.ckks.flooding import csprng_normal, slot_sigma
from secagg.ckks.presets import PRESETS, CKKSPreset, get_preset
from secagg.ckks.public import PublicCKKS, make_context, to_bytes
from secagg.errors import (
    ConfigError,
    KeySetupError,
    MalformedCiphertext,
    ValueRangeError,
    WrongContext,
)
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.secret.keywrap import KeyWrapper

COMPACT = get_preset("compact")


@pytest.fixture(scope="module")
def keys():
    return SecretKeyHolder(COMPACT)


def test_every_preset_is_accepted_by_seal_at_128_bits():
    for preset in PRESETS.values():
        ctx = make_context(preset)
        assert ctx.parameters_set() and preset.security_bits == 128
        assert (
            ctx.first_context_data().parms().coeff_modulus().__len__() == len(preset.coeff_bits) - 1
        )
        assert preset.headroom > 1


def test_seal_refuses_an_insecure_parameter_set():
    insecure = CKKSPreset("too-big", 4096, (60, 60, 60), 40, 10, "over 109 bits at N=4096")
    with pytest.raises(ConfigError, match="SEAL rejects"):
        make_context(insecure)


def test_weighted_sum_is_accurate_across_chunks(keys):
    server = PublicCKKS(COMPACT)
    rng = np.random.default_rng(0)
    n = COMPACT.values_per_ciphertext * 2 + 17  # two full chunks and a partial one
    xs = [rng.normal(0, 0.05, n) for _ in range(3)]
    w = [0.25, 1.0, 1 / 3]
    total = server.weighted_sum([server.load_ciphertexts(keys.encrypt(x, 1.0), n) for x in xs], w)
    dec = keys.decrypt([to_bytes(c) for c in total], n, server.sum_scale)
    exact = sum(wi * x for wi, x in zip(w, xs))
    assert np.max(np.abs(dec - exact)) / np.max(np.abs(exact)) < 1e-6


def test_uploads_are_seeded_half_size_ciphertexts(keys):
    n = COMPACT.values_per_ciphertext
    (upload,) = keys.encrypt(np.full(n, 0.01), 1.0)
    full = to_bytes(PublicCKKS(COMPACT).load_ciphertexts([upload], n)[0])
    assert len(upload) < 0.6 * len(full)
    assert len(upload) / n <= 16  # the upload target, in bytes per parameter


def test_the_server_half_holds_no_key_and_cannot_decrypt():
    server = CKKSServer(COMPACT)
    seen, stack = set(), [server]
    while stack:  # walk the server backend's whole object graph
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        assert not isinstance(obj, (seal.SecretKey, SecretKeyHolder, seal.Decryptor)), obj
        stack += list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    with pytest.raises(PermissionError):
        server.read(object())


def test_a_key_the_server_makes_itself_decrypts_garbage(keys):
    n = 64
    x = np.linspace(-0.5, 0.5, n)
    parts = keys.encrypt(x, 1.0)
    other = SecretKeyHolder(COMPACT)  # what a server could generate on its own
    garbage = other.decrypt(parts, n, 2.0**COMPACT.scale_bits)
    assert np.max(np.abs(garbage - x)) > 1e3


def test_ciphertexts_from_another_preset_or_corrupted_bytes_are_refused(keys):
    server = PublicCKKS(COMPACT)
    n = 100
    good = keys.encrypt(np.zeros(n), 1.0)
    wide = SecretKeyHolder(get_preset("wide")).encrypt(np.zeros(n), 1.0)
    with pytest.raises((MalformedCiphertext, WrongContext)):
        server.load_ciphertexts(wide, n)
    with pytest.raises(MalformedCiphertext):
        server.load_ciphertexts([good[0][: len(good[0]) // 2]], n)
    with pytest.raises(MalformedCiphertext):
        server.load_ciphertexts([b"\x00" * 64], n)
    with pytest.raises(MalformedCiphertext, match="2 ciphertexts for 100 values"):
        server.load_ciphertexts(good * 2, n)
    with pytest.raises(WrongContext, match="scale"):
        server.load_ciphertexts(good, n, scale=server.sum_scale)


def test_values_beyond_the_headroom_are_refused_before_encryption(keys):
    x = np.zeros(10)
    x[3] = 50.0
    with pytest.raises(ValueRangeError, match=r"value 50 at index 3 exceeds .*'compact'"):
        keys.encrypt(x, bound=COMPACT.headroom / 6)
    with pytest.raises(ValueRangeError, match="non-finite"):
        keys.encrypt(np.array([np.nan]), 1.0)


def test_weights_outside_the_unit_interval_are_refused(keys):
    server = PublicCKKS(COMPACT)
    up = server.load_ciphertexts(keys.encrypt(np.zeros(5), 1.0), 5)
    with pytest.raises(ConfigError, match=r"\|w\| <= 1"):
        server.weighted_sum([up], [1.5])


def test_key_wrap_round_trip_and_tampering():
    alice, bob, eve = KeyWrapper(), KeyWrapper(), KeyWrapper()
    blob = alice.wrap(b"secret", bob.public_bytes, "a", "b", "params")
    assert bob.unwrap(blob, alice.public_bytes, "a", "b", "params") == b"secret"
    with pytest.raises(KeySetupError, match="does not open"):
        eve.unwrap(blob, alice.public_bytes, "a", "b", "params")  # not the recipient
    with pytest.raises(KeySetupError, match="does not open"):
        bob.unwrap(blob, alice.public_bytes, "a", "c", "params")  # readdressed
    with pytest.raises(KeySetupError, match="does not open"):
        bob.unwrap(blob[:-1] + bytes([blob[-1] ^ 1]), alice.public_bytes, "a", "b", "params")
    with pytest.raises(KeySetupError, match="invalid X25519"):
        bob.unwrap(blob, b"short", "a", "b", "params")


def test_flooding_noise_has_the_calibrated_spread(keys):
    n = COMPACT.values_per_ciphertext
    server = PublicCKKS(COMPACT)
    up = server.load_ciphertexts(keys.encrypt(np.full(n, 0.1), 1.0), n)
    agg = [to_bytes(c) for c in server.weighted_sum([up], [1.0])]
    clean = keys.decrypt(agg, n, server.sum_scale)
    coeff_sigma = 2.0**50
    flooded, sigma = keys.decrypt_flooded(agg, n, server.sum_scale, coeff_sigma)
    assert sigma == pytest.approx(
        slot_sigma(coeff_sigma, COMPACT.poly_modulus_degree, server.sum_scale)
    )
    noise = flooded - clean
    # 4096 samples: the sample std is within 5% of σ with overwhelming probability
    assert np.std(noise) == pytest.approx(sigma, rel=0.05)
    assert abs(np.mean(noise)) < 4 * sigma / np.sqrt(n)


def test_csprng_normal_is_standard_normal():
    z = csprng_normal(200_001)  # odd: the last Box–Muller pair gives one sample
    assert z.size == 200_001
    assert abs(z.mean()) < 0.01 and z.std() == pytest.approx(1.0, rel=0.01)
    assert np.mean(np.abs(z) > 1.96) == pytest.approx(0.05, abs=0.003)
    # r·cos θ and r·sin θ of one pair are uncorrelated (and so are the squares: independent)
    cos, sin = z[:100_000], z[100_001:200_001]
    assert abs(np.corrcoef(cos, sin)[0, 1]) < 0.015
    assert abs(np.corrcoef(cos**2, sin**2)[0, 1]) < 0.015
    assert not np.array_equal(csprng_normal(8), csprng_normal(8))  # a fresh key each call


def test_a_decryptor_refuses_beyond_its_flooding_budget():
    from tests.harness import BackendRound

    ids = ["client_0", "client_1"]
    run = BackendRound(ids, 4, decryption_budget=1)  # each client's own configuration
    outs = []
    for _ in range(2):
        ctx = run.ctx()
        total = ctx.weighted_sum(
            run.uploads({c: np.full(4, 0.1) for c in ids}), {c: 0.5 for c in ids}
        )
        request = run.server._release_fields(ctx, total, "global_update", "reveal", "aggregate")
        if outs:
            with pytest.raises(Exception, match="refuses decryption 2"):
                run.ask("client_0", "reveal", request)
        else:
            outs.append(run.ask("client_0", "reveal", request)["global_update"])
    assert np.allclose(np.frombuffer(outs[0].data), 0.1, atol=1e-5)
