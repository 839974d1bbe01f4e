"""A client that lives for one message, restored from the state the previous message
exported, answers exactly as a long-lived client does (as when Flower starts a fresh
ClientApp per message); a blob that is not this client's is refused and changes nothing.

The end-to-end runs go through the real classes: the experiment's ClientFactory builds every
client, the real Server drives the rounds, and the transport below keeps nothing of a client
between messages but the bytes ``export_state`` returned.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from secagg import wire
from secagg.backends.plain import PlainClient
from secagg.clients.state import STATE_VERSION, decode_state, encode_state
from secagg.clients.tasks import ClientData
from secagg.clients.training import LocalTrainer
from secagg.errors import ConfigError, KeySetupError, StateError
from secagg.secret.keywrap import KeyWrapper
from secagg.server.transport import InProcessTransport
from secagg.simulation.experiment import ClientFactory, ExperimentConfig, run_experiment
from secagg.wire import Envelope

#: CostWAgg keeps l(w^c_{t-1}) on the client; client DP and scalar DP draw from the client's
#: noise generator; 5 steps of batch 8 do not divide an epoch, so the batch position matters
PLAIN = ExperimentConfig(
    task="tcga-brca",
    protocol="costwagg",
    backend="plain",
    rounds=3,
    seeds=[1],
    local_steps=5,
    client_dp={"clip": 1.0, "noise": 0.5},
    scalar_dp={"low": 0.5, "high": 2.0, "noise": 0.05},
    dp_noise="seeded",  # reproducible noise: the fresh and the long-lived run must agree
)
#: server-blind LARC: key setup, each client's own model and Adam copy, the probe phase
CKKS = ExperimentConfig(
    task="tcga-brca",
    protocol="larc",
    backend="ckks",
    rounds=3,
    seeds=[1],
    local_steps=5,
    server_blind=True,
)
#: threshold: the record of the client's own uploads (consents), of the releases it answered
#: and the share counters; opens go through t holders' sealed shares
THRESHOLD = replace(CKKS, backend="threshold", rounds=2)
#: DP-SGD (Opacus): accountant, noise generator and the Poisson sampler's place; 7 steps a
#: round over epochs of 31 batches, so rounds end mid-epoch
DP_SGD = ExperimentConfig(
    task="tcga-brca",
    protocol="fedavg",
    backend="plain",
    rounds=3,
    seeds=[1],
    local_steps=7,
    dp_sgd={"clip": 1.0, "noise": 1.0},
    dp_noise="seeded",
)
#: ADMM keeps x_i and w_i on the client and solves its own x-update (no local SGD)
ADMM = ExperimentConfig(
    task="breast-cancer-label",
    protocol="admm",
    backend="plain",
    rounds=4,
    seeds=[1],
    protocol_options={"problem": "logistic"},
)
#: flooding and encryption noise are random on ckks; plain and DP-SGD are deterministic
ATOL = {"plain": 0.0, "ckks": 1e-4, "threshold": 1e-4}


class FreshPerMessage:
    """A transport whose clients live for one message: each request builds a fresh client
    through the experiment's factory, restores the state the previous message exported,
    answers and exports again. ``forget(client, pristine)`` (the controls) damages the
    restored client, to show the comparison would notice that piece of state missing."""

    def __init__(self, factory: ClientFactory, ids: list[str], forget=None):
        self.factory, self.forget = factory, forget
        self.blobs: dict[str, bytes | None] = {cid: None for cid in ids}
        self.messages = 0
        self._inner = InProcessTransport(
            {cid: (lambda data, cid=cid: self._answer(cid, data)) for cid in ids}
        )

    @property
    def peers(self) -> list[str]:
        return self._inner.peers

    def exchange(self, requests):
        return self._inner.exchange(requests)

    def _fresh(self, cid: str):
        return self.factory([cid])[cid]

    def _answer(self, cid: str, data: bytes) -> bytes:
        client = self._fresh(cid)
        if self.blobs[cid] is not None:
            client.restore_state(self.blobs[cid])
            if self.forget is not None:
                self.forget(client, self._fresh(cid))
        reply = client.handle(data)
        self.blobs[cid] = client.export_state()
        self.messages += 1
        return reply


def fresh_run(config: ExperimentConfig, forget=None):
    made: list[FreshPerMessage] = []

    def transport(factory, ids):
        made.append(FreshPerMessage(factory, ids, forget))
        return made[-1]

    return run_experiment(config, transport_factory=transport), made[-1]


_LONG_LIVED: dict[str, object] = {}


def long_lived(config: ExperimentConfig):
    """The reference run (one per config in this module)."""
    key = repr(config)
    if key not in _LONG_LIVED:
        _LONG_LIVED[key] = run_experiment(config)
    return _LONG_LIVED[key]


def exclusions(result) -> list[tuple]:
    return [(e["round"], e["phase"], e["peer"]) for e in result.audit.summary()["exclusions"]]


# ---- (a) a fresh client per message gives the long-lived client's model ---------------------
@pytest.mark.parametrize(
    "config",
    [PLAIN, CKKS, THRESHOLD, DP_SGD, ADMM],
    ids=["plain-costwagg", "ckks-larc-blind", "threshold-larc-blind", "dp-sgd", "plain-admm"],
)
def test_a_fresh_client_per_message_gives_the_long_lived_model(config):
    reference = long_lived(config)
    result, transport = fresh_run(config)
    assert not result.aborted and not reference.aborted
    assert exclusions(result) == exclusions(reference) == []
    # every message was answered by a client that existed for that message only
    assert transport.messages >= config.rounds * len(transport.peers)
    np.testing.assert_allclose(
        result.final_params[1], reference.final_params[1], rtol=0, atol=ATOL[config.backend]
    )
    if config.dp_sgd:  # the ε each client reports comes from its restored accountant
        assert (
            result.metrics["eps_dp_sgd_max"].tolist()[1:]
            == reference.metrics["eps_dp_sgd_max"].tolist()[1:]
        )


def _zero_moments(client, pristine):
    if client.optimizer is not None:
        client.optimizer.load_state_dict(
            {k: np.zeros_like(v) for k, v in client.optimizer.state.items()}
        )


def _reset_dp_sgd(client, pristine):
    client.trainer.load_state_dict(pristine.trainer.state_dict())


CONTROLS = {
    "plain: batch position": (PLAIN, lambda c, p: setattr(c.trainer, "stream", p.trainer.stream)),
    "plain: DP noise generator": (PLAIN, lambda c, p: setattr(c, "rng", p.rng)),
    "plain: loss-ratio half": (PLAIN, lambda c, p: setattr(c, "protocol", p.protocol)),
    "ckks: global model": (CKKS, lambda c, p: setattr(c, "_w", None)),
    "ckks: optimizer moments": (CKKS, _zero_moments),
    "ckks: batch position": (CKKS, lambda c, p: setattr(c.trainer, "stream", p.trainer.stream)),
    "threshold: upload record": (THRESHOLD, lambda c, p: setattr(c.backend, "uploads", {})),
    "threshold: upload bases": (THRESHOLD, lambda c, p: setattr(c.backend, "bases", {})),
    "dp-sgd: Opacus state": (DP_SGD, _reset_dp_sgd),
    "admm: x and w": (ADMM, lambda c, p: setattr(c, "protocol", p.protocol)),
}


@pytest.mark.parametrize("name", list(CONTROLS))
def test_losing_a_piece_of_state_would_change_the_answer(name):
    """Controls: the runs above would notice any of these pieces lost."""
    config, forget = CONTROLS[name]
    reference = long_lived(config)
    result, _ = fresh_run(config, forget)
    if name == "ckks: global model" or name.startswith("threshold"):
        # without its model a client cannot answer the probe; without the record of its
        # uploads (or of what they were made from) no client consents to their release
        assert result.aborted
    else:
        assert not result.aborted
        assert (
            np.max(np.abs(result.final_params[1] - reference.final_params[1]))
            > 100 * ATOL[config.backend] + 1e-9
        )


def test_the_call_count_that_seeds_torch_is_restored():
    """Models with randomness of their own (the β-VAE) draw it per call: a trainer restored
    mid-run draws what the long-lived one draws, one that lost its count does not."""
    data = ClientData(torch.randn(20, 3), torch.randn(20, 1))

    def trainer():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 1))
        return LocalTrainer(model, data, nn.functional.mse_loss, batch_size=6, seed=7)

    w = np.zeros(trainer().n_params) + 0.1
    a = trainer()
    a.train(w, lr=0.1, steps=3)
    state = a.state_dict()
    expected = a.train(w, lr=0.1, steps=3)
    b = trainer()
    b.load_state_dict(state)
    np.testing.assert_array_equal(b.train(w, lr=0.1, steps=3), expected)
    c = trainer()
    c.load_state_dict({**state, "calls": 0})
    assert not np.array_equal(c.train(w, lr=0.1, steps=3), expected)


# ---- (b) foreign, truncated, garbled, other-version blobs are refused; nothing changes ------
@pytest.fixture(scope="module")
def ckks_blobs():
    """Every client's exported state after a short server-blind ckks run, and its factory."""
    _, transport = fresh_run(replace(CKKS, rounds=1))
    return transport.factory, transport.blobs


