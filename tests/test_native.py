"""The native path (``secagg/ckks/native.py``) against TenSEAL's binding: the same SEAL
objects, the same expansions bit for bit, the same sums, and fresh randomness everywhere.

Each test runs the real classes with ``SECAGG_NATIVE`` chosen per test; the set-up builds the
extension (``scripts/build_native.sh``), so a missing one fails here unless it was turned off.
"""

import os
import struct
import sys

import numpy as np
import pytest
import tenseal.sealapi as seal

from secagg.ckks import native
from secagg.ckks.presets import get_preset
from secagg.ckks.public import (
    COMPR_NONE,
    COMPR_PACKED,
    COMPR_ZSTD,
    HEADER_BYTES,
    PACKED_HEAD,
    SEED_INFO_BYTES,
    ciphertext_raw_bytes,
    raw_body,
    read_header,
)
from secagg.ckks.release import SecondPolynomials
from secagg.errors import ConfigError, ReleaseRefused
from secagg.secret.ckks_keys import SecretKeyHolder
from tests.harness import PLAN, BackendRound, planned_sum, planned_values

pytestmark = pytest.mark.skipif(
    os.environ.get(native.ENV, "").lower() == "off", reason="SECAGG_NATIVE=off: not built"
)
VALUES = np.random.default_rng(7).uniform(-1, 1, 9000)  # 3 chunks, the last one partial


def second_polynomial(polys: SecondPolynomials, ct) -> bytes:
    """A whole ciphertext's second polynomial: the last one in its serialised data."""
    from secagg.ckks.public import raw_ciphertext

    return raw_ciphertext(ct)[-polys._poly_bytes :]


def test_the_extension_is_built_on_the_seal_tenseal_reads():
    extension = native.module()
    assert extension is not None, "run scripts/build_native.sh (the set-up does)"
    assert extension.SEAL_VERSION.startswith("4.1.")


def _both_paths(monkeypatch, preset_name):
    """One key; its uploads of VALUES on the native path and on TenSEAL's."""
    keys = SecretKeyHolder(get_preset(preset_name))
    out = {}
    for mode in ("on", "off"):
        monkeypatch.setenv(native.ENV, mode)
        out[mode] = keys.encrypt(VALUES, bound=1.0)
    return keys, out


@pytest.mark.parametrize("preset_name", ["lean", "compact"])
def test_native_uploads_are_seals_objects_and_decrypt_as_tenseals(monkeypatch, preset_name):
    keys, uploads = _both_paths(monkeypatch, preset_name)
    preset = keys.preset
    n, primes = preset.poly_modulus_degree, keys.public.n_primes
    seeded = ciphertext_raw_bytes(n, primes, seeded=True)
    for ours, theirs in zip(uploads["on"], uploads["off"], strict=True):
        raw_ours, raw_theirs = raw_body(ours, seeded, "ours"), raw_body(theirs, seeded, "tenseal")
        assert len(raw_ours) == len(raw_theirs) == seeded
        assert raw_ours[:32] == raw_theirs[:32]  # the same parms_id: the same fresh level
        assert raw_ours[-SEED_INFO_BYTES] == raw_theirs[-SEED_INFO_BYTES]  # the PRNG type
    # lean travels uncompressed (a 60-bit prime leaves nothing to take), compact packed in 48
    # bits a coefficient (``packing``); TenSEAL's binding writes zstd
    mode = read_header(uploads["on"][0]).compr_mode
    assert mode == (COMPR_NONE if preset_name == "lean" else COMPR_PACKED)
    assert read_header(uploads["off"][0]).compr_mode == COMPR_ZSTD
    for mode_name in ("on", "off"):
        decrypted = keys.decrypt(uploads[mode_name], VALUES.size, keys.public.scale)
        np.testing.assert_allclose(decrypted, VALUES, atol=1e-6)
    sizes = {m: sum(map(len, u)) / VALUES.size for m, u in uploads.items()}
    # no larger than TenSEAL's (zstd's output on random coefficients varies by a few bytes);
    # packed, compact's are 12.1 bytes a value against zstd's 13.7
    assert sizes["on"] <= sizes["off"] * (1.002 if preset_name == "lean" else 0.9), sizes


