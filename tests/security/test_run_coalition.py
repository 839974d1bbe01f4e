"""What a coalition learns from every release of a whole run (issue 59).

The adversary holds the model still, so every client's update is the same vector every
round, and chooses each round's contributors (who "dropped out"), weights and pairings. Each
release alone passes every per-release rule; the run is what leaks: sums over sets that
change round by round, or independent weightings of the same set, give every update by
difference (the review recovered all six, to 2.3e-4 … 9e-3). The clients' run ledger
(``secagg.backends.coalition.RunLedger``, ``participation="fixed"``) refuses the second such
release; the control with ``participation="per-round"`` (the run rule off) recovers every
victim, so each test can fail.

Everything goes through the real client and holder halves (``tests.harness.BackendRound``);
only the server deviates (``r.server.releases = None``: it asks for what its honest copy
of the rules would pause).
"""

from __future__ import annotations

import numpy as np
import pytest

import secagg.simulation.experiment as experiment
from secagg.backends.coalition import RunLedger, run_weakest_share
from secagg.ckks.release import Descriptor, ReleasePolicy
from secagg.errors import ReleaseRefused, RoundAborted, RoundSkipped
from secagg.runspec.config import ExperimentConfig
from secagg.wire import Envelope
from tests.harness import BackendRound, collude

IDS = [f"client_{i}" for i in range(6)]
N = 64


def update(k: int) -> np.ndarray:
    """Client k's update, the same every round (a model held still, full-batch training)."""
    return np.random.default_rng(100 + k).normal(0, 0.05, N)


def round_of(participation: str, backend: str, **options) -> BackendRound:
    r = BackendRound(
        IDS,
        N,
        backend=backend,
        decryption_budget=20,
        open_budget=20,
        participation=participation,
        **options,
    )
    r.server.releases = None  # a deviating server: it asks for whatever it likes
    return r


def release(r: BackendRound, contributors: list[str], weights: list[float]) -> np.ndarray | None:
    """One round of the attack: the contributors upload their (repeated) update afresh, the
    server sums them with ``weights`` and asks for the reveal; None when it is refused."""
    r.round += 1
    handles = r.uploads({c: update(IDS.index(c)) for c in contributors})
    total = r.server.weighted_sum([handles[c] for c in contributors], weights)
    try:
        revealed = r.server.reveal(r.ctx(), total, "global_update")[0]
    except (RoundAborted, ReleaseRefused):
        return None
    r.released = getattr(r, "released", 0) + 1
    return revealed


def leave_one_out(r: BackendRound) -> dict[str, np.ndarray]:
    """The server alone: round j leaves client j out ("it dropped"); six releases of five
    equal-weight uploads. Every update recovered from the six: x_j = Σx − R_j/w."""
    got = {}
    for j, c in enumerate(IDS):
        others = [o for o in IDS if o != c]
        revealed = release(r, others, [0.2] * 5)
        if revealed is not None:
            got[c] = revealed / 0.2
    if len(got) < len(IDS):
        return {}
    total = sum(got.values()) / (len(IDS) - 1)
    return {c: total - got[c] for c in IDS}


def relative_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(np.linalg.norm(estimate - truth) / np.linalg.norm(truth))


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_a_server_alone_that_picks_the_dropouts_recovers_no_update(backend):
    """Attack 1 of the review, on ``ckks`` (compact) and on ``threshold`` at the default t
    (4 of 6: every release lists 3 + 2 = 5 uploads). With the run rule the first release
    fixes the set and every honest contributor refuses the next one over another set; with
    it off every update comes back."""
    r = round_of("fixed", backend)
    assert leave_one_out(r) == {}
    assert r.released == 1  # the first release only

    control = round_of("per-round", backend)
    recovered = leave_one_out(control)
    assert len(recovered) == len(IDS)
    tolerance = 1e-3  # the weights' quantisation (2^-16) and ckks's noise
    for k, c in enumerate(IDS):
        assert relative_error(recovered[c], update(k)) < tolerance


