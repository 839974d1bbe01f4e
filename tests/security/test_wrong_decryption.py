"""A decryptor that returns a wrong decryption is caught (issue 31, item 10).

On ``ckks`` every reveal is decrypted by two clients, each flooding independently; the
server accepts their mean only if the two agree within the flooding they report
(``ckks_server.decryptions_agree``), asks a third on disagreement, excludes the decryptor
the other two contradict (``WrongDecryption``, named in the audit) and aborts the round if
no two agree. Each decryption counts in its decryptor's own budget.

The attacks go through the real server half and real client halves (``tests/harness.py``)
and through the engine (``Server``) with clients answering over the in-process transport;
the deviating client is a real client whose reveal handler adds 0.05 to what it decrypted.
"""

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.errors import ProtocolStateError, RoundAborted
from secagg.wire import Envelope
from tests.harness import BackendRound

IDS = ["client_0", "client_1", "client_2", "client_3"]
VALUES = {"client_0": 0.1, "client_1": 0.2, "client_2": 0.6, "client_3": -0.3}
N = 8


def lying(client, delta=0.05, sigma_factor=1.0):
    """Make ``client`` (a real CKKS client half) add ``delta`` to every value it reveals,
    and report its σ times ``sigma_factor``."""
    honest = client.on_reveal

    def on_reveal(env):
        reply = Envelope("c", "s", 0, "r", honest(env))
        (name,) = [k for k in reply.fields if k != "flooding_sigma"]
        lie = {name: wire.vector(reply.vector(name) + delta)}
        if "flooding_sigma" in reply.fields:  # reported since the check (none before)
            lie["flooding_sigma"] = wire.scalar(reply.scalar("flooding_sigma") * sigma_factor)
        return lie

    client.on_reveal = on_reveal


def summed(run, preset, clients=IDS):
    """A weighted mean of the clients' uploads, formed as an honest server forms it."""
    ctx = run.ctx()
    plan = {c: 1 / len(clients) for c in clients}
    values = {c: np.full(N, VALUES[c]) for c in clients}
    if preset == "lean":
        handles = run.uploads(values, plan)
        total = ctx.running_sum(plan)
        for c in clients:
            total.add(c, handles[c])
        return ctx, total.result(), float(np.mean([VALUES[c] for c in clients]))
    handles = run.uploads(values)
    return ctx, ctx.weighted_sum(handles, plan), float(np.mean([VALUES[c] for c in clients]))


def flooding(run):
    return max(c.last_flooding_sigma or 0.0 for c in run.clients.values())


def excluded_in_audit(run):
    return {
        (r["peer"], r["error"])
        for r in run.audit.records
        if r["event"] == "excluded" and r["phase"] == "reveal"
    }


@pytest.mark.parametrize("preset", ["compact", "lean"])
@pytest.mark.parametrize("liar", ["client_0", "client_1"])  # the first or the second asked
def test_a_lying_decryptor_is_excluded_and_named(preset, liar):
    run = BackendRound(IDS, N, decryption_budget=4, reveal_length=N, preset=preset)
    lying(run.clients[liar])
    ctx, total, expected = summed(run, preset)
    value = ctx.reveal(total, "global_update")
    # the applied value is the honest pair's mean: within their flooding of the exact one
    # (plus lean's quantised client weights), not 0.05 off
    sigma = flooding(run)
    assert 0 < sigma < 1e-3
    np.testing.assert_allclose(value, expected, atol=10 * sigma + 1e-6)
    assert liar not in ctx.active
    assert "WrongDecryption" in ctx.excluded[liar]
    assert excluded_in_audit(run) == {(liar, "WrongDecryption")}
    # three decryptions were made, each counted by its decryptor
    assert sorted(c.decryptions for c in run.clients.values()) == [0, 1, 1, 1]


def test_a_liar_that_inflates_its_sigma_is_caught():
    """A liar cannot widen the tolerance by reporting a larger σ: honest decryptors of one
    run report the same σ, and a pair whose σ differ does not agree."""
    run = BackendRound(IDS, N, decryption_budget=4, reveal_length=N)
    lying(run.clients["client_0"], sigma_factor=1e9)
    ctx, total, expected = summed(run, "compact")
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), expected, atol=1e-6)
    assert excluded_in_audit(run) == {("client_0", "WrongDecryption")}