def test_every_chunk_and_every_call_draws_fresh_randomness(monkeypatch):
    """A seed (or the noise behind it) reused across chunks or calls would let the server
    subtract two uploads: every seed differs, and the same values encrypt differently."""
    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset("lean"))
    first, second = keys.encrypt(VALUES, 1.0), keys.encrypt(VALUES, 1.0)
    seeds = [p[-SEED_INFO_BYTES:] for p in first + second]
    assert len(set(seeds)) == len(seeds) == 6
    assert all(a[:-SEED_INFO_BYTES] != b[:-SEED_INFO_BYTES] for a, b in zip(first, second))


def test_threads_change_nothing_but_the_time(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset("lean"))
    monkeypatch.setattr(native, "threads", lambda: 1)
    one = keys.encrypt(VALUES, 1.0)
    monkeypatch.setattr(native, "threads", lambda: 3)
    three = keys.encrypt(VALUES, 1.0)
    for parts in (one, three):
        np.testing.assert_allclose(
            keys.decrypt(parts, VALUES.size, keys.public.scale), VALUES, atol=1e-6
        )


def test_seed_expansion_is_seals_bit_for_bit(monkeypatch):
    """Σ a_i from the native expansion equals what TenSEAL's SEAL expands loading the
    uploads, for every chunk."""
    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset("lean"))
    seeds = [
        b"".join(p[-SEED_INFO_BYTES:] for p in keys.encrypt(VALUES * (i + 1), 4.0))
        for i in range(3)
    ]
    polys = SecondPolynomials(keys.public, keys.seeded_template())
    sums = native.seed_expander(keys.preset.poly_modulus_degree, tuple(keys.preset.coeff_bits)).sum(
        seeds=seeds,
        chunks=3,
        threads=2,
    )
    for j in range(3):
        tenseal = second_polynomial(polys, polys._expanded(polys._zeroed, seeds, j))
        assert np.frombuffer(tenseal, dtype="<u8").tobytes() == sums[j].astype("<u8").tobytes()
        assert second_polynomial(polys, polys._with_second(sums[j])) == tenseal


def test_weighted_seed_expansion_is_seals_multiply_plain_bit_for_bit(monkeypatch):
    """On a server-weighted preset the check recomputes Σ k_i·a_i: the native product by the
    integer k_i mod each prime equals SEAL's multiply_plain by k_i encoded as a constant."""
    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset("compact"))
    seeds = [
        b"".join(
            raw_body(p, 1 << 20, "upload")[-SEED_INFO_BYTES:] for p in keys.encrypt(VALUES, 1.0)
        )
        for _ in range(3)
    ]  # compact's uploads travel zstd-compressed: the seed is at the end of the raw body
    ks = [3, 1, 700_001]
    chunks = len(seeds[0]) // SEED_INFO_BYTES
    sums = native.seed_expander(keys.preset.poly_modulus_degree, tuple(keys.preset.coeff_bits)).sum(
        seeds=seeds,
        chunks=chunks,
        factors=ks,
        threads=2,
    )
    polys = SecondPolynomials(keys.public, keys.seeded_template())
    wscale = 2.0**keys.preset.weight_bits
    factors = []
    for k in ks:
        pt = seal.Plaintext()
        keys.public.encoder.encode(k / wscale, keys.public.context.first_parms_id(), wscale, pt)
        factors.append(pt)
    for j in range(chunks):
        tenseal = second_polynomial(polys, polys._expanded(polys._template, seeds, j, factors))
        assert tenseal == sums[j].astype("<u8").tobytes()
    unweighted = native.seed_expander(
        keys.preset.poly_modulus_degree, tuple(keys.preset.coeff_bits)
    ).sum(
        seeds=seeds,
        chunks=chunks,
        threads=1,
    )
    assert not np.array_equal(unweighted, sums)  # the factors were applied


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_lean_round_reveals_the_same_sum_on_both_paths(monkeypatch, mode):
    monkeypatch.setenv(native.ENV, mode)
    values = planned_values()
    run = BackendRound(list(PLAN), 5000, decryption_budget=4, reveal_length=5000, preset="lean")
    revealed = run.reveal_running_sum(run.uploads(values, PLAN), PLAN)
    np.testing.assert_allclose(revealed, planned_sum(values), atol=2e-3)


