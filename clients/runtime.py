"""The client runtime: answers the server's envelopes, one handler per phase.

A client holds its data, its model and the client half of the backend (which, on encrypted
backends, holds the secret key). It keeps what a later phase of the same round needs — the
global model it started from and its own pseudo-gradient — and nothing leaves it except the
fields its handlers return.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from clients.training import LocalTrainer
from protocols import larc
from protocols.optimizers import ServerOptimizer, make_optimizer, optimizer_from_envelope
from secagg import wire
from secagg.backends import ClientBackend
from secagg.errors import MalformedMessage
from secagg.wire import Envelope, Field

SERVER = "server"


class Client:
    def __init__(self, client_id: str, trainer: LocalTrainer, backend: ClientBackend):
        self.id = client_id
        self.trainer = trainer
        self.backend = backend
        self._w: np.ndarray | None = None  # global model of the current round
        self._g: np.ndarray | None = None  # this client's pseudo-gradient of the current round
        self._optimizer: ServerOptimizer | None = None  # server-blind runs only
        self._handlers: dict[str, Callable[[Envelope], dict[str, Field]]] = {
            "train": self.on_train,
            "larc_probe": self.on_larc_probe,
            "apply": self.on_apply,
            **backend.handlers(),
        }

    def handle(self, request: bytes) -> bytes:
        env = Envelope.from_bytes(request)
        if env.recipient != self.id or env.sender != SERVER:
            raise MalformedMessage(f"{self.id} got a message for {env.recipient} from {env.sender}")
        handler = self._handlers.get(env.phase)
        if handler is None:
            raise MalformedMessage(f"{self.id} has no handler for phase {env.phase!r}")
        reply = Envelope(self.id, SERVER, env.round, env.phase, handler(env))
        return reply.to_bytes()

    # ---- phases -------------------------------------------------------------------------
    @property
    def global_model(self) -> np.ndarray | None:
        return None if self._w is None else self._w.copy()

    def on_train(self, env: Envelope) -> dict[str, Field]:
        cfg = env.config("train")
        if "model" in env.fields:
            self._w = env.vector("model", self.trainer.n_params)
        elif self._w is None:
            raise MalformedMessage(f"{self.id} has no global model to train from")
        if "server_opt" in env.fields and self._optimizer is None:  # server-blind run
            self._optimizer = make_optimizer(env.config("server_opt"))
        self._g = self.trainer.train(self._w, lr=float(cfg["lr"]), steps=int(cfg["steps"]))
        return {
            "pseudo_gradient": self.backend.protect(self._g),
            "n_samples": wire.scalar(len(self.trainer.data)),
        }

    def on_larc_probe(self, env: Envelope) -> dict[str, Field]:
        if self._w is None or self._g is None:
            raise MalformedMessage(f"{self.id} got a LARC probe before training")
        g_hat = self.backend.open(env, "g_hat", self.trainer.n_params)
        # the optimizer's state comes from whoever holds it: the server, or in server-blind
        # runs this client's own copy
        optimizer = (optimizer_from_envelope(env) if "server_opt" in env.fields
                     else self._optimizer)
        if optimizer is None:
            raise MalformedMessage(f"{self.id} got a LARC probe without optimizer state")
        drop_bias = env.config("loss_check")["mode"] == "weights_only"
        dl = larc.delta_loss(
            lambda w: self.trainer.loss_at(w, drop_bias=drop_bias),
            self._w, self._g, g_hat, env.scalar("alpha"), optimizer.peek,
        )
        return {"delta_loss": wire.scalar(dl)}

    def on_apply(self, env: Envelope) -> dict[str, Field]:
        """Server-blind runs: decrypt the global pseudo-gradient and step the optimizer here."""
        if self._optimizer is None or self._w is None:
            raise MalformedMessage(f"{self.id} cannot apply an update: no model or optimizer")
        g_global = self.backend.open(env, "aggregate", self.trainer.n_params)
        self._w = self._w + self._optimizer.step(g_global)
        return {"applied": wire.config({"round": env.round})}