def _bad_blobs(blobs: dict[str, bytes]) -> dict[str, tuple[bytes, str]]:
    own = blobs["client_0"]
    meta, state = decode_state(own, "client_0")
    flipped = bytearray(own)
    flipped[12] ^= 0xFF  # inside the JSON header
    other_version = encode_state("client_0", {**meta, "version": STATE_VERSION + 1}, state)
    other_model = encode_state("client_0", {**meta, "n_params": meta["n_params"] + 1}, state)
    # passes every check before loading, then fails in the trainer, after the backend half
    # took the keys: the client must put its old keys back
    late = copy.deepcopy(state)
    late["trainer"]["stream"]["n"] += 1
    return {
        "another client's": (blobs["client_1"], "state of 'client_1'"),
        "truncated": (own[: len(own) // 2], "not a client state"),
        "empty": (b"", "not a client state"),
        "garbled": (bytes(flipped), "not a client state"),
        "a training message": (
            Envelope("server", "client_0", 0, "train", {}).to_bytes(),
            "not an exported client state",
        ),
        "another version": (other_version, f"version {STATE_VERSION + 1}"),
        "another model": (other_model, "different kind of client"),
        "failing late": (encode_state("client_0", meta, late), "nothing was changed"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "another client's",
        "truncated",
        "empty",
        "garbled",
        "a training message",
        "another version",
        "another model",
        "failing late",
    ],
)
def test_a_blob_that_is_not_this_clients_is_refused_and_changes_nothing(ckks_blobs, case):
    factory, blobs = ckks_blobs
    blob, message = _bad_blobs(blobs)[case]
    for client in (
        factory(["client_0"])["client_0"],  # fresh: no key yet
        _restored(factory, blobs["client_0"]),
    ):  # mid-run: keys and model
        before = client.export_state()
        with pytest.raises(StateError, match=message) as err:
            client.restore_state(blob)
        assert isinstance(err.value, ConfigError)
        assert client.export_state() == before


def test_a_plain_client_refuses_a_ckks_state(ckks_blobs):
    _, blobs = ckks_blobs
    plain = ClientFactory(replace(PLAIN, rounds=1), 1)(["client_0"])["client_0"]
    before = plain.export_state()
    with pytest.raises(StateError, match="backend='ckks', here 'plain'"):
        plain.restore_state(blobs["client_0"])
    assert plain.export_state() == before


def test_backends_without_state_refuse_one():
    assert PlainClient().state_dict() == {}
    PlainClient().load_state_dict({})
    with pytest.raises(ConfigError, match="keeps no state"):
        PlainClient().load_state_dict({"secret_key": b"x"})


# ---- (c) the exported secret key decrypts what the original encrypts ------------------------
def _restored(factory, blob: bytes):
    client = factory(["client_0"])["client_0"]
    client.restore_state(blob)
    return client


def test_the_exported_ckks_key_restores_a_client_that_decrypts_the_originals_uploads():
    kept = {}

    def transport(factory, ids):  # long-lived clients, kept to look at after the run
        kept.update(factory=factory, clients=factory(ids))
        return InProcessTransport({cid: c.handle for cid, c in kept["clients"].items()})

    run_experiment(replace(CKKS, rounds=1), transport_factory=transport)
    original = kept["clients"]["client_0"]
    blob = original.export_state()
    restored = _restored(kept["factory"], blob)
    values = np.random.default_rng(0).normal(size=original.n_params)
    n, scale = original.n_params, 2.0**original.backend.preset.scale_bits

    def decrypt(client, field):  # with the key itself: ``open`` floods and has a budget
        return client.backend.keys.decrypt(field.data_parts(), n, scale)

    class Parts:  # a protected field's ciphertext parts
        def __init__(self, field):
            self.field = field

        def data_parts(self):
            env = Envelope.from_bytes(Envelope("c", "s", 0, "t", {"x": self.field}).to_bytes())
            return env.ciphertext_parts("x")

    np.testing.assert_allclose(
        decrypt(restored, Parts(original.backend.protect(values))), values, atol=1e-6
    )
    # and the other way round: the original decrypts what the restored client encrypts
    np.testing.assert_allclose(
        decrypt(original, Parts(restored.backend.protect(values))), values, atol=1e-6
    )
    assert restored.backend._identity.public_bytes == original.backend._identity.public_bytes
    # a client of the same run that was not restored holds no key
    with pytest.raises(KeySetupError):
        kept["factory"](["client_0"])["client_0"].backend.keys
    # key material travels in opaque fields only, never in the JSON parts
    env = Envelope.from_bytes(blob)
    assert {"opaque:backend/secret_key", "opaque:backend/x25519_private"} <= set(env.fields)
    assert env.fields["opaque:backend/secret_key"].kind == wire.CIPHERTEXT
    assert "secret_key" not in env.config("state")["backend"]


def test_a_key_wrapper_round_trips_its_private_key():
    a = KeyWrapper()
    b = KeyWrapper.from_private_bytes(a.private_bytes())
    assert b.public_bytes == a.public_bytes and len(a.private_bytes()) == 32
    peer = KeyWrapper()
    blob = peer.wrap(b"key", a.public_bytes, "p", "a", "params")
    assert b.unwrap(blob, peer.public_bytes, "p", "a", "params") == b"key"
    with pytest.raises(KeySetupError, match="32 expected"):
        KeyWrapper.from_private_bytes(b"short")


# ---- (d) a threshold client's record comes back whole, or not at all ---------------------------
def test_a_threshold_state_round_trips_and_refuses_another_clients_identity():
    _, transport = fresh_run(replace(THRESHOLD, rounds=1))
    factory, blobs = transport.factory, transport.blobs
    restored = _restored(factory, blobs["client_0"])
    assert restored.export_state() == blobs["client_0"]  # nothing lost or added on the way
    backend = restored.backend
    assert backend.uploads and backend.answered and backend.holders == sorted(blobs)

    _, own = decode_state(blobs["client_0"], "client_0")
    _, other = decode_state(blobs["client_1"], "client_1")
    kept = next(iter(own["backend"]["descriptors"].values()))
    cases = [
        ("identity is not this client's", {"x25519_private": other["backend"]["x25519_private"]}),
        ("answered releases is garbled", {"answered": {"r": ["nobody"]}}),
        ("record of releases is garbled", {"sets": []}),
        ("record of releases is garbled", {"sets": {"d": ["a release it never kept"]}}),
        ("record of releases is garbled", {"descriptors": {"0" * 64: kept}}),  # not its hash
        ("the state's record of releases is garbled", {"released": {"d": [{"kind": "x"}]}}),
        ("not a count", {"open_shares": -1}),
    ]
    for message, change in cases:
        state = copy.deepcopy(own)
        state["backend"].update(change)
        assert_refused_unchanged(factory, blobs["client_0"], state, message)


def assert_refused_unchanged(factory, blob: bytes, state: dict, message: str) -> None:
    """A client restored from ``blob`` refuses ``state`` (saying ``message``) and keeps
    exactly what it had."""
    meta, _ = decode_state(blob, "client_0")
    client = _restored(factory, blob)
    before = client.export_state()
    with pytest.raises(StateError, match="nothing was changed") as err:
        client.restore_state(encode_state("client_0", meta, state))
    assert message in str(err.value)
    assert client.export_state() == before


# ---- (e) one check of the key-holding part, for both encrypted halves ----------------------
@pytest.fixture(scope="module")
def holder_blobs(ckks_blobs):
    """(factory, blobs) of a ckks run and of a threshold run (their halves share HolderState)."""
    _, transport = fresh_run(replace(THRESHOLD, rounds=1))
    return {"ckks": ckks_blobs, "threshold": (transport.factory, transport.blobs)}


HOLDER_CASES = {
    "another client's identity": (
        lambda own, other: {"x25519_private": other["x25519_private"]},
        "identity is not this client's",
    ),
    "another client's signing key": (
        lambda own, other: {"signing_key": other["signing_key"]},
        "signing key is not this client's",
    ),
    "a negative count": (lambda own, other: {"decryptions": -1}, "is not a count"),
    "garbled applied weights": (lambda own, other: {"applied": {"d": 0}}, "applied weights"),
    "garbled upload record": (lambda own, other: {"uploads": {"d": {"open": "x"}}}, "upload"),
    "garbled bases": (lambda own, other: {"bases": {"d": 1}}, "upload bases"),
    "another preset": (lambda own, other: {"preset": "other"}, "made under"),
    "a missing part": (lambda own, other: {"opens": None, "__drop__": "opens"}, "state holds"),
    "an extra part": (lambda own, other: {"secret_share": b"x"}, "state holds"),
}


@pytest.mark.parametrize("backend", ["ckks", "threshold"])
@pytest.mark.parametrize("case", list(HOLDER_CASES))
def test_both_encrypted_halves_refuse_a_bad_key_holding_part_alike(holder_blobs, backend, case):
    factory, blobs = holder_blobs[backend]
    _, own = decode_state(blobs["client_0"], "client_0")
    _, other = decode_state(blobs["client_1"], "client_1")
    change, message = HOLDER_CASES[case]
    state = copy.deepcopy(own)
    edit = change(own["backend"], other["backend"])
    state["backend"].update({k: v for k, v in edit.items() if k != "__drop__"})
    state["backend"].pop(edit.get("__drop__", "-"), None)
    assert_refused_unchanged(factory, blobs["client_0"], state, message)
