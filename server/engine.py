"""The round engine: runs a protocol round after round and applies the server optimizer.

Per round:

1. ``train`` phase: every client gets the global model W and its training settings and
   uploads its protected pseudo-gradient and its sample count;
2. the protocol combines the uploads (possibly asking clients more) and reveals the global
   pseudo-gradient G;
3. the server optimizer turns G into an update: W ← W + Opt(G).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from protocols.base import Protocol, Upload
from protocols.optimizers import ServerOptimizer, StepSchedule
from secagg import wire
from secagg.backends.base import ServerBackend
from secagg.errors import ClientInputError, RoundFailed
from server.audit import AuditLog
from server.round import RoundContext
from server.transport import InProcessTransport

ENGINE_DECLARED = ("n_samples",)  # what the training phase itself shows the server


@dataclass
class RoundReport:
    round: int
    clients: list[str]
    excluded: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)
    update_norm: float = 0.0


class Server:
    def __init__(self, protocol: Protocol, backend: ServerBackend, optimizer: ServerOptimizer,
                 transport: InProcessTransport, initial_params: np.ndarray, *,
                 client_lr: StepSchedule, local_steps: int, audit: AuditLog | None = None,
                 min_clients: int = 1, max_message_bytes: int = wire.DEFAULT_MAX_BYTES):
        self.protocol = protocol
        self.backend = backend
        self.optimizer = optimizer
        self.transport = transport
        self.params = np.asarray(initial_params, dtype=np.float64).copy()
        self.client_lr = client_lr
        self.local_steps = local_steps
        self.audit = audit if audit is not None else AuditLog()
        self.audit.declared |= set(ENGINE_DECLARED) | set(protocol.reveals) | set(backend.declares)
        self.min_clients = min_clients
        self.max_message_bytes = max_message_bytes

    @property
    def n_params(self) -> int:
        return self.params.size

    def setup(self, rounds: int, flooding_bits: int = 30) -> dict[str, str]:
        """Run the backend's one-off phases (CKKS key setup) before round 0.

        The decryption budget is what the run will release: rounds × reveals per round.
        Returns the clients excluded during setup, with reasons.
        """
        ctx = RoundContext(0, self.transport.peers, self.n_params, self.backend,
                           self.transport, self.audit, self.optimizer, self.max_message_bytes)
        self.backend.setup(ctx, rounds * self.protocol.reveals_per_round, flooding_bits)
        return dict(ctx.excluded)

    def run_round(self, rnd: int) -> RoundReport:
        ctx = RoundContext(rnd, self.transport.peers, self.n_params, self.backend,
                           self.transport, self.audit, self.optimizer, self.max_message_bytes)
        train_cfg = wire.config({"lr": self.client_lr.at(rnd), "steps": self.local_steps})
        model = wire.vector(self.params.astype(np.float32))
        replies = ctx.ask("train", {
            c: {"model": model, "train": train_cfg, **self.protocol.train_fields(ctx, c)}
            for c in ctx.active
        }, expect={"pseudo_gradient": self.backend.upload_kind, "n_samples": wire.SCALAR})

        uploads: dict[str, Upload] = {}
        for c, env in replies.items():
            try:
                n = env.scalar("n_samples")
                if not n > 0:
                    raise ClientInputError(f"{c} reports {n} samples")
                uploads[c] = Upload(self.backend.load(env, "pseudo_gradient", self.n_params), n)
            except ClientInputError as exc:
                ctx.exclude(c, "train", exc)
        if len(uploads) < self.min_clients:
            raise RoundFailed(f"round {rnd}: {len(uploads)} usable uploads, need "
                              f"{self.min_clients}; exclusions: {ctx.excluded}")

        g_global = self.protocol.aggregate(ctx, uploads)
        start = time.perf_counter()
        update = self.optimizer.step(g_global)
        self.params += update
        ctx.seconds["optimizer"] += time.perf_counter() - start
        return RoundReport(rnd, list(ctx.active), dict(ctx.excluded), dict(ctx.seconds),
                           float(np.linalg.norm(update)))