def test_a_seed_of_an_unknown_prng_is_refused(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset("lean"))
    seeds = bytearray(b"".join(p[-SEED_INFO_BYTES:] for p in keys.encrypt(VALUES, 1.0)))
    seeds[SEED_INFO_BYTES] = 77  # chunk 1's PRNG type
    polys = SecondPolynomials(keys.public, keys.seeded_template())
    from secagg.ckks.release import Descriptor

    d = Descriptor("reveal", "global_update", 0, VALUES.size, 3, ())
    with pytest.raises(ReleaseRefused, match="do not expand"):
        polys._native_sums(d, [bytes(seeds)])


def test_the_mode_is_checked_and_on_requires_the_extension(monkeypatch):
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ConfigError, match="choose one of auto, on, off"):
        native.module()
    monkeypatch.setitem(sys.modules, "secagg.ckks._seal_native", None)  # as if not built
    monkeypatch.setenv(native.ENV, "on")
    with pytest.raises(ConfigError, match="build_native.sh"):
        native.module()
    monkeypatch.setenv(native.ENV, "auto")
    assert native.module() is None  # auto falls back to TenSEAL's binding


def _expanded_aggregate(monkeypatch):
    """A lean client's own upload, opened as a one-entry aggregate on both paths' inputs."""
    from secagg.ckks.first_polys import FreshLevel, first_polynomials, plaintext_blobs
    from secagg.ckks.release import Descriptor

    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset("lean"))
    level = FreshLevel(keys.public)
    first, seeds = first_polynomials(level, keys.encrypt(VALUES, 1.0), VALUES.size)
    d = Descriptor("reveal", "global_update", 0, VALUES.size, len(first), ())
    polys = SecondPolynomials(keys.public, keys.seeded_template())
    return keys, level, polys, d, first, seeds, plaintext_blobs(level, first, keys.public.scale)


def test_a_native_open_decrypts_what_tenseal_decrypts(monkeypatch):
    from secagg.ckks.first_polys import load_first_sums

    keys, level, polys, d, first, seeds, blobs = _expanded_aggregate(monkeypatch)
    aggregate = polys.expanded(d, [seeds], first, keys.public.scale)
    ours, sigma = keys.open_flooded(aggregate, VALUES.size, 0.0)
    assert sigma == 0
    monkeypatch.setenv(native.ENV, "off")
    cts = polys.build(d, [seeds], load_first_sums(level, blobs, VALUES.size))
    theirs, _ = keys.open_flooded(cts, VALUES.size, 0.0)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours, VALUES, atol=1e-6)
    # flooded: the values move by noise of the σ reported, as on TenSEAL's path
    monkeypatch.setenv(native.ENV, "on")
    flooded, sigma = keys.open_flooded(aggregate, VALUES.size, 2.0**30)
    assert sigma > 1e-7
    assert 0.8 * sigma < float(np.std(flooded - ours)) < 1.2 * sigma


def test_expanding_natively_with_the_extension_off_is_refused(monkeypatch):
    keys, level, polys, d, first, seeds, _ = _expanded_aggregate(monkeypatch)
    monkeypatch.setenv(native.ENV, "off")
    with pytest.raises(ConfigError, match="off or not built"):
        polys.expanded(d, [seeds], first, keys.public.scale)


def test_a_native_open_refuses_a_coefficient_outside_its_prime(monkeypatch):
    from secagg.ckks.release import ExpandedAggregate
    from secagg.errors import MalformedCiphertext

    keys, level, polys, d, first, seeds, _ = _expanded_aggregate(monkeypatch)
    aggregate = polys.expanded(d, [seeds], first, keys.public.scale)
    bad = aggregate.first.copy()
    bad[1, 5] = level.moduli[5]
    with pytest.raises(MalformedCiphertext, match="below its prime"):
        keys.open_flooded(
            ExpandedAggregate(bad, aggregate.second, aggregate.scale), VALUES.size, 0.0
        )


