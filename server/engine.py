"""The round engine: runs a protocol round after round and applies the server optimizer.

Per round:

1. ``train`` phase: every client gets the global model W and its training settings and
   uploads its protected pseudo-gradient and its sample count;
2. the protocol combines the uploads (possibly asking clients more) into the protected global
   pseudo-gradient G;
3. the update policy applies G: the server has it revealed and steps its optimizer,
   W ← W + Opt(G) (:class:`RevealAndStep`), or, server-blind (NVFlare's model), sends it
   encrypted to every client, who decrypt it and step their own copy (:class:`BlindApply`);
4. protocols that observe validation losses (Auto-FedRL) get each client's loss of the new
   W in a ``validate`` phase (and of the initial W before round 0). That phase carries W, so
   the next training request does not send it again.

Streaming: when the protocol can fix its weights before the uploads arrive (FedAvg and the
FedOpt family, Auto-FedRL; ``Protocol.planned_weights``), the clients report their sample
counts once before round 0 (:class:`Enrolment`), and the server folds each upload into a
running sum as it arrives and drops it, so its memory is one model's worth.

A phase that leaves no usable client raises :class:`~secagg.errors.RoundAborted`, whatever
the phase; the experiment driver records it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import ServerBackend
from secagg.dp import ClientDP, joint_noise_multiplier, realised_noise_multiplier
from secagg.errors import (
    ClientInputError,
    ConsentRefused,
    GroupSatOut,
    ProtocolStateError,
    RoundAborted,
    RoundSkipped,
)
from secagg.parts import PART_FIELD, part_bounds
from secagg.protocols.base import Protocol, RoundAPI, Upload
from secagg.protocols.optimizers import ServerOptimizer, StepSchedule
from secagg.protocols.pieces import FederatedInitialisation, ValidationFeedback, piece
from secagg.server.audit import AuditLog
from secagg.server.exchange import Exchange
from secagg.server.plan import RunPolicy, TrainingPlan, check_protocol_run
from secagg.server.round import RoundContext, StreamedSum, capped_weights, check_weights
from secagg.server.transport import Transport

#: consents a client may miss by giving no answer (its node down or late between its upload
#: and its consent) and still be asked next round: each miss skips a round (its upload is
#: in the sum, which cannot be opened without it), so this bounds the rounds one client can
#: stall per run; a refusal, or one miss more, and it leaves the run
MISSED_CONSENTS_FORGIVEN = 1

#: what each DP mechanism covers, as the audit summary states it (``dp_coverage``)
DP_SGD_COVERS = (
    "sample-level DP-SGD: each client's training (its ε, per client and seed, in "
    "privacy.json) protects every sample in it; not client-level: whether a client took part, "
    "and what it reports outside its training (sample counts, losses), are not covered"
)
CLIENT_DP_COVERS = "client-level DP: each client's update clipped and noised before it is protected"

ENGINE_DECLARED = ("n_samples",)  # what the training phase itself shows the server


def _satisfies_round_api(ctx: RoundContext) -> RoundAPI:
    return ctx  # mypy checks here that RoundContext offers everything a protocol may use


@dataclass
class RoundReport:
    round: int
    clients: list[str]
    excluded: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)
    update_norm: float = 0.0
    #: what clients reported with their upload on the run's request (DP-SGD's ε)
    reports: dict[str, dict[str, float]] = field(default_factory=dict)
    #: why the round made no update (contributors refused a release), or None
    skipped: str | None = None
    #: clients whose share of a sum the run's cap changed: (share asked, share used)
    capped: dict[str, tuple[float, float]] = field(default_factory=dict)


class PrivacyLedger:
    """Client-level DP: one Gaussian mechanism per round, with its realised multiplier.

    ``sums``: the sums released this round (revealed, or sent to clients) are accounted
    jointly, since they share the same noised uploads (``secagg.dp.joint_noise_multiplier``).
    Where the server sees every noised upload (``sees_uploads``: plain) each upload is itself
    a release of multiplier σ_c, which is what this run's server got (``noise_multiplier``);
    ``sums_multiplier`` stays what a server seeing only the sums would have got."""

    def __init__(self, client_dp: ClientDP | None, *, sees_uploads: bool):
        self.client_dp = client_dp
        self.sees_uploads = sees_uploads
        self.events: list[dict[str, Any]] = []

    def record(self, ctx: RoundContext) -> None:
        if self.client_dp is None or not ctx.releases:
            return
        sigma = self.client_dp.client_sigma
        sums = joint_noise_multiplier([weights for _, weights in ctx.releases], sigma)
        self.events.append(
            {
                "round": ctx.round,
                "release": "+".join(name for name, _ in ctx.releases),
                # each release as if it were alone: what accounting them separately gives
                "per_release_multipliers": [
                    realised_noise_multiplier(weights, sigma) for _, weights in ctx.releases
                ],
                "clients": len({c for _, weights in ctx.releases for c in weights}),
                "noise_multiplier": min(sigma, sums) if self.sees_uploads else sums,
                "sums_multiplier": sums,
                "against": "each noised upload" if self.sees_uploads else "the released sums",
            }
        )


class Enrolment:
    """Sample counts the clients report once before round 0 (streaming runs), so the
    weights can be fixed before the uploads arrive; each upload's count is checked against
    them."""

    def __init__(self):
        self.counts: dict[str, float] = {}

    def run(self, ctx: RoundContext) -> None:
        replies = ctx.ask("enroll", {c: {} for c in ctx.active}, expect={"n_samples": wire.SCALAR})
        for c, env in replies.items():
            n = env.scalar("n_samples")
            if n > 0:
                self.counts[c] = n
            else:
                ctx.exclude(c, "enroll", ClientInputError(f"{c} reports {n} samples"))

    def check(self, client: str, upload: Upload) -> None:
        if client in self.counts and upload.n_samples != self.counts[client]:
            raise ClientInputError(
                f"{client} enrolled with {self.counts[client]:g} samples "
                f"but reports {upload.n_samples:g}; its weight was fixed "
                "from the first"
            )


class RevealAndStep:
    """The server holds W: it has G revealed and steps its optimizer. Every training request
    carries W unless the client already holds it (it validated the current W)."""

    blind = False

    def __init__(self, initial_params: np.ndarray):
        self.params = np.asarray(initial_params, dtype=np.float64).copy()
        self.holding: set[str] = set()  # clients already holding the current W

    def model_for(self, client: str, round_number: int) -> bool:
        return client not in self.holding

    def apply(self, server: Server, ctx: RoundContext, g_global: Any) -> float:
        g = ctx.reveal(g_global, "global_update")
        start = time.perf_counter()
        update = server.optimizer.step(g, self.params)
        self.params += update
        ctx.seconds["optimizer"] += time.perf_counter() - start
        self.holding = set()
        return float(np.linalg.norm(update))

    def apply_part(self, server: Server, ctx: RoundContext, g_part: Any, lo: int, hi: int) -> float:
        """A round in parts: part [lo, hi) of G revealed and stepped; the squared norm of
        that part of the update."""
        g = ctx.reveal(g_part, "global_update")
        start = time.perf_counter()
        update = server.optimizer.step_part(g, self.params[lo:hi], lo, hi)
        self.params[lo:hi] += update
        ctx.seconds["optimizer"] += time.perf_counter() - start
        return float(update @ update)


class BlindApply(RevealAndStep):
    """Server-blind: the server sends only the public initial model and, each round, the
    encrypted G to every client, who decrypt it and step their own optimizer copy. A client
    that misses an ``apply`` is out of step and leaves the run."""

    blind = True

    def model_for(self, client: str, round_number: int) -> bool:
        return round_number == 0 and client not in self.holding

    def apply(self, server: Server, ctx: RoundContext, g_global: Any) -> float:
        aggregate = ctx.as_fields(g_global, "global_update")
        peers = server.peers()
        done = ctx.ask(
            "apply",
            {c: aggregate for c in peers},
            expect={"applied": wire.CONFIG},
            reach_excluded=True,
        )
        for c in peers:
            if c not in done:
                server.left[c] = f"missed the apply phase of round {ctx.round}"
        self.holding = set()
        return 0.0


class Server:
    """Runs ``protocol`` on ``backend`` over ``transport``.

    Parameters:
        protocol: the server half of the aggregation algorithm.
        backend: the server half of the backend (it holds no secret key).
        optimizer: the server optimizer applied to the revealed global pseudo-gradient.
        transport: how envelopes reach the clients.
        initial_params: the public initial model.
        plan: what clients are asked to do each round.
        policy: server-blind, plaintext updates, streaming, minimum clients, message limit.
        server_lr: a schedule for the optimizer's learning rate (RoLePRO's phases).
        audit: where every message is recorded (a new log by default).
    """

    def __init__(
        self,
        protocol: Protocol,
        backend: ServerBackend,
        optimizer: ServerOptimizer,
        transport: Transport,
        initial_params: np.ndarray,
        *,
        plan: TrainingPlan | None = None,
        policy: RunPolicy | None = None,
        server_lr: StepSchedule | None = None,
        audit: AuditLog | None = None,
    ):
        self.plan = plan if plan is not None else TrainingPlan()
        self.policy = policy if policy is not None else RunPolicy()
        caps = protocol.capabilities
        check_protocol_run(
            protocol,
            backend=backend.name,
            backend_can_read=backend.can_read,
            policy=self.policy,
            client_dp=self.plan.client_dp is not None,
        )
        self.protocol, self.backend, self.optimizer = protocol, backend, optimizer
        self.transport = transport
        self.server_lr = server_lr
        self.audit = audit if audit is not None else AuditLog()
        # what clients report beside their upload (DP-SGD's ε, noise multiplier, sampling
        # rate and counted steps): functions of public settings and each client's n_i
        # (which n_samples shows anyway), declared plaintext items
        reports = set(self.plan.reports)
        self.audit.declared |= (
            set(ENGINE_DECLARED) | set(caps.reveals) | set(backend.declares) | reports
        )
        # "basis": the digest of what an upload was made from (the request and the model),
        # which the clients' consents bind; nothing the server did not send
        self.audit.declared.add("basis")
        self.audit.infrastructure |= set(backend.declares) | {"applied", "basis"} | reports
        self.audit.who_can_decrypt = backend.who_can_decrypt
        self.audit.weights_vary = caps.weights_vary
        if self.policy.server_blind:
            self.audit.declared.add("applied")  # clients' receipts for the apply phase
        if "dp_sgd_epsilon" in self.plan.reports:  # the clients train with DP-SGD
            for item in ("global_update", *self.audit.update_fields):
                self.audit.dp_protect(item, DP_SGD_COVERS)
        if self.plan.client_dp is not None:
            self.audit.dp_protect("global_update", CLIENT_DP_COVERS)
        if self.plan.scalar_dp is not None:
            for item in caps.client_scalars:
                self.audit.dp_protect(item, "scalar DP: each client's value clipped and noised")
        self.ledger = PrivacyLedger(self.plan.client_dp, sees_uploads=backend.can_read)
        self.updates = (
            BlindApply(initial_params)
            if self.policy.server_blind
            else RevealAndStep(initial_params)
        )
        #: fold uploads as they arrive where the protocol plans its weights (needs ``setup``)
        self.streaming = self.policy.streaming and caps.streams
        #: the parts a round moves the model in (``secagg.parts``), or None: whole
        bounds = part_bounds(np.asarray(initial_params).size, self.policy.part_values)
        self.parts = bounds if len(bounds) > 1 and self.streaming else None
        #: the parts of the current round released and stepped so far
        self.parts_stepped = 0
        self.enrolment = Enrolment()
        self.left: dict[str, str] = {}  # clients that left the run (blind: missed an apply)
        #: consents each client missed by not answering (its node down or late)
        self.missed_consents: Counter[str] = Counter()
        #: rounds that moved the model so far (``RoundContext.epoch``)
        self.epoch = 0

    @property
    def params(self) -> np.ndarray:
        """The global model as the server knows it (the initial one in server-blind runs)."""
        return self.updates.params

    @property
    def n_params(self) -> int:
        return self.params.size

    @property
    def privacy_events(self) -> list[dict[str, Any]]:
        return self.ledger.events

    def peers(self) -> list[str]:
        return [c for c in self.transport.peers if c not in self.left]

    def _context(self, round_number: int, optimizer: ServerOptimizer | None = None) -> RoundContext:
        exchange = Exchange(
            round_number, self.peers(), self.transport, self.audit, self.policy.max_message_bytes
        )
        return RoundContext(
            exchange,
            self.n_params,
            self.backend,
            optimizer,
            self.policy.allow_plaintext_updates,
            model=None if self.updates.blind else self._round_model(),
            max_weight_share=self.policy.max_weight_share,
            epoch=self.epoch,
        )

    def _round_model(self) -> np.ndarray:
        """The model the round starts from, for the protocol to read: a read-only view, not
        a copy (a model's worth of memory). The step at the end of the round changes the
        params in place, after the protocol's last use of the round's context."""
        view = self.params.view()
        view.flags.writeable = False
        return view

    def setup(self, rounds: int) -> dict[str, str]:
        """Run the backend's one-off phases (key setup) before round 0, the enrolment and
        the protocol's initialisation of the model (``Protocol.initialise``).

        The decryption budget is what the run will release: rounds × reveals per round, and
        the reveals of the initialisation.
        Returns the clients excluded during setup, with reasons.
        """
        self.audit.begin_setup()  # audited as round 0, stage "setup"
        ctx = self._context(0)
        budget = rounds * self.protocol.capabilities.reveals_per_round
        initialisation = piece(self.protocol, FederatedInitialisation)
        if initialisation is not None:
            budget += initialisation.initial_reveals()
        self.backend.setup(ctx, budget)
        if self.streaming:
            self.enrolment.run(ctx)
        self._initialise(ctx)
        # a client that failed key setup or enrolment holds no key or no planned weight: it
        # leaves the run (every later request would fail or find no weight for it)
        for client, why in ctx.excluded.items():
            self.left[client] = f"excluded at set-up: {why}"
        need = self.policy.required_clients(len(self.transport.peers))
        if len(self.peers()) < need:  # before any upload, so nothing is released
            raise RoundAborted(
                f"set-up left {len(self.peers())} of {len(self.transport.peers)} clients, "
                f"need {need} (min_clients {self.policy.min_clients}); exclusions: "
                f"{ctx.excluded}",
                round=ctx.round,
                phase="setup",
                exclusions=ctx.excluded,
            )
        return dict(ctx.excluded)

    def _initialise(self, ctx: RoundContext) -> None:
        """The protocol's own initialisation of the global model (DEC's centroids)."""
        initialisation = piece(self.protocol, FederatedInitialisation)
        if initialisation is None:
            return
        start = self.params.copy()
        initial = np.asarray(initialisation.initialise(ctx, start), dtype=np.float64)
        if initial.shape != start.shape or not np.all(np.isfinite(initial)):
            raise ProtocolStateError(
                f"{self.protocol.name} initialised a model of shape {initial.shape} "
                f"(finite: {bool(np.all(np.isfinite(initial)))}); the model has {start.shape}"
            )
        self.updates.params = initial

    def run_round(self, number: int) -> RoundReport:
        self.audit.begin_round()  # audited as round number + 1 (metrics.csv's numbering)
        for client, why in self.left.items():  # the summary names every round a client missed
            self.audit.absent(number, client, why)
        if self.server_lr is not None:
            self.optimizer.hyper["lr"] = self.server_lr.at(number)
        ctx = self._context(number, None if self.updates.blind else self.optimizer)
        feedback = piece(self.protocol, ValidationFeedback)
        if number == 0 and feedback is not None:
            self._validate(ctx, feedback, send_model=True)  # the public initial model
        server_lr = self.protocol.begin_round(ctx)
        if server_lr is not None:
            self.optimizer.hyper["lr"] = float(server_lr)
        try:
            if self.parts is not None:
                reports, norm = self._round_in_parts(ctx, self.parts)
            else:
                g_global, reports = self._train(ctx)
                norm = self.updates.apply(self, ctx, g_global)
        except ConsentRefused as exc:
            if not exc.culprits and not isinstance(exc, RoundSkipped):
                raise  # every contributor refused: the request breaks the clients' policy
            return self._skipped(ctx, exc)
        self.epoch += 1  # the round moved the model
        if feedback is not None:
            self._validate(ctx, feedback, send_model=not self.updates.blind)
        self.ledger.record(ctx)
        return RoundReport(
            number,
            list(ctx.active),
            dict(ctx.excluded),
            dict(ctx.seconds),
            norm,
            reports,
            capped=dict(ctx.capped_shares),
        )

    def _skipped(self, ctx: RoundContext, exc: ConsentRefused) -> RoundReport:
        """Some contributors refused a release the others consented to, or the round's
        uploads cannot make a release the clients' rules allow (``RoundSkipped``): nothing can
        be opened this round, so the round makes no update, and the refusers leave the run,
        which goes on without them. A contributor that gave no answer at all (its node went
        down between its upload and its consent) is a dropout, not a refuser: it is asked
        again next round, once per run (:data:`MISSED_CONSENTS_FORGIVEN`; each such miss
        skips a round, so the bound caps the rounds one client can stall). What was
        released before the refusal is still accounted."""
        for client in exc.culprits:
            if client in exc.unanswered:
                self.missed_consents[client] += 1
                if self.missed_consents[client] <= MISSED_CONSENTS_FORGIVEN:
                    continue  # back next round
                self.left[client] = (
                    f"missed its consent in round {ctx.round}, and "
                    f"{self.missed_consents[client] - 1} before"
                )
            else:
                self.left[client] = f"refused consent in round {ctx.round}"
        self.ledger.record(ctx)
        why = str(exc)
        if self.parts is not None and self.parts_stepped:
            self.epoch += 1  # its first parts were stepped: the model moved
            # the parts released before the refusal were stepped: the round is not undone
            why += (
                f"; but the first {self.parts_stepped} of the model's {len(self.parts)} "
                "parts had already been released and stepped"
            )
        return RoundReport(
            ctx.round,
            list(ctx.active),
            dict(ctx.excluded),
            dict(ctx.seconds),
            0.0,
            {},
            skipped=why,
        )

    # ---- the training phase ----------------------------------------------------------------
    def _requests(
        self, ctx: RoundContext, common: dict[str, wire.Field] | None = None
    ) -> dict[str, dict[str, wire.Field]]:
        """Every active client's training request; with ``common`` (a round in parts: its
        part field) the model is not sent, the clients were sent it part by part."""
        settings = self.plan.settings(ctx.round)
        in_parts = common is not None
        common = dict(common or {})
        if self.updates.blind:
            common["server_opt"] = wire.config(self.optimizer.config)
        # one copy, shared by all
        model = None if in_parts else wire.vector(self.params.astype(np.float32))
        requests = {}
        for c in ctx.active:
            request = {
                **common,
                "train": wire.config(self.protocol.train_settings(ctx, c, dict(settings))),
            }
            if model is not None and self.updates.model_for(c, ctx.round):
                request["model"] = model
            requests[c] = {**request, **self.protocol.train_fields(ctx, c)}
        return requests

    def _enough(self, ctx: RoundContext, usable: int) -> None:
        """Abort before combining anything when fewer uploads than the policy's minimum."""
        need = self.policy.required_clients(len(self.transport.peers))
        if usable < need:
            raise RoundAborted(
                f"round {ctx.round}: {usable} usable uploads, need {need} (min_clients "
                f"{self.policy.min_clients}); exclusions: {ctx.excluded}",
                round=ctx.round,
                phase="train",
                exclusions=ctx.excluded,
            )

    def _train_expect(self, ctx: RoundContext) -> dict[str, str]:
        """The fields every training reply carries."""
        return {
            "pseudo_gradient": self.backend.upload_kind,
            "n_samples": wire.SCALAR,
            **{name: wire.SCALAR for name in self.plan.reports},
            **self.protocol.train_reply(ctx),
        }

    def _load_upload(
        self,
        ctx: RoundContext,
        client: str,
        env: wire.Envelope,
        length: int,
        reports: dict[str, dict[str, float]],
    ) -> Upload:
        """Check and load one training reply (ClientInputError if it is unusable), and
        keep what the client reported with it in ``reports``."""
        n = env.scalar("n_samples")
        if not n > 0:
            raise ClientInputError(f"{client} reports {n} samples")
        extra = {k: env.scalar(k) for k in self.protocol.train_reply(ctx)}
        loaded = Upload(self._load_handle(ctx, client, env, length), n, extra)
        self.protocol.check_upload(ctx, client, loaded)
        reports[client] = {name: env.scalar(name) for name in self.plan.reports}
        return loaded

    def _train(self, ctx: RoundContext) -> tuple[Any, dict[str, dict[str, float]]]:
        """Ask for the uploads; return their protected combination and what clients
        reported with them."""
        expect = self._train_expect(ctx)
        optional = self.backend.train_reply_fields
        reports: dict[str, dict[str, float]] = {}

        def upload(client: str, env: wire.Envelope) -> Upload:
            return self._load_upload(ctx, client, env, self.n_params, reports)

        plan = self._planned_weights(ctx)
        requests = self._requests(ctx)
        if plan is None:
            opened = self.protocol.opened_weights(ctx)
            if opened:  # the sum as it will be formed: capped as ``weighted_sum`` caps it
                hint = capped_weights(check_weights(opened), ctx.max_weight_share)
                for c, request in requests.items():
                    request.update(self.backend.opening_fields(ctx, c, hint))
            uploads = ctx.ask("train", requests, expect=expect, on_reply=upload, optional=optional)
            # participation by groups: a group with a member missing sits the round out whole
            for client, why in self.backend.sitting_out(list(uploads)).items():
                ctx.exclude(client, "train", GroupSatOut(why))
                del uploads[client]
            self._enough(ctx, len(uploads))
            return self.protocol.aggregate(ctx, uploads), reports
        total: StreamedSum = ctx.running_sum(plan)
        requests = {c: r for c, r in requests.items() if c in total.weights}  # enrolled only
        for c, request in requests.items():
            if self.backend.weights_at_client:  # each client applies its own planned weight
                request["upload_weight"] = wire.scalar(total.weights[c])
            request.update(self.backend.training_fields(ctx, c, total.weights))

        # participation by groups: a group is left out whole only once every upload has
        # arrived, and a folded upload cannot be taken out again: the uploads wait, then the
        # whole groups' are folded with their planned weights (the same integers every round)
        by_groups = self.backend.by_groups
        held: dict[str, Any] = {}

        def fold(client: str, env: wire.Envelope) -> None:
            loaded = upload(client, env)
            self.enrolment.check(client, loaded)
            if by_groups:
                held[client] = loaded.handle
            else:
                total.add(client, loaded.handle)

        ctx.ask("train", requests, expect=expect, on_reply=fold, optional=optional)
        if by_groups:
            out = self.backend.sitting_out(list(held))
            for client, why in out.items():
                ctx.exclude(client, "train", GroupSatOut(why))
            for client, handle in held.items():
                if client not in out:
                    total.add(client, handle)
        self._enough(ctx, len(total.folded))
        return self.protocol.finish_sum(ctx, total), reports

    # ---- a round in parts (``secagg.parts``) ------------------------------------------------
    def _round_in_parts(
        self, ctx: RoundContext, bounds: list[tuple[int, int]]
    ) -> tuple[dict[str, dict[str, float]], float]:
        """The model out a part at a time, then per part: its uploads folded into a
        part-sized running sum, released, and that slice of the model stepped. Returns
        what the clients reported with part 0 and the update's norm."""
        plan = self._planned_weights(ctx)
        if plan is None:
            raise RoundAborted(
                f"round {ctx.round}: a round in parts needs the weights planned before the "
                "uploads, and no client enrolled",
                round=ctx.round,
                phase="train",
                exclusions=ctx.excluded,
            )
        holders = [c for c in ctx.active if c in plan and self.updates.model_for(c, ctx.round)]
        for index, (lo, hi) in enumerate(bounds):
            if not holders:
                break
            part = {
                PART_FIELD: wire.config({"index": index}),
                "model": wire.vector(self.params[lo:hi].astype(np.float32)),
            }
            sent = ctx.ask("model_part", {c: part for c in holders}, expect={})
            holders = [c for c in holders if c in sent]
        reports: dict[str, dict[str, float]] = {}
        folded: set[str] = set()  # the clients whose part 0 was folded: asked for the rest
        squared = 0.0
        self.parts_stepped = 0
        for index, (lo, hi) in enumerate(bounds):
            total = ctx.running_sum(plan, hi - lo)
            field = {PART_FIELD: wire.config({"index": index})}
            if index == 0:
                requests = self._requests(ctx, field)
                phase, expect = "train", self._train_expect(ctx)
                optional = self.backend.train_reply_fields
            else:  # every client that folded part 0, for the next part of the same update
                requests = {c: dict(field) for c in ctx.active if c in folded}
                phase, expect = "upload_part", {"pseudo_gradient": self.backend.upload_kind}
                optional = {}
            requests = {c: r for c, r in requests.items() if c in total.weights}
            for c, request in requests.items():
                if self.backend.weights_at_client:
                    request["upload_weight"] = wire.scalar(total.weights[c])

            def fold(client: str, env: wire.Envelope, total: StreamedSum = total) -> None:
                if phase == "train":
                    loaded = self._load_upload(ctx, client, env, total.length, reports)
                    self.enrolment.check(client, loaded)
                    handle = loaded.handle
                else:
                    handle = self._load_handle(ctx, client, env, total.length)
                total.add(client, handle)

            ctx.ask(phase, requests, expect=expect, on_reply=fold, optional=optional)
            self._enough(ctx, len(total.folded))
            if index == 0:
                folded = set(total.folded)
            g_part = self.protocol.finish_sum(ctx, total)
            squared += self.updates.apply_part(self, ctx, g_part, lo, hi)
            ctx.forget(g_part)  # released and stepped: the round keeps one part's sum
            self.parts_stepped = index + 1
        self.updates.holding = set()
        return reports, squared**0.5

    def _load_handle(self, ctx: RoundContext, client: str, env: wire.Envelope, length: int) -> Any:
        """A reply's ``pseudo_gradient`` loaded and checked by the backend (a training reply's,
        or a later part's); a copy of an upload already loaded this round is refused
        (DuplicateUpload)."""
        start = time.perf_counter()
        handle = self.backend.load(env, "pseudo_gradient", length)
        ctx.loaded(client, "pseudo_gradient", handle)
        self.backend.remember_upload(client, env)
        ctx.seconds["load"] += time.perf_counter() - start
        return handle

    def _planned_weights(self, ctx: RoundContext) -> dict[str, float] | None:
        if not self.streaming or not self.enrolment.counts:
            return None
        counts = {c: self.enrolment.counts[c] for c in ctx.active if c in self.enrolment.counts}
        plan = self.protocol.planned_weights(ctx, counts) if counts else None
        return None if plan is None else dict(plan)

    # ---- other engine phases -----------------------------------------------------------------
    def _validate(self, ctx: RoundContext, feedback: ValidationFeedback, send_model: bool) -> None:
        """Every client still in the run reports its validation loss of the current W.

        With ``send_model`` the request carries W and the clients keep it for the next
        training phase; in blind runs after an update the clients already hold W."""
        fields: dict[str, wire.Field] = {}
        if send_model:
            fields["model"] = wire.vector(self.params.astype(np.float32))
        if self.plan.scalar_dp is not None:
            fields["scalar_dp"] = wire.config(self.plan.scalar_dp.config())
        replies = ctx.ask(
            "validate",
            {c: fields for c in self.peers()},
            expect={"val_loss": wire.SCALAR},
            reach_excluded=True,
        )
        # ``ask`` already excluded clients whose val_loss is missing or not finite
        losses = {c: env.scalar("val_loss") for c, env in replies.items()}
        if send_model:
            self.updates.holding = set(replies)
        if not losses:
            raise RoundAborted(
                f"round {ctx.round}: no usable validation loss; exclusions: {ctx.excluded}",
                round=ctx.round,
                phase="validate",
                exclusions=ctx.excluded,
            )
        feedback.observe_validation(ctx, losses)

    def sealed_model(self, round_number: int) -> tuple[str, bytes]:
        """The global model sealed by a client for the experimenter's key (server-blind runs:
        the experimenter evaluates the model; the server relays bytes it cannot open)."""
        ctx = self._context(round_number)
        for client in self.peers():
            reply = ctx.ask(
                "observe",
                {client: {}},
                expect={"sealed_model": wire.CIPHERTEXT},
                reach_excluded=True,
            )
            if client in reply:
                return client, b"".join(
                    bytes(p) for p in reply[client].ciphertext_parts("sealed_model")
                )
        raise RoundAborted(
            f"round {round_number}: no client sealed the model for the "
            f"experimenter; {ctx.excluded}",
            round=round_number,
            phase="observe",
            exclusions=ctx.excluded,
        )
