"""The threshold backend (OpenFHE): no single key share decrypts, the joint key is the
holders' signed chain, a deviating server gets partial decryptions of consented sums only,
and the shares of a sum clients open reach them sealed end to end. Parity with plain."""

from __future__ import annotations

import numpy as np
import pytest

import secagg
from secagg import wire
from secagg.errors import KeySetupError, MalformedCiphertext, ReleaseRefused
from secagg.threshold.params import ThresholdContext, get_preset, quantise
from secagg.threshold.shares import KeyShare
from tests.harness import BackendRound

IDS = ["client_0", "client_1", "client_2"]
N = 5000  # two chunks of 4096 values


@pytest.fixture(scope="module")
def context() -> ThresholdContext:
    return ThresholdContext(get_preset("n8192"))


@pytest.fixture(scope="module")
def chain(context):
    shares = [KeyShare(context)]
    for _ in range(2):
        shares.append(KeyShare(context, shares[-1].public_key))
    return shares, context.load_public_key(shares[-1].public_key)


def values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, N)


def c0s(context, cts):
    return [context.load_half(context.c0_half(ct)) for ct in cts]


def partials(context, shares, cts):
    c1 = [context.load_half(context.c1_half(ct)) for ct in cts]
    return [[context.load_partial(p) for p in s.partial(c1)] for s in shares]


def test_every_share_together_decrypts_a_weighted_sum(context, chain):
    shares, joint = chain
    xs, ws = [values(k) for k in range(3)], [0.2, 0.5, 0.3]
    uploads = [context.load_ciphertexts(context.encrypt(joint, x, 5.0), N) for x in xs]
    ks = [quantise(w, context.preset.weight_bits) for w in ws]
    total = context.weighted_sum(uploads, ks)
    c1 = context.sum_c1([[context.load_half(context.c1_half(c)) for c in u] for u in uploads], ks)
    parts = [[context.load_partial(p) for p in s.partial(c1)] for s in shares]
    got = context.fuse(c0s(context, total), parts, N)
    assert np.abs(got - sum(w * x for w, x in zip(ws, xs))).max() < 1e-5


@pytest.mark.parametrize("subset", [[0], [1], [2], [0, 1], [1, 2], [0, 2]])
def test_fewer_than_every_share_decrypts_nothing(context, chain, subset):
    shares, joint = chain
    upload = context.load_ciphertexts(context.encrypt(joint, values(7), 5.0), N)
    parts = partials(context, [shares[i] for i in subset], upload)
    with pytest.raises(MalformedCiphertext, match="do not fuse"):
        context.fuse(c0s(context, upload), parts, N)


def test_a_share_restored_from_its_export_is_the_same_share(context, chain):
    shares, joint = chain
    upload = context.load_ciphertexts(context.encrypt(joint, values(3), 5.0), N)
    once = context.weighted_sum([upload], [quantise(1.0, context.preset.weight_bits)])
    c1 = context.sum_c1([[context.load_half(context.c1_half(c)) for c in upload]], [2**16])
    restored = KeyShare.from_bytes(context, shares[1].export(), shares[1].public_key)
    parts = [[context.load_partial(p) for p in s.partial(c1)] for s in (shares[0], restored)]
    parts.append([context.load_partial(p) for p in shares[2].partial(c1)])
    assert np.abs(context.fuse(c0s(context, once), parts, N) - values(3)).max() < 1e-5


def test_an_update_of_round_off_alone_encrypts_as_zeros(context, chain):
    shares, joint = chain
    upload = context.load_ciphertexts(context.encrypt(joint, np.full(N, 1e-15), 5.0), N)
    assert len(upload) == 2  # OpenFHE alone refuses it: "scaling factor too small"


def test_values_beyond_the_headroom_are_refused_not_wrapped(context, chain):
    _, joint = chain
    with pytest.raises(ValueError, match="headroom"):
        context.encrypt(joint, np.full(3, 6.0), 5.0)


@pytest.mark.parametrize("damage", ["truncate", "header", "huge"])
def test_damaged_uploads_are_typed_errors(context, chain, damage):
    _, joint = chain
    (blob,) = context.encrypt(joint, np.zeros(10), 1.0)
    bad = {
        "truncate": blob[:-100],
        "header": blob[:4] + b"\xff" * 16 + blob[20:],
        "huge": blob * 2,
    }[damage]
    with pytest.raises(MalformedCiphertext):
        context.load_ciphertexts([bad], 10)