def test_the_thread_count_is_checked_and_chosen_restores_the_environment(monkeypatch):
    monkeypatch.delenv(native.THREADS_ENV, raising=False)
    monkeypatch.setenv(native.ENV, "auto")
    assert native.threads() >= 1
    with native.chosen("off", threads=3):
        assert native.module() is None and native.threads() == 3
    assert os.environ[native.ENV] == "auto" and native.THREADS_ENV not in os.environ
    monkeypatch.setenv(native.THREADS_ENV, "0")
    with pytest.raises(ConfigError, match="positive number of threads"):
        native.threads()
    with pytest.raises(ConfigError, match="choose one of"):
        with native.chosen("fast"):
            pass


def _one_chunk_upload(monkeypatch, preset_name: str, mode: int):
    """A native upload of 8 values (one chunk), as it travels in ``mode``, and the level the
    server reads it at; the server accepts it as sent."""
    from secagg.ckks.first_polys import FreshLevel, first_polynomials

    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset(preset_name))
    (upload,) = keys.encrypt(np.ones(8), 1.0)
    assert read_header(upload).compr_mode == mode
    level = FreshLevel(keys.public)
    first_polynomials(level, [upload], 8)  # as sent: accepted
    return level, upload


def _longer(blob: bytes, extra: int) -> bytes:
    """``blob`` with ``extra`` zero bytes appended and its header's size saying so."""
    return blob[:8] + (len(blob) + extra).to_bytes(8, "little") + blob[16:] + bytes(extra)


@pytest.mark.parametrize(
    "forge, error",
    [
        (lambda b: b[:-8], "claims .* bytes but has"),  # truncated, header left as it was
        (lambda b: _longer(b, 8), "inflates to 32954 bytes"),  # the layout is checked
        (lambda b: _longer(b, 70_000), "at most"),  # longer than any ciphertext here
        (lambda b: b[:5] + b"\x01" + b[6:], "compression mode 1"),  # zlib: never written here
        (lambda b: b[:5] + b"\x02" + b[6:], "not a zstd body"),  # says zstd, is not
    ],
    ids=["truncated", "8 bytes longer", "longer than any", "zlib", "zstd-labelled raw body"],
)
def test_a_server_refuses_a_malformed_uncompressed_upload(monkeypatch, forge, error):
    """The native path's uploads travel uncompressed; the server's checks bound them as they
    bound compressed ones, before SEAL reads a byte (``public.raw_body``)."""
    from secagg.ckks.first_polys import first_polynomials
    from secagg.errors import MalformedCiphertext

    level, upload = _one_chunk_upload(monkeypatch, "lean", COMPR_NONE)
    with pytest.raises(MalformedCiphertext, match=error):
        first_polynomials(level, [forge(upload)], 8)


def _set(blob: bytes, at: int, value: bytes) -> bytes:
    return blob[:at] + value + blob[at + len(value) :]


@pytest.mark.parametrize("preset_name", ["lean", "wide"])
def test_an_upload_as_clients_write_it_is_read_in_one_pass_to_the_same_polynomials(
    monkeypatch, preset_name
):
    """An uncompressed upload in the frame this build's clients write is read by array
    operations (``_framed_uploads``), to exactly what the field-by-field parse reads."""
    from secagg.ckks import first_polys

    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset(preset_name))
    level = first_polys.FreshLevel(keys.public)
    upload = keys.encrypt(VALUES, 1.0)
    framed = first_polys._framed_uploads(level, upload)
    assert framed is not None
    monkeypatch.setattr(first_polys, "_framed_uploads", lambda level, parts: None)
    first, seeds = first_polys.first_polynomials(level, upload, VALUES.size)
    assert np.array_equal(framed[0], first) and framed[1] == seeds


