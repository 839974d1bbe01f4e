"""Precomputed checks (``secagg.secret.ckks_masks``): each upload commits its client's next upload's
seeds, the server relays a round's planned seeds to its planned decryptors, and a decryptor
expands the release's check while it trains.

What must hold, attacked through the real halves: a committed seed serves one upload at most
(a retried request, a restored state or a bug cannot send a second upload on it); the
decryptor uses a precomputed sum only for a release whose signed seeds and weights are exactly
the ones it expanded, so a server that relays anything else gets the same checked reveal (and
a forged aggregate is refused as before); the flooding normals drawn ahead serve one opening."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from secagg import wire
from secagg.ckks import native
from secagg.ckks.public import SEED_INFO_BYTES
from secagg.ckks.release import NEXT_SEEDS, PRECHECK
from secagg.errors import MalformedCiphertext, MalformedMessage, ProtocolStateError
from secagg.runspec.config import ExperimentConfig
from secagg.secret import ckks_masks
from secagg.simulation.experiment import run_experiment
from secagg.wire import Envelope
from tests.harness import PLAN, BackendRound, planned_sum, planned_values

pytestmark = pytest.mark.skipif(
    os.environ.get(native.ENV, "").lower() == "off", reason="SECAGG_NATIVE=off: not built"
)
N = 5000


@pytest.fixture(autouse=True)
def native_on(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    monkeypatch.setenv(ckks_masks.ENV, "on")


def upload_seeds(field: wire.Field) -> bytes:
    ends = np.cumsum(field.parts)
    return b"".join(field.data[end - SEED_INFO_BYTES : end] for end in ends)


def committed(run: BackendRound, client: str) -> bytes:
    (seeds,) = Envelope(
        "c", "s", 0, "train", run.clients[client].commit_next_upload(N)
    ).ciphertext_parts(NEXT_SEEDS)
    return bytes(seeds)


def test_an_upload_uses_the_seeds_its_client_committed_once():
    run = BackendRound(list(PLAN), N, preset="lean")
    client = run.clients["client_0"]
    seeds = committed(run, "client_0")
    assert len(seeds) == 2 * SEED_INFO_BYTES  # 5000 values: two chunks of 4096
    client.prepare_upload(N)
    assert client._next_seeds == b""  # forgotten before the masks are made from them
    assert upload_seeds(client.protect(planned_values()["client_0"], 0.5)) == seeds
    client.discard_prepared()
    client.prepare_upload(N)  # the next request, nothing committed since: fresh seeds
    assert upload_seeds(client.protect(planned_values()["client_0"], 0.5)) != seeds


def test_a_retried_request_gets_fresh_seeds():
    """A request refused after its masks were started (its seeds taken), then asked again:
    the second upload cannot reuse the committed seeds, under any noise."""
    run = BackendRound(list(PLAN), N, preset="lean")
    client = run.clients["client_0"]
    seeds = committed(run, "client_0")
    client.prepare_upload(N)
    client.discard_prepared()  # the request ended in a refusal
    client.prepare_upload(N)
    assert upload_seeds(client.protect(planned_values()["client_0"], 0.5)) != seeds


def test_no_second_upload_leaves_on_one_seed():
    """Defence in depth: were a committed seed handed out twice (a bug), the client refuses the
    second upload it made on it: two uploads under one a and one key give away the difference
    of their values."""
    run = BackendRound(list(PLAN), N, preset="lean")
    client = run.clients["client_0"]
    seeds = committed(run, "client_0")
    client.prepare_upload(N)
    client.protect(planned_values()["client_0"], 0.5)
    client._next_seeds = seeds  # the bug
    client.prepare_upload(N)
    with pytest.raises(ProtocolStateError, match="second upload on one seed"):
        client.protect(planned_values()["client_1"], 0.5)


def test_the_native_masks_refuse_seeds_they_cannot_use():
    """``masks_from`` at the native boundary: no seeds, a partial chunk, and a PRNG other than
    SEAL's default (whose expansion the server's and decryptor's loads would not reproduce)."""
    run = BackendRound(list(PLAN), N, preset="lean")
    encryptor = run.clients["client_0"].keys.native_encryptor()
    seeds = committed(run, "client_0")
    other_prng = bytes([seeds[0] ^ 3]) + seeds[1:]
    for bad, match in (
        (b"", "65 bytes a chunk"),
        (seeds[:-1], "65 bytes a chunk"),
        (other_prng, "another PRNG"),
    ):
        with pytest.raises(ValueError, match=match):
            encryptor.masks_from(bad, 1)
    with pytest.raises(ValueError, match="at least one chunk"):
        encryptor.fresh_seeds(0)