def test_an_unflooded_decryption_is_caught():
    """A decryptor that returns the exact decryption (σ 0: no flooding, which exposes the
    key to Li–Micciancio) disagrees with the flooded ones."""
    run = BackendRound(IDS, N, decryption_budget=4, reveal_length=N)
    lying(run.clients["client_1"], delta=0.0, sigma_factor=0.0)
    ctx, total, expected = summed(run, "compact")
    np.testing.assert_allclose(ctx.reveal(total, "global_update"), expected, atol=1e-6)
    assert excluded_in_audit(run) == {("client_1", "WrongDecryption")}


def test_a_disagreement_nobody_can_settle_aborts_the_round():
    """Two decryptors only: the server cannot tell which one lies, so nothing is applied."""
    ids = IDS[:2]
    run = BackendRound(ids, N, decryption_budget=4, reveal_length=N)
    lying(run.clients["client_1"])
    ctx, total, _ = summed(run, "compact", ids)
    with pytest.raises(RoundAborted, match="disagree beyond the flooding"):
        ctx.reveal(total, "global_update")


def test_no_two_agreeing_aborts_the_round():
    run = BackendRound(IDS[:3], N, decryption_budget=4, reveal_length=N)
    lying(run.clients["client_0"], delta=0.05)
    lying(run.clients["client_1"], delta=-0.05)
    ctx, total, _ = summed(run, "compact", IDS[:3])
    with pytest.raises(RoundAborted, match="no two of the decryptions"):
        ctx.reveal(total, "global_update")


@pytest.mark.parametrize("preset", ["compact", "lean"])
def test_honest_reveals_never_trip(preset):
    """Many reveals by honest decryptors (each a fresh flooding from the OS CSPRNG): no
    exclusion, two decryptions per reveal, the mean of two floodings applied."""
    reveals = 12
    run = BackendRound(IDS, N, decryption_budget=reveals, reveal_length=N, preset=preset)
    for r in range(reveals):
        run.round = r
        ctx, total, expected = summed(run, preset)
        value = ctx.reveal(total, "global_update")
        assert not ctx.excluded
        np.testing.assert_allclose(value, expected, atol=10 * flooding(run) + 1e-6)
    assert sum(c.decryptions for c in run.clients.values()) == 2 * reveals
    assert all(c.decryptions <= reveals for c in run.clients.values())
    assert not excluded_in_audit(run)