@pytest.mark.parametrize("preset_name", ["lean", "compact"])  # written as is, and packed
@pytest.mark.parametrize(
    "forge, error",
    [
        (lambda b, m, c: _set(b, c, b"\xff" * 8), "outside its modulus"),  # a coefficient
        (lambda b, m, c: _set(b, m + 32, b"\x00"), "not a CKKS ciphertext in NTT form"),
        (lambda b, m, c: _set(b, m, bytes(32)), "not at this preset's fresh level"),
        (lambda b, m, c: _set(b, m + 57, struct.pack("<d", 2.0**40)), "has scale 2\\^40"),
        (lambda b, m, c: _set(b, m + 65, struct.pack("<Q", 2)), "NTT form"),  # correction
        (lambda b, m, c: _set(b, len(b) - 65, b"\x07"), "PRNG type 7"),
        (lambda b, m, c: _set(b, 3, b"\x09"), "written by SEAL"),  # another SEAL version
    ],
    ids=["coefficient", "not NTT", "parms_id", "scale", "correction", "seed", "version"],
)
def test_the_one_pass_read_takes_nothing_the_field_checks_refuse(
    monkeypatch, preset_name, forge, error
):
    """A chunk that leaves the frame in any field is handed to the field-by-field parse,
    which refuses it and names what is wrong: the fast read never accepts more."""
    from secagg.ckks import first_polys
    from secagg.errors import MalformedCiphertext, WrongContext

    monkeypatch.setenv(native.ENV, "on")
    keys = SecretKeyHolder(get_preset(preset_name))
    level = first_polys.FreshLevel(keys.public)
    upload = keys.encrypt(VALUES, 1.0)
    prefix, _, packed = level.upload_frame()
    assert packed == (preset_name == "compact")
    meta = HEADER_BYTES + (PACKED_HEAD.size if packed else 0)  # the ciphertext's metadata
    forged = [upload[0], forge(upload[1], meta, len(prefix)), upload[2]]
    assert all(len(f) == len(upload[0]) for f in forged)  # the length stays the frame's
    assert first_polys._framed_uploads(level, upload) is not None
    assert first_polys._framed_uploads(level, forged) is None
    with pytest.raises((MalformedCiphertext, WrongContext), match=error):
        first_polys.first_polynomials(level, forged, VALUES.size)


def _packing_head(blob: bytes, offset: int, count: int) -> bytes:
    return _set(blob, HEADER_BYTES, PACKED_HEAD.pack(offset, count))


@pytest.mark.parametrize(
    "forge, error",
    [
        (lambda b: _packing_head(b, 93, 8191), "do not hold"),  # not in fours
        (lambda b: _packing_head(b, 93, 8224), "do not hold"),  # past its bytes
        (lambda b: _packing_head(b, 60_000, 0), "do not hold"),  # an offset past its bytes
        (lambda b: _packing_head(b, 0, 8192)[:-81], "inflates to"),  # fits, not a ciphertext
        (lambda b: b[: HEADER_BYTES + 4], "ends inside its packing head"),
    ],
    ids=["count", "past the end", "offset", "layout", "truncated head"],
)
def test_a_server_refuses_a_malformed_packed_upload(monkeypatch, forge, error):
    """A packed chunk's head says where its packed coefficients are; the server unpacks
    nothing its bytes do not hold, nor more than a ciphertext of the preset, and then checks
    the unpacked body as any other (``public.unpacked``)."""
    from secagg.ckks.first_polys import first_polynomials
    from secagg.errors import MalformedCiphertext

    level, upload = _one_chunk_upload(monkeypatch, "compact", COMPR_PACKED)
    forged = forge(upload)
    forged = forged[:8] + len(forged).to_bytes(8, "little") + forged[16:]  # its length, said
    with pytest.raises(MalformedCiphertext, match=error):
        first_polynomials(level, [forged], 8)


@pytest.mark.parametrize("preset_name", ["lean", "compact"])
def test_a_clients_own_seeds_are_read_off_its_chunks_on_every_path(monkeypatch, preset_name):
    """``upload_seeds`` takes a chunk's last bytes where it travels as written or packed and
    inflates a zstd one first: the seeds a full read gives, in chunk order."""
    from secagg.ckks.public import upload_seeds

    keys, uploads = _both_paths(monkeypatch, preset_name)
    most = ciphertext_raw_bytes(keys.preset.poly_modulus_degree, keys.public.n_primes, True)
    for parts in uploads.values():
        full = b"".join(raw_body(p, most, "own")[-SEED_INFO_BYTES:] for p in parts)
        assert upload_seeds(parts, most) == full and len(full) == SEED_INFO_BYTES * len(parts)