def test_committed_seeds_never_reach_the_state():
    run = BackendRound(list(PLAN), N, preset="lean")
    client = run.clients["client_0"]
    seeds = committed(run, "client_0")
    state = client.state_dict()
    assert seeds not in pickle.dumps(state)
    client.load_state_dict(state)
    assert client._next_seeds == b""  # a restored client commits afresh


def test_a_client_living_for_one_message_commits_nothing():
    """A Flower node's client (``flower/node.py`` sets it): its commitment would die with
    its process, and the decryptors would expand a check for nothing."""
    run = BackendRound(list(PLAN), N, preset="lean")
    run.clients["client_0"].commits_ahead = False
    assert run.clients["client_0"].commit_next_upload(N) == {}
    assert run.clients["client_0"]._next_seeds == b""


def test_the_switch_turns_committed_seeds_off(monkeypatch):
    run = BackendRound(list(PLAN), N, preset="lean")
    monkeypatch.setenv(ckks_masks.ENV, "off")
    fields = run.clients["client_0"].commit_next_upload(N)
    assert fields == {}
    env = Envelope.from_bytes(Envelope("client_0", "server", 0, "train", fields).to_bytes())
    run.server.remember_upload("client_0", env)
    assert run.server.training_fields(run.ctx(), "client_0", PLAN) == {}


def round_with_prechecks(preset: str, hint=None):
    """Every client commits, the server relays the planned seeds to the planned decryptors
    (or ``hint(fields)``'s edit of them), the uploads are made and the sum revealed."""
    values = planned_values()
    run = BackendRound(list(PLAN), N, preset=preset, decryption_budget=4, reveal_length=N)
    for c in PLAN:
        fields = run.clients[c].commit_next_upload(N)
        env = Envelope.from_bytes(Envelope(c, "server", 0, "train", fields).to_bytes())
        run.server.remember_upload(c, env)
    ctx = run.ctx()
    decryptors = [c for c in PLAN if run.server.training_fields(ctx, c, PLAN)]
    assert len(decryptors) == 2
    for c in decryptors:
        fields = run.server.training_fields(ctx, c, PLAN)
        run.clients[c].prepare_release(run.request(c, "train", hint(fields) if hint else fields), N)
    for c in PLAN:
        run.clients[c].prepare_upload(N)
    weights = PLAN if preset == "lean" else None
    handles = run.uploads(values, weights)
    if preset == "lean":
        revealed = run.reveal_running_sum(handles, PLAN)
    else:
        ctx = run.ctx()
        revealed = ctx.reveal(ctx.weighted_sum(handles, PLAN), "g")
    used = {c: run.clients[c].prechecks_used for c in decryptors}
    return run, revealed, planned_sum(values), used, decryptors


@pytest.mark.parametrize("preset", ["lean", "compact"])
def test_a_precomputed_check_reveals_the_same_sum(preset):
    run, revealed, expected, used, decryptors = round_with_prechecks(preset)
    np.testing.assert_allclose(revealed, expected, atol=2e-3)
    assert list(used.values()) == [1, 1]
    # both decryptors (the reveal and its check) added the flooding noise encoded ahead
    assert [run.clients[c].keys.noise_encoded_ahead_used for c in decryptors] == [1, 1]


def _other_seeds(fields):
    parts = Envelope("s", "c", 0, "t", fields).ciphertext_parts(f"{PRECHECK}.seeds")
    swapped = [bytes(p[:-1]) + bytes([p[-1] ^ 1]) for p in parts]
    return {**fields, f"{PRECHECK}.seeds": wire.ciphertext(swapped)}


def _other_weights(fields):
    entries = [
        [c, k + 1] for c, k in Envelope("s", "c", 0, "t", fields).config(PRECHECK)["entries"]
    ]
    return {**fields, PRECHECK: wire.config({"entries": entries})}


def _one_missing(fields):
    env = Envelope("s", "c", 0, "t", fields)
    entries, parts = env.config(PRECHECK)["entries"], env.ciphertext_parts(f"{PRECHECK}.seeds")
    return {
        PRECHECK: wire.config({"entries": entries[:-1]}),
        f"{PRECHECK}.seeds": wire.ciphertext([bytes(p) for p in parts[:-1]]),
    }


