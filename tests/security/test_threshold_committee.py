"""A key-holder committee on ``threshold`` (``--threshold-committee c``): the roster's n clients
upload, c of them hold the one-time keys' shares, t of the c open a consented sum.

What must hold: an upload carries c shares whatever n (a round deals n·c, not n²); a client
off the committee holds no share and answers no request for one; the server and t − 1
colluders (on the committee or off it) learn nothing of an honest upload; a sum opens with up
to c − t holders missing; each client's range bound is counted over the roster, not the
committee (a sum of n uploads must not wrap). Attacked through the real classes.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy.stats import binomtest

import secagg
from secagg import wire
from secagg.backends import make_client_backend, provision
from secagg.backends.consent import gather_consents
from secagg.errors import (
    ConfigError,
    KeySetupError,
    MalformedCiphertext,
    ReleaseRefused,
    RoundAborted,
    ValueRangeError,
)
from secagg.threshold.params import (
    get_preset,
    holders_of,
    share_label,
    upload_bytes,
)
from secagg.wire import Envelope
from tests.harness import BackendRound, guesses_won

IDS = [f"client_{i:02d}" for i in range(12)]
C = 5  # t = 3: a strict majority of the committee
N = 300


def values(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, n)


def make(preset: str = "wide", ids=IDS, n: int = N, **extra) -> BackendRound:
    options = {"decryption_budget": 8, "open_budget": 8, "preset": preset, "committee": C}
    return BackendRound(list(ids), n, backend="threshold", **{**options, **extra})


def parts_of(field: wire.Field) -> list[bytes]:
    env = Envelope.from_bytes(Envelope("a", "b", 0, "x", {"f": field}).to_bytes())
    return [bytes(p) for p in env.ciphertext_parts("f")]


# ---- who holds ------------------------------------------------------------------------------
def test_the_committee_is_the_same_for_every_party_and_checked():
    committee = holders_of(IDS, C)
    assert len(committee) == C and committee == sorted(committee)
    assert holders_of(list(reversed(IDS)), C) == committee  # no order, no message needed
    assert holders_of({c: b"" for c in IDS}, C) == committee  # a roster mapping alike
    assert committee != IDS[:C]  # by hash, not by name
    assert holders_of(IDS, 0) == holders_of(IDS, len(IDS)) == IDS
    for bad in (-1, len(IDS) + 1, 2.5):
        with pytest.raises(ConfigError, match="committee"):
            holders_of(IDS, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="committee"):
        make(committee=-1)
    with pytest.raises(ConfigError, match="the roster's 4 clients"):
        make(ids=IDS[:4])  # a committee of 5 from a roster of 4: the server's own check
    with pytest.raises(KeySetupError, match="the roster's 4 clients"):
        make_client_backend(  # and each client's, from its own provisioning
            "threshold", IDS[0], {"committee": C}, provision(IDS[:4], 1)[IDS[0]]
        )


def test_each_party_takes_the_committee_from_its_own_options():
    r = make()
    committee = holders_of(IDS, C)
    assert r.server.holders == committee
    assert all(c.holders == committee and c.t == 3 for c in r.clients.values())
    assert r.server.t == 3


# ---- what it costs: shares per upload fixed by c ------------------------------------------
def test_an_upload_carries_one_share_per_committee_member_whatever_the_roster():
    preset = get_preset("wide")
    sizes = {}
    for n_clients in (8, 12):
        r = make(ids=IDS[:n_clients], committee=4)
        field = r.protect(IDS[0], values(1))
        parts = parts_of(field)
        assert len(parts) == 4 + 2  # blocks, one sealed share per holder, signature
        sizes[n_clients] = sum(map(len, parts))
    assert sizes[8] == sizes[12] == upload_bytes(preset, N, 4, 3)


# ---- it opens what it should ----------------------------------------------------------------
def test_the_committee_reveals_the_weighted_sum_and_no_one_else_answers():
    r = make()
    xs = {c: values(k) for k, c in enumerate(IDS)}
    weights = {c: 1 / len(IDS) for c in IDS}
    handles = r.uploads(xs)
    total = r.server.weighted_sum([handles[c] for c in IDS], [weights[c] for c in IDS])
    got, who = r.server.reveal(r.ctx(), total, "global_update")
    assert np.abs(got - sum(weights[c] * xs[c] for c in IDS)).max() < 1e-5
    committee = holders_of(IDS, C)
    assert who == f"holders {','.join(committee)} ({C} of {C}, t = 3)"
    assert {c for c, client in r.clients.items() if client.decryptions} == set(committee)


def test_on_lean_the_committee_opens_a_streamed_sum_of_the_whole_roster():
    r = make("lean")
    xs = {c: values(k) for k, c in enumerate(IDS)}
    plan = {c: 1 / len(IDS) for c in IDS}
    got = r.reveal_running_sum(r.uploads(xs, plan), plan)
    assert np.abs(got - sum(plan[c] * xs[c] for c in IDS)).max() < 5e-6


def test_a_holder_keeps_one_record_of_a_release_of_n_uploads():
    """What a holder remembers of a release grows with n once, not n times (it is checked
    against every later release of the same uploads, ``_check_history``): one descriptor,
    and each upload's digest naming it."""
    r = make()
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [1 / 12] * 12)
    r.server.reveal(r.ctx(), total, "global_update")
    for holder in holders_of(IDS, C):
        client = r.clients[holder]
        (release,) = client.descriptors
        assert client.sets == {e.digest: [release] for e in total.entries}


