"""A deployment's secagg keys on disk: each node's identity (its own directory, mode 0600),
the signers' roster for the server, and the name of the experiment both sides run.

Two ways to provision a node:

- **made on the node** (``secagg flower init``): the node writes ``keys.json`` (its X25519
  and Ed25519 private keys, mode 0600) and ``public.json`` (the public halves, and its
  SuperNode key's public half), and only ``public.json`` leaves it; the coordinator's
  ``prepare --nodes`` assembles the rosters, and the node takes ``roster.json`` (both rosters,
  public) back with the rest of its bundle (``secagg flower join``);
- **made by ``prepare``** (a demo on one machine): ``identity.json`` holds the private keys
  and both rosters together.

The server's file holds the Ed25519 public keys only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from secagg.backends import Identity
from secagg.errors import ConfigError
from secagg.runspec.config import ExperimentConfig


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


def private_folders(folder: Path, top: Path | None = None) -> None:
    """Make ``folder`` with every missing folder above it, each 0700 whatever the umask;
    ``top`` (``folder`` or a folder above it) and every folder from it down to ``folder``
    must be their owner's alone: any of them that exists with a wider mode is tightened to
    0700 (a node's ``state/``, made 0755 by an older secagg)."""
    folder = Path(folder)
    chain = [folder, *folder.parents]
    missing = []
    for each in chain:
        if each.is_dir():
            break
        missing.append(each)
    for each in reversed(missing):
        try:
            each.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process: judged below
            pass
        else:
            os.chmod(each, 0o700)  # mkdir's mode went through the umask
    if top is None:
        return
    top = Path(top)
    if top != folder and top not in folder.parents:
        raise ValueError(f"{top} is not {folder} or a folder above it")
    for each in chain[: chain.index(top) + 1]:
        info = os.stat(each)
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(each, stat.S_IMODE(info.st_mode) & 0o700)


def write_private_bytes(path: Path, data: bytes, *, private_from: Path | None = None) -> None:
    """A file only its owner reads (0600), replaced whole or not at all (a crash mid-write
    leaves the previous one): written to a fresh temporary beside it (O_CREAT | O_EXCL,
    mode 0600, a name no one can have made beforehand), fsynced, renamed over ``path``, and
    the rename fsynced. Missing folders are made 0700; ``private_from``: the folders from it
    down to ``path``'s are tightened to 0700 too (:func:`private_folders`)."""
    path = Path(path)
    private_folders(path.parent, private_from)
    # an older secagg wrote through ``<name>.tmp``, created 0644 if someone made it first
    # (O_TRUNC keeps a file's mode): what it left holds state, and goes
    legacy = path.with_name(path.name + ".tmp")
    if legacy.is_file() and not legacy.is_symlink():
        legacy.unlink()
    fd, tmp = -1, ""
    for _ in range(100):
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp"))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no fresh temporary name beside {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # the umask could only have narrowed it; say it
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # the rename itself survives a crash once its folder is synced
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


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


# ---- keys made on the node ------------------------------------------------------------------
KEYS, PUBLIC, ROSTER, IDENTITY = "keys.json", "public.json", "roster.json", "identity.json"


def write_node_keys(folder: Path, identity: Identity, auth_public: str | None) -> Path:
    """A node's own keys (``keys.json``, 0600) and what it shows (``public.json``)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    write_private(
        folder / KEYS,
        json.dumps(
            {
                "client": identity.client_id,
                "x25519_private": _b64(identity.x25519_private),
                "ed25519_private": _b64(identity.ed25519_private),
            },
            indent=1,
        ),
    )
    raw = (Encoding.Raw, PublicFormat.Raw)
    public = {
        "client": identity.client_id,
        "x25519": _b64(
            X25519PrivateKey.from_private_bytes(identity.x25519_private)
            .public_key()
            .public_bytes(*raw)
        ),
        "ed25519": _b64(
            Ed25519PrivateKey.from_private_bytes(identity.ed25519_private)
            .public_key()
            .public_bytes(*raw)
        ),
        "auth": auth_public,
    }
    (folder / PUBLIC).write_text(json.dumps(public, indent=1) + "\n")
    return folder / PUBLIC


def read_public(path: Path) -> dict[str, Any]:
    """A node's ``public.json``: its client id, its two public keys (raw bytes) and its
    SuperNode key's public half (OpenSSH text) or None. ConfigError for anything else,
    private keys included (they have no business in a file that travels)."""
    try:
        raw = json.loads(Path(path).read_text())
        if set(raw) != {"client", "x25519", "ed25519", "auth"}:
            raise ValueError(f"keys {sorted(raw)}")
        x, ed = _unb64(raw["x25519"], "x25519", path), _unb64(raw["ed25519"], "ed25519", path)
        if len(x) != 32 or len(ed) != 32:
            raise ValueError("a public key is not 32 bytes")
        auth = raw["auth"]
        if auth is not None and (not isinstance(auth, str) or "PRIVATE" in auth):
            raise ValueError("auth is not a public key")
        return {"client": str(raw["client"]), "x25519": x, "ed25519": ed, "auth": auth}
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist: a node's public.json (secagg flower init)"
        ) from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} is not a node's public.json ({exc}); send the file `secagg flower "
            "init` wrote, never keys.json"
        ) from None


def write_roster(path: Path, roster: Mapping[str, bytes], signers: Mapping[str, bytes]) -> None:
    path.write_text(
        json.dumps(
            {
                "roster": {c: _b64(k) for c, k in roster.items()},
                "signers": {c: _b64(k) for c, k in signers.items()},
            },
            indent=1,
        )
        + "\n"
    )


def read_node_identity(folder: Path) -> Identity:
    """A node folder's identity: ``identity.json`` where ``prepare`` made the keys, else the
    node's own ``keys.json`` with the coordinator's ``roster.json``, checked to name this
    node's public keys for its client (a roster without them is refused)."""
    folder = Path(folder)
    if (folder / IDENTITY).exists():
        return read_identity(folder / IDENTITY)
    keys, roster = folder / KEYS, folder / ROSTER
    try:
        own = json.loads(keys.read_text())
        rosters = json.loads(roster.read_text())
        identity = Identity(
            str(own["client"]),
            _unb64(own["x25519_private"], "x25519_private", keys),
            _unb64(own["ed25519_private"], "ed25519_private", keys),
            {str(c): _unb64(k, f"roster[{c}]", roster) for c, k in rosters["roster"].items()},
            {str(c): _unb64(k, f"signers[{c}]", roster) for c, k in rosters["signers"].items()},
        )
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{folder} has no {Path(str(exc.filename)).name}: make the node's keys with "
            "`secagg flower init` and take in the coordinator's bundle with `secagg flower "
            "join`"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{folder}: not a node's keys and roster ({exc})") from None
    mine = json.loads((folder / PUBLIC).read_text()) if (folder / PUBLIC).exists() else None
    ours = {
        "x25519": _b64(identity.roster.get(identity.client_id, b"")),
        "ed25519": _b64(identity.signers.get(identity.client_id, b"")),
    }
    if mine is None or any(mine.get(k) != v for k, v in ours.items()):
        raise ConfigError(
            f"{folder}: the roster does not hold this node's own public keys for "
            f"{identity.client_id}; the coordinator must prepare with this node's public.json"
        )
    return identity
