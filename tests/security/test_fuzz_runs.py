"""No client can stop the run: whole runs with one client whose every reply is mutated.

``tests/security/test_fuzz.py`` drives mutated bytes into the server's decoders one entry
point at a time; here one malicious client answers every phase of real runs (key setup,
enrolment, training, consents, reveals and each protocol's own phases) with a mutated reply:
a field of another kind, a JSON list or a nested JSON bomb in place of an object, NaN and
huge scalars, truncated or padded ciphertexts, missing or extra fields, another round.
Every run must end normally or with a recorded abort, never with another exception; the
malicious client's exclusions carry the server's typed reasons, and the honest clients keep
the run going wherever the protocol can go on without one client (n-of-n threshold and a
run's last usable client cannot).

The client side is ``test_client_policy.test_every_client_phase_refuses_garbage_with_a_code``.
"""

from __future__ import annotations

import json
import random

import pytest

from secagg import wire
from secagg.runspec.config import ExperimentConfig
from secagg.server.transport import InProcessTransport
from secagg.simulation.experiment import run_experiment
from secagg.wire import Envelope, Field

MALICIOUS = "client_1"


def mutations(rng: random.Random, name: str, f: Field) -> Field:
    """One mutation of one reply field."""
    choice = rng.randrange(9)
    if choice == 0:
        return wire.Field(wire.CONFIG, b"[1, 2, 3]")
    if choice == 1:
        return wire.Field(wire.CONFIG, b"[" * 40 + b"]" * 40)
    if choice == 2:
        return wire.scalar(1e300)
    if choice == 3:
        return wire.Field(wire.SCALAR, b"\x00\x00\x00\x00\x00\x00\xf8\x7f")  # NaN
    if choice == 4:
        return wire.vector([float(rng.random()) for _ in range(rng.randrange(1, 9))])
    if choice == 5 and f.kind == wire.CIPHERTEXT:
        data = bytes(f.data)
        return wire.ciphertext([data[: max(1, len(data) // 2)]])
    if choice == 6 and f.kind == wire.CIPHERTEXT:
        return wire.ciphertext([bytes(f.data) + b"\x00" * 17])
    if choice == 7:
        return wire.config({"signature": "A" * 88, name: [None]})
    return wire.ciphertext([bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))])


def mutated(reply: bytes, rng: random.Random) -> bytes:
    env = Envelope.from_bytes(reply)
    fields = dict(env.fields)
    if fields and rng.random() < 0.8:
        name = rng.choice(sorted(fields))
        fields[name] = mutations(rng, name, fields[name])
    if rng.random() < 0.2:
        fields[f"extra_{rng.randrange(9)}"] = wire.scalar(1.0)
    if rng.random() < 0.1 and fields:
        del fields[rng.choice(sorted(fields))]
    round_number = env.round + (1 if rng.random() < 0.05 else 0)
    return Envelope(env.sender, env.recipient, round_number, env.phase, fields).to_bytes()


def chaos_transport(seed: int, rate: float):
    """The in-process transport, with each of ``MALICIOUS``'s replies mutated at ``rate``
    (below 1 it gets through key setup now and then, and reaches the later phases)."""
    rng = random.Random(seed)

    def make(factory, ids):
        clients = factory(ids)

        def handler(cid):
            def answer(data: bytes) -> bytes:
                reply = clients[cid].handle(data)
                if cid == MALICIOUS and rng.random() < rate:
                    reply = mutated(reply, rng)
                    phases.append(Envelope.from_bytes(reply).phase)
                return reply

            return answer

        return InProcessTransport({cid: handler(cid) for cid in ids})

    phases: list[str] = []  # the phases whose replies were mutated
    make.phases = phases  # type: ignore[attr-defined]
    return make


RUNS = {
    "fedadam-ckks-lean": dict(task="tcga-brca", protocol="fedadam", backend="ckks"),
    "larc-ckks": dict(task="tcga-brca", protocol="larc", backend="ckks"),
    "regagg-ckks": dict(task="tcga-brca", protocol="regagg", backend="ckks"),
    "costwagg-plain": dict(task="tcga-brca", protocol="costwagg", backend="plain"),
    "larc-blind": dict(task="tcga-brca", protocol="larc", backend="ckks", server_blind=True),
    "admm-ckks": dict(
        task="breast-cancer-iid",
        protocol="admm",
        backend="ckks",
        protocol_options={"problem": "logistic"},
    ),
    "xgboost-ckks": dict(task="xgb-breast-cancer-iid", protocol="xgboost", backend="ckks"),
    "autofedrl-plain": dict(
        task="digits-dir8", protocol="autofedrl", backend="plain", validation_split=0.2
    ),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("seed,rate", [(0, 1.0), (1, 0.3), (2, 0.3)])
def test_a_client_mutating_its_replies_cannot_stop_the_run(name, seed, rate):
    config = ExperimentConfig(rounds=2, seeds=[seed], local_steps=2, **RUNS[name])
    transport = chaos_transport(seed, rate)
    result = run_experiment(config, transport_factory=transport)  # never raises
    summary = result.audit.summary()
    excluded = [r for r in result.audit.records if r["event"] == "excluded"]
    mine = [r for r in excluded if r["peer"] == MALICIOUS]
    if rate == 1.0:  # its first reply is already mutated (some mutations are harmless later)
        assert mine, "the mutated client was never excluded"
    # the server's reasons are typed; nothing the honest clients did was refused
    assert {r["error"] for r in mine} <= typed_client_errors(), mine
    assert not [r for r in excluded if r["peer"] != MALICIOUS]
    # the honest clients carry every round (the run's one client that mutates is out)
    assert not result.aborted, result.aborted
    assert result.metrics["round"].max() == config.rounds
    json.dumps(summary)  # the audit stays serialisable whatever the client sent


def typed_client_errors() -> set[str]:
    """The names of every error that excludes a client (ClientInputError and below)."""
    from secagg.errors import ClientInputError

    names, todo = set(), [ClientInputError]
    while todo:
        kind = todo.pop()
        names.add(kind.__name__)
        todo += kind.__subclasses__()
    return names


def test_the_chaos_client_is_deterministic():
    """The mutations come from the test's seed alone (a failure reproduces)."""
    rng_a, rng_b = random.Random(5), random.Random(5)
    reply = Envelope("c", "server", 0, "train", {"n_samples": wire.scalar(3.0)}).to_bytes()
    assert mutated(reply, rng_a) == mutated(reply, rng_b)
