"""SAVAE with the joint pseudo-point prior (GenoMed4All D6.2 §6.5.1, Eq. 6.18–6.26), on top
of weight averaging.

Each node m has K pseudo-inputs α_m^(1..K) (feature space, trained with its model) and its
part of the prior is the mixture of their encodings, p_λm(z) = (1/K) Σ_k q_φ(z | α_m^(k))
(Eq. 6.24). The prior every node trains against is their normalised product (Eq. 6.23),

    p_λ(z) = (1/𝒵) Π_m p_λm(z),

which node i can only form if it holds every other node's pseudo-inputs: "the pseudopoints
can be shared" (§6.5.1.1). A round of ``savae_prior``:

1. ``savae_pseudo_points``: the server asks every client for its current α_i and learns
   them in plaintext (declared: ``pseudo_points``);
2. ``train``: each client gets the other nodes' α_j with its training request, trains the
   SAVAE with its own α_i free and the others' fixed (the task's model detaches them), keeps
   its new α_i, and uploads the change of the network weights only (the pseudo-input block
   of its update is zero);
3. FedAvg: G = Σ_i (n_i / Σ_j n_j) G_i, a weighted sum (encrypted on ckks), revealed and
   applied as by ``fedavg``.

Why the pseudo-points are plaintext and not a weighted sum: the product of experts (and the
mixture of experts below) needs every node's mixture components *individually* (node i
multiplies by, or mixes in, each p_λm's components), not their sum. A sum can only carry
them in disjoint slots (node m's α in slot m, zero elsewhere), and then the revealed
"aggregate" is each node's α one by one: encryption would hide nothing and only pretend
to. So they travel as plaintext vectors, declared in ``Capabilities.reveals``,
on every backend; the network weights stay encrypted sums. They are not covered by
client-level DP (``client_dp_compatible=False``: such runs are refused).

Deviations chosen: the report leaves each node with its own encoder φ_m; under weight
averaging there is one encoder, so node i encodes every node's pseudo-inputs with its current
φ. The pseudo-inputs start uniform in [0, 1] (the features' scaled range) from a generator of
the run seed and the client id, never from patients (a real record would then be sent). 𝒵 is
computed exactly (the product of Gaussian mixtures is a Gaussian mixture, K^M components).
The task's model fixes how the nodes' mixtures combine: ``savae-prior-*`` as the report's
product, ``savae-moe-*`` as the mixture of experts (1/M) Σ_m p_λm(z) that §6.5.1 names as
the alternative (for patients split across nodes, rather than features, each node's mixture
approximates the same aggregated posterior, and their product counts it M times: a prior
M times too sharp). The protocol is the same for both.

Limits: the protocol cannot see the model's structure, only its size: a model too small for
the pseudo-input block is refused by every client (the round aborts with the reason), but a
large model without pseudo-inputs would have its tail taken for them; run it on the
``savae-prior-*`` and ``savae-moe-*`` tasks. A node that never answered the pseudo-point
phase leaves the prior undefined: the run stops with ``ProtocolStateError`` (a node that
answered once keeps its last pseudo-points).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, ProtocolStateError
from secagg.options import Flag
from secagg.protocols.base import Capabilities, ClientAPI, RoundAPI, VectorStateHalf
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

PHASE = "savae_pseudo_points"


# ---- the layout -----------------------------------------------------------------------------
def pseudo_block(n_params: int, nodes: int, n_pseudo: int, n_features: int) -> slice:
    """Where the pseudo-inputs sit in the flat model: its last nodes × K × features values
    (own block first, then the other nodes'), as ``SAVAE`` registers them."""
    size = nodes * n_pseudo * n_features
    if nodes < 2 or n_pseudo < 1 or size >= n_params:
        raise ConfigError(
            f"savae_prior needs a SAVAE with a joint prior of {nodes} nodes × {n_pseudo} "
            f"pseudo-inputs × {n_features} features = {size} values inside a model of "
            f"{n_params} parameters (use a savae-prior-* or savae-moe-* task)"
        )
    return slice(n_params - size, n_params)


def with_pseudo_points(
    model: np.ndarray, block: slice, own: np.ndarray, others: np.ndarray
) -> np.ndarray:
    """The model with its pseudo-input block set to [own | others]."""
    start = np.array(model, dtype=np.float64, copy=True)
    start[block] = np.concatenate([own, others])
    return start


# ---- the protocol ---------------------------------------------------------------------------
class SAVAEPriorClient(VectorStateHalf):
    """Node i's own pseudo-inputs α_i (kept between rounds) and its training against the joint
    prior."""

    phases = {PHASE: "share"}
    vectors = ("pseudo",)
    pseudo: np.ndarray | None

    def _own(self, client: ClientAPI, settings: Mapping[str, Any]) -> np.ndarray:
        if self.pseudo is None:  # uniform in the scaled features' range; never a patient
            rng = np.random.default_rng([int(settings["seed"]), *client.id.encode()])
            size = int(settings["n_pseudo"]) * client.features().shape[1]
            self.pseudo = rng.uniform(0.0, 1.0, size)
        return self.pseudo

    def share(self, client: ClientAPI, request: Envelope) -> dict[str, Field]:
        return {"pseudo_points": wire.vector(self._own(client, request.config("savae_prior")))}

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        settings = request.config("savae_prior")
        nodes, n_pseudo = int(settings["nodes"]), int(settings["n_pseudo"])
        n_features = client.features().shape[1]
        block = pseudo_block(client.n_params, nodes, n_pseudo, n_features)
        own = self._own(client, settings)
        # every node's pseudo-inputs in roster order, the same request for every node (a
        # client consents only to sums of uploads made from the same request): drop its own
        roster = settings.get("roster")
        if not isinstance(roster, list) or len(roster) != nodes or client.id not in roster:
            raise ProtocolStateError(f"{client.id}: the request's roster does not hold it")
        every = request.vector("pseudo_points", nodes * own.size).reshape(nodes, own.size)
        others = np.delete(every, roster.index(client.id), axis=0).ravel()
        start = with_pseudo_points(client.model, block, own, others)
        delta = client.train(start, request.config("train"))
        self.pseudo = own + delta[block][: own.size]
        delta[block] = 0.0  # the pseudo-inputs travel in the clear, not in the weighted sum
        return delta


class SAVAEPrior(FedAvg):
    name = "savae_prior"
    capabilities = Capabilities(
        reveals=("global_update", "pseudo_points"),
        streams=True,
        client_dp_compatible=False,  # the pseudo-points are released without DP noise
    )
    client = SAVAEPriorClient

    def __init__(
        self,
        n_pseudo: Annotated[
            int, Flag("savae-pseudo", "pseudo-inputs per node (the task fixes it)")
        ] = 8,
    ):
        if not (isinstance(n_pseudo, int) and n_pseudo >= 1):
            raise ConfigError(f"savae_prior needs n_pseudo >= 1, got {n_pseudo!r}")
        self.n_pseudo = n_pseudo
        self.run_seed = 0
        self.roster: list[str] | None = None
        self.shared: dict[str, np.ndarray] = {}

    def seed(self, seed: int) -> None:
        self.run_seed = seed

    def _config(self) -> dict[str, Any]:
        nodes = len(self.roster or [])
        return {"n_pseudo": self.n_pseudo, "nodes": nodes, "seed": self.run_seed}

    def _settings(self) -> Field:
        return wire.config(self._config())

    def begin_round(self, ctx: RoundAPI) -> None:
        if self.roster is None:  # the nodes of the prior: the clients at the first round
            self.roster = sorted(ctx.active)
        request = {"savae_prior": self._settings()}
        replies = ctx.ask(
            PHASE, dict.fromkeys(ctx.active, request), expect={"pseudo_points": wire.VECTOR}
        )
        for client, env in replies.items():
            self.shared[client] = env.vector("pseudo_points")
        return None

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        roster = self.roster or []
        missing = [c for c in roster if c != client and c not in self.shared]
        if missing:  # a node that never answered: its part of the prior is unknown
            raise ProtocolStateError(f"savae_prior holds no pseudo-points of {missing} yet")
        every = np.concatenate([self.shared[c] for c in roster])
        settings = {**self._config(), "roster": list(roster)}
        return {"savae_prior": wire.config(settings), "pseudo_points": wire.vector(every)}


register_protocol(
    "savae_prior",
    SAVAEPrior,
    summary="SAVAE weight averaging with the joint pseudo-point prior, pseudo-points in "
    "plaintext (GenoMed4All D6.2 6.5.1)",
    example=Example(
        # each node sends its prior's pseudo-points every round; local Adam
        settings={"task": "savae-prior-gbsg2", "batch_size": 32},
        amplified=True,
        client_vectors={"pseudo_points": "round"},
    ),
    tasks=("savae-prior-*", "savae-moe-*"),
    _builtin=True,
)
