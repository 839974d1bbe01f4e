"""A server that deviates gets nothing opened that the clients cannot check.

Each test forms releases through the real server half (consent phase included) and real
client halves (``tests/harness.py``), then plays the deviating server: it edits what the
server half produced, or asks for what an honest server never would. Every attack is
refused, spends nothing, and the honest release still opens to the right values.
"""

import base64
import json
from dataclasses import replace

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.ckks.flooding import error_bound, flooding_sigma, slot_sigma
from secagg.ckks.presets import get_preset
from secagg.errors import (
    ConsentRefused,
    MalformedCiphertext,
    ProtocolStateError,
    ReleaseRefused,
    RoundAborted,
    RoundSkipped,
)
from secagg.wire import Envelope
from tests.harness import BackendRound

PRESET = get_preset("compact")
IDS = ["client_0", "client_1", "client_2"]
VALUES = {"client_0": 0.1, "client_1": 0.2, "client_2": 0.6}


def fresh(run, n=8):
    return run.uploads({c: np.full(n, VALUES[c]) for c in run.clients})


def release(run, ctx, total, name="global_update", kind="reveal", field="aggregate"):
    """What the honest server half sends a decryptor (or an opener) for ``total``."""
    return run.server._release_fields(ctx, total, name, kind, field)


def edited(fields, field="aggregate", **changes):
    """The request with the descriptor's entries changed, as a deviating server would."""
    info = json.loads(bytes(fields[f"{field}.release"].data))
    info["descriptor"].update(changes)
    return {**fields, f"{field}.release": wire.config(info)}


def revealed(run, to, fields, name="global_update"):
    return Envelope("c", "s", 0, "r", run.ask(to, "reveal", fields)).vector(name)


@pytest.fixture
def run():
    return BackendRound(IDS, 8, decryption_budget=4, reveal_length=8)


def test_an_honest_release_opens_to_the_weighted_sum(run):
    ctx = run.ctx()
    total = ctx.weighted_sum(fresh(run), {"client_0": 0.5, "client_1": 0.25, "client_2": 0.25})
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), 0.25, atol=1e-6)


def whole_ciphertext(run, client):
    """One of ``client``'s uploads as a whole ciphertext, both polynomials (what a
    server-weighted release carried before it carried first polynomials only): loaded by
    SEAL, which expands its seed into a_i, and saved again."""
    from secagg.ckks.public import to_bytes

    field = run.protect(client, np.full(8, VALUES[client]))
    parts = Envelope("c", "s", 0, "train", {"u": field}).ciphertext_parts("u")
    cts, _ = run.server.public.load_upload(parts, 8)
    return wire.ciphertext([to_bytes(ct) for ct in cts])


def test_a_crafted_ciphertext_is_refused(run):
    """The review's key-recovery request: a ciphertext whose second polynomial the server
    chose (here: one client's raw upload passed as 'the aggregate' of three). A release
    carries no second polynomial any more (the decryptor expands its own from the signed
    seeds), so a whole ciphertext is refused before anything is decrypted."""
    ctx = run.ctx()
    handles = fresh(run)
    fields = release(run, ctx, ctx.weighted_sum(handles, dict.fromkeys(IDS, 1 / 3)))
    forged = {**fields, "aggregate": whole_ciphertext(run, "client_1")}
    with pytest.raises(MalformedCiphertext, match="bytes; a chunk here has"):
        run.ask("client_0", "reveal", forged)
    assert run.clients["client_0"].decryptions == 0
    np.testing.assert_allclose(revealed(run, "client_0", fields), 0.3, atol=1e-6)


def test_a_one_upload_or_one_hot_sum_is_refused_at_consent(run):
    ctx = run.ctx()
    handles = fresh(run)
    one = ctx.weighted_sum({"client_1": handles["client_1"]}, {"client_1": 1.0})
    with pytest.raises(RoundAborted, match="opens sums of at least 2"):
        release(run, ctx, one)
    ctx = run.ctx()
    ctx.max_weight_share = 1.0  # a deviating server: it does not cap its weights
    near_one_hot = ctx.weighted_sum(handles, {"client_0": 1e-5, "client_1": 1.0, "client_2": 1e-5})
    with pytest.raises(RoundAborted, match="a sum one upload dominates"):
        release(run, ctx, near_one_hot)


