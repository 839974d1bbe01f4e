"""Attacks on key setup by a server that deviates, through the real client classes.

The clients hold a roster of the run's identities in their own configuration, so a server
can neither add itself as a peer, nor swap a public key, nor plant a key it knows, nor run
setup twice, nor change the flooding; each attempt is refused and leaves the client as it
was. An honest setup still gives every client the same key.
"""

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.ckks.presets import get_preset
from secagg.ckks.public import KEY_REFUSED, params_fingerprint
from secagg.errors import KeySetupError, ProtocolStateError
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.secret.keywrap import KeyWrapper
from secagg.wire import Envelope
from tests.harness import BackendRound

IDS = ["client_0", "client_1", "client_2"]
PRESET = get_preset("compact")
SETUP = wire.config({"preset": PRESET.name, "params": params_fingerprint(PRESET)})
#: a hello that proposes no flooding, a huge budget and one client
HOSTILE = wire.config(
    {
        "preset": PRESET.name,
        "params": params_fingerprint(PRESET),
        "flooding_bits": 0,
        "decryption_budget": 10**6,
        "n_clients": 1,
    }
)


def ask(client, phase, fields, sender="server"):
    """A request from the (deviating) server, answered by the real client half."""
    return client.handlers()[phase](Envelope(sender, client.id, 0, phase, dict(fields)))


def honest_setup(clients):
    leader, *others = IDS
    wrapped = ask(
        clients[leader], "key_generate", {"setup": SETUP, "peers": wire.config({"ids": others})}
    )
    for c in others:
        ask(
            clients[c],
            "key_install",
            {
                "setup": SETUP,
                "leader": wire.config({"id": leader}),
                "wrapped_key": wire.ciphertext(bytes(wrapped[f"wrapped_key.{c}"].data)),
            },
        )


@pytest.fixture
def clients():
    _, backends = make_backends("ckks", IDS, decryption_budget=2)
    return backends


def test_an_honest_setup_gives_every_client_the_one_key(clients):
    honest_setup(clients)
    parts = clients["client_1"].keys.encrypt(np.array([0.25, -1.5]), bound=10.0)
    for c in IDS:
        np.testing.assert_allclose(
            clients[c].keys.decrypt(parts, 2, 2.0**PRESET.scale_bits), [0.25, -1.5], atol=1e-6
        )


def test_the_leader_wraps_for_no_one_outside_its_roster(clients):
    """The server lists itself as a peer: the leader refuses the whole request and makes no
    key (before: it wrapped the key for the server's X25519 key, which it took from the
    server's own message)."""
    with pytest.raises(KeySetupError, match="not another client in this client's roster"):
        ask(
            clients["client_0"],
            "key_generate",
            {"setup": SETUP, "peers": wire.config({"ids": ["client_1", "server"]})},
        )
    with pytest.raises(KeySetupError, match="no CKKS key yet"):
        clients["client_0"].keys


def test_public_keys_from_the_server_are_ignored(clients):
    """The server sends its own key for client_1 beside the ids: the leader wraps with the
    roster's key, which the server cannot open."""
    attacker = KeyWrapper()
    wrapped = ask(
        clients["client_0"],
        "key_generate",
        {
            "setup": SETUP,
            "peers": wire.config({"ids": ["client_1"]}),
            "client_1": wire.config({"key": attacker.public_bytes.hex()}),
        },
    )
    blob = bytes(wrapped["wrapped_key.client_1"].data)
    with pytest.raises(KeySetupError):
        attacker.unwrap(
            blob,
            clients["client_0"].roster["client_0"],
            "client_0",
            "client_1",
            params_fingerprint(PRESET),
        )


def test_a_key_the_server_made_is_not_installed(clients):
    """The server wraps a CKKS key of its own (which it could then read uploads with) and
    claims it comes from the leader: the client opens wrapped keys only with its leader's
    roster key, so it refuses and holds no key. (The refusal is a receipt that says the
    wrapped key does not open, ``KEY_REFUSED``, so that the server can have the key wrapped
    again by another client instead of excluding this one: ``tests/security/
    test_run_stoppers.py``.)"""
    attacker = KeyWrapper()
    planted = SecretKeyHolder(PRESET)
    blob = attacker.wrap(
        planted.export_for_wrapping(),
        clients["client_1"].roster["client_1"],
        "client_0",
        "client_1",
        params_fingerprint(PRESET),
    )
    receipt = ask(
        clients["client_1"],
        "key_install",
        {
            "setup": SETUP,
            "leader": wire.config({"id": "client_0", "key": attacker.public_bytes.hex()}),
            "wrapped_key": wire.ciphertext(blob),
        },
    )
    refused = Envelope("c", "s", 0, "p", receipt).config("installed")
    assert refused == {"params": params_fingerprint(PRESET), "refused": KEY_REFUSED}
    with pytest.raises(KeySetupError, match="no CKKS key yet"):
        clients["client_1"].keys


