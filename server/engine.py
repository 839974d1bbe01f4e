"""The round engine: runs a protocol round after round and applies the server optimizer.

Per round:

1. ``train`` phase: every client gets the global model W and its training settings and
   uploads its protected pseudo-gradient and its sample count;
2. the protocol combines the uploads (possibly asking clients more) into the protected global
   pseudo-gradient G;
3. the server has G revealed and applies its optimizer: W ← W + Opt(G).

Server-blind runs (NVFlare's model) skip the reveal: the server sends the encrypted G to every
client in an ``apply`` phase, and the clients decrypt it and apply their own copy of the
server optimizer. The server then never learns W after round 0 (where it sends the public
initial model); a client that misses an ``apply`` is out of step and leaves the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from protocols.base import Protocol, Upload
from protocols.optimizers import ServerOptimizer, StepSchedule
from secagg import wire
from secagg.backends.base import ServerBackend
from secagg.errors import ClientInputError, ConfigError, RoundFailed
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
                 client_lr: StepSchedule, local_steps: int, local_epochs: int | None = None,
                 audit: AuditLog | None = None,
                 min_clients: int = 1, max_message_bytes: int = wire.DEFAULT_MAX_BYTES,
                 server_blind: bool = False, allow_plaintext_updates: bool = False,
                 server_lr: StepSchedule | None = None):
        if server_blind and backend.can_read:
            raise ConfigError("server-blind runs need an encrypted backend: on plain the "
                              "server reads every upload anyway")
        if server_blind and protocol.server_computes_update:
            raise ConfigError(f"{protocol.name} forms the global update in plaintext on the "
                              "server (from revealed sums), so it cannot run server-blind")
        self.protocol = protocol
        self.backend = backend
        self.optimizer = optimizer
        self.transport = transport
        self.params = np.asarray(initial_params, dtype=np.float64).copy()
        self.client_lr = client_lr
        self.local_steps = local_steps
        self.local_epochs = local_epochs
        self.audit = audit if audit is not None else AuditLog()
        self.audit.declared |= set(ENGINE_DECLARED) | set(protocol.reveals) | set(backend.declares)
        if server_blind:
            self.audit.declared.add("applied")  # clients' receipts for the apply phase
        self.min_clients = min_clients
        self.max_message_bytes = max_message_bytes
        self.server_blind = server_blind
        self.allow_plaintext_updates = allow_plaintext_updates
        self.server_lr = server_lr
        self.left: dict[str, str] = {}  # clients that left the run (blind: missed an apply)

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
        peers = [c for c in self.transport.peers if c not in self.left]
        if self.server_lr is not None:
            self.optimizer.hyper["lr"] = self.server_lr.at(rnd)
        ctx = RoundContext(rnd, peers, self.n_params, self.backend, self.transport, self.audit,
                           None if self.server_blind else self.optimizer,
                           self.max_message_bytes, self.allow_plaintext_updates)
        work = ({"epochs": self.local_epochs} if self.local_epochs else
                {"steps": self.local_steps})
        train = {"train": wire.config({"lr": self.client_lr.at(rnd), **work})}
        if not self.server_blind or rnd == 0:  # blind: only the public initial model
            train["model"] = wire.vector(self.params.astype(np.float32))
        if self.server_blind:
            train["server_opt"] = wire.config(self.optimizer.config)
        replies = ctx.ask("train", {
            c: {**train, **self.protocol.train_fields(ctx, c)} for c in ctx.active
        }, expect={"pseudo_gradient": self.backend.upload_kind, "n_samples": wire.SCALAR,
                   **self.protocol.train_reply(ctx)})

        uploads: dict[str, Upload] = {}
        for c, env in replies.items():
            try:
                n = env.scalar("n_samples")
                if not n > 0:
                    raise ClientInputError(f"{c} reports {n} samples")
                extra = {k: env.scalar(k) for k in self.protocol.train_reply(ctx)}
                upload = Upload(self.backend.load(env, "pseudo_gradient", self.n_params), n,
                                extra)
                self.protocol.check_upload(c, upload)
                uploads[c] = upload
            except ClientInputError as exc:
                ctx.exclude(c, "train", exc)
        if len(uploads) < self.min_clients:
            raise RoundFailed(f"round {rnd}: {len(uploads)} usable uploads, need "
                              f"{self.min_clients}; exclusions: {ctx.excluded}")

        g_global = self.protocol.aggregate(ctx, uploads)
        if self.server_blind:
            self._apply_blind(ctx, g_global)
            return RoundReport(rnd, list(ctx.active), dict(ctx.excluded), dict(ctx.seconds))
        g_global = ctx.reveal(g_global, "global_update")
        start = time.perf_counter()
        update = self.optimizer.step(g_global)
        self.params += update
        ctx.seconds["optimizer"] += time.perf_counter() - start
        return RoundReport(rnd, list(ctx.active), dict(ctx.excluded), dict(ctx.seconds),
                           float(np.linalg.norm(update)))

    def _apply_blind(self, ctx: RoundContext, g_global) -> None:
        field = ctx.as_field(g_global)
        done = ctx.ask("apply", {c: {"aggregate": field} for c in self.transport.peers
                                 if c not in self.left},
                       expect={"applied": wire.CONFIG}, reach_excluded=True)
        for c in self.transport.peers:
            if c not in done and c not in self.left:
                self.left[c] = f"missed the apply phase of round {ctx.round}"
