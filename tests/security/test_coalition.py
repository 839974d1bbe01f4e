"""What a coalition learns from all the releases of a run (``secagg.backends.coalition``).

The server with up to t − 1 colluding clients (on ``threshold``; the server alone on
``ckks``) attacks through the real engine classes: weights that vanish modulo the prime,
honest uploads paired with a colluder's in small sums, two weightings of the same uploads,
a retried upload released beside the first. Each attack succeeded before the rules (issue
46 measured them: the victim's upload to 4e-11, five of five honest updates, 300 of 300
isolations); now every honest client refuses it and no holder answers, or the honest
server skips the round before asking. The exact two-release check is held against a
brute-force search over directions.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from secagg import wire
from secagg.backends.coalition import RunLedger, independent_rows, weakest_share
from secagg.backends.threshold_server import ThresholdHandle
from secagg.ckks.release import Descriptor
from secagg.errors import ReleaseRefused, RoundAborted, RoundSkipped
from secagg.wire import Envelope
from tests.harness import BackendRound, collude

IDS = [f"client_{i}" for i in range(5)]  # t = 3: up to 2 colluders, a release lists >= 4
N = 300


def values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, N)


def threshold_round(**options) -> BackendRound:
    options = {"decryption_budget": 50, "open_budget": 50, **options}
    r = BackendRound(IDS, N, backend="threshold", **options)
    r.server.releases = None  # a deviating server: it asks for what its clients refuse
    return r


def forged_sum(r: BackendRound, handles: list[ThresholdHandle], ks: list[int]) -> ThresholdHandle:
    """Σ k_i·b_i with integer weights the server chose (no quantisation, no bound)."""
    stacked = np.stack([h.total for h in handles]).reshape(len(handles), -1)
    total = r.server.ring.combine(stacked, ks).reshape(handles[0].total.shape)
    return ThresholdHandle(
        total,
        N,
        tuple(replace(h.entries[0], k=k) for h, k in zip(handles, ks)),
        {c: v for h in handles for c, v in h.sealed.items()},
        summed=True,
    )


def shares_given(r: BackendRound) -> int:
    return sum(c.decryptions + c.open_shares for c in r.clients.values())


# ---- 1. weights that vanish modulo the prime -----------------------------------------------
@pytest.mark.parametrize(
    "family",
    ["p and p + 1", "2p and 1", "-p and p + 1", "p + 1 alone over 2^16"],
)
def test_weights_that_vanish_modulo_the_prime_open_nothing(family):
    """The server lists every contributor but the victim at a multiple of p (0 in the ring)
    and the victim at p + 1 (1 in the ring): the "sum" would be the victim's upload, exact.
    Every honest contributor refuses a weight beyond 2^16 (|w| > 1), so no holder is asked."""
    r = threshold_round()
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    p = r.server.preset.prime
    others, victim = {
        "p and p + 1": (p, p + 1),
        "2p and 1": (2 * p, 1),
        "-p and p + 1": (-p, p + 1),
        "p + 1 alone over 2^16": (1 << 16, p + 1),
    }[family]
    ks = [others] * 4 + [victim]
    with pytest.raises(RoundAborted, match="beyond this client's bound"):
        r.server.reveal(r.ctx(), forged_sum(r, [handles[c] for c in IDS], ks), "global_update")
    assert shares_given(r) == 0


def test_on_ckks_a_weight_beyond_the_bound_gets_no_consent():
    """The same bound on ckks (where σ grows with |k| and the gap gave garbage, not a leak):
    a listed weight above 2^weight_bits is refused by every contributor."""
    r = BackendRound(IDS[:3], N, backend="ckks", decryption_budget=4)
    r.server.releases = None
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS[:3])})
    total = r.server.weighted_sum([handles[c] for c in IDS[:3]], [0.3, 0.3, 0.4])
    big = 1 + r.server.preset.max_weight
    forged = replace(total, entries=tuple(replace(e, k=big) for e in total.entries))
    with pytest.raises(RoundAborted, match="beyond this client's bound"):
        r.server.reveal(r.ctx(), forged, "global_update")
    assert all(c.decryptions == 0 for c in r.clients.values())


# ---- 2. honest uploads paired with a colluder's ---------------------------------------------
@pytest.mark.parametrize("colluders", [1, 2])
def test_honest_uploads_paired_with_colluders_uploads_open_nothing(colluders):
    """Each colluder's software makes an extra upload of values it knows per victim and
    consents to anything; the server sums each honest upload with the colluders' in a sum of
    colluders + 1 uploads (the default minimum of two is met). An honest victim refuses a
    release of fewer than t − 1 + 2 = 4 uploads, and so does the honest server."""
    r = threshold_round()
    bad, honest = IDS[:colluders], IDS[colluders:]
    for c in bad:
        collude(r, c)
    victims = r.uploads({c: values(10 + k) for k, c in enumerate(honest)})
    for victim in honest:
        extra = [r.upload(c, np.zeros(N)) for c in bad]  # a fresh upload of known values
        pair = r.server.weighted_sum([*extra, victims[victim]], [0.5] * (colluders + 1))
        with pytest.raises(RoundAborted, match="opens sums of at least 4"):
            r.server.reveal(r.ctx(), pair, "global_update")
    assert shares_given(r) == 0
    honest_server = BackendRound(IDS, N, backend="threshold", decryption_budget=4)
    handles = honest_server.uploads({c: values(k) for k, c in enumerate(IDS[:3])})
    small = honest_server.server.weighted_sum(list(handles.values()), [0.3] * 3)
    with pytest.raises(RoundSkipped, match="the round is skipped"):
        honest_server.server.reveal(honest_server.ctx(), small, "global_update")


# ---- 3. two weightings of the same uploads --------------------------------------------------
def test_an_open_and_a_reveal_that_differ_in_one_weight_isolate_nobody():
    """An ``open`` to the clients with equal weights, then a ``reveal`` to the server over
    the same uploads with one weight changed: their difference would be that client's
    upload. The honest contributors see both weightings and refuse the second; so do the
    holders, and the two colluders' shares open nothing."""
    r = threshold_round()
    for c in IDS[:2]:
        collude(r, c)
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    listed = [handles[c] for c in IDS]
    r.ctx().as_fields(r.server.weighted_sum(listed, [0.2] * 5), "g_hat")
    before = shares_given(r)
    second = r.server.weighted_sum(listed, [0.2, 0.2, 0.2, 0.2, 0.4])
    with pytest.raises(RoundAborted, match="singles an upload out"):
        r.server.reveal(r.ctx(), second, "global_update")
    assert shares_given(r) == before