# ---- the backend halves, with a deviating server --------------------------------------------
@pytest.fixture
def backend_round():
    return BackendRound(IDS, N, backend="threshold", decryption_budget=4)


def reveal_request(r: BackendRound, handle, name="global_update"):
    d = r.server.descriptor(r.ctx(), handle, "reveal", name)
    from secagg.backends.consent import gather_consents

    consents = gather_consents(r.ctx(), d, r.server.signers)
    halves = [b for e in handle.entries for b in handle.halves[e.client]]
    return d, {
        "release": wire.config({"descriptor": d.to_config(), "consents": consents}),
        "halves": wire.ciphertext(halves),
    }


def test_an_honest_reveal_fuses_every_holders_partial(backend_round):
    r = backend_round
    xs = {c: values(k) for k, c in enumerate(IDS)}
    handles = r.uploads(xs)
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.25, 0.5, 0.25])
    got, who = r.server.reveal(r.ctx(), total, "global_update")
    expected = 0.25 * xs[IDS[0]] + 0.5 * xs[IDS[1]] + 0.25 * xs[IDS[2]]
    assert np.abs(got - expected).max() < 1e-5 and who == "holders " + ",".join(IDS)


def test_a_server_asking_to_decrypt_one_upload_is_refused(backend_round):
    r = backend_round
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    alone = r.server.weighted_sum([handles[IDS[0]]], [1.0])
    with pytest.raises(ReleaseRefused, match="at least 2"):
        r.ask(
            IDS[1],
            "consent",
            {
                "release": wire.config(
                    r.server.descriptor(r.ctx(), alone, "reveal", "x").to_config()
                )
            },
        )


def test_a_server_substituting_another_upload_for_a_consented_one_is_refused(backend_round):
    """The descriptor names the consented uploads by their c1 digests: c1 halves of another
    upload (one a holder would partially decrypt alone) do not match."""
    r = backend_round
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.3, 0.4, 0.3])
    _, request = reveal_request(r, total)
    extra = r.upload(IDS[0], values(9))  # a second upload of client_0, never consented to
    forged = [b for c in IDS for b in (extra.halves[IDS[0]] if c == IDS[0] else total.halves[c])]
    request["halves"] = wire.ciphertext(forged)
    with pytest.raises(ReleaseRefused, match="not its upload's"):
        r.ask(IDS[1], "decrypt_share", request)


def test_a_server_splicing_its_own_key_into_the_chain_is_refused():
    r = BackendRound(IDS, 10, backend="threshold")
    joint_of_server = KeyShare(r.server.context).public_key  # the server knows this secret
    chain = {"holders": IDS, "links": [{"previous": "0", "public": "1", "signature": "x"}] * 3}
    fresh = r.clients[IDS[0]].__class__  # a client that already installed refuses anyway
    assert fresh is not None
    with pytest.raises(KeySetupError):
        r.ask(
            IDS[0],
            "key_install",
            {
                "setup": wire.config(r.server.setup_config()),
                "chain": wire.config(chain),
                "joint_key": wire.ciphertext([joint_of_server]),
            },
        )


# ---- clients opening a sum: every holder's partial, sealed end to end -----------------------
def opened(r: BackendRound, xs: dict, weights=(0.25, 0.5, 0.25), name="g_hat"):
    handles = r.uploads(xs)
    total = r.server.weighted_sum([handles[c] for c in IDS], list(weights))
    fields = r.server.release(r.ctx(), total, name)
    expected = sum(w * xs[c] for w, c in zip(weights, IDS))
    return fields, expected


def open_as(r: BackendRound, client: str, fields: dict, name="g_hat") -> np.ndarray:
    return r.clients[client].open(r.request(client, "larc_probe", fields), name, N)


@pytest.fixture
def opening_round():
    return BackendRound(IDS, N, backend="threshold", decryption_budget=4, open_budget=4)


