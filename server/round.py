"""One round as a protocol sees it: ask clients, sum their protected vectors, reveal.

Every request and reply goes through ``ask``, which serialises the envelope, counts and
audits it, and checks the reply before a protocol touches it: a client whose reply is
undecodable, from the wrong sender, for the wrong round or phase (a replay), or lacking an
expected field is excluded from the rest of the round, and the audit says why.

``ask`` can hand each reply to a callback as it arrives instead of collecting them: with a
:class:`StreamedSum` the server folds every upload into a running sum and drops it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable, Mapping

import numpy as np

from secagg.protocols.optimizers import ServerOptimizer
from secagg import wire
from secagg.backends.base import ServerBackend
from secagg.protocols.base import Plaintext, Upload
from secagg.errors import (ClientInputError, ConfigError, DuplicateMessage, MalformedMessage,
                           UnexpectedField, UnknownSender)
from secagg.wire import Envelope, Field
from secagg.server.audit import AuditLog
from secagg.server.transport import Transport

SERVER = "server"


class RoundContext:
    def __init__(self, rnd: int, clients: list[str], n_params: int, backend: ServerBackend,
                 transport: Transport, audit: AuditLog,
                 optimizer: ServerOptimizer | None,
                 max_message_bytes: int = wire.DEFAULT_MAX_BYTES,
                 allow_plaintext_updates: bool = False):
        self.round = rnd
        self.n_params = n_params
        self.backend = backend
        self.transport = transport
        self.audit = audit
        self._optimizer = optimizer
        self.max_message_bytes = max_message_bytes
        self.allow_plaintext_updates = allow_plaintext_updates
        self.active = list(clients)
        self.excluded: dict[str, str] = {}
        #: weights of every weighted sum formed this round, and the sums that left the
        #: server's protected state (revealed, or sent to clients): client-level DP accounts
        #: each release with its realised weights
        self._sums: list[tuple[Any, dict[str, float]]] = []
        self.releases: list[tuple[str, dict[str, float]]] = []
        self.seconds: dict[str, float] = defaultdict(float)

    @property
    def upload_kind(self) -> str:
        return self.backend.upload_kind

    @property
    def server_optimizer(self) -> ServerOptimizer | None:
        return self._optimizer

    def exclude(self, client: str, phase: str, error: Exception) -> None:
        if client in self.active:
            self.active.remove(client)
        self.excluded[client] = f"{phase}: {type(error).__name__}: {error}"
        self.audit.excluded(self.round, phase, client, error)

    # ---- messaging ----------------------------------------------------------------------
    def ask(self, phase: str, messages: Mapping[str, Mapping[str, Field]],
            expect: Mapping[str, str] | None = None, reach_excluded: bool = False,
            on_reply: Callable[[str, Envelope], Any] | None = None) -> dict[str, Any]:
        """Send each active client its fields; return the replies that pass every check.

        ``expect`` maps reply field names to wire kinds; scalars are also checked finite.
        ``reach_excluded`` also addresses clients excluded earlier in the round (to keep
        their state in step); a failure then is recorded but changes nothing else.
        ``on_reply(client, envelope)`` is called as each good reply arrives and its result
        is kept instead of the envelope (a ClientInputError it raises excludes the client);
        its time counts to whatever it does, not to the phase.
        Replies are returned in the order of ``messages``, however they arrived.
        """
        start = time.perf_counter()
        in_callbacks = 0.0
        targets = [c for c in messages if c in self.active or reach_excluded]

        def outgoing():  # serialised one at a time, as the transport asks for them
            for client in targets:
                request = Envelope(SERVER, client, self.round, phase, dict(messages[client]))
                data = request.to_bytes()
                self.audit.message("sent", request, len(data), client)
                yield client, data

        replies: dict[str, Any] = {}
        for client, raw in self.transport.exchange(outgoing()):
            try:
                if isinstance(raw, ClientInputError):
                    raise raw
                begin = time.perf_counter()
                try:
                    reply = self._accept(client, phase, raw, expect or {})
                finally:  # decoding and checking envelopes: the server's share of an upload
                    self.seconds["receive"] += time.perf_counter() - begin
                del raw
                if on_reply is None:
                    replies[client] = reply
                else:
                    begin = time.perf_counter()
                    try:
                        replies[client] = on_reply(client, reply)
                    finally:
                        in_callbacks += time.perf_counter() - begin
                        del reply  # a streamed upload lives on only in the running sum
            except ClientInputError as exc:
                self.exclude(client, phase, exc)
        self.seconds[phase] += time.perf_counter() - start - in_callbacks
        return {c: replies[c] for c in targets if c in replies}

    def _accept(self, client: str, phase: str, raw: bytes, expect: Mapping[str, str]
                ) -> Envelope:
        try:
            reply = Envelope.from_bytes(raw, self.max_message_bytes)
        except ClientInputError as exc:
            self.audit.undecodable(self.round, phase, client, len(raw), str(exc))
            raise
        self.audit.message("received", reply, len(raw), client)
        if reply.sender != client or reply.recipient != SERVER:
            raise UnknownSender(f"reply to {client} claims to come from {reply.sender!r}")
        if reply.round != self.round or reply.phase != phase:
            raise DuplicateMessage(
                f"{client} answered round {reply.round} phase {reply.phase!r} "
                f"during round {self.round} phase {phase!r} (replayed or stale)")
        for name, kind in expect.items():
            reply.get(name, kind)
            if kind == wire.SCALAR:
                reply.scalar(name)
        extra = set(reply.fields) - set(expect)
        if expect and extra:
            raise UnexpectedField(f"{client} sent undeclared fields {sorted(extra)}")
        return reply

    # ---- aggregation --------------------------------------------------------------------
    def weighted_sum(self, handles: Mapping[str, Any], weights: Mapping[str, float]) -> Any:
        clients = [c for c in handles if c in weights and c in self.active]
        if not clients:
            raise MalformedMessage("no client left to aggregate")
        start = time.perf_counter()
        total = self.backend.weighted_sum([handles[c] for c in clients],
                                          [float(weights[c]) for c in clients])
        self.seconds["aggregate"] += time.perf_counter() - start
        self._sums.append((total, {c: float(weights[c]) for c in clients}))
        return total

    def running_sum(self, weights: Mapping[str, float]) -> "StreamedSum":
        return StreamedSum(self, weights)

    def _released(self, handle: Any, name: str) -> None:
        for i, (total, weights) in enumerate(self._sums):
            if total is handle:
                self.releases.append((name, weights))
                del self._sums[i]
                return

    def as_field(self, handle: Any, name: str = "aggregate") -> Field:
        self._released(handle, name)
        return self.backend.to_field(handle)

    def load(self, replies: Mapping[str, Envelope], name: str) -> dict[str, Any]:
        handles = {}
        for client, env in replies.items():
            try:
                handles[client] = self.backend.load(env, name, self.n_params)
            except ClientInputError as exc:
                self.exclude(client, env.phase, exc)
        return handles

    @staticmethod
    def plaintext(values: np.ndarray) -> Plaintext:
        return Plaintext(np.asarray(values, dtype=np.float64))

    def individual_updates(self, uploads: Mapping[str, Upload]) -> dict[str, np.ndarray]:
        if self.backend.can_read:
            return {c: self.backend.read(u.handle) for c, u in uploads.items()
                    if c in self.active}
        if not self.allow_plaintext_updates:
            raise ConfigError(
                "this aggregator needs every client's update in plaintext (a median or a "
                "trimmed mean is not a sum); on an encrypted backend allow it explicitly "
                "(--allow-plaintext-updates) and the audit will record the revealed updates")
        replies = self.ask("plaintext_update", {c: {} for c in uploads},
                           expect={"pseudo_gradient": wire.VECTOR})
        return {c: env.vector("pseudo_gradient", self.n_params) for c, env in replies.items()}

    def reveal(self, handle: Any, name: str) -> np.ndarray:
        """The backend reveals: plain reads it, ckks asks a decryptor client (audited as a
        received plaintext vector named ``name``). A :class:`Plaintext` result is already
        the server's: it was computed from revealed aggregates."""
        if isinstance(handle, Plaintext):
            return handle.values
        self._released(handle, name)
        start = time.perf_counter()
        value, by = self.backend.reveal(self, handle, name)
        if by == SERVER:  # a decryptor's reveal is timed and audited by ``ask``
            self.seconds["reveal"] += time.perf_counter() - start
            self.audit.reveal(self.round, "reveal", name, int(value.size), by=SERVER)
        return value