def test_a_proportional_second_weighting_tells_nothing_new_and_is_allowed():
    r = threshold_round()
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    listed = [handles[c] for c in IDS]
    r.ctx().as_fields(r.server.weighted_sum(listed, [0.125] * 5), "g_hat")
    got, _ = r.server.reveal(r.ctx(), r.server.weighted_sum(listed, [0.25] * 5), "global_update")
    np.testing.assert_allclose(got, 0.25 * sum(values(k) for k in range(5)), atol=1e-9)


def test_a_second_weighting_over_another_set_of_the_same_uploads_is_refused():
    """Two sums over sets that differ by one upload give it by difference: the contributors
    refuse the second set (rule 2), even where it is large enough on its own."""
    ids = [f"client_{i}" for i in range(7)]  # t = 4: a release lists >= 5
    # per-round participation: fixed participation refuses any second set before rule 2
    # (test_run_coalition); an open, then a reveal: the budget (one of each) lets both through
    r = BackendRound(
        ids, N, backend="threshold", decryption_budget=9, open_budget=9, participation="per-round"
    )
    r.server.releases = None
    handles = r.uploads({c: values(k) for k, c in enumerate(ids)})
    r.ctx().as_fields(r.server.weighted_sum([handles[c] for c in ids], [0.1] * 7), "g_hat")
    six = r.server.weighted_sum([handles[c] for c in ids[:6]], [0.1] * 6)
    with pytest.raises(RoundAborted, match="one set per upload"):
        r.server.reveal(r.ctx(), six, "g")


# ---- 4. a retried upload released beside the first ------------------------------------------
def test_a_retried_requests_upload_is_not_released_beside_the_first():
    """A server that asks a client twice for the same request gets two uploads of the same
    update (a retry); releasing one with some partners and the other with others would let
    their difference through. The client consents for one of them only."""
    r = threshold_round()
    victim = r.clients[IDS[0]]
    x = values(1)
    first = {IDS[0]: victim.protect(x, basis="b", request="r1")}
    second = {IDS[0]: victim.protect(x, basis="b", request="r2")}
    others = {
        c: r.clients[c].protect(values(k), basis="b", request="r1") for k, c in enumerate(IDS[1:])
    }
    loaded = {}
    for tag, fields in (("first", first), ("second", second)):
        env = Envelope(
            IDS[0],
            "server",
            0,
            "train",
            {"u": fields[IDS[0]], "basis": wire.config({"basis": "b"})},
        )
        loaded[tag] = r.server.load(Envelope.from_bytes(env.to_bytes()), "u", N)
    rest = []
    for c, field in others.items():
        env = Envelope(c, "server", 0, "train", {"u": field, "basis": wire.config({"basis": "b"})})
        rest.append(r.server.load(Envelope.from_bytes(env.to_bytes()), "u", N))
    r.server.reveal(r.ctx(), r.server.weighted_sum([loaded["first"], *rest], [0.2] * 5), "a")
    with pytest.raises(RoundAborted, match="one upload per client per request"):
        r.server.reveal(r.ctx(), r.server.weighted_sum([loaded["second"], *rest], [0.2] * 5), "b")


