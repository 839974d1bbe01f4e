"""A deployment's secagg keys on disk: each node's identity (its own directory, mode 0600),
the signers' roster for the server, and the name of the experiment both sides run.

The identity file holds the client's X25519 and Ed25519 private keys and the two rosters
(public keys of every client); the server's file holds the Ed25519 public keys only. Nothing
here is sent anywhere: a deployment copies each node's directory to its machine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from secagg.backends import Identity
from secagg.errors import ConfigError
from secagg.simulation.config import ExperimentConfig


def experiment_name(config: ExperimentConfig) -> str:
    """What a node and the server compare before any message is answered: a digest of the
    complete settings (a node configured for another run refuses every request)."""
    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object, what: str, path: Path) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except ValueError:
        raise ConfigError(f"{path}: {what} is not base64") from None


def write_private_bytes(path: Path, data: bytes) -> None:
    """A file only its owner reads, replaced whole or not at all (a crash mid-write leaves
    the previous one)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_private(path: Path, text: str) -> None:
    write_private_bytes(path, text.encode())


def write_identity(path: Path, identity: Identity) -> None:
    write_private(
        path,
        json.dumps(
            {
                "client": identity.client_id,
                "x25519_private": _b64(identity.x25519_private),
                "ed25519_private": _b64(identity.ed25519_private),
                "roster": {c: _b64(k) for c, k in identity.roster.items()},
                "signers": {c: _b64(k) for c, k in identity.signers.items()},
            },
            indent=1,
        ),
    )


def read_identity(path: Path) -> Identity:
    try:
        raw = json.loads(path.read_text())
        return Identity(
            str(raw["client"]),
            _unb64(raw["x25519_private"], "x25519_private", path),
            _unb64(raw["ed25519_private"], "ed25519_private", path),
            {str(c): _unb64(k, f"roster[{c}]", path) for c, k in raw["roster"].items()},
            {str(c): _unb64(k, f"signers[{c}]", path) for c, k in raw["signers"].items()},
        )
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist: provision the node first (secagg flower prepare)"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is not a secagg identity file ({exc})") from None


def write_signers(path: Path, signers: Mapping[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({c: _b64(k) for c, k in signers.items()}, indent=1))


def read_signers(path: Path) -> dict[str, bytes]:
    try:
        raw = json.loads(path.read_text())
        return {str(c): _unb64(k, f"signer {c}", path) for c, k in raw.items()}
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: the server's roster of signers") from None
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"{path} is not a roster of signers ({exc})") from None