@pytest.mark.parametrize("edit", [_other_seeds, _other_weights, _one_missing])
def test_a_server_relaying_other_seeds_only_costs_the_precomputation(edit):
    """A deviating server's precheck (a seed flipped, other weights, an upload left out):
    the decryptors expand the release's own check and reveal the same checked sum."""
    run, revealed, expected, used, decryptors = round_with_prechecks("compact", edit)
    np.testing.assert_allclose(revealed, expected, atol=2e-3)
    assert list(used.values()) == [0, 0]
    noise_ahead = [run.clients[c].keys.noise_encoded_ahead_used for c in decryptors]
    assert noise_ahead == ([1, 1] if edit is _other_seeds else [0, 0])


def test_a_forged_aggregate_is_refused_even_with_a_matching_precheck(monkeypatch):
    """The precheck was expanded from exactly the release's seeds, and the server's first
    polynomial has a coefficient at its prime: refused, nothing decrypted, the precomputed
    sum spent."""
    import struct

    from secagg.ckks.public import COUNT, PLAINTEXT_META, SEAL_HEADER
    from tests.security.test_reveals import release
    from tests.test_native import _forged

    values = planned_values()
    run = BackendRound(list(PLAN), N, preset="compact", decryption_budget=4, reveal_length=N)
    for c in PLAN:
        env = Envelope.from_bytes(
            Envelope(c, "server", 0, "train", run.clients[c].commit_next_upload(N)).to_bytes()
        )
        run.server.remember_upload(c, env)
        run.clients[c].prepare_upload(N)
    ctx = run.ctx()
    hint = run.server.training_fields(ctx, "client_0", PLAN)
    assert hint
    client = run.clients["client_0"]
    client.prepare_release(run.request("client_0", "train", hint), N)
    total = ctx.weighted_sum(run.uploads(values), PLAN)
    fields = release(run, ctx, total)
    keys = client.keys
    prime = keys.public.context.first_context_data().parms().coeff_modulus()[0].value()

    def first_out_of_range(raw, j):
        struct.pack_into("<Q", raw, PLAINTEXT_META.size + SEAL_HEADER.size + COUNT.size, prime)

    with pytest.raises(MalformedCiphertext, match="outside its modulus"):
        run.ask("client_0", "reveal", _forged(fields, first_out_of_range))
    assert client.prechecks_used == 1 and client.decryptions == 0
    revealed = Envelope("c", "s", 0, "r", run.ask("client_0", "reveal", fields))
    np.testing.assert_allclose(revealed.vector("global_update"), planned_sum(values), atol=1e-6)


def test_the_flooding_noise_made_ahead_serves_one_opening():
    run = BackendRound(list(PLAN), N, preset="lean")
    client = run.clients["client_0"]
    pending = ckks_masks.start_check(client.keys, [(1, committed(run, "client_1"))], 2, 1e3)
    size = 2 * client.preset.values_per_ciphertext
    normals, encoded = pending.noise(size)
    assert normals is not None and normals.size == size and np.std(normals) > 0.9
    flooding, (sigma, scale) = encoded
    assert flooding.chunks == 2 and not flooding.used and sigma > 0
    assert scale == client.keys.public.sum_scale
    assert pending.noise(size) == (None, None)  # taken: no second opening gets them
    other = ckks_masks.start_check(client.keys, [(1, committed(run, "client_2"))], 2, 1e3)
    assert other.noise(size - 1) == (None, None)  # another size: not these (and wiped)
    assert other.noise(size) == (None, None)
    # without flooding (flooding_bits 0) there is nothing to encode
    bare = ckks_masks.start_check(client.keys, [(1, committed(run, "client_2"))], 2, 0.0)
    assert bare.noise(size)[1] is None


def _aggregate(keys, chunks: int, seed: int = 0):
    """An aggregate's polynomials as the native opening takes them (coefficients below the
    primes; what they decrypt to does not matter here, only that both ways agree)."""
    from secagg.ckks.release import ExpandedAggregate

    width = keys.preset.poly_modulus_degree * keys.public.n_primes
    rng = np.random.default_rng(seed)
    first, second = (rng.integers(0, 2**20, (chunks, width), dtype=np.uint64) for _ in "ab")
    return ExpandedAggregate(first, second, keys.public.sum_scale)