def test_packing_is_exact_below_2_48_and_refuses_what_it_would_cut():
    from secagg.ckks.packing import pack_words, unpack_words

    rng = np.random.default_rng(3)
    words = rng.integers(0, 1 << 48, size=(3, 8192), dtype=np.uint64)
    words[0, :4] = [0, (1 << 48) - 1, 1, 1 << 47]
    packed = pack_words(words)
    assert packed.shape == (3, 6144)
    assert np.array_equal(unpack_words(packed), words)
    words[2, 17] = 1 << 48
    with pytest.raises(ValueError, match="2\\^48"):
        pack_words(words)
    with pytest.raises(ValueError, match="multiple of 4"):
        pack_words(words[:, :6])


def _sum_chunks(factors=(1.0, 1.0, 1.0)):
    """A lean aggregate of 3 chunks as the server writes it, chunk j at the preset's scale
    times ``factors[j]`` (a renormalised sum's scale is below it)."""
    from secagg.ckks import first_polys

    keys = SecretKeyHolder(get_preset("lean"))
    level = first_polys.FreshLevel(keys.public)
    first, _ = first_polys.first_polynomials(level, keys.encrypt(VALUES, 1.0), VALUES.size)
    scale = keys.public.scale
    chunks = [
        bytes(first_polys.plaintext_chunks(level, first[j : j + 1], scale * f)[0])
        for j, f in enumerate(factors)
    ]
    return level, chunks


def test_an_aggregate_as_the_server_writes_it_is_read_in_one_pass_to_the_same_sum(monkeypatch):
    """The decryptor's read of a client-weighted sum (``_framed_sums``) gives exactly what
    the field-by-field read gives."""
    from secagg.ckks import first_polys

    monkeypatch.setenv(native.ENV, "on")
    level, chunks = _sum_chunks((0.75, 0.75, 0.75))
    framed = first_polys._framed_sums(level, chunks)
    assert framed is not None
    monkeypatch.setattr(first_polys, "_framed_sums", lambda level, parts: None)
    first, scale = first_polys.checked_first_sums(level, chunks, VALUES.size)
    assert np.array_equal(framed[0], first) and framed[1] == scale == 0.75 * level.public.scale


@pytest.mark.parametrize(
    "factors, forge, error",
    [
        ((1, 1, 1), lambda c: c, None),  # as written: read
        ((1, 0.5, 1), lambda c: c, "different scales"),
        ((2, 2, 2), lambda c: c, "outside its range"),
        ((1, 1, 1), lambda c: c[:-8] + b"\xff" * 8, "outside its modulus"),
        ((1, 1, 1), lambda c: _set(c, HEADER_BYTES, bytes(32)), "fresh level"),
        ((1, 1, 1), lambda c: c[:-8], "has 32848 bytes; a chunk here has 32856"),
    ],
    ids=["as written", "two scales", "scale", "coefficient", "parms_id", "truncated"],
)
def test_the_one_pass_read_of_an_aggregate_takes_nothing_the_field_checks_refuse(
    monkeypatch, factors, forge, error
):
    from secagg.ckks import first_polys
    from secagg.errors import MalformedCiphertext, WrongContext

    monkeypatch.setenv(native.ENV, "on")
    level, chunks = _sum_chunks(factors)
    chunks[1] = forge(chunks[1])
    if error is None:
        assert first_polys._framed_sums(level, chunks) is not None
        return
    assert first_polys._framed_sums(level, chunks) is None
    with pytest.raises((MalformedCiphertext, WrongContext), match=error):
        first_polys.checked_first_sums(level, chunks, VALUES.size)


# ---- a server-weighted aggregate, read and opened natively -----------------------------------
def _compact_release(monkeypatch, mode):
    """A compact round of three clients on ``mode``'s path: the run, the honest reveal
    request's fields for client_0, and the expected sum."""
    from tests.security.test_reveals import release

    monkeypatch.setenv(native.ENV, mode)
    values = planned_values()
    run = BackendRound(list(PLAN), 5000, decryption_budget=8, reveal_length=5000)
    ctx = run.ctx()
    total = ctx.weighted_sum(run.uploads(values), PLAN)
    return run, release(run, ctx, total), planned_sum(values)