def test_the_server_and_t_minus_one_clients_choosing_the_dropouts_recover_no_update():
    """Attack 2 (threshold, t = 4 of 6: three colluders C): three rounds over
    {C, h3, h4}, {C, h3, h5}, {C, h4, h5}, each a legal five-upload sum. The colluders'
    uploads are known to them, so each release is a sum of two honest updates; the three
    together give each one. The honest clients refuse the second set."""

    def attack(r: BackendRound) -> dict[str, np.ndarray]:
        colluders, honest = IDS[:3], IDS[3:]
        for c in colluders:
            collude(r, c)
        pairs = [(honest[0], honest[1]), (honest[0], honest[2]), (honest[1], honest[2])]
        sums = []
        for a, b in pairs:
            revealed = release(r, [*colluders, a, b], [0.2] * 5)
            if revealed is None:
                return {}
            known = 0.2 * sum(update(IDS.index(c)) for c in colluders)
            sums.append((revealed - known) / 0.2)
        s01, s02, s12 = sums
        return {
            honest[0]: (s01 + s02 - s12) / 2,
            honest[1]: (s01 + s12 - s02) / 2,
            honest[2]: (s02 + s12 - s01) / 2,
        }

    assert attack(round_of("fixed", "threshold")) == {}
    recovered = attack(round_of("per-round", "threshold"))
    for c, estimate in recovered.items():
        assert relative_error(estimate, update(IDS.index(c))) < 1e-3
    assert len(recovered) == 3


def test_weightings_that_change_round_by_round_over_one_set_are_refused():
    """Within one fixed set, independent weight rows over repeated uploads single one out
    (the larc-lagged attack's shape: a victim's weight raised one round at a time). A
    protocol whose weights do not vary with the data keeps its rows proportional, so the
    clients refuse the second row; the control recovers every update from six rows."""

    assert raised_rows(round_of("fixed", "ckks"), 0.3, 0.14) == {}
    recovered = raised_rows(round_of("per-round", "ckks"), 0.3, 0.14)
    assert len(recovered) == len(IDS)
    for k, c in enumerate(IDS):
        assert relative_error(recovered[c], update(k)) < 5e-3


def test_the_same_set_with_proportional_weights_goes_on_every_round():
    """What an honest FedAvg run does under ``fixed``: one set, the same weights, every
    round released, and nothing but that sum learned (the run's weakest share is the one
    release's)."""
    r = round_of("fixed", "threshold")
    weights = [0.1, 0.15, 0.15, 0.2, 0.2, 0.2]
    truth = sum(w * update(k) for k, w in enumerate(weights))
    for _ in range(4):
        revealed = release(r, IDS, weights)
        assert revealed is not None
        np.testing.assert_allclose(revealed, truth, atol=1e-5)  # weights in 2^-16
    rows = [dict(zip(IDS, [13107, 19661, 19661, 26214, 26214, 26214]))] * 4
    # the coalition takes the three largest: the fifth largest over the largest is left
    assert run_weakest_share(rows, colluders=3, min_honest=2) == pytest.approx(19661 / 26214)


def test_an_honest_server_pauses_releases_when_a_contributor_is_missing():
    """The server's own copy of the rule: a sum over the run's set minus one client is not
    asked for; the round is skipped (the run ``degraded``), and the release resumes once
    the client answers again."""
    r = BackendRound(IDS, N, backend="threshold", decryption_budget=20, participation="fixed")
    handles = r.uploads({c: update(k) for k, c in enumerate(IDS)})
    r.server.reveal(r.ctx(), r.server.weighted_sum(list(handles.values()), [1 / 6] * 6), "g")
    shares = sum(c.decryptions for c in r.clients.values())
    r.round += 1
    handles = r.uploads({c: update(k) for k, c in enumerate(IDS[:5])})
    with pytest.raises(RoundSkipped, match="participation is fixed and client_5 is not in"):
        r.server.reveal(r.ctx(), r.server.weighted_sum(list(handles.values()), [0.2] * 5), "g")
    assert sum(c.decryptions for c in r.clients.values()) == shares  # nobody was asked
    r.round += 1
    handles = r.uploads({c: update(k) for k, c in enumerate(IDS)})
    got, _ = r.server.reveal(
        r.ctx(), r.server.weighted_sum(list(handles.values()), [1 / 6] * 6), "g"
    )
    np.testing.assert_allclose(got, sum(update(k) for k in range(6)) / 6, atol=1e-5)


def test_the_run_ledger_survives_a_restart_of_the_client_half():
    """The ledger travels with the half's state: a client restored from its export after
    the first release still refuses a second set."""
    r = round_of("fixed", "ckks")
    assert release(r, IDS[:5], [0.2] * 5) is not None
    for c in IDS:
        state = r.clients[c].state_dict()
        fresh = BackendRound([c], N, backend="ckks", participation="fixed").clients[c]
        assert fresh.ledger.streams == {}
        r.clients[c].load_state_dict(state)
        assert r.clients[c].ledger.streams == r.clients[c].ledger.to_config()["streams"]
    assert release(r, IDS[1:], [0.2] * 5) is None


