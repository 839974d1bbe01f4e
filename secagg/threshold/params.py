"""Threshold CKKS's parameter set and its public operations (OpenFHE, no secret key here).

The scheme (OpenFHE's multiparty CKKS, Asharov et al. style additive key shares):

- every key holder k draws a secret s_k; the joint public key (b, a) with b = −a·s + e,
  s = Σ_k s_k, is built along a chain: holder 1 runs ``KeyGen``, holder k runs
  ``MultipartyKeyGen`` on holder k−1's public key. No party ever holds s;
- a client encrypts m as (c0, c1) = (v·b + e0 + Δm, v·a + e1) under the joint key;
- the server forms Σ k_i·ct_i with integer weights k_i = round(w_i·2^weight_bits), by
  doubling and adding (``EvalAdd`` only: depth 0, no evaluation key, no rescaling);
- each holder's partial decryption of (c0, c1) is c1·s_k + f_k (OpenFHE's
  ``MultipartyDecryptMain``, f_k its fixed Gaussian noise, σ = 2^20); whoever fuses every
  holder's partial with c0 gets c0 + c1·s + Σ f_k = Δ·Σ k_i m_i + noise. A partial depends on
  c1 only, so a holder computes it on its own recomputation of Σ k_i·c1_i from the uploads'
  c1 halves (``c1_half``), never on a ciphertext the server chose.

Parameter set ``n8192``: ring dimension 8192 (4096 values per ciphertext), one 60-bit
modulus (``FIXEDMANUAL``, multiplicative depth 0), scale 2^36, weights quantised to 2^-16;
OpenFHE's ``HEStd_128_classic`` check accepts it (128-bit classical security for N = 8192 up
to a 218-bit modulus). Values are decoded exactly only while |Σ w_i x_i| < headroom = 2^(60 − 1
− 36 − 16 − 2) = 16, and overflow is silent, so each client checks |x| ≤ headroom / n before it
encrypts. Measured precision: max |error| about 2e-6 on Σ w_i x_i for three uploads of N(0,
0.05²) values (public-key encryption noise under a joint secret dominates). Sizes: 32.2 bytes
per value per upload, 16.2 per value per partial decryption.

Parameter set ``wide``: the same ring with a second modulus (60 + 59 bits; BV key switching,
which adds no auxiliary modulus, so the same 128-bit check passes; nothing is ever
multiplied) and scale 2^59: 64.2 bytes per value, 32.2 per partial, max |error| about 2e-13.
It is for sums of small terms (RegAgg's and SimAgg's τ-scaled A and B, entries ~1e-5, which
n8192's 2e-6 would swamp), as ckks's ``wide`` is. Headroom is capped at 16 for both.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import openfhe as fhe

from secagg.errors import ConfigError, KeySetupError, MalformedCiphertext


@dataclass(frozen=True)
class ThresholdPreset:
    name: str
    ring_dim: int
    #: the first modulus; a depth-1 preset adds a second of ``scale_bits``
    first_modulus_bits: int
    scale_bits: int
    weight_bits: int
    description: str
    #: 0: one modulus; 1: two (no multiplication is ever made: the second modulus buys a
    #: larger scale, that is precision, for 2x the bytes)
    depth: int = 0

    @property
    def modulus_bits(self) -> int:
        return self.first_modulus_bits + self.depth * self.scale_bits

    @property
    def slots(self) -> int:
        return self.ring_dim // 2

    @property
    def headroom(self) -> float:
        """The bound on |Σ w_i x_i| (|w_i| ≤ 1 summed) that decodes without wrapping, with
        two bits kept for the noise; capped at 16 (no update comes near it, and the decoder
        is tested up to it)."""
        return 2.0 ** min(4, self.modulus_bits - 1 - self.scale_bits - self.weight_bits - 2)


#: serialised objects carry their key's tag, whose length varies: sizes are checked to within
#: this many bytes before OpenFHE parses anything
SIZE_SLACK = 1024

PRESETS = {
    "n8192": ThresholdPreset(
        "n8192",
        ring_dim=8192,
        first_modulus_bits=60,
        scale_bits=36,
        weight_bits=16,
        description="N=8192, one 60-bit modulus, scale 2^36: 32 B/value, |error| ~2e-6, "
        "headroom 16",
    ),
    "wide": ThresholdPreset(
        "wide",
        ring_dim=8192,
        first_modulus_bits=60,
        scale_bits=59,
        weight_bits=16,
        depth=1,
        description="N=8192, moduli 60+59 bits (BV key switching), scale 2^59: 64 B/value, "
        "|error| ~2e-13, for sums of small terms (RegAgg, SimAgg)",
    ),
}


def get_preset(name: str) -> ThresholdPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown threshold preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]


def quantise(weight: float, weight_bits: int) -> int:
    """The integer a weight becomes: round(w·2^wb), half away from zero."""
    k = int(math.floor(abs(float(weight)) * 2.0**weight_bits + 0.5))
    return -k if weight < 0 else k


def serialize(obj) -> bytes:
    return fhe.Serialize(obj, fhe.BINARY)


def canonical_ciphertext(ct) -> bytes:
    """The bytes a ciphertext has after one round trip (OpenFHE's first serialisation of a
    fresh object differs from every later one): what peers compare and digest."""
    return serialize(fhe.DeserializeCiphertextString(serialize(ct), fhe.BINARY))


def canonical_public_key(key) -> bytes:
    return serialize(fhe.DeserializePublicKeyString(serialize(key), fhe.BINARY))


class ThresholdContext:
    """The crypto context of a preset and every operation that needs no secret: encrypt
    under a public key, weighted sums, the c1 halves, fusion, (de)serialisation with
    checks. Every party builds the same one from the preset (OpenFHE caches it by its
    parameters)."""

    def __init__(self, preset: ThresholdPreset):
        self.preset = preset
        params = fhe.CCParamsCKKSRNS()
        params.SetMultiplicativeDepth(preset.depth)
        params.SetScalingTechnique(fhe.FIXEDMANUAL)
        # BV adds no auxiliary moduli (HYBRID's would push a depth-1 key past N = 8192)
        params.SetKeySwitchTechnique(fhe.BV)
        params.SetFirstModSize(preset.first_modulus_bits)
        params.SetScalingModSize(preset.scale_bits)
        params.SetRingDim(preset.ring_dim)
        params.SetBatchSize(preset.slots)
        params.SetSecurityLevel(fhe.HEStd_128_classic)
        self.cc = fhe.GenCryptoContext(params)
        for feature in (fhe.PKE, fhe.LEVELEDSHE, fhe.MULTIPARTY):
            self.cc.Enable(feature)
        #: names the parameters: a client refuses a setup proposing any other
        self.fingerprint = hashlib.sha256(serialize(self.cc)).hexdigest()[:16]
        probe = self.encrypt_chunks(self._throwaway_public_key(), np.zeros(1))[0]
        self._zero = self.cc.EvalSub(probe, probe).GetElements()[0]
        self.ciphertext_bytes = len(canonical_ciphertext(probe))
        self.c1_bytes = len(self.c1_half(probe))
        self.scale = probe.GetScalingFactor()

    def _throwaway_public_key(self):
        key = self.cc.KeyGen().publicKey  # its secret is dropped at once: sizes only
        self.public_key_bytes = len(canonical_public_key(key))
        return key

    def load_public_key(self, blob: bytes):
        """A public key from bytes a peer sent: this preset's size, canonical."""
        blob = bytes(blob)
        if abs(len(blob) - self.public_key_bytes) > SIZE_SLACK:
            raise KeySetupError(
                f"a public key of this preset has about {self.public_key_bytes} bytes, got "
                f"{len(blob)}"
            )
        try:
            key = fhe.DeserializePublicKeyString(blob, fhe.BINARY)
        except Exception:  # noqa: BLE001 - the binding raises several types
            raise KeySetupError("not an OpenFHE public key") from None
        if serialize(key) != blob:
            raise KeySetupError("a public key of other parameters or not canonical")
        return key

    def chunks(self, n_values: int) -> int:
        return max(1, -(-n_values // self.preset.slots))

    # ---- clients ---------------------------------------------------------------------------
    def encrypt_chunks(self, public_key, values: np.ndarray) -> list:
        values = np.ascontiguousarray(values, dtype=np.float64)
        slots = self.preset.slots
        return [
            self.cc.Encrypt(public_key, self._encode(values[i : i + slots]))
            for i in range(0, max(values.size, 1), slots)
        ]

    def _encode(self, chunk: np.ndarray):
        try:
            return self.cc.MakeCKKSPackedPlaintext(chunk)
        except RuntimeError as exc:
            # OpenFHE refuses a chunk whose encoding rounds to zero but is not zero ("scaling
            # factor too small": e.g. an update of float round-off); zero is what it encodes
            if "Scaling factor too small" not in str(exc):
                raise
            return self.cc.MakeCKKSPackedPlaintext(np.zeros_like(chunk))

    def encrypt(self, public_key, values: np.ndarray, bound: float) -> list[bytes]:
        """Encrypted chunks of ``values`` (|x| ≤ ``bound``, else ValueError: a value beyond
        the headroom would wrap silently), serialised canonically."""
        values = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(values)) or (values.size and np.abs(values).max() > bound):
            raise ValueError(
                f"values must be finite and within ±{bound:.4g} (the threshold preset's "
                "headroom shared by the clients)"
            )
        return [canonical_ciphertext(ct) for ct in self.encrypt_chunks(public_key, values)]

    # ---- loading untrusted bytes ------------------------------------------------------------
    def load_ciphertexts(self, parts: Sequence[bytes], n_values: int) -> list:
        """Fresh ciphertexts of ``n_values`` values from bytes a peer sent: the right
        number of chunks, each exactly a fresh ciphertext of this preset (size, two
        polynomials, level 0, the preset's scale), canonical bytes."""
        if len(parts) != self.chunks(n_values):
            raise MalformedCiphertext(
                f"expected {self.chunks(n_values)} ciphertext chunk(s), got {len(parts)}"
            )
        return [self._load(bytes(p), self.ciphertext_bytes, 2) for p in parts]

    def load_half(self, blob: bytes | memoryview):
        """One half (c0 or c1: a one-polynomial ciphertext) from bytes a peer sent."""
        return self._load(bytes(blob), self.c1_bytes, 1)

    def load_partial(self, blob: bytes | memoryview):
        """One partial decryption from bytes a peer sent."""
        return self._load(bytes(blob), self.c1_bytes, 1)

    def _load(self, blob: bytes, size: int, elements: int):
        # size first: OpenFHE's deserialiser is not meant for hostile input
        if abs(len(blob) - size) > SIZE_SLACK:
            raise MalformedCiphertext(
                f"a ciphertext of this preset has about {size} bytes, got {len(blob)}"
            )
        try:
            ct = fhe.DeserializeCiphertextString(blob, fhe.BINARY)
        except Exception as exc:  # noqa: BLE001 - the binding raises RuntimeError and others
            raise MalformedCiphertext(f"not an OpenFHE ciphertext: {type(exc).__name__}") from None
        if (
            ct.NumberCiphertextElements() != elements
            or ct.GetLevel() != 0
            or ct.GetScalingFactor() != self.scale
            or ct.GetSlots() != self.preset.slots
            or serialize(ct) != blob
        ):
            raise MalformedCiphertext("a ciphertext of other parameters or not canonical")
        return ct

    # ---- the server's sums ------------------------------------------------------------------
    def times(self, ct, k: int):
        """k·ct with additions alone (doubling and adding, in place on copies): depth 0,
        the scale unchanged; ``ct`` is left as it was."""
        if k == 0:
            return self.cc.EvalSub(ct, ct)
        return self.weighted_sum([[ct]], [k])[0]

    def weighted_sum(self, uploads: Sequence[Sequence], ks: Sequence[int]) -> list:
        """Σ_i k_i·uploads[i], chunk by chunk (integer weights, not all 0), by Horner's rule
        over the weights' bits: one doubling per bit for the whole sum, one addition per set
        bit of each weight, all in place (the inputs are not modified). Ring arithmetic is
        exact, so the result is bit for bit the term-by-term sum's, about 20× faster."""
        top = max(abs(k) for k in ks).bit_length()
        if top == 0:
            raise MalformedCiphertext("a sum needs at least one non-zero weight")
        out = []
        for j in range(len(uploads[0])):
            terms = [
                (chunks[j] if k > 0 else self.cc.EvalNegate(chunks[j]), abs(k))
                for chunks, k in zip(uploads, ks)
                if k
            ]
            acc = None
            for bit in range(top - 1, -1, -1):
                if acc is not None:
                    self.cc.EvalAddInPlace(acc, acc)
                for term, k in terms:
                    if (k >> bit) & 1:
                        if acc is None:
                            acc = term.Clone()
                        else:
                            self.cc.EvalAddInPlace(acc, term)
            out.append(acc)
        return out

    # ---- halves, views, fusion ----------------------------------------------------------------
    def _boxed(self, like, polynomials: list):
        box = like.Clone()
        box.SetElements(polynomials)
        return box

    def c1_half(self, ct) -> bytes:
        """The c1 polynomial alone, serialised: all a partial decryption depends on."""
        return serialize(self._boxed(ct, [ct.GetElements()[1]]))

    def c0(self, ct):
        """The c0 polynomial alone (a one-polynomial ciphertext): what partials fuse with."""
        return self._boxed(ct, [ct.GetElements()[0]])

    def c0_half(self, ct) -> bytes:
        """:meth:`c0`, serialised: what the server sends the clients that open a sum."""
        return serialize(self.c0(ct))

    def view(self, c1):
        """(0, c1): the ciphertext a holder partially decrypts (c0 does not enter a partial)."""
        return self._boxed(c1, [self._zero, c1.GetElements()[0]])

    def sum_c1(self, halves: Sequence[Sequence], ks: Sequence[int]) -> list:
        """Σ_i k_i·c1_i, chunk by chunk, from the uploads' c1 halves."""
        return self.weighted_sum(halves, ks)

    def fuse(self, c0s: Sequence, partials: Sequence[Sequence], n_values: int) -> np.ndarray:
        """c0 + Σ_k partial_k per chunk, decoded, divided by 2^weight_bits: Σ w_i x_i.
        ``c0s``: the sum's c0 halves, loaded (``load_half``); ``partials``: per holder, one
        partial per chunk. Missing a holder's partial gives noise, not the sum (OpenFHE
        raises: the decoded error is too large)."""
        out = np.empty(self.chunks(n_values) * self.preset.slots)
        slots = self.preset.slots
        for j, c0 in enumerate(c0s):
            try:
                plain = self.cc.MultipartyDecryptFusion([c0] + [p[j] for p in partials])
            except RuntimeError as exc:
                raise MalformedCiphertext(
                    f"the partial decryptions do not fuse to a sum ({str(exc)[-60:]})"
                ) from None
            plain.SetLength(slots)
            out[j * slots : (j + 1) * slots] = plain.GetRealPackedValue()
        return out[:n_values] / 2.0**self.preset.weight_bits


def c1_digest(halves: Sequence[bytes]) -> str:
    """What names an upload in a release: SHA-256 of its chunks' c1 halves."""
    return hashlib.sha256(b"".join(halves)).hexdigest()
