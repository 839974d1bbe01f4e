"""The round engine: runs a protocol round after round and applies the server optimizer.

Per round:

1. ``train`` phase: every client gets the global model W and its training settings and
   uploads its protected pseudo-gradient and its sample count;
2. the protocol combines the uploads (possibly asking clients more) into the protected global
   pseudo-gradient G;
3. the server has G revealed and applies its optimizer: W ← W + Opt(G);
4. protocols that observe validation losses (Auto-FedRL) get each client's loss of the new
   W in a ``validate`` phase (and of the initial W before round 0). That phase carries W, so
   the next training request does not send it again.

Streaming: when the protocol can fix its weights before the uploads arrive (FedAvg and the
FedOpt family, Auto-FedRL; ``Protocol.planned_weights``), the clients report their sample
counts once before round 0 (``enroll``), and the server folds each upload into a running
sum as it arrives and drops it, so its memory is one model's worth, not one per client.

Server-blind runs (NVFlare's model) skip the reveal: the server sends the encrypted G to every
client in an ``apply`` phase, and the clients decrypt it and apply their own copy of the
server optimizer. The server then never learns W after round 0 (where it sends the public
initial model); a client that misses an ``apply`` is out of step and leaves the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from secagg.protocols.base import Protocol, Upload
from secagg.protocols.optimizers import ServerOptimizer, StepSchedule
from secagg import wire
from secagg.backends.base import ServerBackend
from secagg.dp import ClientDP, ScalarDP, realised_noise_multiplier
from secagg.errors import ClientInputError, ConfigError, RoundFailed
from secagg.server.audit import AuditLog
from secagg.server.round import RoundContext, StreamedSum
from secagg.server.transport import Transport

ENGINE_DECLARED = ("n_samples",)  # what the training phase itself shows the server
#: client-reported scalars that scalar DP (clip and noise on the client) covers
NOISABLE_SCALARS = ("loss_ratio", "delta_loss", "val_loss", "discrepancy")


@dataclass
class RoundReport:
    round: int
    clients: list[str]
    excluded: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)
    update_norm: float = 0.0


class Server:
    def __init__(self, protocol: Protocol, backend: ServerBackend, optimizer: ServerOptimizer,
                 transport: Transport, initial_params: np.ndarray, *,
                 client_lr: StepSchedule, local_steps: int, local_epochs: int | None = None,
                 audit: AuditLog | None = None,
                 min_clients: int = 1, max_message_bytes: int = wire.DEFAULT_MAX_BYTES,
                 server_blind: bool = False, allow_plaintext_updates: bool = False,
                 server_lr: StepSchedule | None = None, prox_mu: float = 0.0,
                 client_dp: ClientDP | None = None, scalar_dp: ScalarDP | None = None,
                 streaming: bool = True):
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
        self.audit.infrastructure |= set(backend.declares) | {"applied"}
        if server_blind:
            self.audit.declared.add("applied")  # clients' receipts for the apply phase
        self.min_clients = min_clients
        self.max_message_bytes = max_message_bytes
        self.server_blind = server_blind
        self.allow_plaintext_updates = allow_plaintext_updates
        self.server_lr = server_lr
        self.prox_mu = prox_mu  # FedProx: clients add μ/2·||w − W||² to their loss
        if client_dp is not None and not protocol.client_dp_compatible:
            raise ConfigError(f"{protocol.name}'s update is not one weighted sum of the "
                              "clients' noised uploads, so client-level DP cannot be accounted "
                              "for it; use a weighted-sum protocol (fedavg, fedadam, larc, ...)")
        self.client_dp, self.scalar_dp = client_dp, scalar_dp
        #: one entry per release of an aggregate: round, name, clients, realised multiplier
        self.privacy_events: list[dict] = []
        if client_dp is not None:
            self.audit.dp_protected.add("global_update")
        if scalar_dp is not None:
            self.audit.dp_protected |= set(NOISABLE_SCALARS) & set(protocol.reveals)
        #: fold uploads as they arrive where the protocol plans its weights (needs ``setup``)
        self.streaming = streaming and protocol.streams
        self.enrolled: dict[str, float] = {}  # sample counts reported before round 0
        self._holding: set[str] = set()  # clients already holding the current W
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
        if self.streaming:
            self._enroll(ctx)
        return dict(ctx.excluded)

    def _enroll(self, ctx: RoundContext) -> None:
        """Streaming runs: every client reports its sample count once, so the weights can be
        fixed before the uploads arrive. Each upload's count is checked against it."""
        replies = ctx.ask("enroll", {c: {} for c in ctx.active},
                          expect={"n_samples": wire.SCALAR})
        for c, env in replies.items():
            n = env.scalar("n_samples")
            if n > 0:
                self.enrolled[c] = n
            else:
                ctx.exclude(c, "enroll", ClientInputError(f"{c} reports {n} samples"))

    def run_round(self, rnd: int) -> RoundReport:
        peers = [c for c in self.transport.peers if c not in self.left]
        if self.server_lr is not None:
            self.optimizer.hyper["lr"] = self.server_lr.at(rnd)
        ctx = RoundContext(rnd, peers, self.n_params, self.backend, self.transport, self.audit,
                           None if self.server_blind else self.optimizer,
                           self.max_message_bytes, self.allow_plaintext_updates)
        if rnd == 0 and self.protocol.observes_validation:
            self._validate(ctx, send_model=True)  # the public initial model
        server_lr = self.protocol.begin_round(ctx)
        if server_lr is not None:
            self.optimizer.hyper["lr"] = float(server_lr)
        work = ({"epochs": self.local_epochs} if self.local_epochs else
                {"steps": self.local_steps})
        settings = {"lr": self.client_lr.at(rnd), **work}
        if self.prox_mu:
            settings["prox_mu"] = self.prox_mu
        settings.update(self._dp_settings())
        common = {}
        if self.server_blind:
            common["server_opt"] = wire.config(self.optimizer.config)
        model = self._model_field()  # one copy, shared by every request
        requests = {}
        for c in ctx.active:
            request = {**common, "train": wire.config(
                self.protocol.train_settings(ctx, c, dict(settings)))}
            # blind runs send only the public initial model; clients that validated the
            # current W already hold it
            if (rnd == 0 or not self.server_blind) and c not in self._holding:
                request["model"] = model
            requests[c] = {**request, **self.protocol.train_fields(ctx, c)}
        expect = {"pseudo_gradient": self.backend.upload_kind, "n_samples": wire.SCALAR,
                  **self.protocol.train_reply(ctx)}
        plan = self._planned_weights(ctx)
        if plan is None:
            replies = ctx.ask("train", requests, expect=expect)
            uploads: dict[str, Upload] = {}
            for c, env in replies.items():
                try:
                    uploads[c] = self._upload(ctx, c, env)
                except ClientInputError as exc:
                    ctx.exclude(c, "train", exc)
            self._check_enough(rnd, len(uploads), ctx)
            g_global = self.protocol.aggregate(ctx, uploads)
        else:
            total = ctx.running_sum(plan)
            ctx.ask("train", requests, expect=expect,
                    on_reply=lambda c, env: self._fold(ctx, total, c, env))
            self._check_enough(rnd, len(total.folded), ctx)
            g_global = total.result()
        self._holding = set()
        if self.server_blind:
            self._apply_blind(ctx, g_global)
            norm = 0.0
        else:
            g_global = ctx.reveal(g_global, "global_update")
            start = time.perf_counter()
            update = self.optimizer.step(g_global)
            self.params += update
            ctx.seconds["optimizer"] += time.perf_counter() - start
            norm = float(np.linalg.norm(update))
        if self.protocol.observes_validation:
            self._validate(ctx, send_model=not self.server_blind)
        self._account(ctx)
        return RoundReport(rnd, list(ctx.active), dict(ctx.excluded), dict(ctx.seconds), norm)

    def _planned_weights(self, ctx: RoundContext) -> dict[str, float] | None:
        if not self.streaming or not self.enrolled:
            return None
        counts = {c: self.enrolled[c] for c in ctx.active if c in self.enrolled}
        plan = self.protocol.planned_weights(ctx, counts) if counts else None
        return None if plan is None else dict(plan)

    def _upload(self, ctx: RoundContext, client: str, env: wire.Envelope) -> Upload:
        """Check and load one training reply (raises ClientInputError if it is unusable)."""
        n = env.scalar("n_samples")
        if not n > 0:
            raise ClientInputError(f"{client} reports {n} samples")
        extra = {k: env.scalar(k) for k in self.protocol.train_reply(ctx)}
        start = time.perf_counter()
        upload = Upload(self.backend.load(env, "pseudo_gradient", self.n_params), n, extra)
        ctx.seconds["load"] += time.perf_counter() - start
        self.protocol.check_upload(client, upload)
        return upload

    def _fold(self, ctx: RoundContext, total: StreamedSum, client: str,
              env: wire.Envelope) -> None:
        """Streaming: check an upload as it arrives, add it to the running sum, drop it."""
        upload = self._upload(ctx, client, env)
        if client in self.enrolled and upload.n_samples != self.enrolled[client]:
            raise ClientInputError(f"{client} enrolled with {self.enrolled[client]:g} samples "
                                   f"but reports {upload.n_samples:g}; its weight was fixed "
                                   "from the first")
        total.add(client, upload.handle)

    def _check_enough(self, rnd: int, usable: int, ctx: RoundContext) -> None:
        if usable < self.min_clients:
            raise RoundFailed(f"round {rnd}: {usable} usable uploads, need "
                              f"{self.min_clients}; exclusions: {ctx.excluded}")

    def _dp_settings(self) -> dict:
        """What every client applies before protecting its reply (clients are honest)."""
        out = {}
        if self.client_dp is not None:
            out["client_dp"] = self.client_dp.config()
        if self.scalar_dp is not None:
            out["scalar_dp"] = self.scalar_dp.config()
        return out

    def _account(self, ctx: RoundContext) -> None:
        """Client-level DP: the realised noise multiplier of every released sum."""
        if self.client_dp is None:
            return
        for name, weights in ctx.releases:
            self.privacy_events.append({
                "round": ctx.round, "release": name, "clients": len(weights),
                "noise_multiplier": realised_noise_multiplier(weights,
                                                              self.client_dp.client_sigma)})

    def _model_field(self) -> wire.Field:
        return wire.vector(self.params.astype(np.float32))

    def _validate(self, ctx: RoundContext, send_model: bool) -> None:
        """Every client still in the run reports its validation loss of the current W.

        With ``send_model`` the request carries W and the clients keep it for the next
        training phase; in blind runs after an update the clients already hold W."""
        peers = [c for c in self.transport.peers if c not in self.left]
        fields = {"model": self._model_field()} if send_model else {}
        if self.scalar_dp is not None:
            fields["scalar_dp"] = wire.config(self.scalar_dp.config())
        replies = ctx.ask("validate", {c: fields for c in peers},
                          expect={"val_loss": wire.SCALAR}, reach_excluded=True)
        # ``ask`` already excluded clients whose val_loss is missing or not finite
        losses = {c: env.scalar("val_loss") for c, env in replies.items()}
        if send_model:
            self._holding = set(replies)
        if not losses:
            raise RoundFailed(f"round {ctx.round}: no usable validation loss; exclusions: "
                              f"{ctx.excluded}")
        self.protocol.observe_validation(ctx, losses)

    def _apply_blind(self, ctx: RoundContext, g_global) -> None:
        field = ctx.as_field(g_global, "global_update")
        done = ctx.ask("apply", {c: {"aggregate": field} for c in self.transport.peers
                                 if c not in self.left},
                       expect={"applied": wire.CONFIG}, reach_excluded=True)
        for c in self.transport.peers:
            if c not in done and c not in self.left:
                self.left[c] = f"missed the apply phase of round {ctx.round}"
