"""What every protocol is written against.

A protocol sees a round through :class:`RoundAPI` (implemented by ``server.round``): it can
ask clients to compute something, form weighted sums of their protected vectors and reveal an
intermediate aggregate when its algorithm needs one. It never sees how the backend does that,
so the same code runs on ``plain`` and on encrypted backends. The round engine runs the common
first phase (local training, upload of ``pseudo_gradient`` and ``n_samples``), then reveals
the aggregate the protocol returns and applies the server optimizer to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol as TypingProtocol

import numpy as np

from secagg.wire import Envelope, Field


@dataclass(frozen=True)
class Upload:
    """One client's answer to the training phase, as the server holds it."""

    handle: Any  # protected pseudo-gradient (a vector on plain, ciphertexts otherwise)
    n_samples: float
    extra: Mapping[str, float] = field(default_factory=dict)  # scalars the protocol asked for


@dataclass(frozen=True)
class Plaintext:
    """An aggregate the server already holds in the clear (computed from revealed sums)."""

    values: Any


class RoundAPI(TypingProtocol):
    round: int
    n_params: int
    upload_kind: str  # wire kind of a protected vector on this backend

    @property
    def active(self) -> list[str]:
        """The clients still in this round."""

    def ask(self, phase: str, messages: Mapping[str, Mapping[str, Field]],
            expect: Mapping[str, str] | None = None) -> dict[str, Envelope]:
        """Send each client its fields; return the replies that carry ``expect``'s fields
        (name -> wire kind). Clients with bad replies are excluded from the round."""

    def weighted_sum(self, handles: Mapping[str, Any], weights: Mapping[str, float]) -> Any:
        """Σ_i weights[i] · handles[i] over the clients present in both mappings."""

    def running_sum(self, weights: Mapping[str, float]) -> Any:
        """An empty sum with these weights that uploads are folded into as they arrive."""

    def as_field(self, handle: Any, name: str = "aggregate") -> Field:
        """Encode a handle (an aggregate) to send it to clients (a release, for DP)."""

    def reveal(self, handle: Any, name: str) -> np.ndarray:
        """Decrypt an aggregate for the server; recorded in the audit as a revealed item."""

    def load(self, replies: Mapping[str, Envelope], name: str) -> dict[str, Any]:
        """Protected vectors from replies (clients whose field is bad are excluded)."""

    def plaintext(self, values: np.ndarray) -> Plaintext:
        """Mark a result the server computed in the clear from revealed aggregates."""

    def individual_updates(self, uploads: Mapping[str, Upload]) -> dict[str, np.ndarray]:
        """Each client's update in plaintext: free on plain; on encrypted backends only if
        the run allows plaintext updates (the audit then records them)."""

    @property
    def server_optimizer(self) -> Any:
        """The server optimizer before this round's step (read it, don't step it); None in
        server-blind runs, where only the clients hold it."""


class Protocol(ABC):
    """An aggregation algorithm. Subclasses keep their arithmetic in module-level pure functions."""

    name: str = "abstract"
    #: the plaintext items the server learns on an encrypted backend, besides the training
    #: phase's ``n_samples``; the audit summary lists anything else as undeclared
    reveals: tuple[str, ...] = ("global_update",)
    #: aggregates decrypted for the server per round (sizes the CKKS flooding budget)
    reveals_per_round: int = 1
    #: the server forms the update in plaintext (from revealed sums): no server-blind runs
    server_computes_update: bool = False
    #: needs each client's own update (medians, trimming): not expressible as sums
    needs_individual_updates: bool = False

    #: every update the protocol releases is one weighted sum of the (noised) uploads, so
    #: client-level DP can be accounted from the realised weights
    client_dp_compatible: bool = True
    #: the weights can be fixed before the uploads arrive, from each client's sample count
    #: (reported once, before round 0) and public state: see ``planned_weights``
    streams: bool = False
    #: clients report their validation loss of the global model before round 0 and after
    #: every update (Auto-FedRL's reward); the engine then calls ``observe_validation``
    observes_validation: bool = False

    def seed(self, seed: int) -> None:
        """Protocols with randomness of their own draw it from the run's seed."""

    def begin_round(self, rnd: RoundAPI) -> float | None:
        """Called before the training phase; may return this round's server learning rate."""
        return None

    def train_settings(self, rnd: RoundAPI, client: str, settings: dict[str, Any]
                       ) -> dict[str, Any]:
        """A client's training settings (``lr``, ``steps`` or ``epochs``, ``prox_mu``) for
        this round; the engine's defaults unless the protocol chooses them."""
        return settings

    def observe_validation(self, rnd: RoundAPI, losses: Mapping[str, float]) -> None:
        """The clients' validation losses of the current global model."""

    def train_fields(self, rnd: RoundAPI, client: str) -> dict[str, Field]:
        """Extra fields for a client's training request (none by default)."""
        return {}

    def train_reply(self, rnd: RoundAPI) -> dict[str, str]:
        """Extra scalar fields the training reply must carry (name -> wire kind)."""
        return {}

    def planned_weights(self, rnd: RoundAPI, n_samples: Mapping[str, float]
                        ) -> Mapping[str, float] | None:
        """This round's weights, fixed before any upload arrives (protocols with ``streams``).

        ``n_samples`` are the sample counts the active clients reported at enrolment. With
        planned weights the server folds each upload into a running sum as it arrives and
        drops it (memory O(model), not O(clients × model)); a client that drops out is
        renormalised away. ``aggregate`` must give the same sum. None: this round needs every
        upload at once (the weights depend on all of them, or a second phase reuses them)."""
        return None

    def check_upload(self, client: str, upload: Upload) -> None:
        """Raise ClientInputError if an upload's extra scalars are unusable: the engine then
        excludes that client from the round instead of failing the run."""

    @abstractmethod
    def aggregate(self, rnd: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        """Combine the uploads into the global pseudo-gradient, still protected (a handle).

        The engine reveals it to the server, or in server-blind runs sends it to the clients,
        who decrypt it and apply the optimizer themselves."""

    def round_log(self) -> dict[str, float]:
        """Numbers worth a column in the run's per-round metrics (e.g. chosen settings)."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}
