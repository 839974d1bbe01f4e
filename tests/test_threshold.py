"""The threshold backend (OpenFHE): no single key share decrypts, the joint key is the
holders' signed chain, and a deviating server gets partial decryptions of consented sums
only. Parity with plain on the reveal-only protocols."""

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


def partials(context, shares, cts):
    c1 = [context.load_c1(context.c1_half(ct)) for ct in cts]
    return [[context.load_partial(p) for p in s.partial(c1)] for s in shares]


def test_every_share_together_decrypts_a_weighted_sum(context, chain):
    shares, joint = chain
    xs, ws = [values(k) for k in range(3)], [0.2, 0.5, 0.3]
    uploads = [context.load_ciphertexts(context.encrypt(joint, x, 5.0), N) for x in xs]
    ks = [quantise(w, context.preset.weight_bits) for w in ws]
    total = context.weighted_sum(uploads, ks)
    c1 = context.sum_c1([[context.load_c1(context.c1_half(c)) for c in u] for u in uploads], ks)
    parts = [[context.load_partial(p) for p in s.partial(c1)] for s in shares]
    got = context.fuse(total, parts, N)
    assert np.abs(got - sum(w * x for w, x in zip(ws, xs))).max() < 1e-5


@pytest.mark.parametrize("subset", [[0], [1], [2], [0, 1], [1, 2], [0, 2]])
def test_fewer_than_every_share_decrypts_nothing(context, chain, subset):
    shares, joint = chain
    upload = context.load_ciphertexts(context.encrypt(joint, values(7), 5.0), N)
    parts = partials(context, [shares[i] for i in subset], upload)
    with pytest.raises(MalformedCiphertext, match="do not fuse"):
        context.fuse(upload, parts, N)


def test_a_share_restored_from_its_export_is_the_same_share(context, chain):
    shares, joint = chain
    upload = context.load_ciphertexts(context.encrypt(joint, values(3), 5.0), N)
    once = context.weighted_sum([upload], [quantise(1.0, context.preset.weight_bits)])
    c1 = context.sum_c1([[context.load_c1(context.c1_half(c)) for c in upload]], [2**16])
    restored = KeyShare.from_bytes(context, shares[1].export(), shares[1].public_key)
    parts = [[context.load_partial(p) for p in s.partial(c1)] for s in (shares[0], restored)]
    parts.append([context.load_partial(p) for p in shares[2].partial(c1)])
    assert np.abs(context.fuse(once, parts, N) - values(3)).max() < 1e-5


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


def test_protocols_that_open_aggregates_are_refused_before_training():
    with pytest.raises(secagg.errors.ConfigError, match="open aggregates themselves"):
        secagg.ExperimentConfig(protocol="larc", backend="threshold").validate()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["fedavg", "costwagg"])
def test_threshold_gives_the_plain_model(protocol):
    settings = dict(protocol=protocol, rounds=2, seeds=[1, 2], local_steps=5)
    plain = secagg.run(backend="plain", **settings)
    threshold = secagg.run(backend="threshold", **settings)
    for seed in (1, 2):
        assert np.abs(plain.final_params[seed] - threshold.final_params[seed]).max() < 1e-5
    summary = threshold.audit_summary
    assert not summary["individual_updates_revealed"]
    assert summary["undeclared_plaintext_items"] == []
    assert "pseudo_gradient" in summary["ciphertext_fields_received"]