def test_every_client_opens_the_released_sum(opening_round):
    r = opening_round
    fields, expected = opened(r, {c: values(k) for k, c in enumerate(IDS)})
    for c in IDS:
        assert np.abs(open_as(r, c, fields) - expected).max() < 1e-5
    # what the server relays: the c0 halves and sealed shares, none of which is a partial
    for blob in r.request(IDS[0], "x", fields).ciphertext_parts("g_hat.sealed"):
        with pytest.raises(MalformedCiphertext):
            r.server.context.load_partial(blob)


def test_the_server_cannot_open_the_shares_it_relays(opening_round):
    """The server holds no client's X25519 key: with a key of its own (the best it can do)
    nothing unseals, so it cannot fuse the sum it released."""
    from secagg.ckks.keywrap import KeyWrapper
    from secagg.ckks.release import Descriptor
    from secagg.threshold.share_relay import release_label, unseal

    r = opening_round
    fields, _ = opened(r, {c: values(k) for k, c in enumerate(IDS)})
    got = r.request(IDS[0], "x", fields)
    info = got.config("g_hat.release")
    label = release_label(
        r.server.context.fingerprint, Descriptor.from_config(info["descriptor"]).hash()
    )
    server_key = KeyWrapper()
    chunks = len(got.ciphertext_parts("g_hat"))
    for i, holder in enumerate(IDS):
        for j, recipient in enumerate(IDS):
            with pytest.raises(ReleaseRefused, match="do not open"):
                unseal(
                    server_key,
                    recipient,
                    holder,
                    r.clients[holder].roster[holder],
                    got.ciphertext_parts("g_hat.sealed")[i * chunks : (i + 1) * chunks],
                    got.ciphertext_parts("g_hat.keys")[i * len(IDS) + j],
                    label,
                )


@pytest.mark.parametrize("tamper", ["swap_keys", "flip_sealed", "other_release", "drop_holder"])
def test_a_relay_that_tampers_with_the_shares_opens_nothing(opening_round, tamper):
    r = opening_round
    fields, _ = opened(r, {c: values(k) for k, c in enumerate(IDS)})
    got = r.request(IDS[0], "x", fields)
    keys = [bytes(b) for b in got.ciphertext_parts("g_hat.keys")]
    sealed = [bytes(b) for b in got.ciphertext_parts("g_hat.sealed")]
    info = got.config("g_hat.release")
    if tamper == "swap_keys":  # client_1's wrapped key from client_0 handed to client_0
        keys[0], keys[1] = keys[1], keys[0]
    elif tamper == "flip_sealed":
        sealed[0] = sealed[0][:-1] + bytes([sealed[0][-1] ^ 1])
    elif tamper == "other_release":  # the same shares presented for another round's release
        info["descriptor"] = {**info["descriptor"], "round": 7}
    else:  # the server leaves a holder out and hopes fewer shares fuse
        info["holders"] = IDS[:2]
    fields = {
        **fields,
        "g_hat.keys": wire.ciphertext(keys),
        "g_hat.sealed": wire.ciphertext(sealed),
        "g_hat.release": wire.config(info),
    }
    with pytest.raises(ReleaseRefused):
        open_as(r, IDS[0], fields)


def test_a_client_that_was_not_a_recipient_cannot_open():
    ids = [*IDS, "client_3"]
    r = BackendRound(ids, N, backend="threshold", decryption_budget=4, open_budget=4)
    handles = r.uploads({c: values(k) for k, c in enumerate(ids)})
    total = r.server.weighted_sum([handles[c] for c in ids], [0.25] * 4)
    ctx = r.ctx()
    ctx.exclude("client_3", "train", ValueError("late"))
    fields = r.server.release(ctx, total, "g_hat")
    assert r.request("client_3", "x", fields).config("g_hat.release")["recipients"] == IDS
    with pytest.raises(ReleaseRefused, match="not sealed for this client"):
        r.clients["client_3"].open(r.request("client_3", "x", fields), "g_hat", N)


def test_a_holder_seals_shares_only_for_clients_of_its_roster(opening_round):
    r = opening_round
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.3, 0.4, 0.3])
    d = r.server.descriptor(r.ctx(), total, "open", "g_hat")
    from secagg.backends.consent import gather_consents

    request = {
        "release": wire.config(
            {"descriptor": d.to_config(), "consents": gather_consents(r.ctx(), d, None)}
        ),
        "halves": wire.ciphertext([b for e in total.entries for b in total.halves[e.client]]),
        "recipients": wire.config({"ids": [*IDS, "server"]}),
    }
    with pytest.raises(ReleaseRefused, match="roster"):
        r.ask(IDS[0], "open_share", request)


