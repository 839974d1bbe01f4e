"""What a decryptor accepts to reveal comes from its own configuration: how many values
(the model's size) and how much flooding (sized for every decryption the shared key may
make, across all clients)."""

import math

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.ckks.flooding import error_bound, flooding_sigma, slot_sigma
from secagg.ckks.presets import get_preset
from secagg.errors import ProtocolStateError
from secagg.wire import Envelope

PRESET = get_preset("compact")


def reveal(client, parts, n_values):
    request = Envelope(
        "server",
        client.id,
        0,
        "reveal",
        {
            "aggregate": wire.ciphertext(parts),
            "reveal": wire.config({"name": "global_update", "n_values": n_values}),
        },
    )
    return client.handlers()["reveal"](request)


def test_a_decryptor_returns_its_model_size_and_nothing_more():
    """A 40-value model: the server asks for a whole chunk (4096 values, the key-recovery
    attack's request) and is refused; 40 values are revealed."""
    from secagg.backends import Provision, make_client_backend
    from secagg.ckks.secret import SecretKeyHolder

    (only,) = make_backends("ckks", ["client_0"])[1].values()
    leader = make_client_backend(
        "ckks", "client_0", {}, Provision(only._wrapper.private_bytes(), only.roster, 3, 40)
    )
    keys = SecretKeyHolder(PRESET)
    leader._keys = keys  # as after key setup
    parts = keys.encrypt(np.full(40, 0.25), bound=10.0)
    with pytest.raises(ProtocolStateError, match="reveals 40 values, the model's size"):
        reveal(leader, parts, PRESET.values_per_ciphertext)
    assert leader.decryptions == 0  # a refused request spends nothing
    out = Envelope("c", "s", 0, "r", reveal(leader, parts, 40)).vector("global_update")
    # a fresh upload's scale is 2^20 below an aggregate's, so the flooding shows more
    assert out.size == 40 and np.allclose(out, 0.25, atol=5e-3)


@pytest.mark.parametrize("n_clients", [2, 6])
def test_flooding_is_sized_for_every_decryption_the_shared_key_may_make(n_clients):
    """Each of n clients may spend its budget b on the one key: the key releases up to n·b
    decryptions, and the flooding is sized for n·b (before: b)."""
    ids = [f"client_{k}" for k in range(n_clients)]
    _, clients = make_backends("ckks", ids, decryption_budget=5, open_budget=0)
    from secagg.ckks.secret import SecretKeyHolder

    client = clients["client_0"]
    client._keys = SecretKeyHolder(PRESET)
    reveal(client, client.keys.encrypt(np.zeros(8), bound=1.0), 8)
    # a fresh upload carries scale Δ; the flooding's per-value σ follows from it
    coeff = flooding_sigma(error_bound(n_clients, PRESET.weight_bits), 5 * n_clients, 30)
    expected = slot_sigma(coeff, PRESET.poly_modulus_degree, 2.0**PRESET.scale_bits)
    assert client.last_flooding_sigma == pytest.approx(expected, rel=1e-12)
    per_client = slot_sigma(
        flooding_sigma(error_bound(n_clients, PRESET.weight_bits), 5, 30),
        PRESET.poly_modulus_degree,
        2.0**PRESET.scale_bits,
    )
    assert client.last_flooding_sigma == pytest.approx(per_client * math.sqrt(n_clients))


def test_what_a_client_opens_itself_is_budgeted_and_flooded():
    """LARC's probe opened any ciphertext the server sent, any number of times, exactly
    (a decryption oracle through ΔL). Now each open spends the client's own open budget and
    is flooded like a reveal: the same ciphertext opened twice gives two different values."""
    from secagg.ckks.secret import SecretKeyHolder

    _, clients = make_backends("ckks", ["client_0", "client_1"], open_budget=2)
    client = clients["client_0"]
    client._keys = SecretKeyHolder(PRESET)  # as after key setup
    probe = Envelope.from_bytes(
        Envelope(
            "server",
            "client_0",
            0,
            "larc_probe",
            {"g_hat": wire.ciphertext(client.keys.encrypt(np.full(8, 0.5), bound=1.0))},
        ).to_bytes()
    )
    first, second = (client.open(probe, "g_hat", 8) for _ in range(2))
    assert not np.array_equal(first, second)
    assert np.allclose(first, 0.5, atol=5e-3) and np.allclose(second, 0.5, atol=5e-3)
    with pytest.raises(ProtocolStateError, match="refuses to open aggregate 3"):
        client.open(probe, "g_hat", 8)