def test_noise_encoded_ahead_opens_bit_for_bit_as_noise_encoded_at_the_reveal():
    """The reveal adds the noise encoded ahead only for exactly its σ, scale and chunks;
    otherwise it encodes the same normals itself. Either way the same values come out, and
    the encoding is wiped, used or not (a second opening cannot reuse it)."""
    from secagg.ckks.flooding import csprng_normal, slot_sigma

    run = BackendRound(list(PLAN), N, preset="lean")
    keys = run.clients["client_0"].keys
    encryptor = keys.native_encryptor()
    aggregate = _aggregate(keys, 3)
    coeff_sigma = 1e3
    sigma = slot_sigma(coeff_sigma, keys.preset.poly_modulus_degree, aggregate.scale)
    normals = csprng_normal(3 * keys.preset.values_per_ciphertext)
    want, _ = keys.open_flooded(aggregate, 100, coeff_sigma, normals.copy())
    for made_for, used_ahead in (
        ((sigma, aggregate.scale), True),
        ((sigma * 2, aggregate.scale), False),  # planned for another release's σ
        ((sigma, aggregate.scale / 2), False),  # another scale (a renormalised sum)
    ):
        flooding = encryptor.encode_noise(made_for[0] * normals, made_for[1])
        got, got_sigma = keys.open_flooded(
            aggregate, 100, coeff_sigma, normals.copy(), (flooding, made_for)
        )
        assert flooding.used  # wiped in any case
        if used_ahead:
            assert np.array_equal(got, want) and got_sigma == sigma
        else:  # fell back to encoding the same normals now: the same values
            assert np.array_equal(got, want)
    flooding = encryptor.encode_noise(sigma * normals, aggregate.scale)
    encryptor.open(aggregate.first, aggregate.second, aggregate.scale, np.empty(0), 1, flooding)
    with pytest.raises(ValueError, match="used already"):
        encryptor.open(aggregate.first, aggregate.second, aggregate.scale, np.empty(0), 1, flooding)
    fewer = encryptor.encode_noise(sigma * normals[: 2 * keys.preset.values_per_ciphertext], 1.0)
    with pytest.raises(ValueError, match="another release"):
        encryptor.open(aggregate.first, aggregate.second, aggregate.scale, np.empty(0), 1, fewer)
    assert fewer.used


def _hint(entries: list, seeds: list[bytes]) -> dict[str, wire.Field]:
    return {
        PRECHECK: wire.config({"entries": entries}),
        f"{PRECHECK}.seeds": wire.ciphertext(seeds),
    }


#: a deviating server's prechecks, each given client_1's committed seeds
MALFORMED = {
    "seed size": lambda s: _hint([["client_1", 5]], [s[:-1]]),
    "not in the roster": lambda s: _hint([["mallory", 5]], [s]),
    "a client twice": lambda s: _hint([["client_1", 5]] * 2, [s, s]),
    "a boolean weight": lambda s: _hint([["client_1", True]], [s]),
    "counts differ": lambda s: _hint([["client_1", 5], ["client_2", 5]], [s]),
    "more than the roster": lambda s: _hint([[f"client_{i % 3}", 1] for i in range(4)], [s] * 4),
}


@pytest.mark.parametrize("why", list(MALFORMED))
def test_a_malformed_precheck_is_refused(why):
    run = BackendRound(list(PLAN), N, preset="lean")
    fields = MALFORMED[why](committed(run, "client_1"))
    with pytest.raises(MalformedMessage, match="precheck lists"):
        run.clients["client_0"].prepare_release(run.request("client_0", "train", fields), N)
    assert run.clients["client_0"]._precheck is None


@pytest.mark.parametrize("parts", [[b"x" * 64], [b"x" * 65, b"x" * 65]], ids=["size", "two"])
def test_the_server_refuses_a_malformed_commitment(parts):
    run = BackendRound(list(PLAN), N, preset="lean")
    env = Envelope("client_0", "server", 0, "train", {NEXT_SEEDS: wire.ciphertext(parts)})
    with pytest.raises(MalformedCiphertext, match="commits its next seeds"):
        run.server.remember_upload("client_0", Envelope.from_bytes(env.to_bytes()))


