"""The public half of CKKS: parameters, ciphertext (de)serialisation and weighted sums.

Nothing here can decrypt: no function takes or produces a secret key.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as seal

from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.errors import ConfigError, MalformedCiphertext, WrongContext

# SEAL's Python binding (de)serialises through files only: keep them in memory-backed /dev/shm
# when the machine has it, and delete each file as soon as it has been read. Names come from a
# counter (no uuid, no pathlib: this runs once per ciphertext chunk, hundreds of times per
# million parameters), with the thread id so that threads never share a file.
_SCRATCH = tempfile.mkdtemp(prefix="secagg-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
_NAMES = itertools.count()
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)


def _scratch_path() -> str:
    return f"{_SCRATCH}/{threading.get_ident()}-{next(_NAMES)}"


def to_bytes(obj) -> bytes:
    """SEAL object -> bytes (SEAL's own format, zstd-compressed)."""
    path = _scratch_path()
    try:
        obj.save(path)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def from_bytes(obj, context: seal.SEALContext, data: bytes | memoryview):
    """Load bytes (or a view into a received message) into a fresh SEAL object; SEAL
    validates them against the context."""
    path = _scratch_path()
    try:
        with open(path, "wb") as f:
            f.write(data)
        obj.load(context, path)
        return obj
    finally:
        os.unlink(path)


@functools.cache
def make_context(preset: CKKSPreset) -> seal.SEALContext:
    """SEAL's context for a preset, built once per process and shared: it is immutable, and
    building one (NTT tables, prime checks) costs about 10 ms, which 100 clients and the
    server would otherwise pay twice each."""
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(preset.poly_modulus_degree)
    parms.set_coeff_modulus(
        seal.CoeffModulus.Create(preset.poly_modulus_degree, list(preset.coeff_bits))
    )
    context = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    if not context.parameters_set():
        raise ConfigError(
            f"SEAL rejects preset {preset.name}: {context.parameters_error_message()}"
        )
    return context


@functools.cache
def params_fingerprint(preset: CKKSPreset) -> str:
    """A short public identifier of the parameter set, bound into key wrapping."""
    parms = make_context(preset).key_context_data().parms()
    return hashlib.sha256(to_bytes(parms)).hexdigest()[:16]


class PublicCKKS:
    """What the server holds: the parameters and an evaluator. No key of any kind."""

    def __init__(self, preset: CKKSPreset):
        self.preset = preset
        self.context = make_context(preset)
        self.evaluator = seal.Evaluator(self.context)
        self.encoder = seal.CKKSEncoder(self.context)
        self.scale = 2.0**preset.scale_bits

    def load_ciphertexts(
        self,
        parts: Sequence[bytes | memoryview],
        n_values: int,
        scale: float | None = None,
        aggregate: bool = False,
    ) -> list[seal.Ciphertext]:
        """Load and check ciphertexts for an n-value vector at the fresh-upload level.

        Uploads must carry the fresh scale Δ (or ``scale``). An ``aggregate`` (a weighted
        sum the server sends back) carries Δ·2^weight_bits, or less when the server
        renormalised a sum some clients dropped out of: any scale in [Δ, Δ·2^weight_bits].
        """
        expected = chunks_for(n_values, self.preset)
        if len(parts) != expected:
            raise MalformedCiphertext(
                f"{len(parts)} ciphertexts for {n_values} values; preset {self.preset.name} "
                f"packs {self.preset.values_per_ciphertext} per ciphertext, so {expected}"
            )
        out: list[seal.Ciphertext] = []
        for i, data in enumerate(parts):
            try:
                ct = from_bytes(seal.Ciphertext(), self.context, data)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise MalformedCiphertext(f"ciphertext {i} does not load: {exc}") from None
            if ct.parms_id() != self.context.first_parms_id():
                raise WrongContext(f"ciphertext {i} is not at this preset's fresh level")
            if ct.size() != 2 or not ct.is_ntt_form():
                raise MalformedCiphertext(f"ciphertext {i} has size {ct.size()}, expected 2")
            if aggregate:
                if not self.scale <= ct.scale <= self.sum_scale or (
                    out and ct.scale != out[0].scale
                ):
                    raise WrongContext(
                        f"aggregate ciphertext {i} has scale "
                        f"2^{np.log2(ct.scale):.1f}, outside [2^"
                        f"{self.preset.scale_bits}, 2^"
                        f"{self.preset.scale_bits + self.preset.weight_bits}] "
                        "or unlike the other chunks"
                    )
            elif ct.scale != (self.scale if scale is None else scale):
                raise WrongContext(
                    f"ciphertext {i} has scale 2^{np.log2(ct.scale):.1f}, "
                    f"preset {self.preset.name} uses 2^{self.preset.scale_bits}"
                )
            out.append(ct)
        return out

    def weighted_sum(
        self, vectors: Sequence[list[seal.Ciphertext]], weights: Sequence[float]
    ) -> list[seal.Ciphertext]:
        """Σ_i w_i · vectors[i], chunk by chunk, with w_i quantised to 2^-weight_bits."""
        total = CiphertextSum(self)
        for vec, w in zip(vectors, weights):
            total.add(vec, w)
        return total.result()

    @property
    def sum_scale(self) -> float:
        return self.scale * 2.0**self.preset.weight_bits


class CiphertextSum:
    """A running Σ_i round(w_i · 2^weight_bits) · ct_i, chunk by chunk.

    The server folds each upload in as it arrives and can drop it at once, so a round holds
    one model's worth of ciphertexts however many clients take part. Weights need |w| ≤ 1
    (headroom: each client's values are checked against headroom / n_clients, so any such
    weights keep the sum inside the modulus); a weight that rounds to zero adds nothing.
    """

    def __init__(self, public: PublicCKKS):
        self.public = public
        self.chunks: list[seal.Ciphertext] | None = None
        self._wscale = 2.0**public.preset.weight_bits

    def add(self, vector: list[seal.Ciphertext], weight: float, consume: bool = False) -> bool:
        """Fold ``weight · vector`` in; False if the weight rounds to zero at this preset's
        precision and nothing was added. ``consume`` multiplies ``vector`` in place (no
        copy) when the caller drops it afterwards, as a streaming server does."""
        w = float(weight)
        if not abs(w) <= 1.0:
            raise ConfigError(f"CKKS weighted sums need |w| <= 1 (headroom); got {w}")
        if round(abs(w) * self._wscale) == 0:
            return False
        if self.chunks is not None and len(vector) != len(self.chunks):
            raise MalformedCiphertext(
                f"{len(vector)} chunks, the running sum has {len(self.chunks)}"
            )
        factor = seal.Plaintext()  # the constant round(w·2^wb), encoded once per upload
        self.public.encoder.encode(w, vector[0].parms_id(), self._wscale, factor)
        evaluator = self.public.evaluator
        if consume:
            for ct in vector:
                evaluator.multiply_plain_inplace(ct, factor)
        else:
            scaled = []
            for ct in vector:
                out = seal.Ciphertext()
                evaluator.multiply_plain(ct, factor, out)
                scaled.append(out)
            vector = scaled
        if self.chunks is None:
            self.chunks = list(vector)
        else:
            for acc, ct in zip(self.chunks, vector):
                evaluator.add_inplace(acc, ct)
        return True

    def result(self, normaliser: float = 1.0) -> list[seal.Ciphertext]:
        """The sum, to be decoded as Σ w_i x_i / normaliser: the normaliser goes into the
        ciphertexts' scale (SEAL stores the scale with a ciphertext), so a sum that some
        clients dropped out of is renormalised without another multiplication."""
        if self.chunks is None:
            raise ConfigError("every weight rounds to zero at this preset's weight precision")
        if not 0 < normaliser <= 1 + 1e-9:
            raise ConfigError(f"a running sum's normaliser must lie in (0, 1], got {normaliser}")
        if normaliser != 1.0:
            for ct in self.chunks:
                ct.scale = self.public.sum_scale * normaliser
        return self.chunks
