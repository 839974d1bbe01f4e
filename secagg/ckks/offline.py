"""Offline/online uploads: the part of an encryption that does not depend on the values,
computed while the client trains.

SEAL's seeded symmetric encryption of a plaintext m is an encryption of zero,
(c₀, c₁) = (−a·s + e, seed of a), to which m is added: c₀ + m (``Encryptor::encrypt_internal``).
Expanding a from a fresh seed, sampling e and forming −a·s + e in the NTT domain is most of
an upload's cost and needs only the key, so a client starts it on a background thread as soon
as a training request is accepted (:meth:`CKKSClient.prepare_upload`) and, once training
ends, the online step is encode + add (``SecretKeyCKKS.encrypt_masked``). The bytes are those
a fresh encryption writes; the server cannot tell them apart.

The masks are key material, handled like keys:

- made fresh for one upload (new seeds, new noise: SEAL's samplers, as any encryption), used
  once: taking them wipes them, whether or not the encryption then succeeds;
- never persisted: they live in the native object only, for the one request that made them
  (the client discards whatever that request did not use, on success and on failure);
- on a failure while they are made, the client encrypts afresh, as without them.

Only the native path has them; on TenSEAL's binding a client encrypts as before.
``SECAGG_UPLOAD_MASKS=off`` turns them off (every upload encrypted afresh, after training: the
before of the overhead benchmark's before-and-after); ``on``, the default, makes them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from secagg.ckks import native
from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.errors import ConfigError

ENV = "SECAGG_UPLOAD_MASKS"


def enabled() -> bool:
    """Whether clients make their uploads' masks beside training (``SECAGG_UPLOAD_MASKS``)."""
    value = os.environ.get(ENV, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ConfigError(f"{ENV}={value!r}: choose on or off")
    return value == "on"


class PendingMasks:
    """One upload's masks, being made on a background thread (the native call releases the
    GIL, so it runs beside the client's training)."""

    def __init__(self, encryptor: Any, preset: CKKSPreset, n_values: int):
        self.preset = preset
        self.chunks = chunks_for(n_values, preset)
        self.seconds = 0.0  # the masks' own time, off the critical path when training is longer
        self._masks: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._make, args=(encryptor,), name="secagg-upload-masks", daemon=True
        )
        self._thread.start()

    def _make(self, encryptor: Any) -> None:
        start = time.perf_counter()
        try:
            self._masks = encryptor.masks(self.chunks, native.threads())
        except BaseException as exc:  # noqa: BLE001 - reported by take(): encrypt afresh
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - start

    def take(self, n_values: int) -> Any:
        """The masks for an upload of ``n_values`` values (waiting for them if need be), or
        None if they were made for another size or could not be made. Only once: after this
        call this object holds nothing."""
        self._thread.join()
        masks, self._masks = self._masks, None
        if masks is not None and masks.chunks != chunks_for(n_values, self.preset):
            masks.wipe()
            return None
        return masks

    def discard(self) -> None:
        """Wipe the masks if nobody took them (waits for the thread: no mask outlives the
        request that made it)."""
        self._thread.join()
        masks, self._masks = self._masks, None
        if masks is not None:
            masks.wipe()


def start(keys: Any, n_values: int) -> PendingMasks | None:
    """Begin making the masks of an upload of ``n_values`` values under ``keys`` (a
    :class:`~secagg.ckks.secret.SecretKeyHolder`), or None on TenSEAL's binding."""
    if not enabled():
        return None
    encryptor = keys.native_encryptor()
    if encryptor is None or n_values < 1:
        return None
    return PendingMasks(encryptor, keys.preset, n_values)