def test_a_decryptor_checks_the_policy_itself(run):
    """Consents gathered for a good sum, then the descriptor edited to a one-hot weighting:
    the decryptor refuses (policy, then signatures), whatever the server relays."""
    ctx = run.ctx()
    fields = release(run, ctx, ctx.weighted_sum(fresh(run), dict.fromkeys(IDS, 1 / 3)))
    info = json.loads(bytes(fields["aggregate.release"].data))
    entries = info["descriptor"]["entries"]
    one_hot = [[c, (2**20 if c == "client_1" else 1), d] for c, _, d in entries]
    with pytest.raises(ReleaseRefused, match="dominates"):
        run.ask("client_0", "reveal", edited(fields, entries=one_hot))
    renamed = [[c, k, d] for c, k, d in entries]
    renamed[0][1] += 1  # a weight the contributors did not sign
    with pytest.raises(ReleaseRefused, match="no valid consent"):
        run.ask("client_0", "reveal", edited(fields, entries=renamed))
    with pytest.raises(ReleaseRefused, match="opens 8 values"):
        run.ask("client_0", "reveal", edited(fields, n_values=PRESET.values_per_ciphertext))
    assert run.clients["client_0"].decryptions == 0


def test_two_weightings_of_the_same_uploads_are_refused(run):
    """Differencing: (1/3, 1, 1) and (1, 1, 1) of the same uploads give client_0's upload.
    The honest server foresees the refusal and skips the round; a deviating server that
    asks anyway gets no consent: the two weightings together single client_0 out."""
    ctx = run.ctx()
    handles = fresh(run)
    first = ctx.weighted_sum(handles, {"client_0": 1 / 3, "client_1": 1.0, "client_2": 1.0})
    ctx.reveal(first, "global_update")
    second = ctx.weighted_sum(handles, dict.fromkeys(IDS, 1.0))
    with pytest.raises(RoundSkipped, match="singles an upload out"):
        ctx.reveal(second, "global_update")
    run.server.releases = None  # a deviating server: it asks anyway
    with pytest.raises(RoundAborted, match="singles? (an upload|one) out"):  # every client refused
        ctx.reveal(second, "global_update")
    # an open of the same uploads is another kind: one is allowed (LARC's Ĝ) where its
    # weights tell nothing new: proportional to the reveal's as quantised (the same here;
    # (1/6, 1/2, 1/2) is not: 1/3 and 1/6 round apart, and the rounding residue alone
    # would single client_0 out)
    ctx = run.ctx()
    again = {"client_0": 1 / 3, "client_1": 1.0, "client_2": 1.0}
    assert "g_hat.release" in ctx.as_fields(ctx.weighted_sum(handles, again), "g_hat")


