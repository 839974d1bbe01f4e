"""The client is the trust anchor: a deviating server that asks a client for anything its own
provisioning does not allow gets a refusal, and nothing the server learns is an individual
update (issue 31's attacks, through the real engine, driver and client classes).

Each attack is a :class:`~secagg.server.engine.Server` subclass that changes what an honest
server sends, run through ``run_experiment`` (the driver provisions every client with its own
policy, as a deployment's node does from its own file). Each one handed the server an
individual update, or an un-noised one, on the code before the client policy.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import secagg.simulation.experiment as experiment
from secagg import wire
from secagg.ckks.release import Descriptor, ReleasePolicy
from secagg.errors import ClientRefused, ReleaseRefused
from secagg.runspec.config import ExperimentConfig
from secagg.server.engine import Server
from secagg.server.round import capped_weights
from secagg.simulation.experiment import ClientFactory, run_experiment
from secagg.wire import Envelope

VICTIM = "client_2"
CKKS = ExperimentConfig(
    task="tcga-brca", protocol="fedavg", backend="ckks", rounds=2, seeds=[3], local_steps=3
)
CODE = re.compile(r"refused '[a-z_]+': [a-z_]+")


def deviating(monkeypatch, edit):
    """Run the driver with a server whose training requests ``edit(client, request)``
    changes (in place), as a server that deviates would."""

    class Deviating(Server):
        def _requests(self, ctx):
            requests = super()._requests(ctx)
            for client, request in requests.items():
                edit(client, request, ctx.round)
            return requests

    monkeypatch.setattr(experiment, "Server", Deviating)


def revealed_updates(result) -> int:
    learned = result.audit.summary()["learned_in_plaintext"]
    return sum(learned.get("global_update", {}).values())


def exclusions(result) -> dict[tuple[int, str], str]:
    return {(e["round"], e["peer"]): e["reason"] for e in result.audit.summary()["exclusions"]}


def set_train(request, **changes):
    """The request's training settings with ``changes`` (None removes a setting)."""
    current = Envelope("s", "c", 0, "t", {"train": request["train"]}).config("train")
    current.update(changes)
    for key, value in list(current.items()):
        if value is None:
            del current[key]
    request["train"] = wire.config(current)


# ---- 1. plaintext_update after an honest round ----------------------------------------------
@pytest.mark.parametrize("preset", ["lean", "compact"])
def test_plaintext_update_after_an_honest_round_is_refused(preset):
    """The gate on plaintext updates is the client's own: asked after an honest round, every
    client refuses and the server gets a code, not the update."""
    kept = {}

    def transport(factory, ids):
        kept["clients"] = factory(ids)
        return experiment.InProcessTransport({c: k.handle for c, k in kept["clients"].items()})

    config = replace(CKKS, rounds=1, backend_options={"preset": preset})
    result = run_experiment(config, transport_factory=transport)
    assert not result.aborted and revealed_updates(result) == 2  # one checked reveal
    for cid, client in kept["clients"].items():
        request = Envelope("server", cid, 0, "plaintext_update")
        with pytest.raises(ClientRefused) as info:
            client.handle(request.to_bytes())
        assert info.value.code == "refused_by_policy"
        assert "plaintext_update" in client.refusals[-1][2]


def test_plaintext_updates_are_answered_only_where_the_client_allows_them():
    """A client provisioned for a median (``allow_plaintext_updates``) gives this round's
    update once, and nothing for a round it did not train."""
    config = replace(CKKS, protocol="trimmedmean", allow_plaintext_updates=True, rounds=1)
    factory = ClientFactory(config, 3, provisions=experiment.provision([VICTIM], 2))
    client = factory([VICTIM])[VICTIM]
    assert "plaintext_update" in client.policy.phases
    with pytest.raises(ClientRefused):  # it has not trained in round 0
        client.handle(Envelope("server", VICTIM, 0, "plaintext_update").to_bytes())
    assert "at most once" in client.refusals[-1][2]


# ---- 2. training settings come from the client ----------------------------------------------
def test_lr_zero_to_every_client_but_one_reveals_nothing(monkeypatch):
    """lr = 0 everywhere but the victim would make the others' uploads encryptions of zero:
    they refuse to train with it, so no sum holds the victim's update with enough others."""

    def edit(client, request, _round):
        if client != VICTIM:
            set_train(request, lr=0.0)

    deviating(monkeypatch, edit)
    result = run_experiment(CKKS)
    assert revealed_updates(result) == 0
    reasons = exclusions(result)
    assert all(
        "refused_by_policy" in reasons[(1, c)]
        for c in (f"client_{k}" for k in range(6))
        if c != VICTIM
    )
    # the victim alone: too few contributors for any release, so every round is skipped
    # (the server foresees the clients' refusal) and no update is made
    rounds = result.metrics.dropna(subset=["clients"])
    assert not result.aborted and (rounds["skipped"] == 1).all()


