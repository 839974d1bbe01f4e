"""End-to-end key wrapping between clients: X25519 + HKDF-SHA256 + AES-256-GCM.

The server relays wrapped keys but holds no X25519 private key of any client, so it cannot
derive the wrapping key. The associated data binds sender, recipient and the CKKS parameter
fingerprint (length-prefixed, so unambiguous), so a blob cannot be replayed to another client
or under other parameters.

Public keys never come from the server: every client holds the roster of the run's
identities (client id -> X25519 public key) in its own configuration, provisioned like
NVFlare's and Flower's node keys; see ``secagg.secret.ckks_client``. ``fingerprint`` gives a
short string to compare a roster out of band.
"""

from __future__ import annotations

import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secagg.errors import KeySetupError

_INFO = b"secagg/ckks-secret-key-wrap/v2"
_NONCE = 12


def _aad(sender: str, recipient: str, params: str) -> bytes:
    """Sender, recipient and parameters, each length-prefixed: no two triples give the same
    bytes (with a separator, ("a", "b->c") and ("a->b", "c") would)."""
    return b"".join(
        len(p).to_bytes(4, "big") + p for p in (s.encode() for s in (sender, recipient, params))
    )


def fingerprint(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:16]


class KeyWrapper:
    """One client's X25519 identity for wrapping and unwrapping key material."""

    def __init__(self, private: X25519PrivateKey | None = None):
        self._private = private if private is not None else X25519PrivateKey.generate()

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyWrapper:
        """The identity :meth:`private_bytes` exported (a client restored from its state)."""
        try:
            return cls(X25519PrivateKey.from_private_bytes(bytes(raw)))
        except (ValueError, TypeError) as exc:
            raise KeySetupError(
                f"not a raw X25519 private key ({len(bytes(raw))} bytes; 32 expected): {exc}"
            ) from None

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key: secret, for the client's own state export only
        (whoever holds it can unwrap every key wrapped for this client)."""
        return self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    @property
    def public_bytes(self) -> bytes:
        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def _key(self, peer_public: bytes, aad: bytes) -> bytes:
        try:
            peer = X25519PublicKey.from_public_bytes(peer_public)
        except ValueError as exc:
            raise KeySetupError(f"invalid X25519 public key: {exc}") from None
        shared = self._private.exchange(peer)
        return HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO + b"|" + aad
        ).derive(shared)

    def wrap(
        self, payload: bytes, peer_public: bytes, sender: str, recipient: str, params: str
    ) -> bytes:
        aad = _aad(sender, recipient, params)
        nonce = os.urandom(_NONCE)
        return nonce + AESGCM(self._key(peer_public, aad)).encrypt(nonce, payload, aad)

    def unwrap(
        self, blob: bytes | memoryview, peer_public: bytes, sender: str, recipient: str, params: str
    ) -> bytes:
        aad = _aad(sender, recipient, params)
        blob = bytes(blob)  # may be a view into the message it came in
        if len(blob) <= _NONCE:
            raise KeySetupError("wrapped key is too short")
        try:
            return AESGCM(self._key(peer_public, aad)).decrypt(blob[:_NONCE], blob[_NONCE:], aad)
        except InvalidTag:
            raise KeySetupError(
                f"wrapped key from {sender} does not open for {recipient} "
                "(tampered, misaddressed or other parameters)"
            ) from None
