"""Named CKKS parameter sets (SEAL via TenSEAL's ``sealapi``).

Every preset is checked by SEAL at 128-bit security (``SEC_LEVEL_TYPE.TC128``, the
HomomorphicEncryption.org table for ternary secrets), so an insecure set cannot be built.

How the numbers were chosen (all logs base 2):

- Vectors are packed two reals per complex slot: N reals per ciphertext.
- Clients encrypt with the shared secret key (seeded symmetric encryption): the upload's second
  polynomial is a 64-byte seed, so an upload costs about ``N · bits(data primes)`` bits, i.e.
  ``bits(data primes) / 8`` bytes per parameter before SEAL's zstd compression.
- Weighted sums use no rescale level: the server multiplies each upload by the integer
  ``round(w · 2^weight_bits)`` (a constant plaintext at scale 2^weight_bits; |w| ≤ 1), so the
  sum has scale Δ·2^weight_bits and decodes to Σ w_i x_i with weights quantised to
  2^-weight_bits. The last prime is SEAL's special prime: it never travels, since no
  relinearisation or Galois key exists.
- Headroom: the aggregate's polynomial coefficients stay below Q/2 while
  ``sqrt(2) · Δ · 2^weight_bits · |Σ w x|∞ < Q/2``; clients check ``|x|∞ ≤ headroom / C``.
- Precision is dominated by the noise flooding of revealed aggregates (``flooding.py``), whose
  absolute error is independent of ``weight_bits`` and falls as 1/Δ, hence a large Δ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from secagg.errors import ConfigError


@dataclass(frozen=True)
class CKKSPreset:
    name: str
    poly_modulus_degree: int
    coeff_bits: tuple[int, ...]  # data primes followed by SEAL's special prime
    scale_bits: int
    weight_bits: int
    description: str

    security_bits = 128

    @property
    def data_bits(self) -> int:
        """Bits of the modulus a fresh ciphertext is encrypted under (special prime excluded)."""
        return sum(self.coeff_bits[:-1])

    @property
    def values_per_ciphertext(self) -> int:
        return self.poly_modulus_degree  # N/2 complex slots, two reals each

    @property
    def headroom(self) -> float:
        """Largest |Σ w_i x_i| entry an aggregate can hold (with a 2-bit safety margin)."""
        return 2.0 ** (self.data_bits - 1 - 0.5 - self.scale_bits - self.weight_bits - 2)

    def check(self) -> CKKSPreset:
        if self.scale_bits + self.weight_bits + 4 > self.data_bits:
            raise ConfigError(f"preset {self.name}: scale and weight bits leave no headroom")
        return self


PRESETS: dict[str, CKKSPreset] = {
    p.name: p.check()
    for p in (
        CKKSPreset(
            "compact",
            4096,
            (47, 46, 16),
            scale_bits=62,
            weight_bits=20,
            description="N=4096, 93-bit data modulus (109 bits with the special prime, "
            "SEAL's 128-bit maximum): headroom 181",
        ),
        CKKSPreset(
            "wide",
            8192,
            (60, 60, 60),
            scale_bits=80,
            weight_bits=24,
            description="N=8192, 120-bit data modulus: headroom 5,800, flooding error below 1e-14",
        ),
    )
}
DEFAULT_PRESET = "compact"


def get_preset(name: str) -> CKKSPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown CKKS preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


def chunks_for(n_values: int, preset: CKKSPreset) -> int:
    return max(1, math.ceil(n_values / preset.values_per_ciphertext))
