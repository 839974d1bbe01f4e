"""The client-weighted preset (``lean``): the clients apply the planned weights, the server
only adds, and a server that deviates still gets nothing opened that the clients cannot check.

Each attack goes through the real server half (its running sum, consent phase and reveal)
and real client halves (``tests/harness.py``): the server sends the clients weights other
than an honest plan, or lists weights other than those the clients applied.
"""

from dataclasses import replace

import numpy as np
import pytest

from secagg.ckks.presets import get_preset
from secagg.ckks.public import to_bytes
from secagg.errors import ConfigError, ProtocolStateError, ReleaseRefused, RoundAborted
from secagg.runspec.config import ExperimentConfig
from tests.harness import BackendRound

LEAN = get_preset("lean")
IDS = ["client_0", "client_1", "client_2"]
VALUES = {"client_0": 0.1, "client_1": 0.2, "client_2": 0.6}
PLAN = {"client_0": 0.5, "client_1": 0.25, "client_2": 0.25}


@pytest.fixture
def run():
    return BackendRound(IDS, 8, decryption_budget=4, reveal_length=8, preset="lean")


def streamed(run, sent, listed, clients=IDS, cap=0.5):
    """The clients apply the weights ``sent``; the server folds their uploads into a
    running sum planned with the weights ``listed`` (an honest server: the same), capped at
    ``cap`` of their total (an honest server caps at the clients' max_weight_share)."""
    ctx = run.ctx()
    ctx.max_weight_share = cap
    handles = run.uploads({c: np.full(8, VALUES[c]) for c in clients}, sent)
    total = ctx.running_sum(listed)
    for c in clients:
        total.add(c, handles[c])
    return ctx, total.result()


def test_the_clients_weight_and_the_server_only_adds(run):
    ctx, total = streamed(run, PLAN, PLAN)
    expected = sum(PLAN[c] * VALUES[c] for c in IDS)  # 0.25, not the unweighted 0.9
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), expected, atol=1e-4)
    # the descriptor lists the integer weight each client applied, and the decryptor's
    # flooding is sized for noise multipliers of 1: the server multiplied nothing
    assert [e.k for e in total.entries] == [round(PLAN[c] * LEAN.client_weight_unit) for c in IDS]


def test_a_client_that_drops_out_is_renormalised_away(run):
    # client_0 drops out: the other two are renormalised to halves each (a pair where one
    # had 2/3 would exceed the clients' max_weight_share of 1/2 and get no consent)
    ctx, total = streamed(run, PLAN, PLAN, clients=["client_1", "client_2"])
    expected = (0.25 * VALUES["client_1"] + 0.25 * VALUES["client_2"]) / 0.5
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), expected, atol=1e-4)


def test_a_near_one_hot_plan_is_refused(run):
    """The server asks one client to weigh almost everything: each client applies what it
    was sent, but no client consents to a sum one upload dominates."""
    one_hot = {"client_0": 1e-4, "client_1": 0.9998, "client_2": 1e-4}
    ctx, total = streamed(run, one_hot, one_hot, cap=1.0)  # a deviating server: no cap
    with pytest.raises(RoundAborted, match="a sum one upload dominates"):
        ctx.reveal(total, "global_update")
    assert all(c.decryptions == 0 for c in run.clients.values())


def test_weights_other_than_those_applied_get_no_consent(run):
    """The server lists client_0's upload at 0.25 (it applied 0.5): with the listed weights
    it would mis-scale, or with a one-hot listing single out, what the clients sent."""
    ctx, total = streamed(run, PLAN, {**PLAN, "client_0": 0.25})
    with pytest.raises(RoundAborted, match="it applied"):
        ctx.reveal(total, "global_update")


def all_ones(run):
    """A server that tells every client to apply 1.0 and adds the uploads itself (the
    engine's own plan would refuse weights that add up to more than 1)."""
    ctx = run.ctx()
    handles = run.uploads({c: np.full(8, VALUES[c]) for c in IDS}, dict.fromkeys(IDS, 1.0))
    total = run.server.running_sum(8)
    for c in IDS:
        total.add(handles[c], 1.0)
    return ctx, total.result()


