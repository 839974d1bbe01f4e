"""How envelopes reach clients. In-process by default: a dict of callables bytes -> bytes.

The server never imports the client package: the experiment driver hands it the callables.
A network transport would implement the same ``request`` method.
"""

from __future__ import annotations

from typing import Callable, Mapping

from secagg.errors import ClientInputError, UnknownSender


class ClientUnavailable(ClientInputError):
    """The client did not answer (in-process: its handler raised)."""


class InProcessTransport:
    def __init__(self, handlers: Mapping[str, Callable[[bytes], bytes]]):
        self._handlers = dict(handlers)

    @property
    def peers(self) -> list[str]:
        return list(self._handlers)

    def request(self, peer: str, data: bytes) -> bytes:
        handler = self._handlers.get(peer)
        if handler is None:
            raise UnknownSender(f"no client called {peer!r} is connected")
        try:
            reply = handler(data)
        except Exception as exc:  # the client failed; to the server that is a missing answer
            raise ClientUnavailable(f"{peer} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(reply, (bytes, bytearray)):
            raise ClientUnavailable(f"{peer} answered with {type(reply).__name__}, not bytes")
        return bytes(reply)