def test_a_ledger_kept_under_other_rules_or_garbled_is_refused():
    ledger = RunLedger("fixed")
    ledger.uploaded("d0", N)
    d = Descriptor("reveal", "g", 0, N, 1, (("a", 3, "d0"), ("b", 3, "d1")))
    ledger.record(d, "d0")
    kept = ledger.to_config()
    with pytest.raises(ValueError, match="kept under participation 'fixed'"):
        RunLedger("per-round").load(kept)
    garbled = {**kept, "streams": {str(N): {"set": ["a"], "rows": {"": [[1, 2]]}, "releases": 1}}}
    with pytest.raises(ValueError, match="garbled"):
        RunLedger("fixed").load(garbled)
    again = RunLedger("fixed")
    again.load(kept)
    policy = ReleasePolicy(max_weight=1 << 16)

    def release(*entries):
        return Descriptor("reveal", "g", 1, N, 1, tuple(entries))

    with pytest.raises(ReleaseRefused, match="another set of clients"):
        again.check("a", release(("a", 3, "d0"), ("c", 3, "d2")), "d0", policy)
    with pytest.raises(ReleaseRefused, match="singles an upload out over the run"):
        again.check("a", release(("a", 3, "d0"), ("b", 4, "d3")), "d0", policy)
    again.check("a", release(("a", 6, "d0"), ("b", 6, "d3")), "d0", policy)


