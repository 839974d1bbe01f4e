"""What every protocol is written against, on both sides.

A protocol is one module with two halves that register together:

- the server half, a :class:`Protocol`, sees a round through :class:`RoundAPI` (implemented
  by ``secagg.server.round``): it can ask clients to compute something, form weighted sums of
  their protected vectors and reveal an intermediate aggregate when its algorithm needs one.
  It never sees how the backend does that, so the same code runs on ``plain`` and on
  encrypted backends. The round engine runs the common first phase (local training, upload
  of ``pseudo_gradient`` and ``n_samples``), then reveals the aggregate the protocol returns
  and applies the server optimizer to it;
- the client half, a :class:`ClientHalf`, answers the protocol's own phases (LARC's probe,
  RegAgg's terms, ...) and adds fields to the training reply, through :class:`ClientAPI`
  (implemented by ``secagg.clients.runtime``), which offers the client's model, update,
  local loss and its half of the backend.

What a protocol needs from the engine and shows the server is one value,
:class:`Capabilities`; a composed protocol (RoLePRO's two phases) unites its parts'.
Behaviours only some protocols have (a fixed server step, a pre-stage, scores made by the
clients, ...) are not hooks here but pieces (:mod:`secagg.protocols.pieces`) that a protocol
adds by subclassing them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar
from typing import Protocol as TypingProtocol

import numpy as np

from secagg.errors import ConfigError, StateError
from secagg.options import Option, options_of
from secagg.wire import Envelope, Field


@dataclass(frozen=True)
class Capabilities:
    """What a protocol needs from the round engine and what it shows the server."""

    #: plaintext items the server learns on an encrypted backend, besides the training
    #: phase's ``n_samples``; the audit summary lists anything else as undeclared
    reveals: tuple[str, ...] = ("global_update",)
    #: the subset of ``reveals`` that clients report as scalars computed from their data
    #: (scalar DP clips and noises exactly these, and accounts them per client)
    client_scalars: tuple[str, ...] = ()
    #: aggregates decrypted for the server per round (sizes the CKKS flooding budget)
    reveals_per_round: int = 1
    #: aggregates each client opens itself per round in the protocol's own phases (LARC's Ĝ,
    #: RegAgg's centre): a client opens no more, and the flooding counts them too
    opens_per_round: int = 0
    #: the server forms the update in plaintext (from revealed sums): no server-blind runs
    server_computes_update: bool = False
    #: needs each client's own update (medians, trimming): not expressible as sums
    needs_individual_updates: bool = False
    #: every update the protocol releases is one weighted sum of the (noised) uploads, so
    #: client-level DP can be accounted from the realised weights
    client_dp_compatible: bool = True
    #: the weights can be fixed before the uploads arrive, from each client's sample count
    #: (reported once, before round 0) and public state: see ``Protocol.planned_weights``
    streams: bool = False
    #: the protocol converges to an exact optimum and needs its sums to about 1e-8 (ADMM):
    #: on ckks it keeps the precise server-weighted default preset even where it streams
    precise_sums: bool = False
    #: every client's opens are of a different aggregate (Sequential: each centre opens its
    #: predecessor's model), so on threshold a key holder gives a share for each of them
    distinct_opens: bool = False
    #: the round is one streamed sum, revealed and stepped by the server optimizer (which is
    #: elementwise), with no other phase that carries the model: the engine may move it in
    #: parts (``secagg.parts``). A subclass that changes the round (its own ``finish_sum``,
    #: another phase) gives its own capabilities without it, as DGD does
    moves_in_parts: bool = False
    #: its weights vary with the data every round (LARC's α from the ΔL's, loss-ratio
    #: weights): the clients' run ledger fixes the contributor set but holds the weight
    #: rows per model, not over the run, so over the run only client DP covers it (the
    #: guarantee per round stays; ``secagg.backends.coalition.RunLedger``)
    weights_vary: bool = False
    #: it picks each round's contributors by their data (TopKRegCost keeps the best 80 %):
    #: no fixed contributor set, so on an encrypted backend only per-round participation
    #: with client DP (``secagg.backends.coalition``)
    selects_contributors: bool = False

    def __post_init__(self):
        if not set(self.client_scalars) <= set(self.reveals):
            raise ConfigError(
                f"client scalars {self.client_scalars} must be declared in reveals {self.reveals}"
            )
        if self.reveals_per_round < 0 or self.opens_per_round < 0:
            raise ConfigError("reveals_per_round and opens_per_round must be >= 0")

    def union(self, other: Capabilities) -> Capabilities:
        """What a protocol made of both needs: every item either reveals, the larger reveal
        count, any requirement either has, and client DP only if both allow it."""
        merged: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("reveals", "client_scalars"):
                merged[f.name] = tuple(dict.fromkeys(a + b))
            elif f.name in ("reveals_per_round", "opens_per_round"):
                merged[f.name] = max(a, b)
            elif f.name in ("client_dp_compatible", "moves_in_parts"):
                merged[f.name] = a and b
            else:
                merged[f.name] = a or b
        return Capabilities(**merged)


@dataclass(frozen=True)
class Allowed:
    """The values a protocol may choose for one training setting, round by round: a closed
    range ``[low, high]``, or a finite set ``values``."""

    low: float | None = None
    high: float | None = None
    values: tuple[float, ...] = ()

    def admits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.values:
            return value in self.values
        return self.low is not None and self.high is not None and self.low <= value <= self.high


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


class PlannedSum(TypingProtocol):
    """A round's uploads folded as they arrived with weights fixed before
    (``secagg.server.round.StreamedSum``)."""

    def result(self, renormalise: bool = True) -> Any: ...


class RoundAPI(TypingProtocol):
    """What the engine offers a protocol's server half in a round (``ctx``): the round's
    clients, requests to them, and the backend's sums of their protected uploads, revealed
    only as the protocol declared (its ``Capabilities``)."""

    @property
    def round(self) -> int:
        """The round's number."""

    @property
    def epoch(self) -> int:
        """How many rounds before this one moved the model (a skipped round does not)."""

    @property
    def n_params(self) -> int:
        """Parameters of the model."""

    @property
    def upload_kind(self) -> str:
        """The wire kind of a protected vector on this backend."""

    @property
    def active(self) -> list[str]:
        """The clients still in this round."""

    @property
    def excluded(self) -> dict[str, str]:
        """The clients excluded this round, with why."""

    def ask(
        self,
        phase: str,
        messages: Mapping[str, Mapping[str, Field]],
        expect: Mapping[str, str] | None = None,
    ) -> dict[str, Envelope]:
        """Send each client its fields; return the replies that carry ``expect``'s fields
        (name -> wire kind). Clients with bad replies are excluded from the round."""

    def weighted_sum(self, handles: Mapping[str, Any], weights: Mapping[str, float]) -> Any:
        """Σ_i weights[i] · handles[i] over the clients present in both mappings."""

    def weights_of(self, handle: Any) -> dict[str, float]:
        """The weights a sum formed this round was made with: the protocol's, unless the
        clients' cap on one weight's share lowered them (``max_weight_share``)."""

    def running_sum(self, weights: Mapping[str, float]) -> Any:
        """An empty sum with these weights that uploads are folded into as they arrive."""

    def as_fields(self, handle: Any, name: str) -> dict[str, Field]:
        """Fields that send an aggregate to clients under ``name`` (a release, for DP): a
        client opens it with ``ClientAPI.open(env, name)``, which checks it first."""

    def reveal(self, handle: Any, name: str) -> np.ndarray:
        """Decrypt an aggregate for the server; recorded in the audit as a revealed item."""

    def load(
        self, replies: Mapping[str, Envelope], name: str, *, length: int | None = None
    ) -> dict[str, Any]:
        """Protected vectors from replies (clients whose field is bad are excluded), of the
        model's length unless ``length`` says otherwise (Ensemble's scores)."""

    def plaintext(self, values: np.ndarray) -> Plaintext:
        """Mark a result the server computed in the clear from revealed aggregates."""

    def individual_updates(self, uploads: Mapping[str, Upload]) -> dict[str, np.ndarray]:
        """Each client's update in plaintext: free on plain; on encrypted backends only if
        the run allows plaintext updates (the audit then records them)."""

    @property
    def server_optimizer(self) -> Any:
        """The server optimizer before this round's step (read it, don't step it); None in
        server-blind runs, where only the clients hold it."""

    @property
    def model(self) -> np.ndarray | None:
        """The global model this round starts from; None in server-blind runs."""


