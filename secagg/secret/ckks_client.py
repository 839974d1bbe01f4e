"""Client half of the CKKS backend: key setup, encryption, decryption, flooded reveals.

What the client's security rests on comes from its own configuration (its provisioning),
never from a server's message: its X25519 identity, the roster of the run's identities
(client id -> public key), its flooding bits and its decryption budget. Key setup is
authenticated by the roster: the leader wraps the CKKS key only for peers in it, with their
roster keys; a peer opens a wrapped key only with its leader's roster key; and a client
takes part in key setup once (a second ``key_generate`` or ``key_install`` is refused), so
a server can neither add itself as a peer, nor swap a public key, nor plant a key it knows,
nor change the flooding mid-run.

What the client opens is checked (``secagg.ckks.release``): it signs a consent for each of
its uploads at most once per kind (reveal, open), and reveals or opens only an aggregate whose
every contributor signed the same descriptor, that is the weighted sum of those uploads, and
that its own policy accepts (contributors, weight shares, length). Flooding is sized from the
accepted sum's own error bound.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends import Provision
from secagg.backends.base import own_weight
from secagg.ckks import native
from secagg.ckks.first_polys import FreshLevel, checked_first_sums, load_first_sums
from secagg.ckks.flooding import error_bound, flooding_sigma
from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.ckks.public import (
    KEY_REFUSED,
    SEED_INFO_BYTES,
    ciphertext_raw_bytes,
    is_key_id,
    params_fingerprint,
    upload_seeds,
)
from secagg.ckks.release import (
    NEXT_SEEDS,
    PRECHECK,
    Descriptor,
    SecondPolynomials,
    check_entries,
    seed_digest,
    server_multipliers,
)
from secagg.errors import (
    ClientInputError,
    KeySetupError,
    MalformedMessage,
    ProtocolStateError,
    ReleaseRefused,
)
from secagg.secret import ckks_masks
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.secret.consenting import as_bytes, check_applied_total, read_release
from secagg.secret.holder import KeyHoldingClient
from secagg.wire import Envelope, Field


class CKKSClient(KeyHoldingClient):
    name = "ckks"
    STATE_BACKEND = "CKKS"
    #: this half's own parts of its state, besides every key-holding half's (HolderState)
    STATE_EXTRAS = ("secret_key", "last_flooding_sigma")

    def __init__(
        self,
        client_id: str,
        preset: CKKSPreset,
        provision: Provision,
        options: Mapping[str, Any],
    ):
        """What :class:`~secagg.secret.holder.KeyHoldingClient` takes, and from
        ``options`` the flooding bits, which with the provisioned decryption budget size
        the flooding of every reveal; the provisioned ``reveal_length``, if given, is the
        only number of values a reveal may return (the model's size: a server asking for a
        whole chunk of a 40-value aggregate gets nothing)."""
        super().__init__(client_id, preset, provision, options)
        self.fingerprint = params_fingerprint(preset)
        flooding_bits = options["flooding_bits"]
        if not isinstance(flooding_bits, int) or not (
            flooding_bits == 0 or 30 <= flooding_bits <= 128
        ):
            raise KeySetupError(
                f"flooding_bits must be 0 (off, insecure) or lie in [30, 128], got "
                f"{flooding_bits!r}"
            )
        self.flooding_bits = flooding_bits
        self._keys: SecretKeyHolder | None = None
        self._second_polys: SecondPolynomials | None = None
        self._pending: ckks_masks.PendingMasks | None = None  # never in the state: key material
        #: the seeds this client committed for its next upload: in memory only, taken once
        #: (``prepare_upload``), so that no restored state or retried request replays one
        self._next_seeds = b""
        #: a precomputed check for the round's reveal (``prepare_release``), used once
        self._precheck: ckks_masks.PendingCheck | None = None
        #: releases this client checked with a precomputed sum (the rest expanded theirs)
        self.prechecks_used = 0
        self.last_flooding_sigma: float | None = None

    @property
    def params(self) -> str:
        return self.fingerprint

    def handlers(self) -> dict[str, Callable[[Envelope], dict[str, Field]]]:
        return {
            "key_hello": self.on_hello,
            "key_generate": self.on_generate,
            "key_install": self.on_install,
            "key_share": self.on_share,
            "reveal": self.on_reveal,
            "consent": self.on_consent,
        }

    @property
    def keys(self) -> SecretKeyHolder:
        if self._keys is None:
            raise KeySetupError(f"{self.id} has no CKKS key yet (key setup did not complete)")
        return self._keys

    # ---- state between messages -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything key setup and reveals leave behind. ``x25519_private``,
        ``signing_key`` and ``secret_key`` (None before key setup) are secret bytes: whoever
        reads the last can decrypt every upload of the run."""
        return {
            **self._held_state(),
            "secret_key": (self._keys.export_for_wrapping() if self._keys is not None else None),
            "last_flooding_sigma": self.last_flooding_sigma,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load every key before assigning any, so a bad state leaves this half as it was."""
        held = self._restored(state)
        sigma = state["last_flooding_sigma"]
        keys = (
            None
            if state["secret_key"] is None
            else SecretKeyHolder(self.preset, as_bytes(state["secret_key"]))
        )
        self._take(held)
        self._keys = keys
        self._second_polys = None
        self._next_seeds, self._precheck = b"", None  # a restored client commits afresh
        self.last_flooding_sigma = None if sigma is None else float(sigma)

    # ---- key setup -----------------------------------------------------------------------
    def _accept_setup(self, env: Envelope) -> None:
        """The server proposes only the parameter set; it must be this client's own."""
        setup = env.config("setup")
        if (
            not isinstance(setup, dict)
            or setup.get("params") != self.fingerprint
            or setup.get("preset") != self.preset.name
        ):
            raise KeySetupError(
                f"{self.id}: the server proposes parameters {setup!r}, this client runs "
                f"{self.preset.name} ({self.fingerprint})"
            )

    def _once(self) -> None:
        if self._keys is not None:
            raise KeySetupError(f"{self.id} already holds this run's key: setup happens once")

    def _roster_key(self, peer: Any, role: str) -> bytes:
        if not isinstance(peer, str) or peer == self.id or peer not in self.roster:
            raise KeySetupError(
                f"{self.id}: the server names {peer!r} as {role}, who is not another client "
                "in this client's roster; refusing"
            )
        return self.roster[peer]

    def on_hello(self, env: Envelope) -> dict[str, Field]:
        self._accept_setup(env)
        return {"x25519_public": wire.config({"key": _b64(self._identity.public_bytes)})}

    def _peers(self, env: Envelope) -> dict[str, bytes]:
        """The peers the server lists to wrap for, each with its key from this client's own
        roster (all of them, or a refusal)."""
        peers = env.config("peers")
        ids = peers.get("ids") if isinstance(peers, dict) else None
        if not isinstance(ids, list) or len(set(map(str, ids))) != len(ids):
            raise KeySetupError(f"{self.id}: the peers to wrap for must be a list of ids")
        return {peer: self._roster_key(peer, "a peer") for peer in ids}

    def _wrapped(self, keys: SecretKeyHolder, publics: Mapping[str, bytes]) -> dict[str, Field]:
        secret = keys.export_for_wrapping()
        return {
            f"wrapped_key.{peer}": wire.ciphertext(
                self._identity.wrap(secret, public, self.id, peer, self.fingerprint)
            )
            for peer, public in publics.items()
        }

    def _receipt(self, **fields: Any) -> dict[str, Field]:
        return {"installed": wire.config({"params": self.fingerprint, **fields})}

    def on_generate(self, env: Envelope) -> dict[str, Field]:
        """The key leader makes the CKKS key and wraps it for the other clients the server
        lists, each with its public key from this client's own roster; its receipt commits
        to the key (its id), which every peer checks before installing it."""
        self._once()
        self._accept_setup(env)
        publics = self._peers(env)
        keys = SecretKeyHolder(self.preset)
        wrapped = self._wrapped(keys, publics)
        self._keys = keys
        return {**wrapped, **self._receipt(key=keys.key_id)}

    def on_install(self, env: Envelope) -> dict[str, Field]:
        """Open the wrapped key with its sender's public key from the roster (``leader``:
        the leader, or a client that installed the leader's key and wraps it again) and
        install it if it is the key the leader committed to (``leader.key``, where the
        server sends it). A key that does not open, does not load, or is another key is not
        installed: the receipt reports it (``KEY_REFUSED``), this client still holds no key,
        and the server settles whether the sender or this client is at fault."""
        self._once()
        self._accept_setup(env)
        leader = env.config("leader")
        leader_id = leader.get("id") if isinstance(leader, dict) else None
        committed = leader.get("key") if isinstance(leader, dict) else None
        if committed is not None and not is_key_id(committed):
            raise KeySetupError(f"{self.id}: the key to install is named by a key id")
        public = self._roster_key(leader_id, "the key's sender")
        parts = env.ciphertext_parts("wrapped_key")
        if len(parts) != 1:
            raise KeySetupError(f"{self.id}: expected one wrapped key, got {len(parts)} parts")
        try:
            secret = self._identity.unwrap(
                parts[0], public, str(leader_id), self.id, self.fingerprint
            )
            keys = SecretKeyHolder(self.preset, secret)
        except (KeySetupError, ClientInputError):
            return self._receipt(refused=KEY_REFUSED)
        if committed is not None and keys.key_id != committed:
            return self._receipt(refused=KEY_REFUSED)
        self._keys = keys
        return self._receipt(key=keys.key_id)

    def on_share(self, env: Envelope) -> dict[str, Field]:
        """Wrap this client's key again for the peers the server lists, as a leader does
        (roster peers whose key from the leader did not open): during key setup only,
        before this client has encrypted or decrypted anything with it."""
        keys = self.keys
        self._accept_setup(env)
        if self.uploads or self.decryptions or self.opens:
            raise KeySetupError(f"{self.id} wraps its key for a peer during key setup only")
        return self._wrapped(keys, self._peers(env))

    # ---- data path -------------------------------------------------------------------------
    def prepare_upload(self, n_values: int) -> None:
        self.discard_prepared()
        # the committed seeds are forgotten before anything is made with them: whatever
        # happens to this request, they serve one upload at most
        seeds, self._next_seeds = self._next_seeds, b""
        if self._keys is not None:
            self._pending = ckks_masks.start(self._keys, n_values, seeds)

    def commit_next_upload(self, n_values: int) -> dict[str, Field]:
        """The seeds of this client's next upload of ``n_values`` values (public: the a they
        expand to travels in every upload), sent with this one so that the round's decryptors
        can expand its check ahead (``secagg.secret.ckks_masks``); none where uploads are not
        masked ahead."""
        keys = self._keys if self.commits_ahead else None
        self._next_seeds = b"" if keys is None else ckks_masks.commit_seeds(keys, n_values)
        return {NEXT_SEEDS: wire.ciphertext(self._next_seeds)} if self._next_seeds else {}

    def prepare_release(self, env: Envelope, n_values: int) -> None:
        """Begin this round's check if the training request names this client a planned
        decryptor (``precheck``: the planned uploads' committed seeds and integer weights).
        The server's word is only a hint: the sum is used only for a release whose signed
        seeds and weights are exactly these (``_checked``)."""
        self._drop_precheck()
        if PRECHECK not in env.fields or self._keys is None:
            return
        entries = env.config(PRECHECK).get("entries")
        seeds = [bytes(p) for p in env.ciphertext_parts(f"{PRECHECK}.seeds")]
        chunks = chunks_for(n_values, self.preset)
        if (
            not isinstance(entries, list)
            or not 0 < len(entries) == len(seeds) <= len(self.signers)
            or not all(
                isinstance(e, list)
                and len(e) == 2
                and e[0] in self.signers
                and isinstance(e[1], int)
                and not isinstance(e[1], bool)
                for e in entries
            )
            or len({e[0] for e in entries}) != len(entries)
            or any(len(s) != chunks * SEED_INFO_BYTES for s in seeds)
        ):
            raise MalformedMessage(
                f"{self.id}: a precheck lists [client, integer weight] for at most "
                f"{len(self.signers)} roster clients, each with {chunks} seeds of its size"
            )
        factors = server_multipliers(self.preset.weighted_by_clients, (k for _, k in entries))
        self._precheck = ckks_masks.start_check(
            self._keys, list(zip(factors, seeds)), chunks, self._flooding_sigma(factors, chunks)
        )

    def _drop_precheck(self) -> None:
        precheck, self._precheck = self._precheck, None
        if precheck is not None:
            precheck.discard()
            self.offline_seconds += precheck.seconds

    def discard_prepared(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.discard()
            self.offline_seconds += pending.seconds

    def protect(
        self, values: np.ndarray, weight: float | None = None, *, basis: str = "", request: str = ""
    ) -> Field:
        """Encrypt ``values``; on a client-weighted preset, ``weight`` (the planned weight
        the server sent with the training request) times ``values``, and the integer weight
        applied is remembered: this client consents only to sums listing that weight.
        Masks made beside training (:meth:`prepare_upload`) for this size are used, once."""
        applied = own_weight(self.id, self.preset, weight)
        pending, self._pending = self._pending, None
        masks = None
        if pending is not None:
            masks = pending.take(np.size(values))
            self.offline_seconds += pending.seconds
        parts = self.keys.encrypt(
            values,
            bound=self.preset.client_bound(len(self.roster)),
            factor=1.0 if applied is None else applied / self.preset.client_weight_unit,
            masks=masks,
        )
        most = ciphertext_raw_bytes(
            self.preset.poly_modulus_degree, self.keys.public.n_primes, True
        )
        seeds = upload_seeds(parts, most)
        digest = seed_digest(seeds)
        if digest in self.uploads:  # never reached: a seed is used once (prepare_upload)
            raise ProtocolStateError(f"{self.id} refuses to send a second upload on one seed")
        self._record_upload(digest, basis, request, applied, len(values))
        return wire.ciphertext(parts)

    # ---- releases: consent (the base), then reveal or open -------------------------------
    def _checked(self, env: Envelope, field: str, kind: str, name: str | None = None):
        """The release in ``field`` of ``env``, checked: (descriptor, ciphertexts)."""
        d, signatures = read_release(
            self.id,
            env.config(f"{field}.release"),
            kind,
            self.policy,
            field,
            name,
            uploads=self.uploads,
        )
        seeds = [bytes(p) for p in env.ciphertext_parts(f"{field}.seeds")]
        check_entries(d, signatures, seeds, self.signers)
        if self.preset.weighted_by_clients:
            check_applied_total(self.id, d, self.preset.client_weight_unit)
        if self._second_polys is None:
            self._second_polys = SecondPolynomials(self.keys.public, self.keys.seeded_template())
        parts = env.ciphertext_parts(field)
        ready = None
        if self._precheck is not None:  # expanded ahead: used only for exactly these uploads
            factors = self._second_polys.factors(d)
            ready = self._precheck.sums(list(zip(factors, seeds)), d.chunks)
            self.prechecks_used += ready is not None
        # the server sends its summed first polynomials only: the second polynomial this
        # client decrypts with is the one it expands from the signed seeds and weights itself
        level = FreshLevel(self.keys.public)
        if native.module() is not None:  # the native path opens it in one call
            first, scale = checked_first_sums(level, parts, d.n_values)
            return d, self._second_polys.expanded(d, seeds, first, scale, ready)
        firsts = load_first_sums(level, parts, d.n_values)
        return d, self._second_polys.build(d, seeds, firsts)

    def _coeff_sigma(self, d: Descriptor) -> float:
        """Flooding for this sum's own error (its weights, all its coefficients) and for
        every decryption the shared key may make: each client of the roster may spend its
        reveal and open budgets."""
        # the server multiplied each upload's encryption noise by its k, or on a
        # client-weighted preset only added (the clients weighted before encrypting)
        factors = server_multipliers(self.preset.weighted_by_clients, (k for _, k, _ in d.entries))
        return self._flooding_sigma(factors, d.chunks)

    def _flooding_sigma(self, factors: Sequence[int], chunks: int) -> float:
        """:meth:`_coeff_sigma` of a sum with these server multipliers over ``chunks``
        chunks (a planned release's, for its noise encoded ahead)."""
        if self.flooding_bits == 0:
            return 0.0
        total = (self.decryption_budget + self.open_budget) * len(self.roster)
        error = error_bound(
            list(factors), chunks * self.preset.poly_modulus_degree, self.flooding_bits
        )
        return flooding_sigma(error, max(total, 1), self.flooding_bits)

    def open(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        """An aggregate the server sent this client (LARC's Ĝ, RegAgg's centre, a
        server-blind update): checked like a reveal and flooded, since what the client
        computes from it may be released. At most ``open_budget`` times."""
        self._check_open_budget()
        d, cts = self._checked(envelope, name, "open", name)
        if d.n_values != length:
            raise ReleaseRefused(f"{self.id}: {name} has {d.n_values} values, expected {length}")
        values, _ = self.keys.open_flooded(
            cts, d.n_values, self._coeff_sigma(d), *self._precomputed_noise(d)
        )
        self.opens += 1
        return values

    def _precomputed_noise(self, d: Descriptor) -> tuple[np.ndarray | None, Any]:
        """The flooding noise made ahead with this round's check, for one opening: its
        normals and its encoding (``PendingCheck.noise``); the precheck is spent after it (a
        second release of the round draws its own)."""
        if self._precheck is None:
            return None, None
        noise = self._precheck.noise(d.chunks * self.preset.values_per_ciphertext)
        self._drop_precheck()
        return noise

    def on_reveal(self, env: Envelope) -> dict[str, Field]:
        """Decrypt a checked aggregate for the server, flooded; with the flooding σ per
        value, by which the server checks this decryption against another decryptor's
        (``CKKSServer.reveal``). A second decryptor of the same release decrypts it as the
        first did: each counts in its own budget."""
        budget = self.decryption_budget
        if self.decryptions >= budget:
            raise ProtocolStateError(
                f"{self.id} refuses decryption {self.decryptions + 1}: the "
                f"flooding was sized for {budget}"
            )
        d, cts = self._checked(env, "aggregate", "reveal")
        start = time.perf_counter()
        values, self.last_flooding_sigma = self.keys.open_flooded(
            cts, d.n_values, self._coeff_sigma(d), *self._precomputed_noise(d)
        )
        self.opening_seconds += time.perf_counter() - start
        self.decryptions += 1
        return {
            d.name: wire.vector(values),
            "flooding_sigma": wire.scalar(self.last_flooding_sigma),
        }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