def test_a_replayed_or_reattributed_upload_gets_no_consent():
    # per-round participation: the last case is a two-upload set in a run of three, which
    # fixed participation refuses everywhere before the reattribution (test_run_coalition)
    run = BackendRound(IDS, 8, decryption_budget=4, reveal_length=8, participation="per-round")
    run.server.releases = None  # a deviating server: it asks for what its clients refuse
    ctx = run.ctx()
    old = fresh(run)
    ctx.reveal(ctx.weighted_sum(old, dict.fromkeys(IDS, 1 / 3)), "global_update")
    run.round = 1
    ctx = run.ctx()
    new = fresh(run)
    replayed = {**new, "client_0": old["client_0"]}  # last round's upload, already released
    # its budget refuses it first (one reveal an upload: the cheap check before rule 2's)
    with pytest.raises(RoundAborted, match="already entered 1 release"):
        ctx.reveal(ctx.weighted_sum(replayed, dict.fromkeys(IDS, 1 / 3)), "global_update")
    ctx = run.ctx()
    new = fresh(run)  # client_1 and client_2 spent their consent on the replayed sum
    entry = new["client_2"].entries[0]
    swapped = replace(  # client_2's upload presented as client_1's
        new["client_2"], entries=(type(entry)("client_1", 0, entry.seeds),)
    )
    # the same upload under two senders: every client refuses the descriptor itself
    with pytest.raises(RoundAborted, match="lists one upload twice"):
        ctx.reveal(
            ctx.weighted_sum(
                {**new, "client_1": swapped, "client_2": new["client_2"]},
                dict.fromkeys(IDS, 1 / 3),
            ),
            "global_update",
        )
    ctx = run.ctx()
    new = fresh(run)
    entry = new["client_2"].entries[0]
    alone = replace(  # client_2's upload presented as client_1's, client_2 left out
        new["client_2"], entries=(type(entry)("client_1", 0, entry.seeds),)
    )
    with pytest.raises(ConsentRefused, match="client_1") as refused:
        ctx.reveal(
            ctx.weighted_sum(
                {"client_0": new["client_0"], "client_1": alone}, dict.fromkeys(IDS, 1 / 2)
            ),
            "global_update",
        )
    assert refused.value.culprits == ["client_1"]  # the engine would take it out: a lie it
    # cannot tell from a refusal; an honest server never sends this


def test_forged_seeds_or_consents_are_refused(run):
    ctx = run.ctx()
    fields = release(run, ctx, ctx.weighted_sum(fresh(run), dict.fromkeys(IDS, 1 / 3)))
    parts = [
        bytes(p) for p in Envelope("s", "c", 0, "r", fields).ciphertext_parts("aggregate.seeds")
    ]
    parts[1] = parts[1][:-1] + bytes([parts[1][-1] ^ 1])
    with pytest.raises(ReleaseRefused, match="seeds sent for client_1"):
        run.ask("client_0", "reveal", {**fields, "aggregate.seeds": wire.ciphertext(parts)})
    info = json.loads(bytes(fields["aggregate.release"].data))
    info["consents"]["client_2"] = base64.b64encode(b"\0" * 64).decode()
    with pytest.raises(ReleaseRefused, match="no valid consent from client_2"):
        run.ask("client_0", "reveal", {**fields, "aggregate.release": wire.config(info)})
    assert run.clients["client_0"].decryptions == 0


def test_an_open_is_checked_budgeted_and_flooded(run):
    """LARC's probe opened any ciphertext, any number of times, exactly. Now an open is
    checked like a reveal, spends the client's own open budget and is flooded."""
    ctx = run.ctx()
    handles = fresh(run)
    fields = ctx.as_fields(ctx.weighted_sum(handles, dict.fromkeys(IDS, 1 / 3)), "g_hat")
    client = run.clients["client_0"]
    client.open_budget = 2
    probe = run.request("client_0", "larc_probe", fields)
    first, second = (client.open(probe, "g_hat", 8) for _ in range(2))
    assert not np.array_equal(first, second)
    np.testing.assert_allclose([first, second], 0.3, atol=1e-6)
    with pytest.raises(ProtocolStateError, match="refuses to open aggregate 3"):
        client.open(probe, "g_hat", 8)
    client.open_budget = 3
    forged = {**fields, "g_hat": whole_ciphertext(run, "client_1")}
    with pytest.raises(MalformedCiphertext, match="bytes; a chunk here has"):
        client.open(run.request("client_0", "larc_probe", forged), "g_hat", 8)
    with pytest.raises(ReleaseRefused, match="of kind 'open'"):
        client.on_reveal(
            run.request(
                "client_0",
                "reveal",
                {
                    "aggregate": fields["g_hat"],
                    "aggregate.release": fields["g_hat.release"],
                    "aggregate.seeds": fields["g_hat.seeds"],
                },
            )
        )