def test_applied_weights_above_one_in_all_are_refused(run):
    """Every client told to apply 1.0: equal weights pass the share check, but the sum
    could overflow the headroom each client checked its values against."""
    ctx, total = all_ones(run)
    with pytest.raises(RoundAborted, match=r"add up to 3 > 1"):
        ctx.reveal(total, "global_update")


def test_a_decryptor_checks_the_applied_weights_itself(run):
    """The consents of an all-ones plan gathered by a server that skips its own checks:
    the decryptor refuses the sum before decrypting."""
    ctx, total = all_ones(run)
    fields = run.server._release_fields(ctx, total, "global_update", "reveal", "aggregate")
    with pytest.raises(ReleaseRefused, match="add up to 3"):
        run.ask("client_0", "reveal", fields)
    assert run.clients["client_0"].decryptions == 0


@pytest.mark.parametrize("weight", [None, 0.0, -0.5, 1.5, float("nan"), 1e-12])
def test_a_lean_client_refuses_to_upload_without_a_valid_weight(run, weight):
    with pytest.raises(ProtocolStateError, match="weight"):
        run.protect("client_0", np.ones(8), weight)
    assert run.clients["client_0"].uploads == {}


def test_a_server_weighted_client_refuses_a_weight_to_apply():
    compact = BackendRound(IDS, 8, decryption_budget=4, reveal_length=8)
    with pytest.raises(ProtocolStateError, match="weights on the server"):
        compact.protect("client_0", np.ones(8), 0.5)
    plain = BackendRound(IDS, 8, backend="plain")
    with pytest.raises(ProtocolStateError, match="weights uploads on the server"):
        plain.protect("client_0", np.ones(8), 0.5)


def test_the_lean_server_forms_no_weighted_sum(run):
    ctx = run.ctx()
    handles = run.uploads({c: np.full(8, VALUES[c]) for c in IDS}, PLAN)
    with pytest.raises(ConfigError, match="use the compact or wide preset"):
        ctx.weighted_sum(handles, PLAN)


def test_each_client_may_use_the_whole_headroom(run):
    """Client weights add up to at most 1, so a client's bound is the headroom itself (22),
    not the headroom shared by the roster as on compact."""
    big = np.full(8, 0.9 * LEAN.headroom)
    run.protect("client_0", big, 0.5)
    with pytest.raises(Exception, match="per-client bound"):
        run.protect("client_1", 1.2 * big, 0.5)