@pytest.mark.parametrize("change", [{"steps": 0}, {"lr": 1e3}, {"epochs": 3, "steps": None}])
def test_any_other_training_setting_is_refused(monkeypatch, change):
    deviating(monkeypatch, lambda client, request, _: set_train(request, **change))
    result = run_experiment(replace(CKKS, rounds=1))
    assert revealed_updates(result) == 0
    assert all("refused_by_policy" in reason for reason in exclusions(result).values())


def test_dp_dropped_from_the_request_is_refused(monkeypatch):
    """Without the client's DP in the request, the victim would upload un-noised while
    privacy.json still booked ε: it refuses; its DP is its own."""
    config = replace(CKKS, client_dp={"clip": 1.0, "noise": 1.0})

    def edit(client, request, _round):
        if client == VICTIM:
            set_train(request, client_dp=None)

    deviating(monkeypatch, edit)
    result = run_experiment(config)
    assert "refused_by_policy" in exclusions(result)[(1, VICTIM)]
    sent = [
        r
        for r in result.audit.records
        if r["event"] == "message" and r["direction"] == "received" and r["peer"] == VICTIM
    ]
    assert not any(f["name"] == "pseudo_gradient" for r in sent for f in r["fields"])


# ---- 2. consents bind the model and settings the client trained from --------------------------
def test_different_models_to_different_clients_get_no_release(monkeypatch):
    """Pasquini et al. (CCS 2022): the victim trains from the real model, the others from
    another one. Every consent binds the model a client trained from, so no sum of both
    kinds of upload is opened."""

    def edit(client, request, _round):
        if client == VICTIM:
            w = Envelope("s", "c", 0, "t", {"model": request["model"]}).vector("model")
            request["model"] = wire.vector((w + 0.01).astype(np.float32))

    deviating(monkeypatch, edit)
    result = run_experiment(replace(CKKS, rounds=1))
    assert revealed_updates(result) == 0
    assert "release_refused" in exclusions(result)[(1, VICTIM)]


def test_a_release_listing_one_upload_twice_is_refused():
    entries = [["client_0", 5, "ab"], ["client_1", 5, "ab"]]
    config = {
        "basis": "",
        "kind": "reveal",
        "name": "g",
        "round": 0,
        "n_values": 3,
        "chunks": 1,
        "entries": entries,
    }
    with pytest.raises(ReleaseRefused, match="one upload twice"):
        Descriptor.from_config(config)


# ---- 3. a dominant weight ----------------------------------------------------------------------
def test_a_dominant_weight_is_refused_and_the_honest_server_caps_it():
    def descriptor(ks):
        entries = tuple((f"c{i}", k, f"d{i}") for i, k in enumerate(ks))
        return Descriptor("reveal", "g", 0, 3, 1, entries)

    policy = ReleasePolicy()
    with pytest.raises(ReleaseRefused, match="max_weight_share"):
        policy.check(descriptor([990, 2, 2, 2, 2, 2]))  # the review's lean attack
    with pytest.raises(ReleaseRefused, match="max_weight_share"):
        policy.check(descriptor([1001, 200, 200, 200, 200, 200]))  # just over half
    policy.check(descriptor([1000, 200, 200, 200, 200, 200]))  # half: the others weigh as much
    capped = capped_weights({"a": 0.9, "b": 0.05, "c": 0.05}, 0.5)
    assert capped == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25})
    # two-upload sums have the floor only (the cap would force equal weights)
    assert capped_weights({"a": 0.3, "b": 0.7}, 0.5) == {"a": 0.3, "b": 0.7}
    policy.check(descriptor([700, 300]))


def test_a_client_claiming_a_million_samples_does_not_stop_the_run(monkeypatch):
    """Its planned weight is capped to half the sum's; the honest weights stay within the
    policy, every round makes an update."""
    from secagg.clients.runtime import Client

    def inflated(original):
        def answer(self, env):
            fields = original(self, env)
            if self.id == VICTIM:
                fields["n_samples"] = wire.scalar(1e6)
            return fields

        return answer

    for phase in ("on_enroll", "on_train"):  # the enrolment and every upload say 10^6
        monkeypatch.setattr(Client, phase, inflated(getattr(Client, phase)))
    result = run_experiment(CKKS)
    assert not result.aborted
    assert revealed_updates(result) == 2 * CKKS.rounds
    assert result.metrics["skipped"].fillna(0).sum() == 0