@pytest.mark.parametrize("offline", [2, 3])
def test_up_to_c_minus_t_holders_may_be_offline(offline):
    r = make()
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [1 / 12] * 12)
    for holder in holders_of(IDS, C)[:offline]:
        r.clients[holder].on_decrypt_share = _offline
    if offline <= C - 3:
        _, who = r.server.reveal(r.ctx(), total, "global_update")
        assert f"({C - offline} of {C}, t = 3)" in who
    else:
        with pytest.raises(RoundAborted, match=f"{C - offline} of {C} holders answered"):
            r.server.reveal(r.ctx(), total, "global_update")


def _offline(env):
    raise ConnectionError("offline")


# ---- attacks ----------------------------------------------------------------------------------
def _reveal_request(r: BackendRound, holders: list[str], shares_of: str) -> dict:
    """A share request for the sum of every upload, naming ``holders`` and carrying the
    sealed shares addressed to committee member ``shares_of``."""
    handles = r.uploads({c: values(k) for k, c in enumerate(IDS)})
    total = r.server.weighted_sum([handles[c] for c in IDS], [1 / 12] * 12)
    d = r.server.descriptor(r.ctx(), total, "reveal", "global_update")
    consents = gather_consents(r.ctx(), d, r.server.signers)
    j = r.server.holders.index(shares_of)
    return {
        "release": wire.config({"descriptor": d.to_config(), "consents": consents}),
        "holders": wire.config({"ids": holders}),
        "preimages": wire.ciphertext([e.seeds for e in total.entries]),
        "shares": wire.ciphertext([total.sealed[e.client][j] for e in total.entries]),
    }


def test_a_client_off_the_committee_answers_no_share_request():
    """A deviating server asks a client that holds no share, naming it among the holders or
    not: it refuses either way and gives nothing."""
    r = make()
    committee = holders_of(IDS, C)
    outsider = next(c for c in IDS if c not in committee)
    request = _reveal_request(r, [*committee, outsider], committee[0])
    with pytest.raises(ReleaseRefused, match="key holders"):
        r.ask(outsider, "decrypt_share", request)
    request["holders"] = wire.config({"ids": committee})
    with pytest.raises(ReleaseRefused, match="itself among them"):
        r.ask(outsider, "decrypt_share", request)
    # a committee member refuses a holder set that names a client off the committee
    with pytest.raises(ReleaseRefused, match="key holders"):
        r.ask(
            committee[0],
            "decrypt_share",
            {**request, "holders": wire.config({"ids": [*committee[:2], outsider]})},
        )
    assert all(c.decryptions == 0 for c in r.clients.values())


