"""The secret half of CKKS: a client's key holder. Only client code imports this module.

It encrypts (seeded symmetric encryption: half-size uploads), decrypts, and decrypts with
noise flooding for releases to the server. The secret key leaves it only through
:meth:`SecretKeyHolder.export_for_wrapping`, whose caller wraps it for another client or puts
it in the client's own state export (``Client.export_state``, kept on the client's node);
``SecretKeyHolder(preset, exported)`` loads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tenseal.sealapi as seal

from secagg.ckks import native
from secagg.ckks.flooding import csprng_normal, slot_sigma
from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.ckks.public import (
    COUNT,
    HEADER_BYTES,
    PLAINTEXT_META,
    SEAL_LOAD_ERRORS,
    PublicCKKS,
    check_nested,
    checked_blob,
    ciphertext_raw_bytes,
    from_bytes,
    inflate,
    key_id,
    parms_id_bytes,
    to_bytes,
    uncompressed_blob,
    upload_chunks,
)
from secagg.ckks.release import ExpandedAggregate
from secagg.errors import ClientInputError, KeySetupError, MalformedCiphertext, ValueRangeError

#: a secret key is a plaintext at the key level (``PLAINTEXT_META``, then its data)
_PLAIN_META, _COUNT = PLAINTEXT_META, COUNT


def secret_key_raw_bytes(n: int, primes: int) -> int:
    """Uncompressed size of a secret key of degree ``n`` over the key level's ``primes``."""
    return _PLAIN_META.size + HEADER_BYTES + _COUNT.size + 8 * n * primes


def check_secret_key_layout(raw: bytes, n: int, primes: int) -> None:
    """Every size in an uncompressed secret key, against the preset's: the key comes from
    the leader (another client) or a state export, and SEAL 4.1 would allocate whatever a
    forged count inside it claims."""
    count = n * primes
    if len(raw) != secret_key_raw_bytes(n, primes):
        raise MalformedCiphertext(
            f"secret key inflates to {len(raw)} bytes; this preset's has "
            f"{secret_key_raw_bytes(n, primes)}"
        )
    _, coeffs, _ = _PLAIN_META.unpack_from(raw)
    check_nested(raw, _PLAIN_META.size, HEADER_BYTES + _COUNT.size + 8 * count, "secret key")
    (claimed,) = _COUNT.unpack_from(raw, _PLAIN_META.size + HEADER_BYTES)
    if coeffs != count or claimed != count:
        raise MalformedCiphertext(
            f"secret key claims {coeffs} and {claimed} coefficients, expected {count}"
        )


def load_secret_key(ctx: seal.SEALContext, data: bytes | memoryview) -> seal.SecretKey:
    """A secret key from bytes: checked (sizes, compression, layout), then loaded by SEAL."""
    n = ctx.key_context_data().parms().poly_modulus_degree()
    primes = len(ctx.key_context_data().parms().coeff_modulus())
    blob = checked_blob(
        data,
        secret_key_raw_bytes(n, primes),
        lambda raw: check_secret_key_layout(raw, n, primes),
        "secret key",
    )
    return from_bytes(seal.SecretKey(), ctx, blob, private=True)


