"""The server holds each model-sized thing once: no copy of the model per round, no float64
copy of a float32 upload or of a decryptor's reveal, and no model-sized temporary when an
upload is folded in or two decryptions are compared.

Measured with ``tracemalloc`` (numpy reports its buffers to it): the peak of what one step
allocates, against the model's size. Allocation counts do not depend on the machine's speed
or load, so these bounds are exact properties of the code, not timings.
"""

import tracemalloc

import numpy as np
import pytest

from secagg import wire
from secagg.backends.ckks_server import decryptions_agree
from secagg.backends.plain import PlainRunningSum, PlainServer
from secagg.backends.threshold_server import fold_into
from secagg.ckks.first_polys import FirstPolynomialSum
from secagg.errors import MalformedCiphertext, UnexpectedField
from secagg.threshold.ring import ntt_prime, ring
from secagg.wire import Envelope
from tests.test_streaming import run_one_round

N = 4_000_000  # 32 MB of float64: a model-sized buffer stands out from any scratch


def peak_bytes(step) -> int:
    """What ``step()`` allocated at its peak, beyond what was held before it."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def envelope_with(values: np.ndarray) -> Envelope:
    env = Envelope("client_0", "server", 0, "train", {"pseudo_gradient": wire.vector(values)})
    return Envelope.from_bytes(env.to_bytes())


def test_a_plain_upload_is_read_in_place_in_its_own_dtype():
    env = envelope_with(np.linspace(-1, 1, 1000, dtype=np.float32))
    handle = PlainServer().load(env, "pseudo_gradient", 1000)
    assert handle.dtype == np.float32 and not handle.flags.writeable
    with pytest.raises(ValueError):
        handle[0] = 1.0  # a handle is only read
    # the copy a reader may change is still there, in float64
    own = env.vector("pseudo_gradient", 1000)
    assert own.dtype == np.float64 and own.flags.writeable
    assert np.array_equal(own, handle.astype(np.float64))


def test_folding_an_upload_allocates_no_model_sized_temporary_and_is_bit_for_bit():
    rng = np.random.default_rng(0)
    x = rng.normal(size=N).astype(np.float32)
    total = PlainRunningSum(N)
    total.add(x, 0.3)
    peak = peak_bytes(lambda: total.add(x, 0.7))
    assert peak < 8 * N / 8, f"a fold allocated {peak / 1e6:.1f} MB (the model: {8 * N / 1e6} MB)"
    expected = 0.3 * x.astype(np.float64)
    expected += 0.7 * x.astype(np.float64)
    assert np.array_equal(total.result(), expected)


class _Level:  # the one thing FirstPolynomialSum reads of its level: the moduli per coefficient
    def __init__(self, prime: int, n: int):
        self.moduli = np.full(n, prime, dtype=np.uint64)


def test_the_first_polynomial_sum_takes_the_first_upload_over_and_folds_in_blocks():
    prime, width, rows = (1 << 60) - 93, 4096, N // 4096
    rng = np.random.default_rng(1)
    a = rng.integers(0, prime, size=(rows, width), dtype=np.uint64)
    b = rng.integers(0, prime, size=(rows, width), dtype=np.uint64)
    expected = (a.astype(object) + b.astype(object)) % prime  # exact, in Python integers
    total = FirstPolynomialSum(_Level(prime, width))  # type: ignore[arg-type]
    first_peak = peak_bytes(lambda: total.add(a))
    assert total.total is a  # taken over (a running sum owns its handles), not copied
    assert first_peak < a.nbytes / 8
    peak = peak_bytes(lambda: total.add(b))
    assert peak < a.nbytes / 8, f"a fold allocated {peak / 1e6:.1f} MB"
    assert np.array_equal(total.total.astype(object), expected)


@pytest.mark.parametrize("factor", [1, 12345])  # lean's clients weight; compact's server does
def test_a_threshold_fold_is_in_place_and_exact_and_checks_every_coefficient(factor):
    ring_ = ring(4096, ntt_prime(60, 4096))
    rows = N // 4096
    rng = np.random.default_rng(3)
    a = rng.integers(0, ring_.p, size=(rows, 4096), dtype=np.uint64)
    b = rng.integers(0, ring_.p, size=(rows, 4096), dtype=np.uint64)
    expected = (a.astype(object) + factor * b.astype(object)) % ring_.p
    acc = a.copy()
    peak = peak_bytes(lambda: fold_into(ring_, acc, b, factor))
    assert peak < a.nbytes / 8, f"a fold allocated {peak / 1e6:.1f} MB"
    assert np.array_equal(acc.astype(object), expected)
    bad = b.copy()
    bad[-1, -1] = ring_.p  # not a residue: refused, as the whole-array combine refused it
    with pytest.raises(ValueError):
        fold_into(ring_, acc, bad, factor)
    with pytest.raises(MalformedCiphertext):
        fold_into(ring_, acc, b[:-1], factor)


def test_a_release_is_written_once_and_read_back_as_sent():
    from secagg.ckks.first_polys import FreshLevel, checked_first_sums, plaintext_chunks
    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import PublicCKKS

    level = FreshLevel(PublicCKKS(get_preset("lean")))
    per_chunk = level.public.preset.values_per_ciphertext
    chunks = N // per_chunk
    rng = np.random.default_rng(4)
    total = rng.integers(
        0, int(level.moduli[0]), size=(chunks, level.coefficients), dtype=np.uint64
    )
    scale = level.public.scale
    release: list[wire.Field] = []
    peak = peak_bytes(
        lambda: release.append(wire.ciphertext_rows(plaintext_chunks(level, total, scale)))
    )
    (field,) = release
    # the release's own bytes and nothing beside them (a list of blobs joined took twice)
    assert field.nbytes <= peak < field.nbytes * 1.05, (peak, field.nbytes)
    env = Envelope.from_bytes(
        Envelope("server", "client_0", 0, "reveal", {"aggregate": field}).to_bytes()
    )
    read, read_scale = checked_first_sums(
        level, env.ciphertext_parts("aggregate"), chunks * per_chunk
    )
    assert np.array_equal(read, total) and read_scale == scale


def test_comparing_two_decryptions_allocates_no_model_sized_temporary():
    rng = np.random.default_rng(2)
    a = rng.normal(size=N)
    b = a + rng.normal(scale=1e-3, size=N)
    peak = peak_bytes(lambda: decryptions_agree(a, 1e-3 / 2**0.5, b, 1e-3 / 2**0.5, rounding=0))
    assert peak < a.nbytes / 8, f"the comparison allocated {peak / 1e6:.1f} MB"
    # still a check that can fail: a shifted decryption disagrees, a fresh draw agrees
    assert decryptions_agree(a, 1e-3 / 2**0.5, b, 1e-3 / 2**0.5, rounding=0)
    assert not decryptions_agree(a, 1e-3 / 2**0.5, b + 0.05, 1e-3 / 2**0.5, rounding=0)


def test_the_rounds_model_is_a_read_only_view_of_the_servers_params():
    server, _, _ = run_one_round("plain", True)
    ctx = server._context(1, server.optimizer)
    assert ctx.model is not None and np.shares_memory(ctx.model, server.params)
    assert np.array_equal(ctx.model, server.params)
    with pytest.raises(ValueError):
        ctx.model[0] = 1.0  # a protocol reads the round's model; only the step changes it


@pytest.mark.parametrize(
    "rows", [np.zeros((3, 8), dtype=np.uint64), np.zeros(24, dtype=np.uint8)], ids=["u64", "1-D"]
)
def test_ciphertext_rows_refuse_anything_but_a_2d_byte_array(rows):
    with pytest.raises(UnexpectedField, match="2-D uint8"):
        wire.ciphertext_rows(rows)