# ---- the rules as pure functions ------------------------------------------------------------
def brute_force(rows: list[list[int]], colluders: int, min_honest: int) -> float:
    k1, k2 = (np.asarray(r, dtype=np.float64) for r in rows)
    theta = np.linspace(0.0, np.pi, 400_001)
    combos = np.abs(np.cos(theta)[:, None] * k1 + np.sin(theta)[:, None] * k2)
    ordered = -np.sort(-combos, axis=1)
    return float(np.min(ordered[:, colluders + min_honest - 1] / ordered[:, 0]))


@pytest.mark.parametrize("seed", range(6))
def test_the_exact_two_release_check_matches_a_search_over_every_direction(seed):
    rng = np.random.default_rng(seed)
    n, colluders = int(rng.integers(4, 9)), int(rng.integers(0, 3))
    rows = [rng.integers(-(1 << 16), 1 << 16, n).tolist() for _ in range(2)]
    exact = weakest_share(rows, colluders, 2)
    assert exact == pytest.approx(brute_force(rows, colluders, 2), abs=1e-4)
    assert exact <= brute_force(rows, colluders, 2) + 1e-12  # the grid never beats it


def test_one_weighting_needs_colluders_plus_min_honest_comparable_weights():
    assert weakest_share([[5, 5, 5, 5]], 2, 2) == 1.0
    assert weakest_share([[5, 5, 5]], 2, 2) == 0.0  # too few: one honest upload left
    assert weakest_share([[100, 90, 80, 1]], 2, 2) == pytest.approx(0.01)  # members: 90, 80
    assert weakest_share([[1, 1, 1], [1, 1, 2]], 0, 2) == 0.0  # the difference is one upload
    assert weakest_share([[1, 1, 1], [3, 3, 3]], 0, 2) == 1.0  # proportional: nothing new
    assert weakest_share([[1, 0, 0], [0, 1, 0], [0, 0, 1]], 0, 1) == 0.0  # three weightings
    assert len(independent_rows([[1, 2, 3], [2, 4, 6], [1, 0, 0], [2, 2, 3]])) == 2
    assert len(independent_rows([[1, 2, 3], [2, 4, 6], [1, 0, 0], [0, 0, 1]])) == 3


def test_the_policy_refuses_what_the_rules_refuse():
    from secagg.ckks.release import ReleasePolicy

    policy = ReleasePolicy(max_weight=1 << 16, colluders=2)
    entries = tuple((f"c{i}", 1 << 15, f"d{i}") for i in range(4))
    d = Descriptor("reveal", "g", 0, 8, 1, entries)
    policy.check(d)
    with pytest.raises(ReleaseRefused, match="opens sums of at least 4"):
        policy.check(replace(d, entries=entries[:3]))
    with pytest.raises(ReleaseRefused, match="bound"):
        policy.check(replace(d, entries=(*entries[:3], ("c3", (1 << 16) + 1, "d3"))))
    shifted = replace(d, entries=(*entries[:3], ("c3", 1 << 14, "d3")))
    with pytest.raises(ReleaseRefused, match="singles an upload out"):
        policy.check_weightings(shifted, [d])