def test_open_shares_and_opens_stop_at_the_budget():
    r = BackendRound(IDS, N, backend="threshold", decryption_budget=4, open_budget=1)
    fields, _ = opened(r, {c: values(k) for k, c in enumerate(IDS)})
    open_as(r, IDS[0], fields)
    with pytest.raises(secagg.errors.ProtocolStateError, match="allows 1"):
        open_as(r, IDS[0], fields)
    with pytest.raises(secagg.errors.RoundAborted, match="refuses open share 2"):
        opened(r, {c: values(k + 5) for k, c in enumerate(IDS)})


@pytest.mark.parametrize("phase", ["decrypt_share", "open_share"])
def test_a_holder_that_drops_before_its_share_stops_the_round_cleanly(opening_round, phase):
    """n-of-n: the other holders' shares cannot fuse without it, so the round stops with a
    typed error that names the holder, and the exclusion is in the audit."""
    r = opening_round
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.3, 0.4, 0.3])

    def gone(env):
        raise ConnectionError("client_2 went offline")

    setattr(r.clients[IDS[2]], f"on_{phase}", gone)
    ctx = r.ctx()
    with pytest.raises(secagg.errors.RoundAborted, match=r"\['client_2'\] sent no share.*n-of-n"):
        if phase == "decrypt_share":
            r.server.reveal(ctx, total, "global_update")
        else:
            r.server.release(ctx, total, "g_hat")
    assert "client_2" in ctx.excluded and "went offline" in ctx.excluded["client_2"]
    assert [(e["peer"], e["phase"]) for e in r.audit.records if e["event"] == "excluded"] == [
        ("client_2", phase)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "protocol, extra",
    [
        ("fedavg", {}),
        ("costwagg", {}),
        ("larc", {}),
        ("regagg", {"backend_options": {"preset": "wide"}}),
        ("simagg", {"backend_options": {"preset": "wide"}}),
        ("fedavg", {"server_blind": True}),
    ],
)
def test_threshold_gives_the_plain_model(protocol, extra):
    settings = dict(protocol=protocol, rounds=2, seeds=[1, 2], local_steps=5)
    plain = secagg.run(backend="plain", **settings)  # (server-blind needs no key on plain)
    threshold = secagg.run(backend="threshold", **settings, **extra)
    # LARC's softmax (q = 19) amplifies the partial decryptions' fixed noise (σ = 2^20) in
    # its probe's Ĝ: its largest gap was 1.03e-5 in 1 of 14 runs (the others below 1e-5)
    tolerance = 3e-5 if protocol == "larc" else 1e-5
    for seed in (1, 2):
        assert np.abs(plain.final_params[seed] - threshold.final_params[seed]).max() < tolerance
    summary = threshold.audit_summary
    assert not summary["individual_updates_revealed"]
    assert summary["undeclared_plaintext_items"] == []
    assert "pseudo_gradient" in summary["ciphertext_fields_received"]


def test_the_audit_lists_every_reveal_the_server_fuses():
    """The server forms the plaintext itself from the holders' partials: no reply carries
    it, so the reveal is recorded as such (it once went unlisted), naming the holders."""
    result = secagg.run(task="diabetes-iid", protocol="fedavg", backend="threshold", rounds=2)
    learned = result.audit_summary["learned_in_plaintext"]
    assert learned["global_update"] == {"revealed aggregate (plaintext vector)": 2}
    reveals = [r for r in result.audit.records if r["event"] == "reveal"]
    assert [r["by"] for r in reveals] == ["holders client_0,client_1,client_2,client_3"] * 2