def test_setup_happens_once_and_settings_come_from_the_clients_own_configuration(clients):
    """After setup a second key_generate or key_install is refused (the key stays the
    same), and a hello that proposes no flooding changes nothing: the next reveal is
    flooded as the client's own configuration says (before: flooding 0 made it exact)."""
    honest_setup(clients)
    before = clients["client_1"].keys.export_for_wrapping()
    for phase, fields in (
        ("key_generate", {"setup": SETUP, "peers": wire.config({"ids": ["client_0"]})}),
        (
            "key_install",
            {
                "setup": SETUP,
                "leader": wire.config({"id": "client_0"}),
                "wrapped_key": wire.ciphertext(b"x" * 64),
            },
        ),
    ):
        with pytest.raises(KeySetupError, match="setup happens once"):
            ask(clients["client_1"], phase, fields)
    assert clients["client_1"].keys.export_for_wrapping() == before

    ask(clients["client_1"], "key_hello", {"setup": HOSTILE})
    assert clients["client_1"].flooding_bits == 30 and clients["client_1"].decryption_budget == 2


def test_a_hostile_key_hello_changes_neither_flooding_nor_budget():
    """The same hostile hello mid-run, then real releases: still flooded, and the budget of
    2 is the client's own."""
    run = BackendRound(IDS, 8, decryption_budget=2)
    run.ask("client_1", "key_hello", {"setup": HOSTILE})
    for attempt in range(3):
        ctx = run.ctx()
        handles = run.uploads({c: np.full(8, 0.5) for c in IDS})
        total = ctx.weighted_sum(handles, {c: 1 / 3 for c in IDS})
        request = run.server._release_fields(ctx, total, "global_update", "reveal", "aggregate")
        if attempt == 2:
            with pytest.raises(ProtocolStateError, match="refuses decryption 3"):
                run.ask("client_1", "reveal", request)
            break
        out = run.ask("client_1", "reveal", request)
        assert run.clients["client_1"].last_flooding_sigma > 0
        values = Envelope("c", "s", 0, "r", out).vector("global_update")
        assert not np.array_equal(values, np.full(8, 0.5))  # flooded, not exact
        np.testing.assert_allclose(values, 0.5, atol=1e-4)


def test_wrapped_key_associated_data_is_unambiguous():
    """("a", "b->c") and ("a->b", "c") were the same associated data with a separator."""
    alice, bob = KeyWrapper(), KeyWrapper()
    blob = alice.wrap(b"secret", bob.public_bytes, "a", "b->c", "p")
    assert bob.unwrap(blob, alice.public_bytes, "a", "b->c", "p") == b"secret"
    with pytest.raises(KeySetupError):
        bob.unwrap(blob, alice.public_bytes, "a->b", "c", "p")


@pytest.mark.slow
def test_server_blind_clients_answer_no_reveal():
    """In a server-blind run the clients' decryption budget is 0 (their provisioning says
    the run reveals nothing), so a server that asks for a reveal anyway gets nothing."""
    from secagg.simulation.experiment import ExperimentConfig, default_transport, run_experiment

    kept = {}

    def keep(factory, ids):
        kept["transport"] = default_transport(factory, ids)
        kept["budgets"] = {c: p.decryption_budget for c, p in factory.provisions.items()}
        return kept["transport"]

    config = ExperimentConfig(
        task="tcga-brca",
        protocol="fedavg",
        backend="ckks",
        server_blind=True,
        rounds=1,
        seeds=[0],
        local_steps=2,
    )
    run_experiment(config, transport_factory=keep)
    assert set(kept["budgets"].values()) == {0}
    # the run's own clients, after the run: ask client_1 to decrypt a ciphertext of its key
    transport = kept["transport"]
    request = Envelope(
        "server",
        "client_1",
        1,
        "reveal",
        {
            "aggregate": wire.ciphertext(b"\0" * 32),
            "reveal": wire.config({"name": "global_update", "n_values": 40}),
        },
    ).to_bytes()
    ((peer, reply),) = list(transport.exchange(iter([("client_1", request)])))
    # the server gets a code; the client's own log says why
    assert isinstance(reply, Exception) and "refused 'reveal': out_of_order" in str(reply)
    client = transport._handlers["client_1"].__self__
    assert "refuses decryption 1" in client.refusals[-1][2]
