"""How envelopes reach clients: any object with ``peers`` and ``exchange``.

``exchange`` takes the round's requests lazily, one (peer, bytes) at a time, and yields the
replies in the order they arrive, so the server can fold each upload into a running sum and
drop it before the next one comes (and never builds every request at once).

In-process by default: a dict of callables bytes -> bytes, answered one after another.
``simulation.workers`` runs clients in worker processes instead, in parallel. The server
never imports the client package: the experiment driver hands it the transport.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from secagg.errors import ClientInputError, UnknownSender

Reply = bytes | ClientInputError  # a reply, or why there is none


class ClientUnavailable(ClientInputError):
    """The client did not answer (in-process: its handler raised)."""


class Transport(Protocol):
    @property
    def peers(self) -> list[str]:
        """The clients connected."""

    def exchange(self, requests: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, Reply]]:
        """Deliver each request; yield (peer, reply or error) as replies arrive."""


class InProcessTransport:
    def __init__(self, handlers: Mapping[str, Callable[[bytes], bytes]]):
        self._handlers = dict(handlers)

    @property
    def peers(self) -> list[str]:
        return list(self._handlers)

    def exchange(self, requests: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, Reply]]:
        for peer, data in requests:
            try:
                yield peer, self.request(peer, data)
            except ClientInputError as exc:
                yield peer, exc

    def request(self, peer: str, data: bytes) -> bytes:
        handler = self._handlers.get(peer)
        if handler is None:
            raise UnknownSender(f"no client called {peer!r} is connected")
        try:
            reply = handler(data)
        except Exception as exc:  # the client failed; to the server that is a missing answer
            raise ClientUnavailable(f"{peer} failed: {type(exc).__name__}: {exc}") from exc
        return check_reply(peer, reply)


def check_reply(peer: str, reply: object) -> bytes:
    if not isinstance(reply, (bytes, bytearray)):
        raise ClientUnavailable(f"{peer} answered with {type(reply).__name__}, not bytes")
    return bytes(reply)