# ---- the two-world game over the server's freedom -------------------------------------------
def _attack(r: BackendRound, family: str, victim_values: np.ndarray, rng) -> np.ndarray | None:
    """One attack of ``family`` through the real classes, the server and two colluders
    (client_0, client_1) against the honest client_4: what it recovers of the victim's
    update, or None when nothing was opened."""
    colluders, victim = IDS[:2], IDS[4]
    for c in colluders:
        collude(r, c)
    known = {c: np.zeros(N) for c in IDS[:4]}
    handles = r.uploads({**known, victim: victim_values})
    listed = [handles[c] for c in IDS]
    p = r.server.ring.p
    unit = 1 << r.server.preset.weight_bits
    try:
        if family == "vanishing weights":
            total = forged_sum(r, listed, [p] * 4 + [p + 1])
            return r.server.reveal(r.ctx(), total, "g")[0] * unit
        if family == "paired with a colluder":
            extra = r.upload(colluders[0], np.zeros(N))
            pair = r.server.weighted_sum([extra, handles[victim]], [0.5, 0.5])
            return 2 * r.server.reveal(r.ctx(), pair, "g")[0]
        # an open of every upload that the colluders read, then a reveal to the server
        ctx = r.ctx()
        fields = ctx.as_fields(r.server.weighted_sum(listed, [0.25] * 5), "g_hat")
        env = Envelope.from_bytes(Envelope("server", colluders[0], 0, "p", fields).to_bytes())
        opened = r.clients[colluders[0]].open(env, "g_hat", N)
        if family == "dropout, then the set without the victim":
            rest = r.server.weighted_sum(listed[:4], [0.25] * 4)
            return 4 * (opened - r.server.reveal(r.ctx(), rest, "g")[0])
        shift = float(rng.uniform(0.05, 0.5))  # two weightings of the same set
        weights = [0.25] * 4 + [0.25 + shift]
        revealed = r.server.reveal(r.ctx(), r.server.weighted_sum(listed, weights), "g")[0]
        return (revealed - opened) / shift
    except (RoundAborted, ReleaseRefused):
        return None


FAMILIES = (
    "vanishing weights",
    "paired with a colluder",
    "dropout, then the set without the victim",
    "two weightings",
)


def _play(trials: int, seed: int) -> tuple[int, int]:
    """(wins, openings): the adversary guesses which of two known updates the victim sent,
    from what its attack recovered (the nearer candidate), or by a coin when it got nothing."""
    rng = np.random.default_rng(seed)
    candidates = [np.full(N, 0.1), np.full(N, -0.1)]
    wins = openings = 0
    for trial in range(trials):
        bit = int(rng.integers(2))
        r = threshold_round(decryption_budget=50)
        got = _attack(r, FAMILIES[trial % len(FAMILIES)], candidates[bit], rng)
        if got is None:
            guess = int(rng.integers(2))
        else:
            openings += 1
            guess = int(np.abs(got - candidates[1]).mean() < np.abs(got - candidates[0]).mean())
        wins += int(guess == bit)
    return wins, openings


def test_the_server_with_t_minus_one_colluders_guesses_no_better_than_chance(monkeypatch):
    """200 trials over four attack families (weights, pairings, a second set after a
    dropout, two weightings): every one is refused, so the adversary's guess of which of
    two updates the victim sent is a coin (binomial test). The control: the same game with
    the clients' coalition rules switched off wins every trial (the test can fail)."""
    from scipy.stats import binomtest

    from secagg.ckks.release import ReleasePolicy

    wins, openings = _play(200, seed=46)
    assert openings == 0
    assert binomtest(wins, 200, 0.5).pvalue > 1e-3

    monkeypatch.setattr(ReleasePolicy, "check_weightings", lambda self, d, earlier: None)
    monkeypatch.setattr(ReleasePolicy, "check", lambda self, d: None)
    monkeypatch.setattr(RunLedger, "check", lambda self, client, d, digest, policy: None)
    wins, openings = _play(40, seed=47)
    assert openings == 40 and wins == 40


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_an_honest_server_refuses_a_weight_above_one_from_its_protocol(backend):
    """A protocol that hands the server a weight of 1.5 gets a typed error when it forms the
    sum (its clients would all refuse it: |w| <= 1); and a sum that lists one anyway (a
    forged handle) is refused by the server's own record before any client is asked."""
    from secagg.errors import ConfigError, ProtocolStateError

    r = BackendRound(IDS, N, backend=backend, decryption_budget=4)
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    listed = [handles[c] for c in IDS]
    with pytest.raises(ConfigError, match=r"need \|w\| <= 1 \(headroom\); got 1\.5"):
        r.server.weighted_sum(listed, [1.5, 0.2, 0.2, 0.2, 0.2])
    total = r.server.weighted_sum(listed, [0.2] * 5)
    big = r.server.preset.max_weight * 3 // 2
    forged = replace(total, entries=(replace(total.entries[0], k=big), *total.entries[1:]))
    with pytest.raises(ProtocolStateError, match=r"a weight of 1\.5 \(> 1\)"):
        r.server.reveal(r.ctx(), forged, "global_update")
    assert all(c.decryptions == 0 for c in r.clients.values())