# ---- 5. errors carry codes --------------------------------------------------------------------
def test_a_failed_reply_carries_a_code_not_the_value(monkeypatch):
    """A client whose update overflows the preset says so with a code; the value it would
    have named (a ValueRangeError) stays in its own log."""
    from secagg.clients.runtime import Client

    original = Client.train

    def huge(self, start, settings):
        g = original(self, start, settings)
        return g * 0 + (-13729.8 if self.id == VICTIM else 0.0) + g

    monkeypatch.setattr(Client, "train", huge)
    result = run_experiment(replace(CKKS, rounds=1, backend_options={"preset": "lean"}))
    reason = exclusions(result)[(1, VICTIM)]
    assert "value_out_of_range" in reason
    assert "13729" not in reason and "13729" not in str(result.audit.records)


# ---- 6. no free oracles -------------------------------------------------------------------------
def test_validation_answers_once_a_round():
    config = replace(
        CKKS,
        protocol="autofedrl",
        backend="plain",
        rounds=2,
        validation_split=0.2,
    )
    factory = ClientFactory(config, 3)
    client = factory([VICTIM])[VICTIM]
    model = wire.vector(np.zeros(client.n_params, dtype=np.float32))

    def validate(round_number, w=model):
        return client.handle(
            Envelope("server", VICTIM, round_number, "validate", {"model": w}).to_bytes()
        )

    validate(0)
    validate(0)  # round 0: the initial model, then the first update
    with pytest.raises(ClientRefused):  # a third model in round 0: a query, refused
        validate(0, wire.vector(np.ones(client.n_params, dtype=np.float32)))
    validate(1)
    with pytest.raises(ClientRefused):
        validate(1)
    with pytest.raises(ClientRefused) as info:  # rounds never go back
        validate(0)
    assert info.value.code == "refused_by_policy"


# ---- 9. no client can stop the run --------------------------------------------------------------
def victims_reply(monkeypatch, cls, method: str, name: str, field: wire.Field) -> None:
    """The victim's ``cls.method`` replies carry ``field`` as ``name`` (a malicious client)."""
    original = getattr(cls, method)

    def answer(self, env):
        fields = original(self, env)
        if self.id == VICTIM:
            fields[name] = field
        return fields

    monkeypatch.setattr(cls, method, answer)


def test_a_consent_that_is_a_json_list_excludes_only_that_client(monkeypatch):
    from secagg.secret.ckks_client import CKKSClient

    listed = wire.Field(wire.CONFIG, b'["not", "a", "mapping"]')
    victims_reply(monkeypatch, CKKSClient, "on_consent", "consent", listed)
    # per-round participation (with client DP): the run goes on without the client
    per_round = replace(
        CKKS,
        rounds=2,
        backend_options={"participation": "per-round"},
        client_dp={"clip": 1.0, "noise": 0.5},
    )
    result = run_experiment(per_round)
    assert not result.aborted
    assert (1, VICTIM) in exclusions(result)
    assert revealed_updates(result) == 2  # round 1 had no update (its upload was in the sum)
    # fixed participation (the default): the run's one contributor set lost a client, so
    # releases pause for the rest of the run (degraded, skipped), and nothing aborts
    result = run_experiment(replace(CKKS, rounds=2))
    assert not result.aborted
    assert (1, VICTIM) in exclusions(result)
    assert revealed_updates(result) == 0


def test_every_client_phase_refuses_garbage_with_a_code():
    """A small fuzzer: every phase a client answers, with random fields, gets an answer or a
    ClientRefused carrying a fixed code, never another exception or a value."""
    config = replace(CKKS, protocol="larc", rounds=1)
    factory = ClientFactory(config, 3, provisions=experiment.provision([VICTIM], 2))
    client = factory([VICTIM])[VICTIM]
    rng = np.random.default_rng(0)
    junk = [
        wire.scalar(1e300),
        wire.vector(rng.normal(size=7)),
        wire.config({"lr": 0.0, "steps": -1}),
        wire.Field(wire.CONFIG, b"[1, 2]"),
        wire.ciphertext([b"\x00" * 9]),
    ]
    names = ["model", "train", "g_hat", "alpha", "release", "aggregate", "setup", "consent"]
    for phase in sorted(client._handlers):
        for trial in range(20):
            fields = {
                names[i]: junk[int(rng.integers(len(junk)))]
                for i in rng.choice(len(names), size=int(rng.integers(0, 4)), replace=False)
            }
            request = Envelope("server", VICTIM, int(rng.integers(0, 2)), phase, fields)
            try:
                client.handle(request.to_bytes())
            except ClientRefused as exc:
                assert CODE.search(str(exc)), str(exc)


