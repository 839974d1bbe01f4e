"""A key holder's secret share s_k and what it does with it: its link of the key chain and
its partial decryptions. Only the client backend imports this (``tests/test_layering.py``
keeps it out of the server's import graph)."""

from __future__ import annotations

from collections.abc import Sequence

import openfhe as fhe

from secagg.errors import KeySetupError
from secagg.threshold.params import (
    ThresholdContext,
    canonical_ciphertext,
    canonical_public_key,
    serialize,
)


class KeyShare:
    """One holder's share of the joint secret.

    ``previous``: the public key of the chain so far (None: this holder starts the chain).
    The public key it returns is the chain's key including this share."""

    def __init__(self, context: ThresholdContext, previous_public: bytes | None = None):
        self.context = context
        cc = context.cc
        if previous_public is None:
            pair = cc.KeyGen()
        else:
            pair = cc.MultipartyKeyGen(context.load_public_key(previous_public))
        self._secret = pair.secretKey
        self.public_key = canonical_public_key(pair.publicKey)

    @classmethod
    def from_bytes(cls, context: ThresholdContext, secret: bytes, public: bytes) -> KeyShare:
        """A share exported by :meth:`export` (the client's own restorable state)."""
        share = cls.__new__(cls)
        share.context = context
        try:
            share._secret = fhe.DeserializePrivateKeyString(secret, fhe.BINARY)
        except Exception:  # noqa: BLE001 - the binding raises several types
            raise KeySetupError("not an exported threshold key share") from None
        share.public_key = public
        return share

    def export(self) -> bytes:
        return serialize(self._secret)

    def partial(self, c1_sum: Sequence) -> list[bytes]:
        """This share's partial decryption of each chunk of Σ k_i·c1_i (computed by the
        caller from the uploads' c1 halves it checked)."""
        views = [self.context.view(c1) for c1 in c1_sum]
        partials = self.context.cc.MultipartyDecryptMain(views, self._secret)
        return [canonical_ciphertext(p) for p in partials]