def run_recording_prechecks(monkeypatch, protocol: str, preset: str):
    """Three rounds of ``protocol`` on ckks ``preset`` over Fed-TCGA-BRCA through the real
    engine and clients; every lookup of a precheck, as (entries asked for, found)."""
    calls: list[tuple[int, bool]] = []
    original = ckks_masks.PendingCheck.sums

    def recording(self, entries, chunks):
        sums = original(self, entries, chunks)
        calls.append((len(entries), sums is not None))
        return sums

    monkeypatch.setattr(ckks_masks.PendingCheck, "sums", recording)
    run = ExperimentConfig(
        task="tcga-brca",
        protocol=protocol,
        backend="ckks",
        rounds=3,
        seeds=[3],
        backend_options={"preset": preset},
    )
    result = run_experiment(run)
    assert not result.audit.summary()["exclusions"]
    return calls


def test_a_run_checks_every_reveal_after_the_first_round_ahead(monkeypatch):
    """Three rounds of FedAvg on lean through the real engine and clients: round 0 has no
    commitments; in rounds 1 and 2 both decryptors use the sum they expanded while training."""
    calls = run_recording_prechecks(monkeypatch, "fedavg", "lean")
    assert [found for _, found in calls] == [True] * 4


def test_the_author_check_follows_each_clients_latest_commitment():
    """An upload on seeds another client committed is refused; seeds a client committed
    before its latest commitment are no longer its own; seeds two clients both committed
    are neither's to use (the lookup that replaced a scan of every client's seeds)."""
    from secagg.errors import DuplicateUpload

    server = BackendRound(["a", "b", "c"], 10, backend="ckks", preset="lean").server

    def commit(client: str, seeds: bytes) -> None:
        fields = {NEXT_SEEDS: wire.ciphertext([seeds])}
        server.remember_upload(client, Envelope(client, "server", 0, "train", fields))

    first, second = bytes(SEED_INFO_BYTES), bytes([1]) * SEED_INFO_BYTES
    commit("a", first)
    server._check_author("a", first)
    with pytest.raises(DuplicateUpload, match="the seeds a committed"):
        server._check_author("b", first)
    commit("a", second)
    server._check_author("b", first)  # a's earlier seeds are nobody's now
    commit("c", second)
    for sender, owner in (("a", "c"), ("c", "a"), ("b", "a")):
        with pytest.raises(DuplicateUpload, match=f"the seeds {owner} committed"):
            server._check_author(sender, second)


def test_larc_clients_expand_the_probes_check_while_they_train(monkeypatch):
    """LARC as published on compact, three rounds through the real engine and clients: Ĝ's
    weights (last round's α) are known before the uploads, so from round 1 on every client
    that opens Ĝ in the probe uses the sum it expanded while training; the global update's
    weights come after the probe, and its decryptors expand theirs at the reveal."""
    calls = run_recording_prechecks(monkeypatch, "larc", "compact")
    clients = 6  # Fed-TCGA-BRCA's centres, every one in every round
    used = [hit for _, hit in calls]
    assert sum(used) == 2 * clients  # every client's probe in rounds 1 and 2
    assert all(n == clients for n, _ in calls)


@pytest.mark.parametrize("edit", [None, _other_seeds, _other_weights, _one_missing])
def test_an_open_uses_the_servers_hint_only_for_exactly_the_release_it_names(edit):
    """The hint every client gets where a protocol opens a sum of planned weights (LARC's Ĝ,
    ``opening_fields``), from a deviating server (a seed flipped, other weights, an upload
    left out): the client opens the signed release all the same, expanding its check at
    the open, and uses the precomputed sum only for the honest hint."""
    values = planned_values()
    run = BackendRound(list(PLAN), N, preset="compact", decryption_budget=4, reveal_length=N)
    for c in PLAN:
        fields = run.clients[c].commit_next_upload(N)
        env = Envelope.from_bytes(Envelope(c, "server", 0, "train", fields).to_bytes())
        run.server.remember_upload(c, env)
    hint = run.server.opening_fields(run.ctx(), "client_0", PLAN)
    assert hint  # every client gets it, not only a planned decryptor
    client = run.clients["client_0"]
    client.prepare_release(run.request("client_0", "train", edit(hint) if edit else hint), N)
    for c in PLAN:
        run.clients[c].prepare_upload(N)
    ctx = run.ctx()
    fields = ctx.as_fields(ctx.weighted_sum(run.uploads(values), PLAN), "g_hat")
    client.open_budget = 1
    opened = client.open(run.request("client_0", "larc_probe", fields), "g_hat", N)
    np.testing.assert_allclose(opened, planned_sum(values), atol=2e-3)
    assert client.prechecks_used == (0 if edit else 1)
