"""The public half of CKKS: parameters, ciphertext (de)serialisation and weighted sums.

Nothing here can decrypt: no function takes or produces a secret key.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Sequence

import numpy as np
import tenseal.sealapi as seal

from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.errors import ConfigError, MalformedCiphertext, WrongContext

# SEAL's Python binding (de)serialises through files only: keep them in memory-backed /dev/shm
# when the machine has it, and delete each file as soon as it has been read.
_SCRATCH = Path(tempfile.mkdtemp(prefix="secagg-",
                                 dir="/dev/shm" if os.path.isdir("/dev/shm") else None))


def to_bytes(obj) -> bytes:
    """SEAL object -> bytes (SEAL's own format, zstd-compressed)."""
    path = _SCRATCH / uuid.uuid4().hex
    try:
        obj.save(str(path))
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def from_bytes(obj, context: seal.SEALContext, data: bytes):
    """Load bytes into a fresh SEAL object; SEAL validates them against the context."""
    path = _SCRATCH / uuid.uuid4().hex
    try:
        path.write_bytes(data)
        obj.load(context, str(path))
        return obj
    finally:
        path.unlink(missing_ok=True)


def make_context(preset: CKKSPreset) -> seal.SEALContext:
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(preset.poly_modulus_degree)
    parms.set_coeff_modulus(seal.CoeffModulus.Create(preset.poly_modulus_degree,
                                                     list(preset.coeff_bits)))
    context = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    if not context.parameters_set():
        raise ConfigError(f"SEAL rejects preset {preset.name}: "
                          f"{context.parameters_error_message()}")
    return context


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
        self.scale = 2.0 ** preset.scale_bits

    def load_ciphertexts(self, parts: Sequence[bytes], n_values: int,
                         scale: float | None = None) -> list[seal.Ciphertext]:
        """Load and check ciphertexts for an n-value vector at the fresh-upload level."""
        expected = chunks_for(n_values, self.preset)
        if len(parts) != expected:
            raise MalformedCiphertext(
                f"{len(parts)} ciphertexts for {n_values} values; preset {self.preset.name} "
                f"packs {self.preset.values_per_ciphertext} per ciphertext, so {expected}")
        out = []
        for i, data in enumerate(parts):
            try:
                ct = from_bytes(seal.Ciphertext(), self.context, data)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise MalformedCiphertext(f"ciphertext {i} does not load: {exc}") from None
            if ct.parms_id() != self.context.first_parms_id():
                raise WrongContext(f"ciphertext {i} is not at this preset's fresh level")
            if ct.size() != 2 or not ct.is_ntt_form():
                raise MalformedCiphertext(f"ciphertext {i} has size {ct.size()}, expected 2")
            if ct.scale != (self.scale if scale is None else scale):
                raise WrongContext(f"ciphertext {i} has scale 2^{np.log2(ct.scale):.1f}, "
                                   f"preset {self.preset.name} uses 2^{self.preset.scale_bits}")
            out.append(ct)
        return out

    def weighted_sum(self, vectors: Sequence[list[seal.Ciphertext]],
                     weights: Sequence[float]) -> list[seal.Ciphertext]:
        """Σ_i w_i · vectors[i], chunk by chunk, with w_i quantised to 2^-weight_bits."""
        weights = [float(w) for w in weights]
        if any(not abs(w) <= 1.0 for w in weights):
            raise ConfigError(f"CKKS weighted sums need |w| <= 1 (headroom); got {weights}")
        wscale = 2.0 ** self.preset.weight_bits
        used = [(v, w) for v, w in zip(vectors, weights) if round(abs(w) * wscale) > 0]
        if not used:
            raise ConfigError("every weight rounds to zero at this preset's weight precision")
        total = []
        for j in range(len(used[0][0])):
            acc = None
            for vec, w in used:
                pt = seal.Plaintext()
                self.encoder.encode(w, vec[j].parms_id(), wscale, pt)  # constant round(w·2^wb)
                term = seal.Ciphertext()
                self.evaluator.multiply_plain(vec[j], pt, term)
                if acc is None:
                    acc = term
                else:
                    self.evaluator.add_inplace(acc, term)
            total.append(acc)
        return total

    @property
    def sum_scale(self) -> float:
        return self.scale * 2.0 ** self.preset.weight_bits
