"""The client runtime: answers the server's envelopes, one handler per phase.

A client holds its data, its model, the client half of the backend (which, on encrypted
backends, holds the secret key) and the client half of the run's protocol. The runtime itself
answers only the engine's phases (``enroll``, ``train``, ``validate``, ``apply``,
``plaintext_update``, ``observe``); a protocol's own phases (LARC's probe, RegAgg's terms,
FedDisco's discrepancy) and its extra training-reply fields are its client half's, which
sees this client through :class:`~secagg.protocols.base.ClientAPI` (implemented here).

The client keeps what a later phase needs — the global model of the round and its own
pseudo-gradient — and nothing leaves it except the fields its handlers return.

**State between messages.** A client may run as a fresh process per message (as Flower may
start a fresh ClientApp per message): :meth:`Client.export_state` writes everything it
remembers — the global model and its pseudo-gradient, its copy of the server optimizer
(server-blind runs), the scalar-DP settings, its DP noise generator, the trainer's place in
its data (and DP-SGD's accountant and generators), the protocol half's and the backend
half's state — as one versioned blob, and :meth:`Client.restore_state` loads it into a
client built the same way, which then answers exactly as the long-lived one would. The blob
is an envelope from the client to ``"state"`` (phase ``client_state``, round 0): a ``meta``
config field (state version, client id, backend, protocol half, model size), a ``state``
config field with the JSON-able parts, ``array:<path>`` float64 vector fields and
``opaque:<path>`` byte fields.

.. warning:: The blob holds **secret key material**: on ckks the run's CKKS secret key (it
   decrypts every client's upload) and this client's X25519 private key; and the states of
   the DP noise generators (with them, noise can be subtracted). Store it only on the
   client's own node, readable by the client alone (e.g. a file of mode 0600); never send it
   to the server or put it in logs.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from secagg import wire
from secagg.backends import ClientBackend
from secagg.clients.policy import (
    ENGINE_PHASES,
    ClientPolicy,
    PolicyGuard,
    model_identity,
    stepped_identity,
    upload_basis,
)
from secagg.clients.state import (
    STATE_VERSION,
    check_meta,
    copied,
    decode_state,
    encode_state,
    model_sized,
    restored_generator,
)
from secagg.clients.tasks import ClientData
from secagg.clients.training import LocalTrainer
from secagg.dp import noised_update, privatize_scalar
from secagg.errors import (
    ClientRefused,
    ConfigError,
    MalformedMessage,
    PolicyRefused,
    ProtocolStateError,
    StateError,
    error_code,
)
from secagg.parts import PART_FIELD
from secagg.protocols.base import ClientHalf
from secagg.protocols.optimizers import (
    ServerOptimizer,
    make_optimizer,
    optimizer_from_envelope,
)
from secagg.secret.sealing import seal
from secagg.wire import Envelope, Field

if TYPE_CHECKING:  # opacus is imported only by clients that train with DP-SGD
    from secagg.clients.privacy import PrivateTrainer

SERVER = "server"
#: where a client writes why it refused a request (never sent to the server)
LOG = logging.getLogger(__name__)
__all__ = ["ENGINE_PHASES", "Client", "SERVER"]


class Client:
    """One client: its trainer (data, model), backend half and protocol half.

    ``policy``: what this client answers, from its own provisioning (its phases, training
    settings, DP, budgets: ``secagg.clients.policy``); every request is checked against it
    before anything is computed.
    ``observer_public``: the X25519 public key of the experimenter, from the client's own
    configuration; with it the client answers ``observe`` requests with its global model
    sealed for the experimenter (server-blind runs, where the server must not see W).

    A request it cannot answer raises :class:`~secagg.errors.ClientRefused`, which carries
    a fixed code only; the detail stays in ``refusals`` (this client's own log).
    """

    def __init__(
        self,
        client_id: str,
        trainer: LocalTrainer | PrivateTrainer,
        backend: ClientBackend,
        *,
        policy: ClientPolicy,
        protocol: ClientHalf | None = None,
        validation: ClientData | None = None,
        seed: int = 0,
        observer_public: bytes | None = None,
    ):
        self.id = client_id
        self.trainer = trainer
        self.backend = backend
        self.protocol = protocol if protocol is not None else ClientHalf()
        self.validation = validation  # held-out local samples (Auto-FedRL's reward)
        self.observer_public = observer_public
        self.rng = np.random.default_rng(seed)  # this client's DP noise
        self.policy = policy
        self.guard = PolicyGuard(policy)
        #: the scalar DP this client applies: its own provisioning's, never a request's
        self._scalar_dp: dict | None = None if policy.scalar_dp is None else dict(policy.scalar_dp)
        #: why each refused request was refused (kept here, never sent: it can hold data)
        self.refusals: list[tuple[int, str, str]] = []
        self._request: Envelope | None = None  # the request being answered (for the basis)
        self._basis: str | None = None  # what this request's uploads were made from
        self._request_id = ""  # names the request being answered (``protect``'s ``request``)
        self._plaintext_sent = -1  # the round whose update went out in plaintext
        self._w: np.ndarray | None = None  # global model of the current round
        self._model_id: str | None = None  # what names it (``policy.model_identity``)
        self._g: np.ndarray | None = None  # this client's pseudo-gradient of the current round
        self._optimizer: ServerOptimizer | None = None  # server-blind runs only
        #: where this client's time goes (for overhead benchmarks; never sent): "train"
        #: (local SGD), "protect" (encode + encrypt, online), "protect_offline" (the
        #: uploads' masks, made beside training), "open" (decrypt an aggregate), and the
        #: whole handling of each phase as "phase:<name>" (envelopes included)
        self.seconds: dict[str, float] = defaultdict(float)
        engine = {
            "enroll": self.on_enroll,
            "train": self.on_train,
            "validate": self.on_validate,
            "apply": self.on_apply,
            "plaintext_update": self.on_plaintext_update,
            "observe": self.on_observe,
            "model_part": self.on_model_part,
            "upload_part": self.on_upload_part,
        }
        self._handlers: dict[str, Callable[[Envelope], dict[str, Field]]] = dict(engine)
        for source, handlers in (
            ("backend", backend.handlers()),
            ("protocol", {p: self._bound(h) for p, h in self.protocol.handlers().items()}),
        ):
            clash = set(handlers) & set(self._handlers)
            if clash:
                raise ConfigError(f"the {source} answers phases already taken: {sorted(clash)}")
            self._handlers.update(handlers)

    def _bound(self, handler) -> Callable[[Envelope], dict[str, Field]]:
        return lambda env: handler(self, env)

    def handle(self, request: bytes) -> bytes:
        """The reply to one request, or :class:`ClientRefused` with a fixed code."""
        start = time.perf_counter()
        phase, round_number = "?", -1
        try:
            env = Envelope.from_bytes(request)
            phase, round_number = env.phase, env.round
            reply = self._answer(env)
        except Exception as exc:  # noqa: BLE001 - whatever failed, only a code leaves
            detail = f"{type(exc).__name__}: {exc}"
            self.refusals.append((round_number, phase, detail))
            # the client's own log (its node's stderr; in simulation, the experimenter's)
            LOG.warning("%s refused %r of round %s: %s", self.id, phase, round_number, detail)
            raise ClientRefused(self.id, phase, error_code(exc)) from None
        self.seconds[f"phase:{env.phase}"] += time.perf_counter() - start
        return reply

    def _answer(self, env: Envelope) -> bytes:
        if env.recipient != self.id or env.sender != SERVER:
            raise MalformedMessage(f"{self.id} got a message for {env.recipient} from {env.sender}")
        handler = self._handlers.get(env.phase)
        if handler is None:
            raise MalformedMessage(f"{self.id} has no handler for phase {env.phase!r}")
        self.policy.check_phase(env.phase)
        self.guard.check_round(env.round)
        self._request, self._basis = env, None
        self._request_id = os.urandom(8).hex()  # a retried request is another request
        try:
            fields = handler(env)
            if self._basis is not None:  # what its uploads were made from (the server lists it)
                fields["basis"] = wire.config({"basis": self._basis})
        finally:
            self._request = None
            self.backend.discard_prepared()  # no upload mask outlives its request
            self.seconds["protect_offline"] = self.backend.offline_seconds
            self.seconds["reveal_open"] = self.backend.opening_seconds
        reply = Envelope(self.id, SERVER, env.round, env.phase, fields).to_bytes()
        self.guard.answered(env.round)
        return reply

    def _timed(self, key: str, fn: Callable, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[key] += time.perf_counter() - start

    # ---- state between messages (a fresh process per message) ---------------------------
    def export_state(self) -> bytes:
        """Everything this client remembers between messages, as one versioned blob.

        It holds secret key material (module docstring): keep it on this client's node
        only, e.g. in a file of mode 0600."""
        return encode_state(self.id, self._state_meta(), self._state())

    def restore_state(self, data: bytes) -> None:
        """Continue from a blob :meth:`export_state` wrote, on a client built the same way
        (same id, task data, trainer, backend and protocol options).

        All or nothing: a blob of another client, truncated or garbled, of another state
        version or made for another kind of client raises :class:`StateError` and this
        client keeps the state it had."""
        meta, state = decode_state(data, self.id)
        check_meta(meta, self._state_meta(), self.id)
        before = self._state()
        try:
            self._load_state(state)
        except Exception as exc:
            self._load_state(before)  # put back whatever the failed load already changed
            raise StateError(
                f"{self.id}: the exported state does not fit this client "
                f"({type(exc).__name__}: {exc}); nothing was changed. Restore a "
                "state exported by this client, built with the same task, "
                "trainer, backend and protocol options"
            ) from exc

    def _state_meta(self) -> dict[str, Any]:
        """What a blob must match before any of it is loaded."""
        half = type(self.protocol)
        return {
            "version": STATE_VERSION,
            "client": self.id,
            "backend": self.backend.name,
            "protocol": f"{half.__module__}.{half.__qualname__}",
            "n_params": self.n_params,
        }

    def _state(self) -> dict[str, Any]:
        if not callable(getattr(self.trainer, "state_dict", None)):
            raise StateError(
                f"{self.id}: its trainer ({type(self.trainer).__name__}) cannot "
                "export its state; give it state_dict/load_state_dict"
            )
        opt = self._optimizer
        return {
            "client": {
                "w": copied(self._w),
                "g": copied(self._g),
                "rng": self.rng.bit_generator.state,
                "guard": self.guard.state_dict(),
                "model_id": self._model_id,
            },
            "optimizer": (
                None if opt is None else {"config": opt.config, "state": opt.state_dict()}
            ),
            "trainer": self.trainer.state_dict(),
            "protocol": self.protocol.state_dict(),
            "backend": self.backend.state_dict(),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        """Check and build this client's own parts first, then hand each half its part."""
        parts = ("client", "optimizer", "trainer", "protocol", "backend")
        if set(state) != set(parts) or set(state["client"]) != {
            "w",
            "g",
            "rng",
            "guard",
            "model_id",
        }:
            raise StateError(f"a client state holds {list(parts)}, got {sorted(state)}")
        own = state["client"]
        w, g = (model_sized(own[k], self.n_params, k) for k in ("w", "g"))
        rng = restored_generator(self.rng, own["rng"], "the DP noise")
        guard = PolicyGuard(self.policy)
        guard.load_state_dict(own["guard"])
        opt = state["optimizer"]
        optimizer = None if opt is None else make_optimizer(opt["config"], opt["state"])
        if optimizer is not None and optimizer.dim != self.n_params:
            raise StateError(
                f"the optimizer copy is for {optimizer.dim} parameters, the "
                f"model has {self.n_params}"
            )
        self.backend.load_state_dict(state["backend"])
        self.trainer.load_state_dict(state["trainer"])
        self.protocol.load_state_dict(state["protocol"])
        model_id = own["model_id"]
        if model_id is not None and not isinstance(model_id, str):
            raise StateError("a client state's model identity is not a digest")
        self._w, self._g, self.guard, self._model_id = w, g, guard, model_id
        self.rng, self._optimizer = rng, optimizer

    def _set_model(self, w: np.ndarray) -> None:
        self._w, self._model_id = w, model_identity(w)

    # ---- what a protocol's client half sees (ClientAPI) -----------------------------------
    @property
    def model(self) -> np.ndarray:
        if self._w is None:
            raise ProtocolStateError(f"{self.id} holds no global model yet")
        return self._w

    @property
    def update(self) -> np.ndarray:
        if self._g is None:
            raise ProtocolStateError(f"{self.id} has not trained this round")
        return self._g

    @property
    def n_params(self) -> int:
        return self.trainer.n_params

    @property
    def optimizer(self) -> ServerOptimizer | None:
        return self._optimizer

    def loss_at(self, w: np.ndarray, *, drop_bias: bool = False) -> float:
        return self.trainer.loss_at(w, drop_bias=drop_bias)

    def features(self) -> np.ndarray:
        return self.trainer.data.x.numpy().astype(np.float64)

    def labels(self) -> np.ndarray:
        return self.trainer.data.y.numpy().astype(np.float64)

    def open(self, envelope: Envelope, name: str) -> np.ndarray:
        return self._timed("open", self.backend.open, envelope, name, self.n_params)

    def protect(self, values: np.ndarray, weight: float | None = None) -> Field:
        """Protect ``values`` for upload, tagged with what they were made from (the basis:
        ``secagg.clients.policy.upload_basis``), which this client's consent then binds."""
        request = self._request
        if request is None:
            raise ProtocolStateError(f"{self.id} protects values only while answering a request")
        basis = upload_basis(request.round, request.phase, request.fields, self._model_id)
        self._basis = basis
        self.backend.note_source(request.phase, self._model_id)
        return self._timed(
            "protect", self.backend.protect, values, weight, basis=basis, request=self._request_id
        )

    def check_own_weight(self, envelope: Envelope, name: str, weight: float) -> None:
        self.backend.check_own_weight(envelope, name, weight)

    def server_optimizer_in(self, envelope: Envelope) -> ServerOptimizer | None:
        if "server_opt" not in envelope.fields:
            return self._optimizer
        config = self.policy.server_optimizer_config(envelope.config("server_opt"))
        return optimizer_from_envelope(envelope, config=config)

    def report(self, value: float) -> Field:
        """A scalar for the server: counted against this client's scalar budget, and
        clipped and noised when its provisioning has scalar DP."""
        self.guard.scalar()
        if self._scalar_dp is not None:
            d = self._scalar_dp
            value = privatize_scalar(
                value, float(d["low"]), float(d["high"]), float(d["sigma"]), self.rng
            )
        return wire.scalar(value)

    # ---- the engine's phases ---------------------------------------------------------------
    def on_enroll(self, env: Envelope) -> dict[str, Field]:
        """Streaming runs: the sample count, once, so the server can fix FedAvg's weights
        before the uploads arrive (it learns the same number with every upload anyway)."""
        return {"n_samples": wire.scalar(len(self.trainer.data))}

    def on_train(self, env: Envelope) -> dict[str, Field]:
        # what the request may ask is fixed by this client's provisioning: checked first
        cfg = self.policy.training(env.config("train"), env.round)
        parts = self.policy.parts(self.n_params)
        first = self._part(env, len(parts)) if len(parts) > 1 else 0
        if first != 0:
            raise PolicyRefused(f"{self.id} sends part 0 of its update with its training")
        self.guard.train(env.round)
        if "model" in env.fields:
            self._set_model(env.vector("model", self.n_params))
        elif self._w is None:
            raise ProtocolStateError(f"{self.id} has no global model to train from")
        elif self._model_id is None:  # assembled from parts: named once, whole
            self._model_id = model_identity(self._w)
        if "server_opt" in env.fields:  # server-blind run: keep a copy of the optimizer
            opt_cfg = self.policy.server_optimizer_config(env.config("server_opt"))
            if self._optimizer is None:
                self._optimizer = make_optimizer(opt_cfg)
            if "lr" in opt_cfg:  # phase-wise server rates (a proximal step has none)
                self._optimizer.hyper["lr"] = opt_cfg["lr"]
        # the upload's value-independent part (its masks) is made beside the training
        lo, hi = parts[0]
        self.backend.prepare_upload(hi - lo)
        # a planned decryptor also starts the round's check (a hint: it verifies the release)
        self.backend.prepare_release(env, self.n_params)
        # a protocol with its own local solver (ADMM's x-update) answers first; else SGD
        own = self._timed("train", self.protocol.local_update, self, env)
        self._g = (
            np.asarray(own, dtype=np.float64) if own is not None else self.train(self.model, cfg)
        )
        dp = self.policy.client_dp  # its own DP, never the request's (checked equal above)
        if dp is not None:  # clip and noise before protecting: nobody sees the raw update
            self._g = noised_update(self._g, float(dp["clip"]), float(dp["sigma"]), self.rng)
        # a client-weighted CKKS preset: the planned weight this upload enters the sum with
        weight = env.scalar("upload_weight") if "upload_weight" in env.fields else None
        if len(parts) > 1:
            self.guard.upload_part(env.round, 0, len(parts))
        reply = {
            "pseudo_gradient": self.protect(self._g[lo:hi], weight),
            "n_samples": wire.scalar(len(self.trainer.data)),
            **self._reports(cfg.get("reports", {})),
            # the next upload's seeds, for a decryptor's check made ahead: one whole upload
            # a round only (an upload in parts is checked as it is released)
            **(self.backend.commit_next_upload(self.n_params) if len(parts) == 1 else {}),
        }
        reply.update(self.protocol.train_reply(self, env))
        return reply

    # ---- a round in parts (``secagg.parts``): the bounds are this client's own --------------
    def _part(self, env: Envelope, parts: int) -> int:
        """The part a request names (its index only: the bounds come from the policy)."""
        index = env.config(PART_FIELD).get("index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < parts:
            raise PolicyRefused(f"{self.id} moves its model in {parts} parts, not part {index!r}")
        return index

    def on_model_part(self, env: Envelope) -> dict[str, Field]:
        """A part of the round's global model, written into this client's copy; the model is
        named (the basis of its uploads) when it trains from it."""
        parts = self.policy.parts(self.n_params)
        lo, hi = parts[self._part(env, len(parts))]
        values = env.vector("model", hi - lo)
        if self._w is None or not self._w.flags.writeable:  # none yet, or a restored view
            self._w = np.zeros(self.n_params) if self._w is None else self._w.copy()
        self._w[lo:hi] = values
        self._model_id = None
        return {}

    def on_upload_part(self, env: Envelope) -> dict[str, Field]:
        """Part p ≥ 1 of this round's update, once (``PolicyGuard.upload_part``), an upload of
        its own: its own seeds or key, and a basis that names the part."""
        parts = self.policy.parts(self.n_params)
        index = self._part(env, len(parts))
        self.guard.upload_part(env.round, index, len(parts))
        lo, hi = parts[index]
        weight = env.scalar("upload_weight") if "upload_weight" in env.fields else None
        return {"pseudo_gradient": self.protect(self.update[lo:hi], weight)}

    def predict(self, w: np.ndarray, features: np.ndarray) -> np.ndarray:
        return self.trainer.predict(w, features)

    def train(self, start: np.ndarray, settings: dict[str, Any]) -> np.ndarray:
        """Local training from ``start`` with a ``train`` config's settings (lr, steps or
        epochs, prox_mu), if this client's provisioning allows them for the request's round;
        returns the pseudo-gradient, new − ``start``."""
        if self._request is not None:  # a protocol's own phase asks too (Sequential's hops)
            settings = self.policy.training(settings, self._request.round)
        steps = (
            int(settings["epochs"]) * -(-len(self.trainer.data) // self.trainer.batch_size)
            if "epochs" in settings
            else int(settings["steps"])
        )
        return self._timed(
            "train",
            self.trainer.train,
            start,
            lr=float(settings["lr"]),
            steps=steps,
            prox_mu=float(settings.get("prox_mu", 0.0)),
        )

    def _reports(self, wanted: dict[str, Any]) -> dict[str, Field]:
        """Data-independent numbers the run asked for: DP-SGD's ε so far (at δ), the noise
        multiplier the client uses (solved for a target ε, or given), its sampling rate and
        the steps its accountant counted so far (the run composes ε over seeds from these)."""
        out = {}
        for name, setting in wanted.items():
            if not name.startswith("dp_sgd_") or not hasattr(self.trainer, "epsilon"):
                raise ProtocolStateError(f"{self.id} cannot report {name!r}")
            trainer: Any = self.trainer  # a PrivateTrainer
            if name == "dp_sgd_epsilon":
                out[name] = wire.scalar(trainer.epsilon(float(setting["delta"])))
            elif name == "dp_sgd_noise_multiplier":
                out[name] = wire.scalar(trainer.noise_multiplier)
            elif name == "dp_sgd_sample_rate":
                out[name] = wire.scalar(trainer.sample_rate)
            elif name == "dp_sgd_steps":
                out[name] = wire.scalar(trainer.steps_taken())
            else:
                raise ProtocolStateError(f"{self.id} cannot report {name!r}")
        return out

    def on_apply(self, env: Envelope) -> dict[str, Field]:
        """Server-blind runs: decrypt the global pseudo-gradient and step the optimizer here."""
        if self._optimizer is None or self._w is None:
            raise ProtocolStateError(f"{self.id} cannot apply an update: no model or optimizer")
        g_global = self.open(env, "global_update")
        self._w = self._w + self._optimizer.step(g_global, self._w)
        self._model_id = stepped_identity(self._model_id or "", env.fields)
        return {"applied": wire.config({"round": env.round})}

    def on_plaintext_update(self, env: Envelope) -> dict[str, Field]:
        """Only for aggregators that cannot work on sums, where this client's own
        provisioning allows plaintext updates (its policy refuses the phase otherwise), and
        only this round's update, once."""
        if self._plaintext_sent == env.round or env.round not in self.guard.trained:
            raise PolicyRefused(f"{self.id} gives its update of round {env.round} at most once")
        self._plaintext_sent = env.round
        return {"pseudo_gradient": wire.vector(self.update)}

    def on_validate(self, env: Envelope) -> dict[str, Field]:
        """Auto-FedRL: the loss of the global model on this client's validation samples,
        at most once a round (twice in round 0). A request that carries the model also
        makes it this client's global model, which it then trains from."""
        if self.validation is None:
            raise ProtocolStateError(f"{self.id} holds no validation samples")
        if "scalar_dp" in env.fields and env.config("scalar_dp") != self._scalar_dp:
            raise PolicyRefused(f"{self.id}: the request's scalar DP is not its own")
        self.guard.validate(env.round)
        if "model" in env.fields:
            self._set_model(env.vector("model", self.n_params))
        return {"val_loss": self.report(self.trainer.loss_at(self.model, data=self.validation))}

    def on_observe(self, env: Envelope) -> dict[str, Field]:
        """The experimenter's copy of the global model, sealed for the experimenter's key
        (from this client's configuration): the server relays bytes it cannot open."""
        if self.observer_public is None:
            raise ProtocolStateError(f"{self.id} has no experimenter key to seal a model for")
        payload = np.ascontiguousarray(self.model, dtype="<f8").tobytes()
        return {
            "sealed_model": wire.ciphertext(
                seal(payload, self.observer_public, f"{self.id}/round-{env.round}")
            )
        }