# ---- 6. LARC's probe: α and the optimizer as the client can check them --------------------------
def probe_edited(monkeypatch, edit):
    """A server whose LARC probe requests ``edit(client, fields)`` changes."""
    from secagg.server.round import RoundContext

    original = RoundContext.ask

    def ask(self, phase, messages, expect=None, **kwargs):
        if phase == "larc_probe":
            messages = {c: edit(c, dict(fields)) for c, fields in messages.items()}
        return original(self, phase, messages, expect, **kwargs)

    monkeypatch.setattr(RoundContext, "ask", ask)


def test_a_larc_probe_with_another_alpha_is_refused(monkeypatch):
    """ΔL at 10·α_i would let the server probe the loss along the client's update: α must
    be the weight Ĝ's signed descriptor lists for the client."""

    def edit(client, fields):
        if client == VICTIM:
            alpha = Envelope("s", "c", 0, "p", fields).scalar("alpha")
            fields["alpha"] = wire.scalar(10 * alpha)
        return fields

    probe_edited(monkeypatch, edit)
    result = run_experiment(replace(CKKS, protocol="larc", rounds=1))
    assert "release_refused" in exclusions(result)[(1, VICTIM)]
    learned = result.audit.summary()["learned_in_plaintext"]
    assert learned["delta_loss"]["plaintext scalar"] == 5  # every client but the victim


def test_a_larc_probe_with_another_optimizer_is_refused(monkeypatch):
    def edit(client, fields):
        if client == VICTIM:
            config = Envelope("s", "c", 0, "p", fields).config("server_opt")
            fields["server_opt"] = wire.config({**config, "beta1": 0.0})
        return fields

    probe_edited(monkeypatch, edit)
    result = run_experiment(replace(CKKS, protocol="larc", rounds=1))
    assert "refused_by_policy" in exclusions(result)[(1, VICTIM)]


def test_a_key_install_receipt_that_is_a_json_list_excludes_only_that_client(monkeypatch):
    from secagg.secret.ckks_client import CKKSClient

    victims_reply(
        monkeypatch, CKKSClient, "on_install", "installed", wire.Field(wire.CONFIG, b"[]")
    )
    result = run_experiment(replace(CKKS, rounds=1))
    assert not result.aborted and (0, VICTIM) in exclusions(result)
    assert revealed_updates(result) == 2


def test_a_threshold_share_reply_with_extra_parts_excludes_only_that_holder(monkeypatch):
    """t of n: a holder whose share reply is malformed is excluded with a typed error, and
    the other holders' shares still open the round's sum."""
    from secagg.secret.threshold_client import ThresholdClient

    original = ThresholdClient.handlers

    def handlers(self):
        out = original(self)
        answer = out["decrypt_share"]

        def doubled(env):
            fields = answer(env)
            if self.id == VICTIM:
                part = bytes(fields["share"].data)
                fields["share"] = wire.ciphertext([part, part])
            return fields

        return {**out, "decrypt_share": doubled}

    monkeypatch.setattr(ThresholdClient, "handlers", handlers)
    result = run_experiment(replace(CKKS, backend="threshold", rounds=1, backend_options={}))
    assert not result.aborted and (1, VICTIM) in exclusions(result)
    assert revealed_updates(result) == 1


def test_a_malformed_top_s_proposal_excludes_only_that_client(monkeypatch):
    from secagg.protocols.xgboost import XGBoostClient

    original = XGBoostClient.handlers

    def handlers(self):
        out = original(self)
        answer = out["xgb_histograms"]

        def garbled(client, env):
            fields = answer(client, env)
            if client.id == VICTIM:
                fields["top_s_splits"] = wire.config({"splits": "x", "n": [1]})
            return fields

        return {**out, "xgb_histograms": garbled}

    monkeypatch.setattr(XGBoostClient, "handlers", handlers)
    config = ExperimentConfig(
        task="xgb-breast-cancer-iid",
        protocol="xgboost",
        backend="plain",
        rounds=2,
        seeds=[3],
        protocol_options={"top_s": 3},
    )
    result = run_experiment(config)
    assert not result.aborted
    assert (1, VICTIM) in exclusions(result)


