"""A server-weighted sum formed natively (``secagg.ckks.server_sums``) is SEAL's own sum,
and a release carries its first polynomials only.

The server reads each upload without SEAL's loader and without expanding its seed, and forms
Σ k_i·c0_i with SEAL's arithmetic on the arrays. Attacked through the real classes: the
bytes it sends are the first polynomials of SEAL's own sum, bit for bit (plain weighted sums
and running sums renormalised for a dropout, on both server-weighted presets), half a whole
ciphertext; a decryptor reveals the same sum from either path; whatever first polynomial the
server sends only shifts the result by what it chose (the second is the decryptor's own); an
upload SEAL's path refuses (a coefficient above its prime, another scale, a seed of no PRNG)
is refused here too, on every preset; weights the SEAL path refuses are refused.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from secagg import wire
from secagg.backends.ckks_server import CKKSHandle, FirstPolysHandle
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
    lean = run.server.weights_at_client  # the clients apply their planned weight there
    out = {}
    for c in IDS:
        field = run.protect(c, rng.normal(0, 0.05, n), 0.25 if lean else None)
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
    assert all(isinstance(h, FirstPolysHandle) for h in fast.values())
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


@pytest.mark.parametrize("preset", ["compact", "wide"])
def test_a_release_is_half_a_whole_ciphertext(preset):
    n = 3 * 2048
    run = BackendRound(IDS, n, preset=preset, decryption_budget=4, reveal_length=n)
    fast = loaded(run, uploads(run, n), n, "auto")
    total = run.server.weighted_sum(list(fast.values()), [0.25] * 4)
    values = run.server.public.preset.values_per_ciphertext
    primes = run.server.public.n_primes
    chunks = -(-n // values)
    # 8 bytes per coefficient, N·primes coefficients a chunk: one polynomial, not two
    assert run.server.to_field(total).nbytes < chunks * (8 * values * primes + 200)


def test_a_crafted_first_polynomial_only_shifts_the_result_by_what_the_server_chose():
    """On a server-weighted preset too, the server controls C0 alone: adding an encoding
    of v to it moves the revealed sum by v, an offset the server chose and knows."""
    import tenseal.sealapi as seal

    from secagg.ckks.first_polys import PLAIN_META
    from secagg.ckks.public import HEADER_BYTES, inflate, to_bytes

    n = 2048
    run = BackendRound(IDS, n, preset="compact", decryption_budget=4, reveal_length=n)
    rng = np.random.default_rng(5)
    values = {c: rng.normal(0, 0.05, n) for c in IDS}
    ctx = run.ctx()
    total = ctx.weighted_sum(run.uploads(values), dict.fromkeys(IDS, 0.25))
    public = run.server.public
    v = np.linspace(-0.5, 0.5, n)
    shift = seal.Plaintext()
    public.encoder.encode(
        v.tolist(),  # a chunk's first N/2 values are its slots' real parts (ckks_keys.encode)
        public.context.first_parms_id(),
        total.scale,
        shift,
    )
    raw = inflate(memoryview(to_bytes(shift))[HEADER_BYTES:], 10**7, "shift")
    coefficients = np.frombuffer(raw, dtype="<u8", offset=PLAIN_META.size + HEADER_BYTES + 8)
    total.first[0] = (total.first[0] + coefficients) % run.server._fresh.moduli
    expected = sum(0.25 * x for x in values.values())
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), expected + v, atol=1e-4)


def test_a_decryptor_reveals_the_natively_formed_sum():
    n = 2048 * 2
    run = BackendRound(IDS, n, preset="compact", decryption_budget=4, reveal_length=n)
    rng = np.random.default_rng(3)
    values = {c: rng.normal(0, 0.05, n) for c in IDS}
    handles = run.uploads(values)
    assert all(isinstance(h, FirstPolysHandle) for h in handles.values())
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
@pytest.mark.parametrize("preset", ["compact", "lean"])
def test_an_upload_seals_load_refuses_is_refused_natively_too(edit, error, preset):
    n = 2048
    run = BackendRound(IDS, n, preset=preset, decryption_budget=4, reveal_length=n)
    env = _edited(uploads(run, n)["client_0"], edit)
    for path in ("auto", "off") if preset == "compact" else ("auto",):
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