class SecretKeyHolder:
    def __init__(self, preset: CKKSPreset, secret_key_bytes: bytes | None = None):
        self.public = PublicCKKS(preset)
        self.preset = preset
        ctx = self.public.context
        if secret_key_bytes is None:
            self._secret = seal.KeyGenerator(ctx).secret_key()
        else:
            try:
                self._secret = load_secret_key(ctx, secret_key_bytes)
            except (ClientInputError, *SEAL_LOAD_ERRORS) as exc:
                raise KeySetupError(
                    f"secret key does not load for preset {preset.name}: {exc}"
                ) from None
        self._encryptor = seal.Encryptor(ctx, self._secret)
        self._decryptor = seal.Decryptor(ctx, self._secret)
        self._encoder = seal.CKKSEncoder(ctx)
        self._native_encryptor: object | None = None  # made on first use (``_native``)
        #: openings that added flooding noise encoded ahead (``open_flooded``'s ``encoded``)
        self.noise_encoded_ahead_used = 0
        self._key_id: str | None = None

    def export_for_wrapping(self) -> bytes:
        return to_bytes(self._secret, private=True)

    @property
    def key_id(self) -> str:
        """This key's public name (:func:`~secagg.ckks.public.key_id`), by which the clients
        of one key setup check they hold the same key."""
        if self._key_id is None:
            self._key_id = key_id(self.export_for_wrapping())
        return self._key_id

    # ---- encryption -----------------------------------------------------------------------
    def encrypt(
        self, values: np.ndarray, bound: float, factor: float = 1.0, *, masks: Any = None
    ) -> list[bytes]:
        """Seeded symmetric encryptions of ``factor · values`` packed N reals per ciphertext.

        ``bound`` is the largest |value| the aggregate's headroom allows for one client;
        CKKS would overflow silently past it, so refuse instead. It applies to ``values``
        themselves; ``factor`` (a client-weighted preset's applied weight, at most 1) only
        shrinks them. ``masks``: this upload's precomputed encryptions of zero
        (``secagg.secret.ckks_masks``), used once: wiped whether or not the encryption succeeds.
        """
        try:
            values = self.checked(values, bound)
            if factor != 1.0:
                values = values * factor
            encryptor = self._native()
            if encryptor is None:
                return self._encrypt_tenseal(values)
            if masks is None:
                blob = encryptor.encrypt(values, self.public.scale, native.threads())
            else:
                blob = encryptor.encrypt_masked(masks, values, self.public.scale, native.threads())
        finally:
            if masks is not None:
                masks.wipe()
        return upload_chunks(blob, encryptor.ciphertext_bytes, self.preset)

    def _encrypt_tenseal(self, values: np.ndarray) -> list[bytes]:
        per = self.preset.values_per_ciphertext
        half = per // 2
        out = []
        for j in range(chunks_for(values.size, self.preset)):
            chunk = np.zeros(per)
            part = values[j * per : (j + 1) * per]
            chunk[: part.size] = part
            pt = seal.Plaintext()
            self._encoder.encode((chunk[:half] + 1j * chunk[half:]).tolist(), self.public.scale, pt)
            out.append(to_bytes(self._encryptor.encrypt_symmetric(pt)))
        return out

    def native_encryptor(self):
        """The native encryptor for this key, or None on the TenSEAL path (what
        ``secagg.secret.ckks_masks`` makes an upload's masks with)."""
        return self._native()

    def _native(self):
        """The native encryptor for this key (``native.py``), or None on the TenSEAL path."""
        extension = native.module()
        if extension is None:
            return None
        if self._native_encryptor is None:
            n, primes = self.preset.poly_modulus_degree, len(self.preset.coeff_bits)
            raw = inflate(
                memoryview(self.export_for_wrapping())[HEADER_BYTES:],
                secret_key_raw_bytes(n, primes),
                "secret key",
            )
            encryptor = extension.SecretKeyCKKS(
                parameters=native.parameters(n, tuple(self.preset.coeff_bits)),
                secret_key=uncompressed_blob(raw),
            )
            if encryptor.first_parms_id != parms_id_bytes(self.public.context.first_parms_id()):
                raise KeySetupError(
                    f"the native extension's parameters for preset {self.preset.name} are not "
                    "TenSEAL's: rebuild it (scripts/build_native.sh) or set SECAGG_NATIVE=off"
                )
            self._native_encryptor = encryptor
        return self._native_encryptor

    def checked(self, values: np.ndarray, bound: float) -> np.ndarray:
        """``values`` as a flat float64 array, refused (ValueRangeError) if any is not
        finite or exceeds ``bound``."""
        values = np.asarray(values, dtype=np.float64).ravel()
        if not np.all(np.isfinite(values)):
            raise ValueRangeError("refusing to encrypt non-finite values")
        peak = float(np.max(np.abs(values))) if values.size else 0.0
        if peak > bound:
            i = int(np.argmax(np.abs(values)))
            raise ValueRangeError(
                f"value {values[i]:.6g} at index {i} exceeds the CKKS preset "
                f"{self.preset.name!r} per-client bound {bound:.6g} (aggregate headroom "
                f"{self.preset.headroom:.6g}); clip or rescale the update, or choose the "
                "'wide' preset"
            )
        return values

    # ---- decryption -----------------------------------------------------------------------
    def decrypt(
        self, parts: Sequence[bytes | memoryview], n_values: int, scale: float | None = None
    ) -> np.ndarray:
        """Decrypt ciphertexts at ``scale``, or (None) an aggregate at the scale it carries."""
        return self._decode(self._load(parts, n_values, scale), n_values)

    def decrypt_flooded(
        self,
        parts: Sequence[bytes | memoryview],
        n_values: int,
        scale: float | None,
        coeff_sigma: float,
    ) -> tuple[np.ndarray, float]:
        """Decrypt with flooding noise; returns the values and the per-value noise σ."""
        cts = self._load(parts, n_values, scale)
        return self.open_flooded(cts, n_values, coeff_sigma)

    def open_flooded(
        self,
        cts: list[seal.Ciphertext] | ExpandedAggregate,
        n_values: int,
        coeff_sigma: float,
        normals: np.ndarray | None = None,
        encoded: tuple[Any, tuple[float, float]] | None = None,
    ) -> tuple[np.ndarray, float]:
        """Add Gaussian noise of ``coeff_sigma`` per coefficient to each ciphertext, then
        decrypt: the noise is in before the decryption is reduced mod q, so whatever the
        ciphertext's first polynomial (the server chose it), every value released is a
        function of flooded coefficients. The noise is encoded as slot values (σ per real
        component, ``slot_sigma``) and rounded to integer coefficients by the encoder.
        ``normals``: the noise's standard normals, drawn ahead from the same CSPRNG
        (``ckks_masks.PendingCheck``) for this opening alone (the native path uses and wipes
        them), or None to draw them now. ``encoded``: those normals' noise encoded ahead
        (``SecretKeyCKKS.encode_noise``) with the (σ, scale) it was encoded for; the native
        path adds it only for exactly this opening's σ, scale and chunks, and wipes it."""
        if isinstance(cts, ExpandedAggregate):
            return self._open_native(cts, n_values, coeff_sigma, normals, encoded)
        if encoded is not None:
            encoded[0].wipe()
        sigma = slot_sigma(coeff_sigma, self.preset.poly_modulus_degree, cts[0].scale)
        if sigma > 0:
            half = self.preset.values_per_ciphertext // 2
            for ct in cts:
                z = sigma * csprng_normal(2 * half)
                noise = seal.Plaintext()
                self._encoder.encode(
                    (z[:half] + 1j * z[half:]).tolist(), ct.parms_id(), ct.scale, noise
                )
                self.public.evaluator.add_plain_inplace(ct, noise)
        return self._decode(cts, n_values), sigma

    def _open_native(
        self,
        aggregate: ExpandedAggregate,
        n_values: int,
        coeff_sigma: float,
        normals: np.ndarray | None = None,
        encoded: tuple[Any, tuple[float, float]] | None = None,
    ) -> tuple[np.ndarray, float]:
        """:meth:`open_flooded` in one native call: the same noise (σ per real component of
        every slot, encoded at the ciphertext's scale and added before decryption), the
        same decryption and decoding, on every chunk at once. The noise encoded ahead is
        the encoding of ``normals`` at (σ, scale): used when both are this opening's."""
        encryptor = self._native()
        if encryptor is None:
            raise KeySetupError("an aggregate expanded natively needs the native extension")
        sigma = slot_sigma(coeff_sigma, self.preset.poly_modulus_degree, aggregate.scale)
        size = len(aggregate.first) * self.preset.values_per_ciphertext
        ahead = None
        if encoded is not None:
            flooding, made_for = encoded
            if (
                sigma > 0
                and made_for == (sigma, aggregate.scale)
                and flooding.chunks == len(aggregate.first)
            ):
                ahead = flooding
            else:  # encoded for another release: never used
                flooding.wipe()
        if normals is None or normals.size != size:
            normals = csprng_normal(size) if sigma > 0 else np.empty(0)
        noise = sigma * normals if sigma > 0 and ahead is None else np.empty(0)
        normals.fill(0.0)  # one opening's: nothing later can reuse them
        try:
            values = encryptor.open(
                aggregate.first,
                aggregate.second,
                aggregate.scale,
                noise,
                native.threads(),
                ahead,
            )
        except ValueError as exc:
            raise MalformedCiphertext(f"the aggregate does not open: {exc}") from None
        finally:
            noise.fill(0.0)
        self.noise_encoded_ahead_used += ahead is not None
        return values[:n_values], sigma

    def seeded_template(self) -> bytes:
        """An uncompressed seeded encryption of zero: the layout a release check fills with
        each upload's seed (``release.SecondPolynomials``)."""
        pt = seal.Plaintext()
        self._encoder.encode(0.0, self.public.scale, pt)
        data = to_bytes(self._encryptor.encrypt_symmetric(pt))
        most = ciphertext_raw_bytes(
            self.preset.poly_modulus_degree, self.public.n_primes, seeded=True
        )
        return inflate(memoryview(data)[HEADER_BYTES:], most, "seeded template")

    def _load(
        self, parts: Sequence[bytes | memoryview], n_values: int, scale: float | None
    ) -> list[seal.Ciphertext]:
        return self.public.load_ciphertexts(parts, n_values, scale=scale, aggregate=scale is None)

    def _decode(self, cts: list[seal.Ciphertext], n_values: int) -> np.ndarray:
        out = []
        for ct in cts:
            pt = seal.Plaintext()
            self._decryptor.decrypt(ct, pt)
            z = np.asarray(self._encoder.decode_complex(pt))
            out.append(np.concatenate([z.real, z.imag]))
        return np.concatenate(out)[:n_values]