# ---- 2. a release listing a client's own upload under another sender ----------------------------
def test_a_victims_upload_reuploaded_by_a_colluder_is_refused_by_the_victim():
    """The review's threshold attack: a colluding client re-uploads the victim's upload as
    its own (its modified software signs and consents), the server drops the victim's own
    upload and asks for the sum with the colluder's copy. The victim refuses a release that
    lists one of its own uploads under another sender, and no other holder can open the
    victim's sealed key shares as the colluder's: nothing is revealed."""
    from secagg.errors import RoundAborted
    from secagg.threshold.params import Upload, get_preset, upload_message
    from tests.harness import BackendRound

    ids = [f"client_{k}" for k in range(5)]  # t = 3: a release lists at least 4
    victim, colluder, *honest = ids
    r = BackendRound(ids, 8, backend="threshold", decryption_budget=4)
    field = r.protect(victim, np.full(8, 0.3))
    sent = Envelope.from_bytes(Envelope(victim, "server", 0, "train", {"u": field}).to_bytes())
    stolen = Upload.from_parts(
        get_preset("wide"), [bytes(p) for p in sent.ciphertext_parts("u")], 8, 5
    )
    client = r.clients[colluder]
    digest = stolen.digest(client.preset)
    resigned = Upload(
        stolen.blocks, stolen.sealed, client._signer.sign(upload_message(colluder, digest))
    )
    client.uploads[digest], client.bases[digest] = {}, ""  # it "made" it
    copy = Envelope(
        colluder, "server", 0, "train", {"pseudo_gradient": wire.ciphertext(resigned.parts())}
    )
    copied = r.server.load(Envelope.from_bytes(copy.to_bytes()), "pseudo_gradient", 8)
    own = [r.upload(c, np.full(8, 0.1)) for c in honest]
    total = r.server.weighted_sum([copied, *own], [0.25] * 4)
    with pytest.raises(RoundAborted, match="do not open"):  # ConsentRefused, the colluder
        r.server.reveal(r.ctx(), total, "global_update")
    assert all(c.decryptions == 0 for c in r.clients.values())


def test_a_protocol_setting_changed_for_every_client_but_one_gets_no_release(monkeypatch):
    """ADMM's own request field: local steps 0 for the others would leave the change of the
    revealed sum the victim's alone. Their uploads are made from another request than the
    victim's, so no sum of both is opened."""

    def edit(client, request, _round):
        if client != VICTIM:
            config = Envelope("s", "c", 0, "t", {"admm": request["admm"]}).config("admm")
            request["admm"] = wire.config({**config, "steps": 0})

    deviating(monkeypatch, edit)
    config = ExperimentConfig(
        task="breast-cancer-iid",
        protocol="admm",
        backend="ckks",
        rounds=2,
        seeds=[3],
        protocol_options={"problem": "logistic"},
    )
    result = run_experiment(config)
    assert "release_refused" in exclusions(result)[(1, VICTIM)]
    # round 1 opened nothing; the victim refused and left, and with participation fixed no
    # later sum is released without it (the round is skipped: degraded, not aborted)
    assert not result.aborted
    reveals = {
        r["round"]
        for r in result.audit.records
        if r["event"] == "message"
        and r["direction"] == "received"
        and any(f["name"] == "global_update" for f in r["fields"])
    }
    assert reveals == set()
    received = {
        r["round"]
        for r in result.audit.records
        if r["event"] == "message"
        and r["direction"] == "received"
        and r["peer"] == VICTIM
        and r["phase"] == "train"
    }
    assert received == {1}


def test_a_refused_request_with_a_far_round_does_not_lock_the_client_out():
    """Rounds never go back after an answer; a garbled request naming round 999 is refused
    and moves nothing, so the next honest round is still answered."""
    config = replace(CKKS, backend="plain", rounds=2)
    client = ClientFactory(config, 3)([VICTIM])[VICTIM]
    with pytest.raises(ClientRefused):
        client.handle(Envelope("server", VICTIM, 999, "train", {}).to_bytes())
    model = wire.vector(np.zeros(client.n_params, dtype=np.float32))
    train = client.policy.plan.settings(1)
    request = {"model": model, "train": wire.config(train)}
    client.handle(Envelope("server", VICTIM, 1, "train", request).to_bytes())  # answered
    with pytest.raises(ClientRefused):
        client.handle(Envelope("server", VICTIM, 0, "enroll").to_bytes())  # but not round 0
