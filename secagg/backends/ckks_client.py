"""Client half of the CKKS backend: key setup, encryption, decryption, flooded reveals."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import ClientBackend
from secagg.ckks.flooding import error_bound, flooding_sigma
from secagg.ckks.keywrap import KeyWrapper
from secagg.ckks.presets import CKKSPreset, get_preset
from secagg.ckks.public import params_fingerprint
from secagg.ckks.secret import SecretKeyHolder
from secagg.errors import KeySetupError, ProtocolStateError
from secagg.wire import Envelope, Field


class CKKSClient(ClientBackend):
    name = "ckks"

    def __init__(self, client_id: str, preset: CKKSPreset):
        self.id = client_id
        self.preset = preset
        self.fingerprint = params_fingerprint(preset)
        self._wrapper = KeyWrapper()
        self._keys: SecretKeyHolder | None = None
        self._setup: dict | None = None
        self.decryptions = 0
        self.last_flooding_sigma: float | None = None

    def handlers(self) -> dict[str, Callable[[Envelope], dict[str, Field]]]:
        return {
            "key_hello": self.on_hello,
            "key_generate": self.on_generate,
            "key_install": self.on_install,
            "reveal": self.on_reveal,
        }

    @property
    def keys(self) -> SecretKeyHolder:
        if self._keys is None:
            raise KeySetupError(f"{self.id} has no CKKS key yet (key setup did not complete)")
        return self._keys

    # ---- state between messages -------------------------------------------------------------
    #: what :meth:`state_dict` holds; a state with other keys is not this half's
    STATE_KEYS = (
        "preset",
        "params",
        "x25519_private",
        "secret_key",
        "setup",
        "decryptions",
        "last_flooding_sigma",
    )

    def state_dict(self) -> dict[str, Any]:
        """Everything key setup and reveals leave behind. ``x25519_private`` and
        ``secret_key`` (None before key setup) are secret bytes: whoever reads them can
        decrypt every upload of the run."""
        return {
            "preset": self.preset.name,
            "params": self.fingerprint,
            "x25519_private": self._wrapper.private_bytes(),
            "secret_key": (self._keys.export_for_wrapping() if self._keys is not None else None),
            "setup": None if self._setup is None else dict(self._setup),
            "decryptions": self.decryptions,
            "last_flooding_sigma": self.last_flooding_sigma,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load every key before assigning any, so a bad state leaves this half as it was."""
        if set(state) != set(self.STATE_KEYS):
            raise KeySetupError(
                f"{self.id}: a CKKS client state holds {list(self.STATE_KEYS)}, got {sorted(state)}"
            )
        if state["preset"] != self.preset.name or state["params"] != self.fingerprint:
            raise KeySetupError(
                f"{self.id}: the state was made under CKKS preset "
                f"{state['preset']} ({state['params']}), this client runs "
                f"{self.preset.name} ({self.fingerprint})"
            )
        decryptions, sigma, setup = (
            state["decryptions"],
            state["last_flooding_sigma"],
            state["setup"],
        )
        if not isinstance(decryptions, int) or isinstance(decryptions, bool) or decryptions < 0:
            raise KeySetupError(f"{self.id}: decryption count {decryptions!r} is not a count")
        if setup is not None and not isinstance(setup, dict):
            raise KeySetupError(f"{self.id}: key setup {setup!r} is not a mapping")
        wrapper = KeyWrapper.from_private_bytes(_as_bytes(state["x25519_private"]))
        keys = (
            None
            if state["secret_key"] is None
            else SecretKeyHolder(self.preset, _as_bytes(state["secret_key"]))
        )
        self._wrapper, self._keys = wrapper, keys
        self._setup = None if setup is None else dict(setup)
        self.decryptions = decryptions
        self.last_flooding_sigma = None if sigma is None else float(sigma)

    # ---- key setup -----------------------------------------------------------------------
    def _accept_setup(self, env: Envelope) -> None:
        setup = env.config("setup")
        if setup.get("params") != self.fingerprint or get_preset(setup["preset"]) != self.preset:
            raise KeySetupError(
                f"{self.id}: the server proposes parameters {setup.get('params')}"
                f", this client runs {self.preset.name} ({self.fingerprint})"
            )
        self._setup = setup

    def on_hello(self, env: Envelope) -> dict[str, Field]:
        self._accept_setup(env)
        return {"x25519_public": wire.config({"key": _b64(self._wrapper.public_bytes)})}

    def on_generate(self, env: Envelope) -> dict[str, Field]:
        """The key leader makes the CKKS key and wraps it for every other client."""
        self._accept_setup(env)
        self._keys = SecretKeyHolder(self.preset)
        secret = self._keys.export_for_wrapping()
        return {
            f"wrapped_key.{peer}": wire.ciphertext(
                self._wrapper.wrap(secret, _unb64(public), self.id, peer, self.fingerprint)
            )
            for peer, public in env.config("peers").items()
        }

    def on_install(self, env: Envelope) -> dict[str, Field]:
        self._accept_setup(env)
        leader = env.config("leader")
        (blob,) = env.ciphertext_parts("wrapped_key")
        secret = self._wrapper.unwrap(
            blob, _unb64(leader["key"]), leader["id"], self.id, self.fingerprint
        )
        self._keys = SecretKeyHolder(self.preset, secret)
        return {"installed": wire.config({"params": self.fingerprint})}

    # ---- data path -------------------------------------------------------------------------
    def protect(self, values: np.ndarray) -> Field:
        n_clients = self._setup["n_clients"] if self._setup else 1
        return wire.ciphertext(self.keys.encrypt(values, bound=self.preset.headroom / n_clients))

    def open(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        return self.keys.decrypt(envelope.ciphertext_parts(name), length)  # an aggregate

    def on_reveal(self, env: Envelope) -> dict[str, Field]:
        """Decrypt an aggregate for the server, flooded for the run's decryption budget."""
        if self._setup is None:
            raise KeySetupError(f"{self.id} has no key setup")
        budget = int(self._setup["decryption_budget"])
        if self.decryptions >= budget:
            raise ProtocolStateError(
                f"{self.id} refuses decryption {self.decryptions + 1}: the "
                f"flooding was sized for {budget}"
            )
        info = env.config("reveal")
        sigma = flooding_sigma(
            error_bound(self._setup["n_clients"], self.preset.weight_bits),
            budget,
            int(self._setup["flooding_bits"]),
        )
        values, self.last_flooding_sigma = self.keys.decrypt_flooded(
            env.ciphertext_parts("aggregate"),
            int(info["n_values"]),
            None,
            sigma if self._setup["flooding_bits"] > 0 else 0.0,
        )
        self.decryptions += 1
        return {info["name"]: wire.vector(values)}


def _as_bytes(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise KeySetupError(f"key material must be bytes, got {type(value).__name__}")
    return bytes(value)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise KeySetupError("a public key is not valid base64") from None