@pytest.mark.parametrize("m", [1, 8, 10_000])
def test_the_tolerance_holds_for_honest_pairs_and_catches_lies(m):
    """The comparison itself, on Gaussian floodings of the reported σ: 300 honest pairs
    (the bound allows a false alarm with probability ≤ 2^-39 per pair) all agree; a shift
    of 0.05, or of 16·sqrt(2)·σ on one value, or of σ on every value of a long vector (a
    thirteenth of each value's tolerance: the norm test catches it) does not."""
    from secagg.backends.ckks_server import CHECK_BITS, decryptions_agree

    rng = np.random.default_rng(0)
    sigma = 1e-3
    exact = rng.normal(size=m)
    for _ in range(300):
        a = exact + rng.normal(scale=sigma, size=m)
        b = exact + rng.normal(scale=sigma, size=m)
        assert decryptions_agree(a, sigma, b, sigma)
        assert not decryptions_agree(a + 0.05, sigma, b, sigma)
        assert not decryptions_agree(a, sigma, b, 2 * sigma)
        one = a.copy()
        one[m // 2] += 16 * np.sqrt(2) * sigma
        assert not decryptions_agree(one, sigma, b, sigma)
    if m >= 10_000:  # a spread lie well inside each value's tolerance, caught by the norm
        assert not decryptions_agree(a + sigma, sigma, b, sigma)
    assert CHECK_BITS == 40


def test_flooding_off_compares_exactly():
    """With flooding off (σ 0, measuring only) two honest decryptions are identical; any
    lie above the decoding slack is caught."""
    from secagg.backends.ckks_server import decryptions_agree

    a = np.linspace(-1, 1, 100)
    assert decryptions_agree(a, 0.0, a.copy(), 0.0)
    assert not decryptions_agree(a + 1e-6, 0.0, a, 0.0)


def engine(ids, values, *, budget, liar=None):
    """A FedAvg server on ckks (compact) and its clients, over the in-process transport."""
    from secagg.protocols import make_protocol
    from secagg.protocols.optimizers import SGD
    from secagg.server.audit import AuditLog
    from secagg.server.engine import Server
    from secagg.server.plan import TrainingPlan
    from secagg.server.transport import InProcessTransport
    from tests.conftest import backend_client

    server_backend, backends = make_backends("ckks", ids, decryption_budget=budget, reveal_length=4)
    if liar is not None:
        lying(backends[liar])
    handlers = {c: backend_client(c, backends[c], np.full(4, values[c]), 10) for c in ids}
    audit = AuditLog()
    server = Server(
        make_protocol("fedavg"),
        server_backend,
        SGD(4, lr=1.0),
        InProcessTransport(handlers),
        np.zeros(4),
        plan=TrainingPlan(local_steps=1),
        audit=audit,
    )
    return server, backends, audit


def test_a_lying_decryptor_in_a_run_is_excluded_and_the_update_is_the_honest_one():
    """Through the engine: the liar is the first decryptor asked in round 0. The applied
    update is the honest run's to within the flooding, and the audit names the liar."""
    rounds = 2
    honest, honest_backends, _ = engine(IDS, VALUES, budget=rounds)
    honest.setup(rounds=rounds)
    for r in range(rounds):
        honest.run_round(r)
    server, backends, audit = engine(IDS, VALUES, budget=rounds, liar="client_0")
    server.setup(rounds=rounds)
    first = server.run_round(0)
    assert "WrongDecryption" in first.excluded["client_0"]
    server.run_round(1)
    sigma = max(b.last_flooding_sigma or 0.0 for b in backends.values())
    expected = rounds * np.mean(list(VALUES.values()))
    np.testing.assert_allclose(server.params, expected, atol=20 * sigma + 1e-6)
    np.testing.assert_allclose(server.params, honest.params, atol=20 * sigma + 1e-6)
    exclusions = audit.summary()["exclusions"]
    # run_round(0) is the audit's round 1
    assert [(e["round"], e["phase"], e["peer"]) for e in exclusions] == [(1, "reveal", "client_0")]
    assert [r["error"] for r in audit.records if r["event"] == "excluded"] == ["WrongDecryption"]


@pytest.mark.parametrize("seed", range(3))
def test_an_honest_run_never_trips(seed):
    rng = np.random.default_rng(seed)
    values = {c: float(v) for c, v in zip(IDS, rng.normal(scale=0.1, size=len(IDS)))}
    rounds = 4
    server, backends, audit = engine(IDS, values, budget=rounds)
    server.setup(rounds=rounds)
    for r in range(rounds):
        report = server.run_round(r)
        assert not report.excluded
    assert audit.summary()["exclusions"] == []
    sigma = max(b.last_flooding_sigma for b in backends.values())
    np.testing.assert_allclose(
        server.params, rounds * np.mean(list(values.values())), atol=20 * sigma + 1e-6
    )
    # two decryptions per reveal, spread by the rotation over the clients
    assert sum(b.decryptions for b in backends.values()) == 2 * rounds
    assert all(b.decryptions <= rounds for b in backends.values())


def test_the_check_fits_each_clients_own_budget_and_a_client_beyond_it_refuses():
    """The check's second decryption counts in its decryptor's own budget. A client is
    asked at most once per reveal, so a budget of the run's reveals suffices even with two
    clients, each of which then decrypts every reveal; the total, 2 per reveal, is within
    the t = roster × budget the flooding was sized for. A reveal beyond the budget is
    refused, and the round with it."""
    ids = IDS[:2]
    rounds = 3
    server, backends, audit = engine(ids, VALUES, budget=rounds)
    server.setup(rounds=rounds)
    for r in range(rounds):
        assert not server.run_round(r).excluded
    assert [b.decryptions for b in backends.values()] == [rounds, rounds]
    assert sum(b.decryptions for b in backends.values()) <= rounds * len(ids)
    with pytest.raises(RoundAborted):
        server.run_round(rounds)
    refusals = [r for r in audit.records if r["event"] == "excluded" and r["phase"] == "reveal"]
    assert refusals and all("refuses decryption 4" in r["reason"] for r in refusals)
    assert [b.decryptions for b in backends.values()] == [rounds, rounds]
    with pytest.raises(ProtocolStateError, match="refuses decryption 4"):
        backends["client_0"].on_reveal(Envelope("server", "client_0", rounds, "reveal", {}))
