"""Sequential federated training (GenoMed4All D6.2 §8.2.2): one model visits the centres.

Per federated epoch (a round) the centres are visited in a fresh random order c_1 … c_K:

    M_0 = W,   M_k = Train_{c_k}(M_{k−1}) for its internal epochs,   W ← M_K

which is FedAvg with one centre per step (the report: "C = 0"). The server passes the model
on "without making any operation"; here it passes it encrypted (on ckks and threshold), so it
sees no centre's model, only W at the end of the round:

- the training phase is c_1's hop: c_1 trains from W and uploads Δ_1 = M_1 − W, protected;
  the other centres are asked for 0 local steps (their uploads are zero and unused: the
  engine's training phase asks everyone, and the cost is one small upload each);
- hop k: the server releases Δ_{k−1} to c_k alone (a one-contributor release), c_k opens it,
  trains from W + Δ_{k−1} and uploads Δ_k = M_k − W, protected;
- the engine reveals Δ_K and W ← W + Δ_K (server SGD, lr 1).

What it reveals: to the server, the end-of-round model as FedAvg does; to each centre, its
predecessor's model (it trains from it), which a release of one contributor's upload is. The
clients' release policy refuses such releases by default (``min_contributors`` 2): a run on
an encrypted backend must set ``--backend-option min_contributors=1``, which the clients
configure themselves. On threshold every hop is opened with t holders' shares of the
predecessor's one-time key, so up to n − t missing holders leave the round intact.

A centre that does not answer its hop is skipped (the model goes on from the last answer).
The order is drawn from the run's seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError
from secagg.protocols.base import (
    Allowed,
    Capabilities,
    ClientAPI,
    ClientHalf,
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field


def visiting_order(clients: list[str], rng: np.random.Generator) -> list[str]:
    """A fresh random order of the centres for one federated epoch."""
    return [clients[i] for i in rng.permutation(len(clients))]


class SequentialClient(ClientHalf):
    """A hop: open the model so far, train from it, upload the change from W."""

    phases = {"sequential_hop": "hop"}

    @staticmethod
    def hop(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        so_far = client.open(env, "model_so_far")  # M_{k−1} − W
        delta = so_far + client.train(client.model + so_far, env.config("train"))
        return {"pseudo_gradient": client.protect(delta)}


class Sequential(Protocol):
    name = "sequential"
    capabilities = Capabilities(
        opens_per_round=1,  # each centre opens its predecessor's model
        client_dp_compatible=False,  # the update is a chain of trainings, not a sum
        distinct_opens=True,
    )
    client = SequentialClient

    @classmethod
    def check_run(cls, run: Any) -> None:
        """Each centre opens its predecessor's model: a release of one client's upload
        alone, which the clients' release policy refuses unless the run allows it."""
        if run.resolved_backend_options().get("min_contributors", 1) > 1:
            raise ConfigError(
                f"{run.protocol} releases one client's upload alone (each centre opens its "
                "predecessor's model), which the clients' release policy refuses by default; "
                "if the clients accept that, run with --min-contributors 1"
            )

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.order: list[str] = []
        self._settings: dict[str, Any] = {}

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 0x5E0])

    def begin_round(self, ctx: RoundAPI) -> None:
        self.order = visiting_order(sorted(ctx.active), self.rng)
        return None

    def varied_settings(self) -> dict[str, Allowed]:
        """Every centre but the round's first trains 0 steps in the training phase (its
        upload is not used: it trains in its hop), so a client admits 0 steps."""
        return {"steps": Allowed(values=(0,))}

    def train_settings(
        self, ctx: RoundAPI, client: str, settings: dict[str, Any]
    ) -> dict[str, Any]:
        self._settings = dict(settings)
        if client == self.order[0]:
            return settings
        return {**{k: v for k, v in settings.items() if k != "epochs"}, "steps": 0}

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        visited = [c for c in self.order if c in uploads]
        last = visited[0]
        handle = uploads[last].handle
        for nxt in visited[1:]:
            so_far = ctx.as_fields(ctx.weighted_sum({last: handle}, {last: 1.0}), "model_so_far")
            reply = ctx.ask(
                "sequential_hop",
                {nxt: {**so_far, "train": wire.config(self._settings)}},
                expect={"pseudo_gradient": ctx.upload_kind},
            )
            loaded = ctx.load(reply, "pseudo_gradient")
            if nxt in loaded:
                last, handle = nxt, loaded[nxt]
        return ctx.weighted_sum({last: handle}, {last: 1.0})

    def round_log(self) -> dict[str, float]:
        return {"sequential_hops": float(len(self.order))}


register_protocol(
    "sequential",
    Sequential,
    summary="one model visits the centres in a random order each round, encrypted between "
    "them (GenoMed4All D6.2 8.2.2)",
    example=Example(
        # each centre opens its predecessor's model alone
        settings={"backend_options": {"min_contributors": 1}}
    ),
    _builtin=True,
)
