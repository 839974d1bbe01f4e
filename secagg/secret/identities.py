"""Fresh client identities: the provisioning authority's key generation.

A deployment's ``prepare`` (``secagg.flower.deployment``) and an in-process run's driver
(``secagg.backends.provision``) make every client's long-term keys here: an X25519 key for
pairwise key wrapping and an Ed25519 key for signed consents, with the two rosters of their
public halves. The private halves leave only inside each client's own
:class:`~secagg.backends.Identity`.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from secagg.backends import Identity
from secagg.secret.keywrap import KeyWrapper


def new_identities(client_ids: list[str]) -> dict[str, Identity]:
    """Fresh identities (X25519 for key wrapping, Ed25519 for consents) for ``client_ids``
    and the rosters they share."""
    wrappers = {c: KeyWrapper() for c in client_ids}
    signing = {c: Ed25519PrivateKey.generate() for c in client_ids}
    roster = {c: w.public_bytes for c, w in wrappers.items()}
    signers = {
        c: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for c, k in signing.items()
    }
    return {
        c: Identity(c, wrappers[c].private_bytes(), signing[c].private_bytes_raw(), roster, signers)
        for c in client_ids
    }
