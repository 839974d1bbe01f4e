"""The client runtime: answers the server's envelopes, one handler per phase.

A client holds its data, its model and the client half of the backend (which, on encrypted
backends, holds the secret key). It keeps what a later phase of the same round needs — the
global model it started from and its own pseudo-gradient — and nothing leaves it except the
fields its handlers return.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from secagg.clients.tasks import ClientData
from secagg.clients.training import LocalTrainer
from secagg.protocols import feddisco, larc, rolepro
from secagg.protocols.optimizers import ServerOptimizer, make_optimizer, optimizer_from_envelope
from secagg import wire
from secagg.backends import ClientBackend
from secagg.dp import noised_update, privatize_scalar
from secagg.errors import MalformedMessage
from secagg.wire import Envelope, Field

SERVER = "server"


class Client:
    def __init__(self, client_id: str, trainer: LocalTrainer, backend: ClientBackend,
                 validation: ClientData | None = None, seed: int = 0):
        self.id = client_id
        self.trainer = trainer
        self.backend = backend
        self.validation = validation  # held-out local samples (Auto-FedRL's reward)
        self.rng = np.random.default_rng(seed)  # this client's DP noise
        self._scalar_dp: dict | None = None  # the run's scalar DP settings, once received
        self._w: np.ndarray | None = None  # global model of the current round
        self._g: np.ndarray | None = None  # this client's pseudo-gradient of the current round
        self._optimizer: ServerOptimizer | None = None  # server-blind runs only
        self._last_trained_loss: float | None = None  # l(w^c_{t-1}) for CostWAgg
        #: FedDisco: the federated β-VAE's encoder, x -> latent means (set before round 0)
        self.encoder: Callable[[Any], np.ndarray] | None = None
        #: where this client's time goes (for overhead benchmarks; never sent): "train"
        #: (local SGD), "protect" (encode + encrypt), "open" (decrypt an aggregate), and the
        #: whole handling of each phase as "phase:<name>" (envelopes included)
        self.seconds: dict[str, float] = defaultdict(float)
        self._handlers: dict[str, Callable[[Envelope], dict[str, Field]]] = {
            "enroll": self.on_enroll,
            "train": self.on_train,
            "larc_probe": self.on_larc_probe,
            "apply": self.on_apply,
            "regagg_terms": self.on_regagg_terms,
            "plaintext_update": self.on_plaintext_update,
            "discrepancy": self.on_discrepancy,
            "validate": self.on_validate,
            **backend.handlers(),
        }

    def handle(self, request: bytes) -> bytes:
        start = time.perf_counter()
        env = Envelope.from_bytes(request)
        if env.recipient != self.id or env.sender != SERVER:
            raise MalformedMessage(f"{self.id} got a message for {env.recipient} from {env.sender}")
        handler = self._handlers.get(env.phase)
        if handler is None:
            raise MalformedMessage(f"{self.id} has no handler for phase {env.phase!r}")
        reply = Envelope(self.id, SERVER, env.round, env.phase, handler(env)).to_bytes()
        self.seconds[f"phase:{env.phase}"] += time.perf_counter() - start
        return reply

    def _timed(self, key: str, fn: Callable, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[key] += time.perf_counter() - start

    # ---- phases -------------------------------------------------------------------------
    @property
    def global_model(self) -> np.ndarray | None:
        return None if self._w is None else self._w.copy()

    def on_enroll(self, env: Envelope) -> dict[str, Field]:
        """Streaming runs: the sample count, once, so the server can fix FedAvg's weights
        before the uploads arrive (it learns the same number with every upload anyway)."""
        return {"n_samples": wire.scalar(len(self.trainer.data))}

    def on_train(self, env: Envelope) -> dict[str, Field]:
        cfg = env.config("train")
        if "model" in env.fields:
            self._w = env.vector("model", self.trainer.n_params)
        elif self._w is None:
            raise MalformedMessage(f"{self.id} has no global model to train from")
        if "server_opt" in env.fields:  # server-blind run: keep a copy of the optimizer
            opt_cfg = env.config("server_opt")
            if self._optimizer is None:
                self._optimizer = make_optimizer(opt_cfg)
            self._optimizer.hyper["lr"] = opt_cfg["lr"]  # phase-wise server rates
        steps = (int(cfg["epochs"]) * -(-len(self.trainer.data) // self.trainer.batch_size)
                 if "epochs" in cfg else int(cfg["steps"]))
        self._g = self._timed("train", self.trainer.train, self._w, lr=float(cfg["lr"]),
                              steps=steps, prox_mu=float(cfg.get("prox_mu", 0.0)))
        if "client_dp" in cfg:  # clip and noise before protecting: nobody sees the raw update
            dp = cfg["client_dp"]
            self._g = noised_update(self._g, float(dp["clip"]), float(dp["sigma"]), self.rng)
        self._scalar_dp = cfg.get("scalar_dp", self._scalar_dp)
        reply = {
            "pseudo_gradient": self._timed("protect", self.backend.protect, self._g),
            "n_samples": wire.scalar(len(self.trainer.data)),
        }
        if "report" in env.fields:
            reply["loss_ratio"] = self._scalar(self._loss_ratio(env.config("report")))
        return reply

    def _loss_ratio(self, report: dict) -> float:
        """RoLePRO's r_c on the local data: "round" = l(w_{t-1}) / l(w^c_t); "cost" =
        l(w^c_{t-1}) / l(w^c_t), falling back to "round" in the client's first round."""
        after = self.trainer.loss_at(self._w + self._g)
        before = self.trainer.loss_at(self._w)
        if report.get("loss_ratio") == "cost" and self._last_trained_loss is not None:
            before = self._last_trained_loss
        self._last_trained_loss = after
        return before / after

    def on_larc_probe(self, env: Envelope) -> dict[str, Field]:
        if self._w is None or self._g is None:
            raise MalformedMessage(f"{self.id} got a LARC probe before training")
        g_hat = self._timed("open", self.backend.open, env, "g_hat", self.trainer.n_params)
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
        return {"delta_loss": self._scalar(dl)}

    def on_apply(self, env: Envelope) -> dict[str, Field]:
        """Server-blind runs: decrypt the global pseudo-gradient and step the optimizer here."""
        if self._optimizer is None or self._w is None:
            raise MalformedMessage(f"{self.id} cannot apply an update: no model or optimizer")
        g_global = self._timed("open", self.backend.open, env, "aggregate",
                               self.trainer.n_params)
        self._w = self._w + self._optimizer.step(g_global)
        return {"applied": wire.config({"round": env.round})}

    def on_regagg_terms(self, env: Envelope) -> dict[str, Field]:
        """RegAgg/SimAgg second phase: the scaled terms of A and B, protected."""
        if self._g is None:
            raise MalformedMessage(f"{self.id} got RegAgg terms before training")
        centre = self.backend.open(env, "centre", self.trainer.n_params)
        numerator, denominator = rolepro.regagg_terms(self._g, centre, env.scalar("nu"),
                                                      env.scalar("tau"))
        return {"numerator": self.backend.protect(numerator),
                "denominator": self.backend.protect(denominator)}

    def on_plaintext_update(self, env: Envelope) -> dict[str, Field]:
        """Only for aggregators that cannot work on sums, in runs that allowed it."""
        if self._g is None:
            raise MalformedMessage(f"{self.id} has no update to send")
        return {"pseudo_gradient": wire.vector(self._g)}

    def on_discrepancy(self, env: Envelope) -> dict[str, Field]:
        """FedDisco: d_k of this client's samples under the federated β-VAE's encoder."""
        if self.encoder is None:
            raise MalformedMessage(f"{self.id} has no β-VAE encoder for FedDisco")
        return {"discrepancy": self._scalar(feddisco.discrepancy(
            self.encoder(self.trainer.data.x)))}

    def on_validate(self, env: Envelope) -> dict[str, Field]:
        """Auto-FedRL: the loss of the global model on this client's validation samples.
        A request that carries the model also makes it this client's global model."""
        if self.validation is None:
            raise MalformedMessage(f"{self.id} holds no validation samples")
        if "model" in env.fields:
            self._w = env.vector("model", self.trainer.n_params)
        if self._w is None:
            raise MalformedMessage(f"{self.id} has no global model to validate")
        if "scalar_dp" in env.fields:
            self._scalar_dp = env.config("scalar_dp")
        return {"val_loss": self._scalar(self.trainer.loss_at(self._w, data=self.validation))}

    def _scalar(self, value: float) -> Field:
        """A scalar for the server: clipped and noised when the run asks for scalar DP."""
        if self._scalar_dp is not None:
            d = self._scalar_dp
            value = privatize_scalar(value, float(d["low"]), float(d["high"]),
                                     float(d["sigma"]), self.rng)
        return wire.scalar(value)