def test_colluders_off_the_committee_can_open_no_share():
    """Every sealed share of an upload is for a committee member: a client off it cannot
    unwrap any of them (so colluders there add no share to the server's), where the member
    it is sealed for can (the same call, so the refusal is not a wrong label)."""
    r = make()
    victim = IDS[0]
    field = r.protect(victim, values(3))
    blocks, *sealed, _ = parts_of(field)
    label = share_label(r.server.preset, hashlib.sha256(blocks).digest())
    committee = holders_of(IDS, C)

    def unwrap(client: str, blob: bytes) -> bytes:
        me = r.clients[client]
        return me._identity.unwrap(blob, me.roster[victim], victim, client, label)

    assert len(sealed) == C
    for holder, blob in zip(committee, sealed):
        assert unwrap(holder, blob)
        for outsider in (c for c in IDS if c not in committee):
            with pytest.raises(KeySetupError):
                unwrap(outsider, blob)


def test_t_minus_one_colluding_committee_members_and_the_server_guess_no_better_than_chance():
    """Two colluders on the committee (t − 1) hold two shares of the victim's key and see its
    upload: their best guess of the key decides which of two known updates the victim sent no
    better than a coin, while three shares always win (so the test can fail)."""
    r = make(n=64)
    committee = holders_of(IDS, C)
    victim = next(c for c in IDS if c not in committee)
    trials = 80
    wins = guesses_won(r, victim, committee[:3], 0.05, trials, seed=11)
    assert wins[3] == trials
    assert binomtest(wins[2], trials, 0.5).pvalue > 1e-3


def test_each_clients_range_is_shared_over_the_roster_not_the_committee():
    """On ``wide`` the server weights (each |w| ≤ 1), so n uploads share the headroom: a
    client bounded by headroom / c could make a sum of n wrap."""
    r = make()
    bound = get_preset("wide").headroom / len(IDS)
    r.protect(IDS[0], np.full(3, bound * 0.99))
    with pytest.raises(ValueRangeError, match="headroom"):
        r.protect(IDS[0], np.full(3, bound * 1.01))


def test_a_client_provisioned_with_another_committee_is_refused_by_type():
    """A client built with another committee deals another number of shares: the server's
    parse says so (a typed error, and the upload is not summed)."""
    r = make()
    other = make(committee=C + 1)
    field = other.protect(IDS[0], values(1))
    env = Envelope(IDS[0], "server", 0, "train", {"u": field})
    with pytest.raises(MalformedCiphertext, match=f"{C} sealed"):
        r.server.load(Envelope.from_bytes(env.to_bytes()), "u", N)


def test_the_colluders_rule_counts_the_roster_not_the_committee():
    """t − 1 colluders and min_contributors honest uploads must fit in the roster: with a
    committee of 5 at t = 5 twelve clients are enough (four colluders, two honest in a
    release of six), where five would not be."""
    assert make(threshold_t=5).server.t == 5
    with pytest.raises(ConfigError, match="min_contributors=1"):
        make(ids=IDS[:5], threshold_t=5, committee=0)


def test_a_run_with_a_committee_gives_the_plain_model():
    settings = dict(task="diabetes-iid", protocol="fedavg", rounds=2, seeds=[1])
    plain = secagg.run(backend="plain", **settings)
    run = secagg.run(backend="threshold", backend_options={"committee": 3}, **settings)
    assert np.abs(plain.final_params[1] - run.final_params[1]).max() < 1e-5
    reveals = [r["by"] for r in run.audit.records if r["event"] == "reveal"]
    committee = holders_of([f"client_{i}" for i in range(4)], 3)
    assert reveals == [f"holders {','.join(committee)} (3 of 3, t = 2)"] * 2
    assert not run.audit_summary["individual_updates_revealed"]