def test_the_run_weakest_share_sees_what_the_releases_together_allow():
    """The audit's run view (uploads of a client as one vector): leave-one-out sets isolate
    (0), one set with proportional rows keeps the single release's share."""
    loo = [{c: 1 for c in IDS if c != out} for out in IDS]
    assert run_weakest_share(loo, colluders=0, min_honest=2) == 0.0
    same = [dict.fromkeys(IDS, 2)] * 5
    assert run_weakest_share(same, colluders=0, min_honest=2) == 1.0
    two = [{"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1, "c": 2}]
    assert run_weakest_share(two, colluders=0, min_honest=2) == 0.0


def raised_rows(
    r: BackendRound, raised: float, others: float, move_model: bool = False
) -> dict[str, np.ndarray]:
    """Rounds over one set, no dropout, the server picking each round's weights with one
    client raised (``raised`` against ``others``, normalised to sum to 1: larc-lagged's ᾱ
    shape, (1, .55, …), (.55, 1, …), …) on a model it holds still; the six rows solve for
    every update ({} once a release is refused). ``move_model``: the server moves the model
    by a hair every round instead, so the clients see another model each time while their
    updates stay (nearly) the same."""
    rows, sums = [], []
    for j in range(len(IDS)):
        if move_model:
            for c in IDS:
                r.clients[c].note_source("train", f"model {j}")
        raw = [raised if k == j else others for k in range(len(IDS))]
        weights = [w / sum(raw) for w in raw]
        revealed = release(r, IDS, weights)
        if revealed is None:
            return {}
        rows.append(weights)
        sums.append(revealed)
    solved = np.linalg.solve(np.asarray(rows), np.stack(sums))
    return {c: solved[k] for k, c in enumerate(IDS)}


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
def test_weights_that_vary_over_a_model_held_still_give_no_third_direction(backend):
    """Where the protocol's weights vary with the data (LARC, larc-lagged: ``weights_vary``),
    the clients count the uploads made from one model as one vector: a server that holds
    the model still gets two weightings of it at most, which rule 4 checks exactly, and
    the third is refused, so the six rows never come together."""
    r = round_of("fixed", backend)
    for c in IDS:
        r.clients[c].ledger.weights_vary = True
    assert raised_rows(r, 1.0, 0.55) == {}  # attack 3 of the review: larc-lagged's ᾱ
    # two on ckks; one on threshold, whose two colluders leave rule 4 no second row here
    assert r.released == (2 if backend == "ckks" else 1)


def test_weights_that_vary_over_a_moving_model_keep_the_per_round_guarantee_only():
    """The limit, stated: when the model moves every round (by a hair of the server's
    choosing), the uploads of different models are different vectors to the ledger, so the
    rows are not bounded over the run and near-equal updates come back. That is why a
    protocol whose weights vary has the per-round guarantee only, and client DP covers the
    run (the audit and ``secagg protocols`` say so)."""
    r = round_of("fixed", "ckks")
    for c in IDS:
        r.clients[c].ledger.weights_vary = True
    recovered = raised_rows(r, 1.0, 0.55, move_model=True)
    assert len(recovered) == len(IDS)
    assert relative_error(recovered[IDS[0]], update(0)) < 0.05


def test_a_consent_padded_with_strangers_is_refused_before_the_expensive_check(monkeypatch):
    """The review's cubic-CPU request: the victim's real upload beside 3,200 entries of
    clients that are not in its roster, then a second weighting. The roster check comes
    first: refused, nothing recorded, and neither the exact two-row check nor the run rule
    ever ran (a spy on ``weakest_share`` fails the test if it did). Nor does the client sign
    a descriptor that lists a stranger (each such signature would burn its upload's one
    reveal)."""
    import secagg.backends.coalition as coalition
    import secagg.ckks.release as release_module
    from secagg import wire

    r = round_of("fixed", "ckks")
    victim = IDS[0]
    handle = r.upload(victim, update(0))
    digest = handle.entries[0].digest
    strangers = tuple((f"stranger_{i}", 1, f"{i:064x}") for i in range(3200))
    d = Descriptor("reveal", "global_update", 0, N, 1, ((victim, 1, digest), *strangers))
    ran = []

    def spy(*args, **kwargs):
        ran.append(args)
        raise AssertionError("the exact check ran")

    monkeypatch.setattr(coalition, "weakest_share", spy)
    monkeypatch.setattr(release_module.ReleasePolicy, "check_weightings", spy)
    client = r.clients[victim]
    with pytest.raises(ReleaseRefused, match="3200 client\\(s\\) not in its roster"):
        client.handlers()["consent"](
            r.request(victim, "consent", {"release": wire.config(d.to_config())})
        )
    assert ran == []
    assert client.uploads[digest] == {} and client.released.get(digest) is None


# ---- through the real engine, driver and clients: only the server's code changed ------------
def frozen_dropout_run(monkeypatch, **config_changes):
    """FedAvg on ckks (compact, server-weighted) over six rounds with full-batch training, run
    by a server that holds the model still and makes client r "drop out" of round r, with
    its own copy of the clients' rules off (it asks for whatever it likes). Returns the
    run's result and what it revealed: [(weights as summed, revealed values)]."""
    from secagg.backends.consent import ReleaseRecord
    from secagg.server.round import RoundContext

    revealed: list = []
    kept: dict = {}
    original_reveal = RoundContext.reveal

    def reveal(self, handle, name):
        values = original_reveal(self, handle, name)
        revealed.append((self.weights_of(handle), np.asarray(values, dtype=np.float64)))
        return values

    class Frozen(experiment.Server):
        def run_round(self, number):
            start = self.params.copy()
            report = super().run_round(number)
            self.params[:] = start  # the model held still: every update repeats
            return report

    def dropping(client_factory, ids):
        clients = client_factory(ids)
        kept.update(clients)

        def handler(client):
            def handle(data: bytes) -> bytes:
                env = Envelope.from_bytes(data)
                if env.phase == "train" and client.id == f"client_{env.round}":
                    raise ConnectionError(f"{client.id} 'dropped'")  # the server's choice
                return client.handle(data)

            return handle

        return experiment.InProcessTransport({c: handler(k) for c, k in clients.items()})

    monkeypatch.setattr(RoundContext, "reveal", reveal)
    monkeypatch.setattr(experiment, "Server", Frozen)
    monkeypatch.setattr(ReleaseRecord, "admit", lambda self, ctx, d: None)
    config = ExperimentConfig(
        task="tcga-brca",
        protocol="fedavg",
        backend="ckks",
        backend_options={"preset": "compact", **config_changes.pop("backend_options", {})},
        streaming=config_changes.pop("streaming", False),
        rounds=6,
        seeds=[0],
        local_steps=3,
        batch_size=10_000,  # full batch: the same model gives the same update
        **config_changes,
    )
    result = experiment.run_experiment(config, transport_factory=dropping)
    # each client's update as it last sent it (the same every round: the model held still)
    sent = {c: np.asarray(k.update, dtype=np.float64) for c, k in kept.items()}
    return result, revealed, sent


def recovered_updates(revealed) -> dict[str, np.ndarray]:
    """Every update, from six releases of leave-one-out sums with known weights."""
    clients = sorted({c for weights, _ in revealed for c in weights})
    rows = np.array([[weights.get(c, 0.0) for c in clients] for weights, _ in revealed])
    solved = np.linalg.lstsq(rows, np.stack([v for _, v in revealed]), rcond=None)[0]
    return dict(zip(clients, solved))


def test_through_the_engine_a_frozen_model_and_chosen_dropouts_open_one_sum_only(monkeypatch):
    """Attack 1 of the review through the real engine, driver and client halves, with only
    the server's code changed: the first sum is opened, and every later one over another
    set is refused by the clients who were in the first (the seed stops or pauses; it never
    opens a second). The control: per-round participation (with client DP at a noise far
    too small to hide anything, which that setting requires) gives every update back."""
    result, revealed, _ = frozen_dropout_run(monkeypatch)
    assert len(revealed) == 1
    assert not result.audit.summary()["individual_updates_revealed"]

    _, revealed, sent = frozen_dropout_run(
        monkeypatch,
        backend_options={"participation": "per-round"},
        client_dp={"clip": 100.0, "noise": 1e-9},
        dp_noise="seeded",
    )
    assert len(revealed) == 6
    recovered = recovered_updates(revealed)
    assert len(recovered) == 6
    for c, estimate in recovered.items():  # each update, as its client sent it
        assert relative_error(estimate, sent[c]) < 1e-2, c  # the review: 2.3e-4 … 9e-3


# ---- participation by groups ------------------------------------------------------------------
def dealt_groups(groups: int = 3) -> list[list[str]]:
    from secagg.backends.coalition import participation_groups

    dealt = participation_groups(IDS, groups)
    return [sorted(c for c in IDS if dealt[c] == g) for g in range(groups)]


def test_groups_are_dealt_publicly_and_evenly():
    from secagg.backends.coalition import participation_groups

    dealt = participation_groups(IDS, 3)
    assert dealt == participation_groups(list(reversed(IDS)), 3)  # from the names alone
    assert sorted(len(g) for g in dealt_groups(3)) == [2, 2, 2]
    for bad in (1, 0, 7):
        with pytest.raises(ValueError, match="2 to 6 groups"):
            participation_groups(IDS, bad)


def test_by_groups_a_server_alone_learns_group_sums_and_no_update():
    """Three groups of two on ckks: the server that picks who drops out gets no release
    that holds part of a group (leave-one-out is refused by the partners left), and what it
    can get, every pair of groups, tells it each group's sum: its best estimate of any one
    update (the group's sum over its weight) is off by more than half."""
    groups = dealt_groups(3)
    r = BackendRound(
        IDS,
        N,
        backend="ckks",
        decryption_budget=20,
        participation="groups",
        participation_groups=3,
    )
    r.server.releases = None
    assert leave_one_out(r) == {}
    sums = {}
    for left_out in range(3):
        members = [c for g, group in enumerate(groups) if g != left_out for c in group]
        revealed = release(r, members, [0.25] * 4)
        assert revealed is not None
        sums[left_out] = revealed / 0.25
    total = sum(sums.values()) / 2  # each group in two of the three sums
    for g, group in enumerate(groups):
        group_sum = total - sums[g]
        np.testing.assert_allclose(group_sum, sum(update(IDS.index(c)) for c in group), atol=1e-3)
        for c in group:
            assert relative_error(group_sum / 2, update(IDS.index(c))) > 0.5


def test_a_group_with_a_member_missing_sits_the_round_out_and_the_others_go_on(monkeypatch):
    """Through the engine: client r's node "drops" in round r; its partner is left out of
    that round with the reason (``GroupSatOut``, not blamed, asked again next round), the
    other groups' sum is released, and the run is degraded, never aborted; the frozen
    model's six rounds give the server group sums only."""
    # streamed (planned weights: the same integers every round, renormalised after the
    # sum), which is what keeps each group's rows proportional over the run
    result, revealed, sent = frozen_dropout_run(
        monkeypatch,
        backend_options={"participation": "groups", "participation_groups": 3},
        streaming=True,
    )
    assert not result.aborted and len(revealed) == 6
    groups = dealt_groups(3)
    for k, (weights, _) in enumerate(revealed):
        out = next(g for g in groups if f"client_{k}" in g)
        assert sorted(weights) == sorted(c for c in IDS if c not in out)
    reasons = [e for e in result.audit.summary()["exclusions"] if e["phase"] == "train"]
    assert {
        e["peer"]
        for e in reasons
        if "GroupSatOut" in e["reason"] or "sits the round out" in e["reason"]
    } == set(IDS)
    # the server's whole view of each group over the six releases is one direction (the
    # group's sum): its members' columns have rank 1, so no update is separable (real
    # updates are alike, so a group's mean is near each of them: that is the guarantee's
    # min_honest = 2, not a leak)
    rows = np.array([[w.get(c, 0.0) for c in IDS] for w, _ in revealed])
    for group in groups:
        assert np.linalg.matrix_rank(rows[:, [IDS.index(c) for c in group]], tol=1e-9) == 1
    assert set(sent) == set(IDS)
    view = result.audit.summary()["run_view"]
    assert view["guarantee"].startswith("run (whole groups")
    assert (
        view["weakest_share"] >= 0.01 and not result.audit.summary()["individual_updates_revealed"]
    )


# ---- the settings' refusals: each bad input, its typed error ---------------------------------
def test_per_round_participation_without_client_dp_is_refused():
    from secagg.errors import ConfigError

    config = ExperimentConfig(backend="ckks", backend_options={"participation": "per-round"})
    with pytest.raises(ConfigError, match="only with client-level DP.*--client-dp"):
        config.validate()
    with_dp = ExperimentConfig(
        backend="ckks",
        backend_options={"participation": "per-round"},
        client_dp={"clip": 1.0, "noise": 1.0},
    )
    with_dp.validate()  # with client DP it runs


@pytest.mark.parametrize("participation", ["fixed", "groups"])
def test_a_protocol_that_picks_its_contributors_needs_per_round_participation(participation):
    from secagg.errors import ConfigError

    options = {"participation": participation}
    if participation == "groups":
        options["participation_groups"] = 3
    config = ExperimentConfig(protocol="topkregcost", backend="ckks", backend_options=options)
    with pytest.raises(ConfigError, match=f"participation {participation} releases only"):
        config.validate()


@pytest.mark.parametrize(
    "options, said",
    [
        ({"participation": "groups"}, "with 0 groups"),
        ({"participation": "groups", "participation_groups": 1}, "with 1 groups"),
        ({"participation": "fixed", "participation_groups": 3}, "'fixed' with 3 groups"),
        ({"participation": "groups", "participation_groups": -2}, "with -2 groups"),
    ],
)
def test_a_group_count_without_groups_or_groups_without_a_count_is_refused(options, said):
    from secagg.backends import resolve_options
    from secagg.errors import ConfigError

    with pytest.raises(ConfigError, match=f"--participation-groups G.*{said}"):
        resolve_options("ckks", options)


def test_groups_too_small_for_the_coalition_are_refused_by_the_client_and_the_server():
    """Three groups of two on threshold at t = 4 (three colluders): a group cannot hide an
    upload among two honest ones. Every client refuses its provisioning; the server's half,
    built alone, refuses its set-up; with t = 2 (one colluder) groups of three do."""
    from secagg.backends import make_server_backend, provision, public_signers, resolve_options
    from secagg.errors import ConfigError, KeySetupError

    options = {"participation": "groups", "participation_groups": 3}
    with pytest.raises(KeySetupError, match="its participation group has 2 clients"):
        BackendRound(IDS, N, backend="threshold", **options)
    signers = public_signers(provision(IDS, 4))
    server = make_server_backend("threshold", resolve_options("threshold", options), signers)
    with pytest.raises(ConfigError, match="participation groups of 2 clients cannot hide"):
        server.setup(None, 4)
    two = {"participation": "groups", "participation_groups": 2, "threshold_t": 2}
    BackendRound(IDS, N, backend="threshold", **two)  # groups of 3 >= 1 + 2


def test_a_ledger_names_a_group_with_groups_only():
    with pytest.raises(ValueError, match="participation is one of"):
        RunLedger("everyone")
    with pytest.raises(ValueError, match="names the client's own group"):
        RunLedger("groups")
    with pytest.raises(ValueError, match="names the client's own group"):
        RunLedger("fixed", group=["a", "b"])


def test_a_run_says_at_its_start_what_holds_over_the_run():
    from secagg.simulation.api import run_guarantee_note

    assert run_guarantee_note(ExperimentConfig(protocol="fedavg", backend="ckks")) == ""
    assert run_guarantee_note(ExperimentConfig(protocol="fedavg", backend="plain")) == ""
    larc = run_guarantee_note(ExperimentConfig(protocol="larc", backend="ckks"))
    assert "weights vary with the data" in larc and "--client-dp" in larc
    per_round = ExperimentConfig(
        backend="threshold",
        backend_options={"participation": "per-round"},
        client_dp={"clip": 1.0, "noise": 1.0},
    )
    assert "client DP is the guarantee" in run_guarantee_note(per_round)