class ClientAPI(TypingProtocol):
    """What the client runtime offers a protocol's client half (one client, its own data)."""

    id: str

    @property
    def model(self) -> np.ndarray:
        """The global model W this round started from."""

    @property
    def update(self) -> np.ndarray:
        """This client's pseudo-gradient of the current round (after any client-level DP)."""

    @property
    def n_params(self) -> int:
        """Parameters of the model."""

    @property
    def optimizer(self) -> Any:
        """This client's copy of the server optimizer (server-blind runs), else None."""

    def loss_at(self, w: np.ndarray, *, drop_bias: bool = False) -> float:
        """The loss of parameters ``w`` on the client's training samples."""

    def predict(self, w: np.ndarray, features: np.ndarray) -> np.ndarray:
        """The model's outputs with parameters ``w`` for ``features`` (one row each)."""

    def train(self, start: np.ndarray, settings: dict[str, Any]) -> np.ndarray:
        """Local training from ``start`` (settings as in the ``train`` config: lr, steps or
        epochs); returns new − ``start`` (the Sequential strategy's hops)."""

    def features(self) -> np.ndarray:
        """The client's training samples' features, one row each (float64)."""

    def labels(self) -> np.ndarray:
        """The client's training samples' targets, row for row with ``features`` (float64)."""

    def open(self, envelope: Envelope, name: str) -> np.ndarray:
        """Read (decrypt) an aggregate of the model's length the server sent."""

    def protect(self, values: np.ndarray) -> Field:
        """Encode (encrypt) a model-length vector for upload."""

    def check_own_weight(self, envelope: Envelope, name: str, weight: float) -> None:
        """Refuse unless the release ``name`` lists this client's upload with ``weight``."""

    def server_optimizer_in(self, envelope: Envelope) -> Any:
        """The server optimizer a request carries (its config checked against this client's
        provisioning), or this client's own copy (server-blind); None: neither."""

    def report(self, value: float) -> Field:
        """A scalar for the server; clipped and noised when the run asks for scalar DP."""


