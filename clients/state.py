"""A client's state as one versioned blob (pure helpers for ``Client.export_state``).

The blob is an envelope from the client to ``"state"`` (phase ``client_state``, round 0): a
``meta`` config field (state version, client id, backend, protocol half, model size), a
``state`` config field with the JSON-able parts, ``array:<path>`` float64 vector fields and
``opaque:<path>`` byte fields (key material stays out of the JSON).

.. warning:: A client's blob holds secret key material (see ``secagg.clients.runtime``):
   keep it on the client's own node.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import ClientInputError, StateError, WireError
from secagg.wire import Envelope

#: layout version of exported client state; a blob of another version is refused
STATE_VERSION = 1
#: the envelope an exported state travels in: from the client, to "state", this phase
STATE_RECIPIENT, STATE_PHASE = "state", "client_state"
_ARRAY, _OPAQUE, _SEP = "array:", "opaque:", "/"  # field-name prefixes, path separator


def encode_state(client_id: str, meta: Mapping[str, Any], state: Mapping[str, Any]) -> bytes:
    """One envelope: ``meta``, the JSON-able skeleton of ``state``, its arrays (float64
    vectors) and its bytes (opaque fields: key material stays out of the JSON)."""
    skeleton, arrays, opaque = split_state(state)
    try:
        fields = {
            "meta": wire.config(meta),
            "state": wire.config(skeleton),
            **{_ARRAY + p: wire.vector(np.asarray(a, dtype=np.float64)) for p, a in arrays.items()},
            **{_OPAQUE + p: wire.ciphertext(b) for p, b in opaque.items()},
        }
    except (TypeError, ValueError, ClientInputError) as exc:  # not JSON, non-finite
        raise StateError(
            f"{client_id}: its state cannot be exported ({exc}); every part "
            "must be JSON-able, a finite 1-D array or bytes"
        ) from None
    return Envelope(client_id, STATE_RECIPIENT, 0, STATE_PHASE, fields).to_bytes()


def decode_state(data: bytes, client_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta, state) of a blob :func:`encode_state` wrote for ``client_id``; changes
    nothing, raises :class:`StateError` for anything else."""
    try:
        env = Envelope.from_bytes(data)
    except WireError as exc:
        raise StateError(
            f"{client_id}: not a client state ({type(exc).__name__}: {exc}); "
            "restore the bytes export_state returned, whole and unmodified"
        ) from None
    if (env.recipient, env.phase, env.round) != (STATE_RECIPIENT, STATE_PHASE, 0):
        raise StateError(
            f"{client_id}: a {env.phase!r} message to {env.recipient!r} is not "
            "an exported client state"
        )
    if env.sender != client_id:
        raise StateError(
            f"{client_id}: this is the state of {env.sender!r}; restore each "
            "client from its own export"
        )
    try:
        meta = env.config("meta")
        version = meta.get("version") if isinstance(meta, dict) else None
        if version != STATE_VERSION:
            raise StateError(
                f"{client_id}: client state version {version!r}; this build "
                f"reads version {STATE_VERSION}. Export it again with this build, "
                "or start the client afresh in a new run"
            )
        skeleton = env.config("state")
        arrays = {n[len(_ARRAY) :]: env.vector(n) for n in env.fields if n.startswith(_ARRAY)}
        opaque = {
            n[len(_OPAQUE) :]: bytes(env.get(n, wire.CIPHERTEXT).data)
            for n in env.fields
            if n.startswith(_OPAQUE)
        }
    except ClientInputError as exc:  # a field missing, mistyped or non-finite
        raise StateError(f"{client_id}: the client state is garbled ({exc})") from None
    stray = (
        set(env.fields)
        - {"meta", "state"}
        - {_ARRAY + p for p in arrays}
        - {_OPAQUE + p for p in opaque}
    )
    if stray or not isinstance(skeleton, dict):
        raise StateError(f"{client_id}: the client state is garbled (stray fields {sorted(stray)})")
    return meta, join_state(skeleton, arrays, opaque)


def split_state(
    state: Mapping[str, Any], path: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, bytes]]:
    """A nested state as (JSON skeleton, arrays by path, bytes by path); paths join the
    keys with "/", so a key may not contain one."""
    skeleton: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    opaque: dict[str, bytes] = {}
    for key, value in state.items():
        if not isinstance(key, str) or _SEP in key:
            raise StateError(
                f"state key {key!r} at {_SEP.join(path) or 'the top'} must be a "
                f"string without {_SEP!r}"
            )
        where = _SEP.join((*path, key))
        if isinstance(value, Mapping):
            skeleton[key], more_arrays, more_opaque = split_state(value, (*path, key))
            arrays.update(more_arrays)
            opaque.update(more_opaque)
        elif isinstance(value, np.ndarray):
            if value.ndim != 1:
                raise StateError(
                    f"state array {where} has shape {value.shape}; only 1-D arrays are exported"
                )
            arrays[where] = value
        elif isinstance(value, (bytes, bytearray, memoryview)):
            opaque[where] = bytes(value)
        else:
            skeleton[key] = value
    return skeleton, arrays, opaque


def join_state(
    skeleton: Mapping[str, Any], arrays: Mapping[str, np.ndarray], opaque: Mapping[str, bytes]
) -> dict[str, Any]:
    """The inverse of :func:`split_state`."""
    state = copy.deepcopy(dict(skeleton))  # the caller's skeleton stays as it was
    for where, value in (*arrays.items(), *opaque.items()):
        *parents, leaf = where.split(_SEP)
        node: Any = state
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf in node:
            raise StateError(f"the client state is garbled: {where} has no place in it")
        node[leaf] = value
    return state


def check_meta(meta: Mapping[str, Any], own: Mapping[str, Any], client_id: str) -> None:
    wrong = {k: meta.get(k) for k in own if meta.get(k) != own[k]}
    if wrong:
        raise StateError(
            f"{client_id}: the state was exported by a different kind of client "
            f"({', '.join(f'{k}={v!r}, here {own[k]!r}' for k, v in wrong.items())}"
            "); restore it into a client built the same way"
        )


def copied(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None else np.array(values, dtype=np.float64, copy=True)


def model_sized(values: Any, n_params: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (n_params,):
        raise StateError(f"the state's {name!r} has {values.size} values, the model {n_params}")
    return values


def restored_generator(like: np.random.Generator, state: Any, what: str) -> np.random.Generator:
    """A new generator of ``like``'s kind at ``state`` (``bit_generator.state``, a plain
    dict); ``like`` is left alone, so a failed restore changes nothing."""
    rng = np.random.Generator(type(like.bit_generator)())
    try:
        rng.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as exc:
        raise StateError(f"{what}'s generator state does not load: {exc}") from None
    return rng