@pytest.mark.parametrize("preset, tolerance", [("n8192", 1e-5), ("wide", 1e-11)])
def test_each_preset_decodes_sums_up_to_its_headroom(preset, tolerance):
    """Values near the headroom (the wide preset's coefficients exceed 64 bits there) and
    tiny ones (RegAgg's τ-scaled terms) come back within the preset's precision."""
    context = ThresholdContext(get_preset(preset))
    shares = [KeyShare(context)]
    for _ in range(2):
        shares.append(KeyShare(context, shares[-1].public_key))
    joint = context.load_public_key(shares[-1].public_key)
    bound = context.preset.headroom / 3
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-bound, bound, N) * 0.99 for _ in range(3)]
    xs[0][:10] = 1e-5 * rng.normal(size=10)
    ws = [0.5, 0.25, 0.25]
    uploads = [context.load_ciphertexts(context.encrypt(joint, x, bound), N) for x in xs]
    ks = [quantise(w, context.preset.weight_bits) for w in ws]
    total = context.weighted_sum(uploads, ks)
    halves = [[context.load_half(context.c1_half(c)) for c in u] for u in uploads]
    parts = partials_of(context, shares, context.sum_c1(halves, ks))
    got = context.fuse(c0s(context, total), parts, N)
    assert np.abs(got - sum(w * x for w, x in zip(ws, xs))).max() < tolerance


def partials_of(context, shares, c1_sum):
    return [[context.load_partial(p) for p in s.partial(c1_sum)] for s in shares]


def test_known_gap_a_holder_cannot_tell_a_crafted_public_key_upload_from_an_honest_one():
    """What an active server with colluding clients still obtains (README, threat model).

    Two clients colluding with the server upload (0, T) instead of an encryption: c1 is the
    constant polynomial T, which no honest encryption produces but nothing can check (a
    public-key upload's c1 = v·a + e1 carries the uploader's private randomness; ckks's
    seeded uploads are checked by re-deriving c1 from the seed). They consent, and the
    honest holder gives its partial decryption T·s_2 + f of their sum: s_2 scaled by T
    against OpenFHE's fixed flooding of σ = 2^20. This test pins the gap; it fails once
    holders refuse such sums (zero-knowledge proofs of well-formed encryption)."""
    from secagg.threshold.params import c1_digest, canonical_ciphertext
    from secagg.wire import Envelope

    r = BackendRound(IDS, 10, backend="threshold", decryption_budget=4)
    context = r.server.context
    honest = r.clients[IDS[2]]
    probe = context.encrypt_chunks(honest._joint, np.zeros(1))[0]
    zero = context.cc.EvalSub(probe, probe)
    handles = {}
    # two different constants: a release listing one upload twice is refused, so each
    # colluder crafts its own (which nothing else tells from an honest upload)
    for shift, colluder in enumerate(IDS[:2]):
        plain = context.cc.MakeCKKSPackedPlaintext([2.0**10 + shift] * 4096)
        constant = context.cc.EvalAdd(zero, plain)
        t_poly = constant.GetElements()[0]
        crafted = canonical_ciphertext(context._boxed(constant, [context._zero, t_poly]))
        upload = Envelope(
            colluder, "server", 0, "train", {"pseudo_gradient": wire.ciphertext([crafted])}
        )
        handles[colluder] = r.server.load(
            Envelope.from_bytes(upload.to_bytes()), "pseudo_gradient", 10
        )
        digest = c1_digest(handles[colluder].halves[colluder])
        r.clients[colluder].uploads[digest] = {}  # its (modified) software records the upload
    total = r.server.weighted_sum([handles[c] for c in IDS[:2]], [0.5, 0.5])
    _, request = reveal_request(r, total)
    reply = r.ask(IDS[2], "decrypt_share", request)
    (partial,) = r.request(IDS[2], "x", reply).ciphertext_parts("partial")
    assert context.load_partial(partial) is not None  # given: T·s_2 + f reaches the server


def test_horners_weighted_sum_is_bit_for_bit_the_term_by_term_sum(context, chain):
    from secagg.threshold.params import serialize

    _, joint = chain
    uploads = [
        context.load_ciphertexts(context.encrypt(joint, values(k), 5.0), N) for k in range(3)
    ]
    ks = [40961, -3, 2**16]
    cc = context.cc
    naive = []
    for j in range(len(uploads[0])):
        acc = cc.EvalSub(uploads[0][j], uploads[0][j])
        for u, k in zip(uploads, ks):
            for _ in range(abs(k) if abs(k) < 100 else 0):
                acc = cc.EvalAdd(acc, u[j]) if k > 0 else cc.EvalSub(acc, u[j])
            if abs(k) >= 100:  # k = Σ 2^b over its set bits, each 2^b·ct by b doublings
                for b in range(abs(k).bit_length()):
                    if (abs(k) >> b) & 1:
                        term = u[j]
                        for _ in range(b):
                            term = cc.EvalAdd(term, term)
                        acc = cc.EvalAdd(acc, term)
        naive.append(acc)
    before = [serialize(c) for u in uploads for c in u]
    fast = context.weighted_sum(uploads, ks)
    assert [serialize(c) for c in fast] == [serialize(c) for c in naive]
    assert [serialize(c) for u in uploads for c in u] == before  # inputs untouched