#: a client-side phase handler: (the client, the request) -> the reply's fields
ClientHandler = Callable[[ClientAPI, Envelope], dict[str, Field]]


class ClientHalf:
    """A protocol's code on one client: its phase handlers and extra fields of the training
    reply. One instance per client; what it remembers between rounds is that client's state
    (``state_dict``), so a client restored from exported state answers the same.

    ``phases`` maps each phase the protocol adds to the name of the method that answers it,
    a ``(client, request) -> fields`` function (usually a staticmethod)."""

    phases: ClassVar[Mapping[str, str]] = {}

    def handlers(self) -> dict[str, ClientHandler]:
        """The protocol's own phases this half answers (phase name -> handler)."""
        return {phase: getattr(self, method) for phase, method in self.phases.items()}

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray | None:
        """This round's pseudo-gradient from the protocol's own local solver (ADMM's
        x-update), in place of the trainer's local SGD; None: local SGD."""
        return None

    def train_reply(self, client: ClientAPI, request: Envelope) -> dict[str, Field]:
        """Extra fields of the training reply (the server asked for them in ``request``)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ConfigError(f"{type(self).__name__} keeps no state, got {sorted(state)}")


class VectorStateHalf(ClientHalf):
    """A client half whose state between rounds is a few optional float vectors, the
    attributes ``vectors`` names (Ensemble's own model, PVI's factor): None until set."""

    vectors: ClassVar[tuple[str, ...]] = ()

    def __init__(self):
        for name in self.vectors:
            setattr(self, name, None)

    def state_dict(self) -> dict[str, Any]:
        kept = {name: getattr(self, name) for name in self.vectors}
        return {name: np.array(v, dtype=np.float64) for name, v in kept.items() if v is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) - set(self.vectors):
            raise StateError(
                f"a {type(self).__name__} state holds {list(self.vectors)}, got {sorted(state)}"
            )
        loaded = {name: state.get(name) for name in self.vectors}
        if any(v is not None and np.ndim(v) != 1 for v in loaded.values()):
            raise StateError(f"a {type(self).__name__} state's vectors are not vectors")
        for name, value in loaded.items():
            setattr(self, name, None if value is None else np.array(value, dtype=np.float64))


class ComposedClientHalf(ClientHalf):
    """The client halves of a composed protocol (each phase's), answering all their phases."""

    def __init__(self, parts: list[ClientHalf]):
        self.parts = parts
        seen: dict[str, ClientHandler] = {}
        for part in parts:
            for phase, handler in part.handlers().items():
                if phase in seen:
                    raise ConfigError(f"two protocol parts answer the phase {phase!r}")
                seen[phase] = handler
        self._handlers = seen

    def handlers(self) -> dict[str, ClientHandler]:
        return dict(self._handlers)

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray | None:
        for part in self.parts:
            own = part.local_update(client, request)
            if own is not None:
                return own
        return None

    def train_reply(self, client: ClientAPI, request: Envelope) -> dict[str, Field]:
        out: dict[str, Field] = {}
        for part in self.parts:
            out.update(part.train_reply(client, request))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {str(i): part.state_dict() for i, part in enumerate(self.parts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for i, part in enumerate(self.parts):
            part.load_state_dict(state.get(str(i), {}))


class _DeclaredOptions:
    """``Protocol.options`` of a subclass: the flagged parameters of its constructor,
    read on first use and kept on the class."""

    def __get__(self, obj: object, owner: type) -> tuple[Option, ...]:
        options = options_of(owner.__init__)  # type: ignore[misc]
        setattr(owner, "options", options)  # later reads find the tuple itself
        return options


class Protocol(ABC):
    """An aggregation algorithm's server half. Subclasses keep their arithmetic in
    module-level pure functions; ``client`` names the client half that registers with it."""

    name: str = "abstract"
    #: what the protocol needs from the engine and shows the server
    capabilities: Capabilities = Capabilities()
    #: its settings with a CLI flag of their own, read from its constructor's signature
    #: (:class:`~secagg.options.Flag`), each stored as the attribute of its key
    #: (:meth:`option_values` reads them back)
    options: ClassVar[tuple[Option, ...]] = ()
    #: the client half (phase handlers on the clients); the base half answers nothing
    client: ClassVar[type[ClientHalf]] = ClientHalf

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options" not in vars(cls):  # unless the class lists its Option records itself
            # read lazily: the signature's annotations may name what the module defines later
            cls.options = _DeclaredOptions()  # type: ignore[assignment]

    @classmethod
    def make_client(cls, **options: Any) -> ClientHalf:
        """The client half for a run with these protocol options (most ignore them)."""
        return cls.client()

    @classmethod
    def check_run(cls, run: Any) -> None:
        """Refuse (ConfigError, with what to do) a run this protocol cannot make, for a
        reason of its own that no capability or piece says; ``run``: the run's
        configuration (``secagg.runspec.config.ExperimentConfig``), checked otherwise.
        Called last by its validation; by default every run is fine."""

    def piece[P](self, kind: type[P]) -> P | None:
        """Its piece ``kind`` (:mod:`secagg.protocols.pieces`), or None; a protocol has a
        piece by subclassing it, a composition answers for its parts."""
        return self if isinstance(self, kind) else None

    def option_values(self) -> dict[str, Any]:
        """The value of each of its ``options``, by key (for requests that carry them)."""
        return {option.key: getattr(self, option.key) for option in self.options}

    def seed(self, seed: int) -> None:
        """Protocols with randomness of their own draw it from the run's seed."""

    def begin_round(self, ctx: RoundAPI) -> float | None:
        """Called before the training phase; may return this round's server learning rate."""
        return None

    def train_settings(
        self, ctx: RoundAPI, client: str, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """A client's training settings (``lr``, ``steps`` or ``epochs``, ``prox_mu``) for
        this round; the engine's defaults unless the protocol chooses them."""
        return settings

    def varied_settings(self) -> Mapping[str, Allowed]:
        """Training settings (``lr``, ``steps``) this protocol chooses round by round in
        ``train_settings``, with the values it may choose: a client's provisioning admits
        them (and refuses any other value); by default none varies."""
        return {}

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        """Extra fields for a client's training request (none by default)."""
        return {}

    def train_reply(self, ctx: RoundAPI) -> dict[str, str]:
        """Extra scalar fields the training reply must carry (name -> wire kind)."""
        return {}

    def planned_weights(
        self, ctx: RoundAPI, n_samples: Mapping[str, float]
    ) -> Mapping[str, float] | None:
        """This round's weights, fixed before any upload arrives (protocols that stream).

        ``n_samples`` are the sample counts the active clients reported at enrolment. With
        planned weights the server folds each upload into a running sum as it arrives and
        drops it (memory O(model), not O(clients × model)); a client that drops out is
        renormalised away. ``aggregate`` must give the same sum. None: this round needs every
        upload at once (the weights depend on all of them, or a second phase reuses them)."""
        return None

    def opened_weights(self, ctx: RoundAPI) -> Mapping[str, float] | None:
        """The weights of a sum this round opens to its contributors (kind ``open``), where
        they are fixed before any upload arrives (LARC's Ĝ: last round's α), else None.

        The engine then sends every client the contributors' committed seeds and these
        weights with its training request, so that it expands the open's check while it
        trains (``secagg.secret.ckks_masks``): a hint, which the client uses only for a
        release whose signed seeds and weights are exactly these."""
        return None

    def finish_sum(self, ctx: RoundAPI, total: PlannedSum) -> Any:
        """The global update's handle from the running sum every upload was folded into
        (streaming runs). By default the sum renormalised over the uploads that arrived; a
        protocol may take it as planned, or ask the clients more about it before the engine
        releases it (``larc-lagged`` does both)."""
        return total.result()

    def check_upload(self, ctx: RoundAPI, client: str, upload: Upload) -> None:
        """Raise ClientInputError if an upload's extra scalars are unusable: the engine then
        excludes that client from the round instead of failing the run."""

    @abstractmethod
    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        """Combine the uploads into the global pseudo-gradient, still protected (a handle).

        The engine reveals it to the server, or in server-blind runs sends it to the clients,
        who decrypt it and apply the optimizer themselves."""

    def round_log(self) -> dict[str, float]:
        """Numbers worth a column in the run's per-round metrics (e.g. chosen settings)."""
        return {}