class StreamedSum:
    """A weighted sum whose weights were fixed before the uploads arrived, folded in as each
    upload arrives. A client that never arrives is renormalised away: the result is
    Σ_arrived w_i x_i / Σ_arrived w_i, as a buffered sum over the arrived clients would be."""

    def __init__(self, ctx: RoundContext, weights: Mapping[str, float]):
        self._ctx = ctx
        self.weights = {c: float(w) for c, w in weights.items()}
        self.folded: dict[str, float] = {}
        self._sum = ctx.backend.running_sum(ctx.n_params)

    def add(self, client: str, handle: Any) -> None:
        if client not in self.weights:
            raise UnknownSender(f"{client} has no planned weight this round (did it enrol?)")
        if client in self.folded:
            raise DuplicateMessage(f"{client}'s upload was already added this round")
        start = time.perf_counter()
        self._sum.add(handle, self.weights[client])
        self.folded[client] = self.weights[client]
        self._ctx.seconds["aggregate"] += time.perf_counter() - start

    def result(self) -> Any:
        clients = list(self.folded)  # a folded upload cannot be taken out again
        if not clients:
            raise MalformedMessage("no client left to aggregate")
        normaliser = sum(self.folded[c] for c in clients)
        start = time.perf_counter()
        total = self._sum.result(normaliser)
        self._ctx.seconds["aggregate"] += time.perf_counter() - start
        self._ctx._sums.append((total, {c: self.folded[c] / normaliser for c in clients}))
        return total