def test_the_applied_weights_survive_a_state_export(run):
    streamed(run, PLAN, PLAN)
    client = run.clients["client_0"]
    state = client.state_dict()
    assert list(state["applied"].values()) == [LEAN.client_weight_unit // 2]
    client.applied = {}
    client.load_state_dict(state)
    assert list(client.applied.values()) == [LEAN.client_weight_unit // 2]
    with pytest.raises(Exception, match="applied weights is garbled"):
        client.load_state_dict({**state, "applied": {"d": -1}})


def test_the_default_preset_follows_the_protocol():
    def preset(**changes):
        cfg = replace(ExperimentConfig(backend="ckks"), **changes).validate()
        return cfg.resolved_backend_options()["preset"]

    assert preset(protocol="fedavg") == "lean"
    assert preset(protocol="fedadam") == "lean"
    assert preset(protocol="fedavg", streaming=False) == "compact"
    assert preset(protocol="larc") == "compact"  # weights after the uploads
    assert preset(protocol="admm", task="diabetes-label") == "compact"  # precise sums
    assert preset(protocol="fedavg", backend_options={"preset": "wide"}) == "wide"
    with pytest.raises(ConfigError, match="weighs its uploads after they arrive"):
        replace(
            ExperimentConfig(backend="ckks"), protocol="larc", backend_options={"preset": "lean"}
        ).validate()
    with pytest.raises(ConfigError, match="is not"):
        replace(
            ExperimentConfig(backend="ckks"), streaming=False, backend_options={"preset": "lean"}
        ).validate()


# ---- the server adds first polynomials only (secagg/ckks/first_polys.py) ----------------------
def test_the_servers_sum_of_first_polynomials_is_seals_bit_for_bit(run):
    """The numpy sum mod q the server forms equals the first polynomial of SEAL's own
    homomorphic sum of the same uploads (SEAL expands the seeds; the server never does)."""
    from secagg.ckks.first_polys import FirstPolynomialSum, FreshLevel, first_polynomials
    from secagg.ckks.public import raw_ciphertext

    level = FreshLevel(run.server.public)
    n = 3 * LEAN.values_per_ciphertext  # three chunks
    rng = np.random.default_rng(0)
    parts = [
        run.clients[c].keys.encrypt(rng.normal(0, 1, n) * PLAN[c], bound=LEAN.headroom) for c in IDS
    ]
    total = FirstPolynomialSum(level)
    for p in parts:
        total.add(first_polynomials(level, p, n)[0])
    seal_sum = None
    for p in parts:
        cts = run.server.public.load_ciphertexts(p, n)
        if seal_sum is None:
            seal_sum = cts
        else:
            for acc, ct in zip(seal_sum, cts):
                run.server.public.evaluator.add_inplace(acc, ct)
    poly = 8 * level.coefficients
    for j, ct in enumerate(seal_sum):
        first = raw_ciphertext(ct)[-2 * poly : -poly]  # (c0, c1): the first of the two
        assert total.total[j].astype("<u8").tobytes() == first


def test_a_crafted_first_polynomial_only_shifts_the_result_by_what_the_server_chose(run):
    """The server controls C0 alone: the decryptor's second polynomial is its own. Adding an
    encoding of v to C0 moves the revealed sum by v, an offset the server chose and knows;
    it learns the flooded honest sum, nothing more."""
    import tenseal.sealapi as seal

    from secagg.ckks.first_polys import PLAIN_META
    from secagg.ckks.public import HEADER_BYTES, inflate

    ctx, total = streamed(run, PLAN, PLAN)
    v = np.linspace(-0.5, 0.5, 8)
    shift = seal.Plaintext()
    run.server.public.encoder.encode(
        np.concatenate([v, np.zeros(LEAN.values_per_ciphertext - 8)])[: 4096 // 2].tolist(),
        run.server.public.context.first_parms_id(),
        total.scale,
        shift,
    )
    raw = inflate(memoryview(to_bytes(shift))[HEADER_BYTES:], 10**6, "shift")
    coefficients = np.frombuffer(raw, dtype="<u8", offset=PLAIN_META.size + HEADER_BYTES + 8)
    level = run.server._level
    total.first[0] = (total.first[0] + coefficients) % level.moduli
    expected = sum(PLAN[c] * VALUES[c] for c in IDS)
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), expected + v, atol=1e-4)


def test_the_aggregate_travels_as_first_polynomials_only(run):
    ctx, total = streamed(run, PLAN, PLAN)
    field = run.server.to_field(total)
    assert field.nbytes < 8.1 * LEAN.values_per_ciphertext  # a full ciphertext: 16 B a value


@pytest.mark.parametrize(
    "forge, error",
    [
        (lambda raw: raw[:-8], "bytes"),
        (lambda raw: raw[:5] + b"\x02" + raw[6:], "compression mode"),  # claims zstd
        (lambda raw: raw[:-8] + (2**64 - 1).to_bytes(8, "little"), "outside its modulus"),
        (lambda raw: _with_scale(raw, 2.0**80), "scale"),
    ],
)
def test_a_malformed_aggregate_is_refused_before_seal_reads_it(run, forge, error):
    from secagg.wire import ciphertext

    ctx, total = streamed(run, PLAN, PLAN)
    fields = run.server._release_fields(ctx, total, "global_update", "reveal", "aggregate")
    (part,) = split(fields["aggregate"])  # 8 values: one chunk
    bad = {**fields, "aggregate": ciphertext([forge(part)])}
    with pytest.raises(Exception, match=error):
        run.ask("client_0", "reveal", bad)
    assert run.clients["client_0"].decryptions == 0


def split(field) -> list[bytes]:
    """A ciphertext field's parts."""
    out, at = [], 0
    for n in field.parts:
        out.append(bytes(field.data[at : at + n]))
        at += n
    return out


def _with_scale(blob: bytes, scale: float) -> bytes:
    import struct

    from secagg.ckks.public import HEADER_BYTES

    at = HEADER_BYTES + 32 + 8  # the plaintext's parms_id and coefficient count
    return blob[:at] + struct.pack("<d", scale) + blob[at + 8 :]


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda raw: raw[: len(raw) // 2], "bytes|truncated|inflate|zstd"),
        (None, "outside its modulus"),
    ],
)
def test_an_upload_with_a_bad_first_polynomial_is_refused(run, mutate, error):
    from secagg.ckks.first_polys import FreshLevel, first_polynomials
    from secagg.ckks.public import CIPHERTEXT_META, HEADER_BYTES, raw_body, uncompressed_blob

    level = FreshLevel(run.server.public)
    (part,) = run.clients["client_0"].keys.encrypt(np.ones(8), bound=1.0)
    if mutate is None:  # a coefficient of q itself, in the upload's own compression mode
        import zstandard

        raw = bytearray(raw_body(part, 10**6, "upload"))
        at = CIPHERTEXT_META.size + HEADER_BYTES + 8  # after the metadata and the count
        raw[at : at + 8] = int(level.moduli[0]).to_bytes(8, "little")
        if part[5] == 0:  # uncompressed (the native path)
            part = uncompressed_blob(bytes(raw))
        else:
            body = zstandard.ZstdCompressor().compress(bytes(raw))
            header = bytearray(uncompressed_blob(b"")[:HEADER_BYTES])
            header[5] = 2  # compression mode: zstd
            header[8:16] = (HEADER_BYTES + len(body)).to_bytes(8, "little")
            part = bytes(header) + body
    else:
        part = mutate(part)
    with pytest.raises(Exception, match=error):
        first_polynomials(level, [part], 8)


