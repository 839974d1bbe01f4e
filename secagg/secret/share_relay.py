"""Holders' shares sealed end to end for the clients that open an aggregate.

When clients open an aggregate themselves (LARC's Ĝ, RegAgg's centre, server-blind
updates), each answering holder's share of the key sum must reach every recipient, and the
server, which relays them, must not be able to combine them. A holder seals its share once
under a fresh 256-bit content key (AES-256-GCM, one random nonce per chunk) and wraps that
key for each recipient with the pairwise X25519 key (``secagg.secret.keywrap``): R recipients
cost one copy of the share and R wrapped keys of 60 bytes, not R copies.

The associated data binds the holder, the chunk's index and a label naming the release
(the parameter fingerprint and the descriptor's hash), so a sealed share cannot be moved to
another chunk, holder or release. Only client code imports this module (it uses a client's
X25519 private key).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secagg.errors import ReleaseRefused
from secagg.secret.keywrap import KeyWrapper

_NONCE = 12
_CONTEXT = b"secagg threshold open share v1"


def release_label(fingerprint: str, descriptor_hash: bytes) -> str:
    """What a sealed share is bound to: the parameters and the release's descriptor."""
    return f"open-share|{fingerprint}|{descriptor_hash.hex()}"


def _aad(label: str, holder: str, index: int) -> bytes:
    return b"|".join((_CONTEXT, label.encode(), holder.encode(), str(index).encode()))


def seal(
    identity: KeyWrapper,
    holder: str,
    shares: Sequence[bytes],
    recipients: Mapping[str, bytes],
    label: str,
) -> tuple[list[bytes], list[bytes]]:
    """(sealed chunks, one wrapped content key per recipient in ``recipients``' order).

    ``recipients``: client id -> X25519 public key, from the holder's own roster."""
    key = AESGCM.generate_key(bit_length=256)
    aead = AESGCM(key)
    sealed = []
    for index, share in enumerate(shares):
        nonce = os.urandom(_NONCE)
        sealed.append(nonce + aead.encrypt(nonce, share, _aad(label, holder, index)))
    wrapped = [
        identity.wrap(key, public, holder, recipient, label)
        for recipient, public in recipients.items()
    ]
    return sealed, wrapped


def unseal(
    identity: KeyWrapper,
    me: str,
    holder: str,
    holder_public: bytes,
    sealed: Sequence[bytes | memoryview],
    wrapped_key: bytes | memoryview,
    label: str,
) -> list[bytes]:
    """The holder's sealed blobs, if they were sealed for ``me`` for this release; else one
    opaque ReleaseRefused (which check failed would only help a forger)."""
    try:
        key = identity.unwrap(wrapped_key, holder_public, holder, me, label)
        aead = AESGCM(key)
        out = []
        for index, blob in enumerate(sealed):
            blob = bytes(blob)
            out.append(aead.decrypt(blob[:_NONCE], blob[_NONCE:], _aad(label, holder, index)))
        return out
    except Exception:  # noqa: BLE001 - KeySetupError, InvalidTag, ValueError: one answer
        raise ReleaseRefused(
            f"{me}: the key share from {holder} does not open for this release "
            "(tampered, misaddressed or from another release)"
        ) from None
