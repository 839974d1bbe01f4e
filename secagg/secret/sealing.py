"""Sealing a payload for one recipient's X25519 key (an ephemeral-static ECIES).

The sender makes a fresh X25519 key, wraps the payload with :class:`KeyWrapper` (X25519 +
HKDF-SHA256 + AES-256-GCM) for the recipient's public key and sends its ephemeral public key
in front of the blob. Used for the experimenter's copy of the global model in server-blind
runs: clients seal it, the server relays bytes it cannot open, the experimenter opens them.
Only clients and the experiment driver import this module (it holds private keys).
"""

from __future__ import annotations

from secagg.errors import KeySetupError
from secagg.secret.keywrap import KeyWrapper

_PUBLIC = 32  # raw X25519 public key
_PURPOSE = "sealed-for-observer/v1"


def seal(payload: bytes, recipient_public: bytes, context: str) -> bytes:
    """Encrypt ``payload`` for the holder of ``recipient_public``, bound to ``context``."""
    ephemeral = KeyWrapper()
    return ephemeral.public_bytes + ephemeral.wrap(
        payload, recipient_public, context, "observer", _PURPOSE
    )


class Observer:
    """The experimenter's key pair: clients seal for ``public_bytes``; ``open`` reads."""

    def __init__(self, private: bytes | None = None):
        """A fresh key pair, or the one whose raw X25519 private key is ``private``."""
        self._wrapper = KeyWrapper() if private is None else KeyWrapper.from_private_bytes(private)

    @property
    def public_bytes(self) -> bytes:
        return self._wrapper.public_bytes

    @property
    def private_bytes(self) -> bytes:
        return self._wrapper.private_bytes()

    def open(self, blob: bytes, context: str) -> bytes:
        blob = bytes(blob)
        if len(blob) <= _PUBLIC:
            raise KeySetupError("sealed payload is too short")
        return self._wrapper.unwrap(blob[_PUBLIC:], blob[:_PUBLIC], context, "observer", _PURPOSE)