def _revealed(run, fields):
    from secagg.wire import Envelope

    return Envelope("c", "s", 0, "r", run.ask("client_0", "reveal", fields)).vector("global_update")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_compact_reveal_opens_the_same_sum_on_both_paths(monkeypatch, mode):
    run, fields, expected = _compact_release(monkeypatch, mode)
    np.testing.assert_allclose(_revealed(run, fields), expected, atol=1e-6)
    assert run.clients["client_0"].decryptions == 1


def _forged(fields, edit):
    """The aggregate's chunks, uncompressed, edited by ``edit(raw, chunk)``, as a deviating
    server would send them."""
    from secagg import wire
    from secagg.ckks.public import uncompressed_blob
    from secagg.wire import Envelope

    env = Envelope.from_bytes(Envelope("s", "c", 0, "r", dict(fields)).to_bytes())
    parts = []
    for j, part in enumerate(env.ciphertext_parts("aggregate")):
        raw = bytearray(raw_body(part, 10**7, "aggregate"))
        edit(raw, j)
        parts.append(uncompressed_blob(bytes(raw)))
    return {**fields, "aggregate": wire.ciphertext(parts)}


def test_a_native_compact_reveal_refuses_every_forged_aggregate(monkeypatch):
    """What the native read takes over from SEAL's loader, attacked: each forgery of the
    released first polynomials (a plaintext per chunk) is refused, counts no decryption, and
    the honest request still opens."""
    import struct

    from secagg.ckks.public import COUNT, PLAINTEXT_META, SEAL_HEADER
    from secagg.errors import MalformedCiphertext, WrongContext

    run, fields, expected = _compact_release(monkeypatch, "on")
    keys = run.clients["client_0"].keys
    n, primes = keys.preset.poly_modulus_degree, keys.public.n_primes
    data = PLAINTEXT_META.size + SEAL_HEADER.size + COUNT.size
    scale_at = 32 + 8
    prime = keys.public.context.first_context_data().parms().coeff_modulus()[0].value()

    def first_out_of_range(raw, j):  # a C0 coefficient at its prime
        struct.pack_into("<Q", raw, data, prime)

    def other_scale(raw, j):  # chunks at different scales
        if j == 1:
            (s,) = struct.unpack_from("<d", raw, scale_at)
            struct.pack_into("<d", raw, scale_at, s / 2)

    def other_level(raw, j):  # another parms id: not the fresh level
        raw[0] ^= 1

    def with_a_second_polynomial(raw, j):  # a whole ciphertext's worth: (C0, C1)
        raw.extend(bytes(8 * n * primes))

    for edit, error, match in (
        (first_out_of_range, MalformedCiphertext, "outside its modulus"),
        (other_scale, WrongContext, "different scales"),
        (other_level, WrongContext, "fresh level"),
        (with_a_second_polynomial, MalformedCiphertext, "bytes; a chunk here has"),
    ):
        with pytest.raises(error, match=match):
            run.ask("client_0", "reveal", _forged(fields, edit))
        assert run.clients["client_0"].decryptions == 0, edit.__name__
    np.testing.assert_allclose(_revealed(run, fields), expected, atol=1e-6)


def test_upload_chunks_packs_only_uncompressed_ciphertexts(monkeypatch):
    """The client's packer refuses bytes that are not the native encryptor's uncompressed
    ciphertexts (a zstd one, here) instead of packing whatever lies at its offsets."""
    from secagg.ckks.public import upload_chunks

    monkeypatch.setenv(native.ENV, "off")
    keys = SecretKeyHolder(get_preset("compact"))
    (chunk,) = keys.encrypt(np.ones(8), 1.0)
    assert read_header(chunk).compr_mode == COMPR_ZSTD
    with pytest.raises(ValueError, match="uncompressed ciphertexts only"):
        upload_chunks(chunk, len(chunk), keys.preset)
