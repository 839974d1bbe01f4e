"""Messaging for one round: send envelopes, check replies, exclude clients that misbehave.

Every request and reply goes through :meth:`Exchange.ask`, which serialises the envelope,
counts and audits it, and checks the reply before anyone touches it: a client whose reply is
undecodable, from the wrong sender, for the wrong round or phase (a replay), or lacking an
expected field is excluded from the rest of the round, and the audit says why. A phase that
leaves no usable client ends the round with :class:`~secagg.errors.RoundAborted`.

``ask`` can hand each reply to a callback as it arrives instead of collecting them: with a
running sum the server folds every upload and drops it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from secagg import wire
from secagg.errors import (
    ClientInputError,
    RoundAborted,
    StaleMessage,
    UnexpectedField,
    UnknownSender,
)
from secagg.server.audit import AuditLog
from secagg.server.transport import ClientUnavailable, Transport
from secagg.wire import Envelope, Field

SERVER = "server"


class Exchange:
    """The clients of one round, who is still in it, and the messages to and from them."""

    def __init__(
        self,
        round_number: int,
        clients: list[str],
        transport: Transport,
        audit: AuditLog,
        max_message_bytes: int = wire.DEFAULT_MAX_BYTES,
    ):
        self.round = round_number
        self.transport = transport
        self.audit = audit
        self.max_message_bytes = max_message_bytes
        self.clients = frozenset(clients)  # everyone asked this round, excluded or not
        self.active = list(clients)
        self.excluded: dict[str, str] = {}
        #: excluded clients that gave no answer (down, late, failed) rather than a refusal:
        #: dropouts, which may be back next round
        self.unanswered: set[str] = set()
        self.seconds: dict[str, float] = defaultdict(float)

    def exclude(self, client: str, phase: str, error: Exception) -> None:
        if client in self.active:
            self.active.remove(client)
        self.excluded[client] = f"{phase}: {type(error).__name__}: {error}"
        if isinstance(error, ClientUnavailable) and not error.refused:
            self.unanswered.add(client)
        else:
            self.unanswered.discard(client)
        self.audit.excluded(self.round, phase, client, error)

    def abort_if_empty(self, phase: str) -> None:
        if not self.active:
            raise RoundAborted(
                f"round {self.round}: no usable client left after phase "
                f"{phase!r}; exclusions: {self.excluded}",
                round=self.round,
                phase=phase,
                exclusions=self.excluded,
            )

    def ask(
        self,
        phase: str,
        messages: Mapping[str, Mapping[str, Field]],
        expect: Mapping[str, str] | None = None,
        reach_excluded: bool = False,
        on_reply: Callable[[str, Envelope], Any] | None = None,
        optional: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send each active client its fields; return the replies that pass every check.

        ``expect`` maps reply field names to wire kinds; scalars are also checked finite.
        ``optional``: fields a reply may carry besides, each of its kind if present.
        ``reach_excluded`` also addresses clients excluded earlier in the round (to keep
        their state in step); a failure then is recorded but changes nothing else.
        ``on_reply(client, envelope)`` is called as each good reply arrives and its result
        is kept instead of the envelope (a ClientInputError it raises excludes the client);
        its time counts to whatever it does, not to the phase.
        Replies are returned in the order of ``messages``, however they arrived. When the
        phase leaves no active client, the round is aborted (RoundAborted).
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
                    reply = self._accept(client, phase, raw, expect or {}, optional or {})
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
        if targets:
            self.abort_if_empty(phase)
        return {c: replies[c] for c in targets if c in replies}

    def _accept(
        self,
        client: str,
        phase: str,
        raw: bytes,
        expect: Mapping[str, str],
        optional: Mapping[str, str],
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
            raise StaleMessage(
                f"{client} answered round {reply.round} phase {reply.phase!r} "
                f"during round {self.round} phase {phase!r} (replayed or stale)"
            )
        for name, kind in expect.items():
            reply.get(name, kind)
            if kind == wire.SCALAR:
                reply.scalar(name)
        for name, kind in optional.items():
            if name in reply.fields:
                reply.get(name, kind)
        # ``basis``: what a client's protected upload was made from (its consent binds it)
        extra = set(reply.fields) - set(expect) - set(optional) - {"basis"}
        if expect and extra:
            raise UnexpectedField(f"{client} sent undeclared fields {sorted(extra)}")
        return reply
