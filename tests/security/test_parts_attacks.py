"""A deviating server against a round in parts (``secagg.parts``): every coordinate of a
client's update leaves it in one upload a round, so no coordinate enters two releases.

The server only names a part's index; the bounds are each client's own. Each attack goes
through the real driver, engine and client classes: the server's requests are rewritten on
the wire (a server that sends what an honest one would not), or sent to a client directly.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import secagg.simulation.experiment as experiment
from secagg import wire
from secagg.errors import ClientRefused
from secagg.parts import PART_FIELD
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.experiment import run_experiment
from secagg.wire import Envelope

CKKS = ExperimentConfig(
    task="tcga-brca",
    protocol="fedavg",
    backend="ckks",
    rounds=1,
    seeds=[3],
    local_steps=3,
    part_values=7,  # 40 parameters: six parts
)


def rewriting(edit, kept: dict):
    """A transport factory whose server rewrites each request with ``edit(envelope)`` (a new
    envelope, or None: as sent) and keeps the clients in ``kept``."""

    def factory(client_factory, ids):
        kept.update(client_factory(ids))

        def handler(client):
            def handle(data: bytes) -> bytes:
                changed = edit(Envelope.from_bytes(data))
                return client.handle(data if changed is None else changed.to_bytes())

            return handle

        return experiment.InProcessTransport({c: handler(k) for c, k in kept.items()})

    return factory


def with_part(env: Envelope, index: int) -> Envelope:
    fields = {**env.fields, PART_FIELD: wire.config({"index": index})}
    return Envelope(env.sender, env.recipient, env.round, env.phase, fields)


def released_parts(result) -> int:
    learned = result.audit.summary()["learned_in_plaintext"].get("global_update", {})
    return sum(learned.values()) // 2  # every ckks reveal is checked by two decryptors


def refusals(kept, text: str) -> int:
    return sum(any(text in r[2] for r in k.refusals) for k in kept.values())


@pytest.mark.parametrize("index", [0, 1])  # part 0 (sent with training) or part 1 again
def test_a_part_asked_for_again_is_refused_by_every_client(index):
    """The server asks for part `index` where it should ask for part 2: were it answered, that
    part's coordinates would enter a second release (a second weighting of them)."""
    kept: dict = {}

    def edit(env):
        if env.phase == "upload_part" and env.config(PART_FIELD)["index"] == 2:
            return with_part(env, index)
        return None

    result = run_experiment(CKKS, transport_factory=rewriting(edit, kept))
    assert refusals(kept, "already left") == 6  # every client, before making anything
    assert released_parts(result) == 2  # parts 0 and 1 only: the round stops at part 2
    assert result.aborted


def test_an_index_outside_the_clients_parts_is_refused():
    kept: dict = {}

    def edit(env):
        if env.phase == "upload_part" and env.config(PART_FIELD)["index"] == 1:
            return with_part(env, 6)  # a seventh part: there are six
        return None

    result = run_experiment(CKKS, transport_factory=rewriting(edit, kept))
    assert refusals(kept, "not part 6") == 6 and released_parts(result) == 1


def test_a_training_request_that_names_another_part_is_refused():
    """Part 0 leaves with the training; a training request naming part 3 gets nothing (it
    would shift which coordinates the first upload carries)."""
    kept: dict = {}

    def edit(env):
        return with_part(env, 3) if env.phase == "train" else None

    result = run_experiment(CKKS, transport_factory=rewriting(edit, kept))
    assert refusals(kept, "part 0 of its update with its training") == 6
    assert released_parts(result) == 0 and result.aborted


def test_a_part_of_a_round_the_client_did_not_train_in_is_refused():
    kept: dict = {}
    result = run_experiment(CKKS, transport_factory=rewriting(lambda env: None, kept))
    assert not result.aborted and released_parts(result) == 6
    client = kept["client_2"]
    for round_number, index in [(0, 3), (1, 1), (0, 9)]:  # again; untrained; no such part
        request = with_part(Envelope("server", "client_2", round_number, "upload_part"), index)
        with pytest.raises(ClientRefused):
            client.handle(request.to_bytes())
    reasons = [r[2] for r in client.refusals[-3:]]
    assert "already left" in reasons[0] and "before its training" in reasons[1]
    assert "not part 9" in reasons[2]


def test_a_client_provisioned_whole_refuses_a_round_in_parts():
    """The parts are the client's provisioning: a server that moves a model in parts the
    clients were not provisioned for gets refusals, not part-sized uploads."""
    kept: dict = {}

    def factory(client_factory, ids):
        whole = replace(client_factory, config=replace(client_factory.config, part_values=0))
        return rewriting(lambda env: None, kept)(whole, ids)

    result = run_experiment(CKKS, transport_factory=factory)
    assert released_parts(result) == 0 and result.aborted
    assert refusals(kept, "does not answer 'model_part'") == 6


def test_a_refusal_in_the_middle_of_a_round_says_which_parts_were_stepped():
    """A contributor that refuses its consent to part 2's release skips the round from
    there: the report says that parts 0 and 1 were already released and stepped."""
    kept: dict = {}
    consents = []

    def edit(env):
        if env.phase == "consent" and env.recipient == "client_2":
            consents.append(env.round)
            if len(consents) == 3:  # part 2's release: a request it cannot consent to
                return Envelope(env.sender, env.recipient, env.round, env.phase, {})
        return None

    lines: list[str] = []
    result = run_experiment(
        replace(CKKS, rounds=2), transport_factory=rewriting(edit, kept), progress=lines.append
    )
    rounds = result.metrics.dropna(subset=["clients"])
    # round 2 pauses: with participation fixed (the default) the refuser's leaving makes the
    # run's contributor set incomplete, so nothing of it is released
    assert list(rounds["skipped"]) == [1, 1]
    assert released_parts(result) == 2
    first, paused = [line for line in lines if "no update" in line]
    assert "the first 2 of the model's 6 parts had already been released and stepped" in first
    assert "participation is fixed" in paused and "already been released" not in paused