@pytest.mark.parametrize("n_clients", [2, 6])
def test_flooding_is_sized_from_the_sum_and_every_decryption_of_the_key(n_clients):
    """σ = E(k, M)·2^{s/2}·sqrt(64·t): E from this sum's own weights over all its
    coefficients, t = every client's reveal and open budgets on the one key."""
    ids = [f"client_{k}" for k in range(n_clients)]
    run = BackendRound(ids, 8, decryption_budget=5, open_budget=0)
    ctx = run.ctx()
    handles = run.uploads({c: np.zeros(8) for c in ids})
    ctx.reveal(ctx.weighted_sum(handles, dict.fromkeys(ids, 1 / n_clients)), "global_update")
    k = round(2**PRESET.weight_bits / n_clients)
    coeff = flooding_sigma(
        error_bound([k] * n_clients, PRESET.poly_modulus_degree, 30), 5 * n_clients, 30
    )
    expected = slot_sigma(
        coeff, PRESET.poly_modulus_degree, 2.0 ** (PRESET.scale_bits + PRESET.weight_bits)
    )
    sigmas = [c.last_flooding_sigma for c in run.clients.values() if c.last_flooding_sigma]
    # two decryptors, each flooding for itself (a checked reveal)
    assert sigmas == [pytest.approx(expected, rel=1e-9)] * 2


@pytest.mark.parametrize("participation", ["per-round", "fixed"])
@pytest.mark.parametrize("how", ["refuses", "never answers"])
def test_a_client_that_withholds_consent_cannot_end_the_run(how, participation):
    """A malicious client uploads, then withholds its consent: its upload is in the sum, so
    nothing can be opened that round (no update). A refusal (``ClientRefused``, the
    client's own rule) takes it out of the run at once; no answer at all is a dropout
    (a node down between its upload and its consent), asked again next round, but only
    once per run (``MISSED_CONSENTS_FORGIVEN``): after that it leaves. With per-round
    participation the run goes on with the others, who reach the honest model; with fixed
    participation (the default) the run's one contributor set has lost a client, so every
    later round is skipped (paused, never aborted): a sum without it, beside the sums with
    it, would give its update by difference once the uploads repeat."""
    from secagg.errors import ClientRefused
    from secagg.protocols import make_protocol
    from secagg.protocols.optimizers import SGD
    from secagg.server.engine import MISSED_CONSENTS_FORGIVEN, Server
    from secagg.server.plan import TrainingPlan
    from secagg.server.transport import InProcessTransport
    from tests.conftest import backend_client

    ids = ["client_0", "client_1", "client_2", "client_bad"]
    server_backend, backends = make_backends("ckks", ids, participation=participation)
    handlers = {c: backend_client(c, backends[c], np.full(4, 0.1), 10) for c in ids[:3]}
    honest_bad = backend_client("client_bad", backends["client_bad"], np.full(4, 0.1), 10)

    def withholds(data):
        if Envelope.from_bytes(data).phase == "consent":
            if how == "refuses":
                raise ClientRefused("client_bad", "consent", "release_refused")
            raise RuntimeError("the node went down")
        return honest_bad(data)

    handlers["client_bad"] = withholds
    server = Server(
        make_protocol("fedavg"),
        server_backend,
        SGD(4, lr=1.0),
        InProcessTransport(handlers),
        np.zeros(4),
        plan=TrainingPlan(local_steps=1),
    )
    stalls = 1 if how == "refuses" else 1 + MISSED_CONSENTS_FORGIVEN
    server.setup(rounds=stalls + 1)
    for number in range(stalls):
        assert "client_bad" not in server.left
        report = server.run_round(number)
        assert report.skipped and "client_bad" in report.skipped
        assert "client_bad" in report.clients or "client_bad" in report.excluded
        np.testing.assert_array_equal(server.params, 0.0)  # no update
    assert "client_bad" in server.left
    last = server.run_round(stalls)
    assert "client_bad" not in last.clients
    if participation == "fixed":
        assert last.skipped is not None and "participation is fixed" in last.skipped
        np.testing.assert_array_equal(server.params, 0.0)  # paused: no update, no abort
        return
    assert last.skipped is None
    np.testing.assert_allclose(server.params, 0.1, atol=1e-6)
    missed = {r["peer"]: r["rounds"] for r in server.audit.rounds_missed()}
    assert missed == {"client_bad": list(range(1, stalls + 2))}  # the user's round numbers