@pytest.mark.parametrize(
    "damage, match",
    [
        ("no_release", "comes without its release"),
        ("other_name", "asked to open 'g_hat'"),
        ("divisor_zero", "divisor 0"),
        ("divisor_above_one", "divisor 2"),
        ("chunk_dropped", "do not match the release"),
        ("key_dropped", "do not match the release"),
    ],
)
def test_an_open_with_a_malformed_release_is_refused(opening_round, damage, match):
    r = opening_round
    fields, _ = opened(r, {c: values(k) for k, c in enumerate(IDS)})
    got = r.request(IDS[0], "x", fields)
    info = got.config("g_hat.release")
    sealed = [bytes(b) for b in got.ciphertext_parts("g_hat.sealed")]
    keys = [bytes(b) for b in got.ciphertext_parts("g_hat.keys")]
    if damage == "no_release":
        info = {k: v for k, v in info.items() if k != "divisor"}
    elif damage == "other_name":
        info["descriptor"] = {**info["descriptor"], "name": "centre"}
    elif damage == "divisor_zero":
        info["divisor"] = 0
    elif damage == "divisor_above_one":
        info["divisor"] = 2
    elif damage == "chunk_dropped":
        sealed = sealed[1:]
    else:
        keys = keys[1:]
    fields = {
        **fields,
        "g_hat.release": wire.config(info),
        "g_hat.sealed": wire.ciphertext(sealed),
        "g_hat.keys": wire.ciphertext(keys),
    }
    with pytest.raises(ReleaseRefused, match=match):
        open_as(r, IDS[0], fields)


@pytest.mark.parametrize("asked, kind", [("decrypt_share", "open"), ("open_share", "reveal")])
def test_a_holder_gives_no_share_for_a_release_of_the_other_kind(opening_round, asked, kind):
    """Consents to a sum the clients open cannot buy a partial the server fuses, nor the
    other way round."""
    r = opening_round
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.3, 0.4, 0.3])
    d = r.server.descriptor(r.ctx(), total, kind, "g_hat")
    from secagg.backends.consent import gather_consents

    request = {
        "release": wire.config(
            {"descriptor": d.to_config(), "consents": gather_consents(r.ctx(), d, None)}
        ),
        "halves": wire.ciphertext([b for e in total.entries for b in total.halves[e.client]]),
        "recipients": wire.config({"ids": IDS}),
    }
    with pytest.raises(ReleaseRefused, match=f"got a release of kind '{kind}'"):
        r.ask(IDS[0], asked, request)


def test_a_holder_sending_the_wrong_number_of_sealed_chunks_stops_the_open(opening_round):
    r = opening_round
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.3, 0.4, 0.3])
    honest = r.clients[IDS[1]].on_open_share

    def short(env):
        reply = honest(env)
        parts = r.request(IDS[1], "x", reply).ciphertext_parts("sealed")
        return {**reply, "sealed": wire.ciphertext([bytes(parts[0])])}

    r.clients[IDS[1]].on_open_share = short
    with pytest.raises(secagg.errors.RoundAborted, match="1 sealed chunk"):
        r.server.release(r.ctx(), total, "g_hat")


def test_a_threshold_client_checks_its_own_identity_and_budget():
    from secagg.backends.threshold_client import ThresholdClient
    from secagg.ckks.keywrap import KeyWrapper

    preset = get_preset("n8192")
    with pytest.raises(KeySetupError, match="identity key is not its key"):
        ThresholdClient("a", preset, identity=KeyWrapper(), roster={"a": KeyWrapper().public_bytes})
    with pytest.raises(KeySetupError, match="open_budget must be a count"):
        ThresholdClient("a", preset, open_budget=-1)
