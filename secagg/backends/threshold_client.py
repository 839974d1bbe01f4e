"""Client half of the threshold backend: one share of the key, the checks before using it.

A holder adds its share to the key chain only after checking the chain so far, accepts the
joint key only if the complete chain is every listed holder's signed link in order ending in
that key and its own link is the one it made, encrypts under the joint key, and gives a
partial decryption only of a release it can check: kind ``reveal``, within its policy and
budget, every contributor's consent valid, and the sum recomputed by itself from the
contributors' c1 halves (whose digests the contributors signed). The server's own
ciphertext never reaches the share.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secagg import wire
from secagg.backends.base import ClientBackend, no_client_weight
from secagg.backends.consenting import (
    as_bytes,
    check_listed_weight,
    consent,
    public_bytes,
    read_release,
    release_identity,
    restored_bases,
    restored_count,
    restored_keys,
    restored_uploads,
)
from secagg.ckks.keywrap import KeyWrapper
from secagg.ckks.release import (
    Descriptor,
    check_entries,
    signature_bytes,
)
from secagg.errors import KeySetupError, MalformedCiphertext, ProtocolStateError, ReleaseRefused
from secagg.threshold.params import (
    ThresholdContext,
    ThresholdPreset,
    c1_digest,
    canonical_public_key,
)
from secagg.threshold.share_relay import release_label, seal, unseal
from secagg.threshold.shares import KeyShare
from secagg.wire import Envelope, Field

_LINK_CONTEXT = b"secagg threshold key link v1"


def link_message(params: str, holders: list[str], index: int, previous: str, public: str) -> bytes:
    """What holder ``index`` signs: the parameters, the holders in order, its index, and the
    digests of the key it received and of the key it made."""
    body = json.dumps([params, holders, index, previous, public], separators=(",", ":"))
    return _LINK_CONTEXT + body.encode()


def digest(blob: bytes | None) -> str:
    return hashlib.sha256(blob or b"").hexdigest()


class ThresholdClient(ClientBackend):
    name = "threshold"

    def __init__(
        self,
        client_id: str,
        preset: ThresholdPreset,
        *,
        identity: KeyWrapper | None = None,
        roster: Mapping[str, bytes] | None = None,
        signing_key: bytes | None = None,
        signers: Mapping[str, bytes] | None = None,
        decryption_budget: int = 1,
        open_budget: int = 0,
        reveal_length: int | tuple[int, ...] | None = None,
        min_contributors: int = 2,
        share_budget: int | None = None,
        min_weight_share: float = 0.01,
        max_weight_share: float = 0.5,
        releases_per_upload: Mapping[str, int] | None = None,
    ):
        """``identity``: this client's X25519 key and ``roster`` every client's X25519
        public key (shares sealed end to end for the clients that open a sum);
        ``signing_key``: this client's Ed25519 key (links and consents); ``signers``:
        every client's Ed25519 public key, the roster of possible holders;
        ``decryption_budget``: partial decryptions it gives the server at most;
        ``open_budget``: sealed shares it gives, and sums it opens, at most (each);
        ``share_budget``: sealed shares it gives, if not ``open_budget`` (when every client
        opens a different aggregate);
        ``min_contributors`` also bounds the holders a key must have; the rest as for
        ckks."""
        self.id = client_id
        self.preset = preset
        self.context = ThresholdContext(preset)
        self._identity = identity if identity is not None else KeyWrapper()
        self.roster = (
            dict(roster) if roster is not None else {client_id: self._identity.public_bytes}
        )
        if self.roster.get(client_id) != self._identity.public_bytes:
            raise KeySetupError(f"{client_id}'s identity key is not its key in the roster")
        if not isinstance(open_budget, int) or open_budget < 0:
            raise KeySetupError(f"open_budget must be a count, got {open_budget!r}")
        if share_budget is not None and (not isinstance(share_budget, int) or share_budget < 0):
            raise KeySetupError(f"share_budget must be a count, got {share_budget!r}")
        self.open_budget, self.open_shares, self.opens = open_budget, 0, 0
        self.share_budget = open_budget if share_budget is None else share_budget
        self._signer, self.signers, self.policy = release_identity(
            client_id,
            signing_key,
            signers,
            min_contributors,
            min_weight_share,
            reveal_length,
            max_weight_share,
        )
        if not isinstance(decryption_budget, int) or decryption_budget < 0:
            raise KeySetupError(f"decryption_budget must be a count, got {decryption_budget!r}")
        self.decryption_budget, self.decryptions = decryption_budget, 0
        self.releases_per_upload = dict(releases_per_upload or {"reveal": 1, "open": 1})
        self.uploads: dict[str, dict[str, int]] = {}
        #: digest of each upload -> what it was made from (``secagg.clients.policy``)
        self.bases: dict[str, str] = {}
        self._share: KeyShare | None = None
        self._link: dict[str, Any] | None = None
        self._joint: Any = None
        self.holders: list[str] = []

    @property
    def signing_public(self) -> bytes:
        return public_bytes(self._signer)

    def handlers(self) -> dict[str, Callable[[Envelope], dict[str, Field]]]:
        return {
            "key_chain": self.on_chain,
            "key_install": self.on_install,
            "consent": self.on_consent,
            "decrypt_share": self.on_decrypt_share,
            "open_share": self.on_open_share,
        }

    # ---- state between messages ------------------------------------------------------------
    #: what :meth:`state_dict` holds; a state with other keys is not this half's
    STATE_KEYS = (
        "preset",
        "params",
        "x25519_private",
        "signing_key",
        "share",
        "link",
        "joint_key",
        "holders",
        "decryptions",
        "opens",
        "open_shares",
        "uploads",
        "bases",
    )

    def state_dict(self) -> dict[str, Any]:
        """Everything key setup and releases leave behind. ``share`` (None before the chain
        reached this client) holds this client's secret key share and public key;
        ``x25519_private`` and ``signing_key`` are its identities: secret bytes all."""
        share = self._share
        return {
            "preset": self.preset.name,
            "params": self.context.fingerprint,
            "x25519_private": self._identity.private_bytes(),
            "signing_key": self._signer.private_bytes_raw(),
            "share": None
            if share is None
            else {"secret": share.export(), "public": share.public_key},
            "link": None if self._link is None else dict(self._link),
            "joint_key": None if self._joint is None else canonical_public_key(self._joint),
            "holders": list(self.holders),
            "decryptions": self.decryptions,
            "opens": self.opens,
            "open_shares": self.open_shares,
            "uploads": {d: dict(kinds) for d, kinds in self.uploads.items()},
            "bases": dict(self.bases),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load and check everything before assigning anything, so a bad state leaves this
        half as it was."""
        if set(state) != set(self.STATE_KEYS):
            raise KeySetupError(
                f"{self.id}: a threshold client state holds {list(self.STATE_KEYS)}, got "
                f"{sorted(state)}"
            )
        if state["preset"] != self.preset.name or state["params"] != self.context.fingerprint:
            raise KeySetupError(
                f"{self.id}: the state was made under threshold preset {state['preset']} "
                f"({state['params']}), this client runs {self.preset.name} "
                f"({self.context.fingerprint})"
            )
        identity, signer = restored_keys(self.id, state, self.roster, self.signers)
        counts = {
            k: restored_count(self.id, state[k], k) for k in ("decryptions", "opens", "open_shares")
        }
        uploads = restored_uploads(self.id, state["uploads"])
        bases = restored_bases(self.id, state["bases"])
        raw_share, link, joint, holders = (
            state[k] for k in ("share", "link", "joint_key", "holders")
        )
        share = None
        if raw_share is not None:
            if not isinstance(raw_share, dict) or set(raw_share) != {"secret", "public"}:
                raise KeySetupError(f"{self.id}: the state's key share is garbled")
            share = KeyShare.from_bytes(
                self.context, as_bytes(raw_share["secret"]), as_bytes(raw_share["public"])
            )
        if link is not None and (
            not isinstance(link, dict)
            or set(link) != {"previous", "public"}
            or share is None
            or link["public"] != digest(share.public_key)
        ):
            raise KeySetupError(f"{self.id}: the state's key link is not its share's")
        joint_key = None if joint is None else self.context.load_public_key(as_bytes(joint))
        if not isinstance(holders, list) or (joint_key is not None) != bool(holders):
            raise KeySetupError(f"{self.id}: the state's key holders are garbled")
        if holders:
            self._holders({"holders": holders})  # distinct, in the roster, itself among them
        self._identity, self._signer, self.uploads = identity, signer, uploads
        self.bases = bases
        self._share, self._link, self._joint, self.holders = share, link, joint_key, holders
        self.decryptions, self.opens = counts["decryptions"], counts["opens"]
        self.open_shares = counts["open_shares"]

    # ---- key setup -----------------------------------------------------------------------------
    def _accept_setup(self, env: Envelope) -> None:
        setup = env.config("setup")
        if setup != {"preset": self.preset.name, "params": self.context.fingerprint}:
            raise KeySetupError(
                f"{self.id}: the server proposes parameters {setup!r}, this client runs "
                f"{self.preset.name} ({self.context.fingerprint})"
            )

    def _holders(self, chain: Any) -> list[str]:
        holders = chain.get("holders") if isinstance(chain, dict) else None
        if (
            not isinstance(holders, list)
            or not all(isinstance(h, str) and h in self.signers for h in holders)
            or len(set(holders)) != len(holders)
            or self.id not in holders
        ):
            raise KeySetupError(
                f"{self.id}: the key's holders must be distinct clients of this client's "
                f"roster including itself, got {holders!r}"
            )
        if len(holders) < self.policy.min_contributors:
            raise KeySetupError(
                f"{self.id}: a key of {len(holders)} holder(s); this client needs at least "
                f"{self.policy.min_contributors}"
            )
        return holders

    def _check_links(self, holders: list[str], links: Any, upto: int) -> str:
        """The first ``upto`` links: each signed by its holder, chained; returns the digest
        of the last key (the empty digest before the first)."""
        if not isinstance(links, list) or len(links) != upto:
            raise KeySetupError(f"{self.id}: expected {upto} key links, got {links!r:.80}")
        previous = digest(None)
        for index, link in enumerate(links):
            holder = holders[index]
            if not isinstance(link, dict) or link.get("previous") != previous:
                raise KeySetupError(f"{self.id}: key link {index} does not follow the chain")
            public = link.get("public")
            signature = signature_bytes(str(link.get("signature", "")))
            try:
                Ed25519PublicKey.from_public_bytes(self.signers[holder]).verify(
                    signature,
                    link_message(self.context.fingerprint, holders, index, previous, str(public)),
                )
            except (InvalidSignature, ValueError):
                raise KeySetupError(
                    f"{self.id}: key link {index} is not signed by {holder}"
                ) from None
            previous = str(public)
        return previous

    def on_chain(self, env: Envelope) -> dict[str, Field]:
        """Add this client's share to the chain so far, and sign the link."""
        if self._share is not None:
            raise KeySetupError(f"{self.id} already holds a share of this run's key")
        self._accept_setup(env)
        chain = env.config("chain")
        holders = self._holders(chain)
        index = chain.get("index")
        if index != holders.index(self.id):
            raise KeySetupError(f"{self.id}: asked to be link {index!r} of {holders}")
        expected = self._check_links(holders, chain.get("links"), index)
        previous = None
        if index > 0:
            (previous,) = (bytes(p) for p in env.ciphertext_parts("previous"))
            if digest(previous) != expected:
                raise KeySetupError(f"{self.id}: the key it got is not the chain's last")
        share = KeyShare(self.context, previous)
        public = digest(share.public_key)
        signature = self._signer.sign(
            link_message(self.context.fingerprint, holders, index, expected, public)
        )
        self._share = share
        self._link = {"previous": expected, "public": public}
        link = {**self._link, "signature": base64.b64encode(signature).decode()}
        return {
            "public_key": wire.ciphertext([share.public_key]),
            "key_link": wire.config(link),
        }

    def on_install(self, env: Envelope) -> dict[str, Field]:
        """Accept the joint key: the complete signed chain, this client's own link in it."""
        if self._share is None or self._link is None:
            raise KeySetupError(f"{self.id} holds no share: it was not part of the chain")
        if self._joint is not None:
            raise KeySetupError(f"{self.id} already installed this run's key")
        self._accept_setup(env)
        chain = env.config("chain")
        holders = self._holders(chain)
        links = chain.get("links")
        last = self._check_links(holders, links, len(holders))  # a list of dicts, checked
        mine = links[holders.index(self.id)]  # type: ignore[index]
        if {k: mine.get(k) for k in ("previous", "public")} != self._link:
            raise KeySetupError(f"{self.id}: the chain does not hold the link this client made")
        (joint,) = (bytes(p) for p in env.ciphertext_parts("joint_key"))
        if digest(joint) != last:
            raise KeySetupError(f"{self.id}: the joint key is not the chain's last key")
        self._joint = self.context.load_public_key(joint)
        self.holders = holders
        return {"installed": wire.config({"params": self.context.fingerprint})}

    # ---- data path -----------------------------------------------------------------------------
    def protect(self, values: np.ndarray, weight: float | None = None, *, basis: str = "") -> Field:
        no_client_weight(self.name, weight)
        if self._joint is None:
            raise ProtocolStateError(f"{self.id} has no joint key yet: key setup comes first")
        parts = self.context.encrypt(
            self._joint, values, bound=self.preset.headroom / len(self.holders)
        )
        chunks = self.context.load_ciphertexts(parts, np.asarray(values).size)
        digest = c1_digest([self.context.c1_half(ct) for ct in chunks])
        self.uploads[digest], self.bases[digest] = {}, basis
        return wire.ciphertext(parts)

    def check_own_weight(self, envelope: Envelope, name: str, weight: float) -> None:
        check_listed_weight(
            self.id, envelope.config(f"{name}.release"), weight, self.preset.weight_bits
        )

    def open(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        """A sum the server sent this client to open (LARC's Ĝ, RegAgg's centre, a
        server-blind update): its c0 halves fused with every holder's partial, each
        unsealed with the pairwise key. The release was checked by every holder before it
        gave its share, this client included: its own share, sealed by itself for this
        descriptor, must be among them. At most ``open_budget`` times."""
        if self.opens >= self.open_budget:
            raise ProtocolStateError(
                f"{self.id} refuses to open aggregate {self.opens + 1}: its configuration "
                f"allows {self.open_budget}"
            )
        info = envelope.config(f"{name}.release")
        if not isinstance(info, dict) or set(info) != {
            "descriptor",
            "holders",
            "recipients",
            "divisor",
        }:
            raise ReleaseRefused(f"{self.id}: {name} comes without its release")
        d = Descriptor.from_config(info["descriptor"])
        if d.kind != "open" or d.name != name or d.n_values != length:
            raise ReleaseRefused(
                f"{self.id}: asked to open {name!r} of {length} values, got a release of "
                f"kind {d.kind!r} for {d.name!r} of {d.n_values}"
            )
        self.policy.check(d)
        holders, recipients, divisor = info["holders"], info["recipients"], info["divisor"]
        if holders != self.holders:
            raise ReleaseRefused(f"{self.id}: {name}: shares from {holders!r:.80}, not the key's")
        if not isinstance(recipients, list) or self.id not in recipients:
            raise ReleaseRefused(f"{self.id}: {name} was not sealed for this client")
        if not isinstance(divisor, (int, float)) or not 0.0 < divisor <= 1.0:
            raise ReleaseRefused(f"{self.id}: {name}: divisor {divisor!r} is not in (0, 1]")
        c0s = [self.context.load_half(b) for b in envelope.ciphertext_parts(name)]
        sealed = envelope.ciphertext_parts(f"{name}.sealed")
        keys = envelope.ciphertext_parts(f"{name}.keys")
        if (
            len(c0s) != d.chunks
            or d.chunks != self.context.chunks(d.n_values)
            or len(sealed) != d.chunks * len(holders)
            or len(keys) != len(recipients) * len(holders)
        ):
            raise ReleaseRefused(f"{self.id}: {name}: the shares do not match the release")
        label = release_label(self.context.fingerprint, d.hash())
        me = recipients.index(self.id)
        partials = [
            [
                self.context.load_partial(p)
                for p in unseal(
                    self._identity,
                    self.id,
                    holder,
                    self.roster[holder],
                    sealed[i * d.chunks : (i + 1) * d.chunks],
                    keys[i * len(recipients) + me],
                    label,
                )
            ]
            for i, holder in enumerate(holders)
        ]
        try:
            values = self.context.fuse(c0s, partials, d.n_values) / float(divisor)
        except MalformedCiphertext as exc:
            raise ReleaseRefused(f"{self.id}: {name}: {exc}") from None
        self.opens += 1
        return values

    # ---- releases --------------------------------------------------------------------------------
    def on_consent(self, env: Envelope) -> dict[str, Field]:
        """Sign a descriptor that holds this client's upload, once per kind per upload."""
        return consent(
            self.id,
            Descriptor.from_config(env.config("release")),
            policy=self.policy,
            uploads=self.uploads,
            bases=self.bases,
            releases_per_upload=self.releases_per_upload,
            signer=self._signer,
        )

    def _partial(self, env: Envelope, kind: str) -> tuple[Descriptor, list[bytes]]:
        """This share's partial decryption of a checked release of ``kind``: the sum
        recomputed by this client from the contributors' c1 halves."""
        if self._share is None or self._joint is None:
            raise ProtocolStateError(f"{self.id} holds no installed key share")
        d, signatures = read_release(
            self.id,
            env.config("release"),
            kind,
            self.policy,
            "a decryption request",
            uploads=self.uploads,
        )
        blobs = [bytes(p) for p in env.ciphertext_parts("halves")]
        if d.chunks != self.context.chunks(d.n_values) or len(blobs) != d.chunks * len(d.entries):
            raise ReleaseRefused(f"{self.id}: {d.name}: the c1 halves do not match the release")
        per_entry = [blobs[i * d.chunks : (i + 1) * d.chunks] for i in range(len(d.entries))]
        check_entries(
            d, signatures, [b"".join(p) for p in per_entry], self.signers, chunk_bytes=None
        )
        halves = [[self.context.load_half(b) for b in entry] for entry in per_entry]
        c1_sum = self.context.sum_c1(halves, [k for _, k, _ in d.entries])
        return d, self._share.partial(c1_sum)

    def on_decrypt_share(self, env: Envelope) -> dict[str, Field]:
        """This share's partial decryption of a checked sum, for the server to fuse."""
        if self.decryptions >= self.decryption_budget:
            raise ProtocolStateError(
                f"{self.id} refuses partial decryption {self.decryptions + 1}: its "
                f"configuration allows {self.decryption_budget}"
            )
        _, partial = self._partial(env, "reveal")
        self.decryptions += 1
        return {"partial": wire.ciphertext(partial)}

    def on_open_share(self, env: Envelope) -> dict[str, Field]:
        """This share's partial decryption of a checked sum that clients will open,
        sealed for each recipient (the server relays it and cannot fuse it)."""
        if self.open_shares >= self.share_budget:
            raise ProtocolStateError(
                f"{self.id} refuses open share {self.open_shares + 1}: its configuration "
                f"allows {self.share_budget}"
            )
        recipients = env.config("recipients")
        ids = recipients.get("ids") if isinstance(recipients, dict) else None
        if (
            not isinstance(ids, list)
            or not ids
            or len(set(map(str, ids))) != len(ids)
            or not all(isinstance(r, str) and r in self.roster for r in ids)
        ):
            raise ReleaseRefused(
                f"{self.id}: the recipients of a share must be distinct clients of this "
                f"client's roster, got {ids!r:.120}"
            )
        d, partial = self._partial(env, "open")
        label = release_label(self.context.fingerprint, d.hash())
        sealed, keys = seal(
            self._identity, self.id, partial, {r: self.roster[r] for r in ids}, label
        )
        self.open_shares += 1
        return {"sealed": wire.ciphertext(sealed), "keys": wire.ciphertext(keys)}