def test_uploads_of_another_preset_or_chunk_count_are_refused(run):
    from secagg.ckks.first_polys import FreshLevel, first_polynomials
    from secagg.errors import MalformedCiphertext
    from secagg.secret.ckks_keys import SecretKeyHolder

    level = FreshLevel(run.server.public)
    compact = SecretKeyHolder(get_preset("compact")).encrypt(np.ones(8), bound=1.0)
    # two primes' ciphertext: larger than any of this preset's, refused before inflating it
    with pytest.raises(MalformedCiphertext, match="inflates to more than|it has at most"):
        first_polynomials(level, compact, 8)
    two = run.clients["client_0"].keys.encrypt(np.ones(5000), bound=1.0)
    with pytest.raises(MalformedCiphertext, match="2 ciphertexts for 8 values"):
        first_polynomials(level, two, 8)


def test_an_aggregate_whose_chunks_differ_in_scale_is_refused():
    from secagg.ckks.first_polys import FreshLevel, load_first_sums
    from secagg.errors import WrongContext

    n = 5000  # two chunks
    run = BackendRound(IDS, n, decryption_budget=4, reveal_length=n, preset="lean")
    ctx = run.ctx()
    handles = run.uploads({c: np.full(n, VALUES[c]) for c in IDS}, PLAN)
    total = ctx.running_sum(PLAN)
    for c in IDS:
        total.add(c, handles[c])
    first, second = split(run.server.to_field(total.result()))
    level = FreshLevel(run.server.public)
    assert len(load_first_sums(level, [first, second], n)) == 2  # as sent: accepted
    with pytest.raises(WrongContext, match="different scales"):
        load_first_sums(level, [first, _with_scale(second, run.server.public.scale / 2)], n)
