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

Committed seeds (precomputed checks). A decryptor checks a release by expanding every
contributor's seeds into Σ k_i·a_i (``release.SecondPolynomials``): ten uploads' worth, most of
a reveal. So each upload also commits its client's *next* upload's seeds (``fresh_seeds``:
public randomness, drawn as SEAL draws an encryption's seed), the server relays the seeds of a
round's planned contributors to the round's planned decryptors with their training requests,
and a decryptor expands the sum while it trains (:class:`PendingCheck`), with its flooding
noise beside it: the unit normals, and the noise encoded as the reveal would encode it, for the
planned release's σ and scale (``SecretKeyCKKS.encode_noise``; most of an opening's own cost).
The reveal adds the encoded noise only if the release's σ, scale and chunks are exactly those
it was encoded for, and otherwise encodes the normals itself; either way the noise is the same
and used once. At the reveal it uses the sum only if the release's signed
seeds and weights are exactly the ones it expanded: a server that relays other seeds only
costs it the precomputation. A committed seed is used once: the client takes it out of memory
before it starts that upload's masks (a retried request gets fresh seeds), never writes it to
its state (a restored state cannot replay it), and refuses an upload whose seeds it has
already sent (``CKKSClient.protect``); its noise is always fresh.

Only the native path has them; on TenSEAL's binding a client encrypts as before.
``SECAGG_UPLOAD_MASKS=off`` turns masks and committed seeds off (every upload encrypted
afresh, after training, and every check computed at the reveal: the before of the overhead
benchmark's before-and-after); ``on``, the default, makes them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from secagg.ckks import native
from secagg.ckks.flooding import csprng_normal, slot_sigma
from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.ckks.public import SEED_INFO_BYTES
from secagg.errors import ConfigError

ENV = "SECAGG_UPLOAD_MASKS"


def enabled() -> bool:
    """Whether clients make their uploads' masks beside training (``SECAGG_UPLOAD_MASKS``)."""
    value = os.environ.get(ENV, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ConfigError(f"{ENV}={value!r}: choose on or off")
    return value == "on"


def beside_training() -> int:
    """Threads for work made beside training: all but one of a native call's, the one left
    to the training itself (a single-threaded trainer, as secagg's runs are by default)."""
    return max(1, native.threads() - 1)


class PendingMasks:
    """One upload's masks, being made on a background thread (the native call releases the
    GIL, so it runs beside the client's training)."""

    def __init__(self, encryptor: Any, preset: CKKSPreset, n_values: int, seeds: bytes = b""):
        self.preset = preset
        self.chunks = chunks_for(n_values, preset)
        self.seconds = 0.0  # the masks' own time, off the critical path when training is longer
        self._masks: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._make, args=(encryptor, seeds), name="secagg-upload-masks", daemon=True
        )
        self._thread.start()

    def _make(self, encryptor: Any, seeds: bytes) -> None:
        start = time.perf_counter()
        try:
            if seeds:  # committed with the previous upload; the noise is drawn now
                self._masks = encryptor.masks_from(seeds, beside_training())
            else:
                self._masks = encryptor.masks(self.chunks, beside_training())
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


def start(keys: Any, n_values: int, seeds: bytes = b"") -> PendingMasks | None:
    """Begin making the masks of an upload of ``n_values`` values under ``keys`` (a
    :class:`~secagg.secret.ckks_keys.SecretKeyHolder`), or None on TenSEAL's binding. ``seeds``:
    the ones this client committed for the upload (:func:`commit_seeds`), used if they are
    for its size (the caller has already forgotten them); else fresh ones."""
    if not enabled():
        return None
    encryptor = keys.native_encryptor()
    if encryptor is None or n_values < 1:
        return None
    if len(seeds) != chunks_for(n_values, keys.preset) * SEED_INFO_BYTES:
        seeds = b""
    return PendingMasks(encryptor, keys.preset, n_values, seeds)


def commit_seeds(keys: Any, n_values: int) -> bytes:
    """Fresh seeds for this client's next upload of ``n_values`` values, to send with this
    one, or b"" where uploads are not masked ahead (TenSEAL's binding, the switch off)."""
    if not enabled() or n_values < 1:
        return b""
    encryptor = keys.native_encryptor()
    if encryptor is None:
        return b""
    return bytes(encryptor.fresh_seeds(chunks_for(n_values, keys.preset)))


class PendingCheck:
    """A decryptor's precomputed check, made on a background thread while it trains: Σ k_i·a_i
    of a round's planned uploads, expanded from the seeds their clients committed (public), and
    its flooding noise (secret: used once, by one opening): the unit normals and, where
    ``flooding`` is given, the same noise encoded for the planned release.

    ``entries``: (integer factor, seeds) per planned upload, the factor 1 for every upload on a
    client-weighted preset (the server only adds there).

    ``flooding``: (the key's native encryptor, the planned release's σ per slot value, its
    scale), to encode the noise ahead too; None to draw the normals only."""

    def __init__(
        self,
        expander: Any,
        entries: list[tuple[int, bytes]],
        chunks: int,
        slots: int,
        flooding: tuple[Any, float, float] | None = None,
    ):
        self.key = sorted(entries)
        self.chunks, self.slots = chunks, slots
        self.seconds = 0.0
        self._sums: Any = None
        self._normals: Any = None
        self._encoded: Any = None
        self._encoded_for: tuple[float, float] | None = None  # (σ, scale)
        self._thread = threading.Thread(
            target=self._make, args=(expander, flooding), name="secagg-precheck", daemon=True
        )
        self._thread.start()

    def _make(self, expander: Any, flooding: tuple[Any, float, float] | None) -> None:
        start = time.perf_counter()
        try:
            self._sums = expander.sum(
                seeds=[s for _, s in self.key],
                chunks=self.chunks,
                factors=[k for k, _ in self.key],
                threads=beside_training(),
            )
            self._normals = csprng_normal(self.chunks * self.slots)
            if flooding is not None and flooding[1] > 0:
                encryptor, sigma, scale = flooding
                noise = sigma * self._normals
                try:
                    self._encoded = encryptor.encode_noise(noise, scale, beside_training())
                    self._encoded_for = (sigma, scale)
                finally:
                    noise.fill(0.0)
        except Exception:  # noqa: BLE001 - nothing precomputed: the reveal computes its own
            self.discard_noise()
            self._sums = None
        finally:
            self.seconds = time.perf_counter() - start

    def sums(self, entries: list[tuple[int, bytes]], chunks: int) -> Any:
        """Σ k_i·a_i if ``entries`` (a checked release's (factor, seeds) per upload) are
        exactly the ones expanded, for ``chunks`` chunks; else None. Once."""
        self._thread.join()
        sums, self._sums = self._sums, None
        return sums if sorted(entries) == self.key and chunks == self.chunks else None

    def noise(self, size: int) -> tuple[Any, Any]:
        """One flooding's noise, once (wiped from here): ``size`` standard normals, or None,
        and the noise encoded ahead with the (σ, scale) it was encoded for, or None. The
        opening uses the encoded noise only for exactly that σ, scale and size, else the
        normals; it wipes what it does not use."""
        self._thread.join()
        normals, self._normals = self._normals, None
        encoded, self._encoded = self._encoded, None
        encoded_for, self._encoded_for = self._encoded_for, None
        if normals is not None and normals.size != size:  # drawn for another release's size
            normals.fill(0.0)
            if encoded is not None:
                encoded.wipe()
            return None, None
        return normals, None if encoded is None else (encoded, encoded_for)

    def discard_noise(self) -> None:
        if self._normals is not None:
            self._normals.fill(0.0)
        if self._encoded is not None:
            self._encoded.wipe()
        self._normals = self._encoded = self._encoded_for = None

    def discard(self) -> None:
        self._thread.join()
        self.discard_noise()
        self._sums = None


def start_check(
    keys: Any, entries: list[tuple[int, bytes]], chunks: int, coeff_sigma: float = 0.0
) -> PendingCheck | None:
    """Begin a decryptor's precomputed check (:class:`PendingCheck`), or None where there is
    none to make (TenSEAL's binding, the switch off). ``coeff_sigma``: the planned release's
    flooding σ per coefficient, to encode its noise ahead at the sum's scale (0: none)."""
    if not enabled() or native.module() is None or not entries:
        return None
    preset = keys.preset
    expander = native.seed_expander(preset.poly_modulus_degree, tuple(preset.coeff_bits))
    scale = keys.public.sum_scale
    sigma = slot_sigma(coeff_sigma, preset.poly_modulus_degree, scale)
    encryptor = keys.native_encryptor() if sigma > 0 else None
    flooding = None if encryptor is None else (encryptor, sigma, scale)
    return PendingCheck(expander, entries, chunks, preset.values_per_ciphertext, flooding)
