"""Ensemble federated strategy (GenoMed4All D6.2 §8.2.4): K models, one per centre, trained
separately; their outputs on an evaluation set are averaged:

    ŷ = Σ_k (n_k / Σ n) · f_{θ_k}(x_eval)

There are no federated epochs in the report: each centre trains for its epochs alone. Here a
round is one stretch of local training on every centre, continuing from where the centre's own
model was (round 1 starts from the public initial model, so R rounds of E epochs are R·E
epochs of isolated training), after which the centres score the evaluation set and the server
forms the weighted sum of their score vectors, protected, and reveals it: the experimenter
scores the run from it (``predictions``). No global model exists; W stays the initial model.

What it reveals: the averaged scores of the evaluation set (its length is the set's size,
which the clients' provisioning allows besides the model's). The evaluation set's features go
to every centre in plaintext (the report's blind test set plays the isolated centre whose
patients the centres score). The training phase's uploads are zero vectors, protected and
never released: the engine's training phase asks every client for one, and the centres'
models never leave them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import MalformedMessage, ProtocolStateError
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    Protocol,
    RoundAPI,
    Upload,
    VectorStateHalf,
)
from secagg.protocols.fedavg import sample_size_weights
from secagg.protocols.pieces import ClientEvaluation, ExtraReleases
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field


def evaluation_fields(features: np.ndarray) -> dict[str, Field]:
    """The evaluation set's features as wire fields (float32 rows, and the row length)."""
    return {
        "evaluation_features": wire.vector(features.astype(np.float32).ravel()),
        "evaluation_columns": wire.scalar(features.shape[1]),
    }


def evaluation_set(env: Envelope) -> np.ndarray:
    """The features :func:`evaluation_fields` sent, as rows (typed error if they do not fit)."""
    values, columns = env.vector("evaluation_features"), env.scalar("evaluation_columns")
    if not (columns >= 1 and columns == int(columns) and values.size % int(columns) == 0):
        raise MalformedMessage(
            f"{values.size} evaluation values do not make rows of {columns} features"
        )
    return values.astype(np.float64).reshape(-1, int(columns))


class EnsembleClient(VectorStateHalf):
    """A centre's own model: it trains it alone and scores the evaluation set with it."""

    phases = {"ensemble_scores": "scores"}
    vectors = ("own",)
    own: np.ndarray | None

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        start = client.model if self.own is None else self.own
        self.own = start + client.train(start, request.config("train"))
        return np.zeros_like(start)  # the centre's model stays here

    def scores(self, client: ClientAPI, env: Envelope) -> dict[str, Field]:
        if self.own is None:
            raise ProtocolStateError(f"{client.id} has trained no model to score with")
        return {"scores": client.protect(client.predict(self.own, evaluation_set(env)))}


class Ensemble(Protocol, ClientEvaluation, ExtraReleases):
    name = "ensemble"
    capabilities = Capabilities(
        reveals=("ensemble_scores",),
        server_computes_update=True,  # no global model: nothing to apply server-blind
        client_dp_compatible=False,
    )
    client = EnsembleClient

    def __init__(self):
        self.features: np.ndarray | None = None
        self.scores: np.ndarray | None = None

    def use_evaluation_set(self, features: np.ndarray) -> None:
        self.features = np.asarray(features, dtype=np.float64)

    def release_lengths(self, data: Any) -> tuple[int, ...]:
        return () if data.pooled_test is None else (len(data.pooled_test),)

    def predictions(self) -> np.ndarray | None:
        return self.scores

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        if self.features is None:
            raise ProtocolStateError("ensemble has no evaluation set to score")
        replies = ctx.ask(
            "ensemble_scores",
            dict.fromkeys(uploads, evaluation_fields(self.features)),
            expect={"scores": ctx.upload_kind},
        )
        scored = ctx.load(replies, "scores", length=len(self.features))
        weights = sample_size_weights({c: uploads[c].n_samples for c in scored})
        self.scores = ctx.reveal(ctx.weighted_sum(scored, weights), "ensemble_scores")
        return ctx.plaintext(np.zeros(ctx.n_params))


register_protocol(
    "ensemble",
    Ensemble,
    summary="each centre trains its own model; their scores of the evaluation set are "
    "averaged as a protected weighted sum (GenoMed4All D6.2 8.2.4)",
    # a pooled evaluation set
    example=Example(settings={"task": "deepcox-gbsg2-balanced"}),
    _builtin=True,
)
