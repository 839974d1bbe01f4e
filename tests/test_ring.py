"""The threshold backend's ring (``secagg/threshold/ring.py`` over the native extension):
SEAL's NTT product against a schoolbook one in Python ints, masks that add up and come off
with the keys' sum up to SEAL's noise bound, public polynomials fixed by their seed, Shamir
shares, the byte format's checks and the constructor's."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from secagg.ckks import native
from secagg.errors import ConfigError, MalformedCiphertext
from secagg.threshold import ring as ring_module
from secagg.threshold.ring import Ring, ntt_prime, ring

pytestmark = pytest.mark.skipif(
    os.environ.get(native.ENV, "").lower() == "off", reason="SECAGG_NATIVE=off: not built"
)

N = 1024
CBD_BOUND = 21  # SEAL's centred binomial noise (σ = 3.2): a sum of 21 bits minus 21 bits
P30, P60 = ntt_prime(30, N), ntt_prime(60, N)
SEED = bytes(range(32))
rng = np.random.default_rng(2024)


def uniform(r: Ring, *shape: int) -> np.ndarray:
    return rng.integers(0, r.p, size=shape or (r.n,), dtype=np.uint64)


def schoolbook(x: np.ndarray, y: np.ndarray, p: int) -> list[int]:
    """x·y mod (X^n + 1, p) in Python ints."""
    n = len(x)
    full = np.convolve(x.astype(object), y.astype(object))
    product = list(full[:n])
    for k in range(n - 1):
        product[k] -= full[n + k]  # X^(n+k) = −X^k
    return [int(v) % p for v in product]


def centred(values: np.ndarray, p: int) -> np.ndarray:
    v = values.astype(object) % p
    return np.array([int(c) - p if c > p // 2 else int(c) for c in v.ravel()]).reshape(values.shape)


@pytest.fixture(params=[P30, P60], ids=["30-bit", "60-bit"])
def r(request: pytest.FixtureRequest) -> Ring:
    return ring(N, request.param)


def test_ntt_prime_is_the_largest_ntt_prime_of_its_size():
    for bits in (30, 31, 60):
        p = ntt_prime(bits, 4096)
        assert p.bit_length() == bits and p % 8192 == 1
        assert pow(3, p - 1, p) == 1  # Fermat: prime (SEAL checked it more thoroughly)
    assert P60 > P30 and (P60 - 1) % (2 * N) == 0
    with pytest.raises(ValueError):
        ntt_prime(61, N)


def test_properties_and_the_cache():
    r = ring(N, P30)
    assert (r.n, r.p, r.bits, r.coefficient_bytes) == (N, P30, 30, 4)
    assert ring(N, P60).coefficient_bytes == 8 and ring(N, P60).bits == 60
    assert ring(N, P30) is r


def test_ntt_multiplication_is_the_negacyclic_product(r: Ring):
    x, y = uniform(r), uniform(r)
    assert r.multiply(x, y).tolist() == schoolbook(x, y, r.p)
    key = r.key()  # a ternary operand, as a mask's
    assert r.multiply(x, key).tolist() == schoolbook(x, key, r.p)
    assert np.array_equal(r.intt(r.ntt(x)), x)
    assert not np.array_equal(r.ntt(x), x)


def test_unmask_removes_the_public_polynomials_times_the_key(r: Ring):
    """unmask(0, k) = −a_b·k, a_b = intt(public(seed)[b]): the NTT-domain public polynomials."""
    key, blocks = r.key(), 3
    a = r.intt(r.public(SEED, blocks))
    got = r.unmask(np.zeros((blocks, r.n), np.uint64), key, SEED)
    assert got.dtype == np.int64 and got.shape == (blocks, r.n)
    for b in range(blocks):
        minus_ak = [(-v) % r.p for v in schoolbook(a[b], key, r.p)]
        assert np.array_equal(got[b], centred(np.array(minus_ak, dtype=object), r.p))


def test_mask_then_unmask_gives_the_messages_plus_small_noise(r: Ring):
    key, blocks = r.key(), 8
    half = (r.p - 1) // 2
    messages = rng.integers(-1000, 1000, size=(blocks, r.n), dtype=np.int64)
    messages[0, :2] = [half - CBD_BOUND, -(half - CBD_BOUND)]  # the edges wrap back exactly
    masked = r.mask(key, SEED, messages)
    assert masked.dtype == np.uint64 and masked.shape == (blocks, r.n)
    assert int(masked.max()) < r.p
    error = r.unmask(masked, key, SEED) - messages
    assert np.abs(error).max() <= CBD_BOUND
    assert abs(error.mean()) < 0.25  # 5 standard errors of the mean of 8192 draws
    assert 2.9 < error.std() < 3.5
    # fresh noise each time: the same key and messages mask differently
    assert not np.array_equal(r.mask(key, SEED, messages), masked)


def test_messages_must_be_below_half_p():
    r = ring(N, P30)
    key, half = r.key(), (r.p - 1) // 2
    for bad in (half + 1, -(half + 1), np.iinfo(np.int64).min):
        messages = np.zeros((1, N), dtype=np.int64)
        messages[0, 5] = bad
        with pytest.raises(ValueError, match="p/2"):
            r.mask(key, SEED, messages)
    with pytest.raises(ValueError, match="integer"):
        r.mask(key, SEED, np.zeros((1, N), dtype=np.float64))
    with pytest.raises(ValueError, match="shape"):
        r.mask(key, SEED, np.zeros((1, N + 1), dtype=np.int64))
    with pytest.raises(ValueError, match="32 bytes"):
        r.mask(key, SEED[:31], np.zeros((1, N), dtype=np.int64))
    with pytest.raises(ValueError, match="not below p"):
        r.mask(np.full(N, r.p, dtype=np.uint64), SEED, np.zeros((1, N), dtype=np.int64))


def test_a_weighted_sum_of_masks_unmasks_with_the_weighted_sum_of_keys(r: Ring):
    weights, blocks = [3, -2, 5], 4
    keys = [r.key() for _ in weights]
    messages = [rng.integers(-500, 500, size=(blocks, r.n), dtype=np.int64) for _ in weights]
    masks = [r.mask(k, SEED, m) for k, m in zip(keys, messages, strict=True)]
    total = r.combine(masks, weights).reshape(blocks, r.n)
    key_sum = r.combine(np.stack(keys), weights)
    expected = sum(w * m for w, m in zip(weights, messages, strict=True))
    error = r.unmask(total, key_sum, SEED) - expected
    assert np.abs(error).max() <= sum(abs(w) for w in weights) * CBD_BOUND
    assert np.abs(error).max() > 0  # the noise is there


def test_public_polynomials_are_fixed_by_seed_and_block(r: Ring):
    a = r.public(SEED, 3)
    assert a.shape == (3, r.n) and a.dtype == np.uint64 and int(a.max()) < r.p
    assert np.array_equal(a, r.public(SEED, 3))
    assert np.array_equal(a[:2], r.public(SEED, 2))  # block b depends on (seed, b) only
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[1], a[2])
    other = r.public(bytes(32), 3)
    assert all(not np.array_equal(a[b], other[b]) for b in range(3))
    assert r.public(SEED, 0).shape == (0, r.n)
    # uniform mod p: the mean of 3n draws is within a few standard errors of (p − 1)/2
    assert abs(a.astype(float).mean() / r.p - 0.5) < 0.02


def test_keys_are_ternary_and_fresh(r: Ring):
    key = r.key()
    assert key.shape == (r.n,) and key.dtype == np.uint64
    values, counts = np.unique(key, return_counts=True)
    assert values.tolist() == [0, 1, r.p - 1]
    assert all(abs(c - r.n / 3) < 0.15 * r.n for c in counts)
    assert not np.array_equal(key, r.key())


def test_shares_reconstruct_from_any_t_and_not_from_fewer(r: Ring):
    secret, t, xs = uniform(r), 3, [1, 2, 3, 7, 9]
    shares = r.shares(secret, t, xs)
    assert shares.shape == (len(xs), r.n) and int(shares.max()) < r.p
    for subset in itertools.combinations(range(len(xs)), t):
        picked = list(subset)
        assert np.array_equal(r.reconstruct(shares[picked], [xs[i] for i in picked]), secret)
    for subset in itertools.combinations(range(len(xs)), t - 1):
        picked = list(subset)
        guess = r.reconstruct(shares[picked], [xs[i] for i in picked])
        assert not np.array_equal(guess, secret)
    assert not np.array_equal(r.shares(secret, t, xs), shares)  # fresh coefficients
    # t = 1: every share is the secret
    assert all(np.array_equal(s, secret) for s in r.shares(secret, 1, [4, 5]))


def test_consistent_detects_an_altered_share(r: Ring):
    secret, t, xs = r.key(), 3, [2, 4, 6, 8, 10]
    shares = r.shares(secret, t, xs)
    assert r.consistent(shares, xs, t)
    assert r.consistent(shares[:t], xs[:t], t)  # t points always fit
    for row in (0, t):  # altered among the first t, and past them
        bad = shares.copy()
        bad[row, 17] = (int(bad[row, 17]) + 1) % r.p
        assert not r.consistent(bad, xs, t)
    # shares of degree t (t + 1 needed) do not lie on a polynomial of degree < t
    assert not r.consistent(r.shares(secret, t + 1, xs), xs, t)


def test_shares_refuse_bad_points():
    r = ring(N, P30)
    secret = r.key()
    for xs, match in (([1, 0, 2], r"\[1, p\)"), ([1, 2, 2], "distinct"), ([1, r.p], r"\[1, p\)")):
        with pytest.raises(ValueError, match=match):
            r.shares(secret, 2, xs)
    with pytest.raises(ValueError, match="t <="):
        r.shares(secret, 4, [1, 2, 3])
    with pytest.raises(ValueError):
        r.lagrange([1, 1])


def test_lagrange_interpolates_at_any_point():
    r = ring(N, P60)
    coefficients = [5, r.p - 7, 2**59 + 3]
    f = lambda x: sum(c * x**d for d, c in enumerate(coefficients)) % r.p
    xs = [3, 10, 2**40]
    for at in (0, 4, r.p - 1):
        lam = r.lagrange(xs, at=at)
        assert sum(li * f(x) for li, x in zip(lam, xs, strict=True)) % r.p == f(at)


def test_combine_reduces_large_and_negative_weights(r: Ring):
    polys = uniform(r, 4, 3 * r.n + 5)  # any length, not only whole polynomials
    weights = [r.p + 3, -2, 2**100 + 1, -(r.p * 5) - 1]
    got = r.combine(polys, weights)
    assert got.shape == (polys.shape[1],) and got.dtype == np.uint64
    for j in (0, 1, r.n, 2 * r.n + 7, polys.shape[1] - 1):
        want = sum(w * int(polys[i, j]) for i, w in enumerate(weights)) % r.p
        assert int(got[j]) == want
    assert np.array_equal(r.combine(list(polys), weights), got)  # m arrays, no stacking
    assert np.array_equal(r.combine(polys, [np.int64(1), 0, 0, 0]), polys[0])
    with pytest.raises(ValueError, match="one weight per"):
        r.combine(polys, [1, 2])
    with pytest.raises(ValueError, match="integer"):
        r.combine(polys, [1.0, 2, 3, 4])  # type: ignore[list-item]
    bad = polys.copy()
    bad[2, 9] = r.p
    with pytest.raises(ValueError, match="not below p"):
        r.combine(bad, weights)


def test_bytes_round_trip_and_refuse_malformed_input(r: Ring):
    polys = uniform(r, 3, r.n)
    blob = r.to_bytes(polys)
    assert len(blob) == 3 * r.n * r.coefficient_bytes
    back = r.from_bytes(blob, 3)
    assert back.dtype == np.uint64 and np.array_equal(back, polys)
    with pytest.raises(MalformedCiphertext, match="bytes"):
        r.from_bytes(blob[:-1], 3)
    with pytest.raises(MalformedCiphertext, match="bytes"):
        r.from_bytes(blob, 2)
    too_big = polys.copy()
    too_big[1, 5] = r.p
    raw = too_big.astype(f"<u{r.coefficient_bytes}").tobytes()
    with pytest.raises(MalformedCiphertext, match="below p"):
        r.from_bytes(raw, 3)
    with pytest.raises(ValueError):
        r.to_bytes(too_big)


def test_the_constructor_refuses_bad_parameters():
    not_ntt = 2**31 - 1  # prime, but 2^31 − 2 is not a multiple of 2n
    for n, p, match in (
        (N, not_ntt, "1 mod 2n"),
        (N, (2 * N + 1) * (4 * N + 1), "not prime"),  # 1 mod 2n, composite
        (N, 2**61 - 1, "60 bits"),  # a Mersenne prime, past SEAL's 60 bits
        (1000, P30, "power of two"),
        (512, P30, "power of two"),
    ):
        with pytest.raises(ValueError, match=match):
            Ring(n, p)
    Ring(4096, ntt_prime(31, 4096))  # what presets use


def test_a_missing_extension_names_the_build_script(monkeypatch: pytest.MonkeyPatch):
    def missing(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    ring_module._extension.cache_clear()
    monkeypatch.setattr(ring_module.importlib, "import_module", missing)
    try:
        with pytest.raises(ConfigError, match="scripts/build_native.sh"):
            Ring(N, P30)
    finally:
        monkeypatch.undo()
        ring_module._extension.cache_clear()


def test_combine_spreads_only_large_sums_over_threads_and_gives_the_same_sum(
    r: Ring, monkeypatch: pytest.MonkeyPatch
):
    """A small sum runs on one thread whatever the cores (starting a thread costs more than
    it saves); a large one on several, with the same result as on one."""
    asked: list[int] = []
    native_combine = r._ring.combine

    def spy(polys, weights, threads):
        asked.append(threads)
        return native_combine(polys=polys, weights=weights, threads=threads)

    monkeypatch.setattr(r, "_ring", type("Spy", (), {"combine": staticmethod(spy)})())
    monkeypatch.setenv(native.THREADS_ENV, "4")
    small = uniform(r, 2, 8 * r.n)
    large = uniform(r, 2, ring_module.COMBINE_PER_THREAD * 2)
    r.combine(small, [1, 3])
    got = r.combine(large, [1, 3])
    r.combine(list(large), [1, 3])
    assert asked == [1, 4, 4]
    monkeypatch.setenv(native.THREADS_ENV, "1")
    assert np.array_equal(r.combine(large, [1, 3]), got)
