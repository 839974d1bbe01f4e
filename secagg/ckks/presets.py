"""Named CKKS parameter sets (SEAL via TenSEAL's ``sealapi``).

Every preset is checked by SEAL at 128-bit security (``SEC_LEVEL_TYPE.TC128``, the
HomomorphicEncryption.org table for ternary secrets), so an insecure set cannot be built.

How the numbers were chosen (all logs base 2):

- Vectors are packed two reals per complex slot: N reals per ciphertext.
- Clients encrypt with the shared secret key (seeded symmetric encryption): the upload's second
  polynomial is a 64-byte seed, so an upload costs one coefficient per value and data prime:
  8 bytes each, or 6 where every data prime is below 2^48 (``compact``'s travel packed,
  ``packing.py``: 12.1 bytes a value).
- Weighted sums use no rescale level: the server multiplies each upload by the integer
  ``round(w · 2^weight_bits)`` (a constant plaintext at scale 2^weight_bits; |w| ≤ 1), so the
  sum has scale Δ·2^weight_bits and decodes to Σ w_i x_i with weights quantised to
  2^-weight_bits. The last prime is SEAL's special prime: it never travels, since no
  relinearisation or Galois key exists.
- Headroom: the aggregate's polynomial coefficients stay below Q/2 while
  ``sqrt(2) · Δ · 2^weight_bits · |Σ w x|∞ < Q/2``; clients check ``|x|∞ ≤ headroom / C``.
- Precision is dominated by the noise flooding of revealed aggregates (``flooding.py``), whose
  absolute error is independent of ``weight_bits`` and falls as 1/Δ, hence a large Δ.

Two ways to weight a sum:

- *server-weighted* (``compact``, ``wide``): the server multiplies each upload by its integer
  weight, so weights may be chosen after the uploads arrive (LARC, FedDisco, RoLePRO's
  aggregators); that costs a second data prime for the weights' ``weight_bits``.
- *client-weighted* (``lean``): for protocols that fix their weights before the uploads
  (FedAvg and the FedOpt family, Auto-FedRL, ADMM: ``Protocol.planned_weights``), each client
  multiplies its own update by its planned weight w_i before encrypting (w_i quantised to
  2^-``client_weight_bits``), and the server only adds. One 60-bit data prime then holds the
  sum: 8 bytes per parameter on the wire, half the NTTs, no multiplication on the server.
  The clients sign the weight they applied (it is the descriptor's integer weight of their
  upload) and a decryptor refuses a sum whose applied weights add up to more than 1, so the
  server cannot overflow the headroom or single one client out (``release.py``). The price
  is precision: Δ = 2^52 on a 60-bit prime leaves about 18 bits between the headroom and
  the flooding noise, so a revealed aggregate's error is about 1e-4 RMS at 1e6 values and
  10 clients (``flooding.py``; it grows as the square root of the clients and of the run's
  decryptions), against about 2e-8 on ``compact``.
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
    #: None: the server weights (integer weights at 2^-weight_bits); an int: the clients
    #: apply their planned weights themselves, quantised to 2^-client_weight_bits, and the
    #: server only adds (module docstring)
    client_weight_bits: int | None = None

    security_bits = 128

    @property
    def weighted_by_clients(self) -> bool:
        return self.client_weight_bits is not None

    @property
    def max_weight(self) -> int:
        """The largest integer weight a release may list: 2^weight_bits (|w| <= 1) where
        the server weights, the unit of an applied weight (<= 1) where the clients do."""
        return 1 << (
            self.client_weight_bits if self.client_weight_bits is not None else self.weight_bits
        )

    @property
    def client_weight_unit(self) -> int:
        """2^client_weight_bits: an applied integer weight k stands for k / this."""
        if self.client_weight_bits is None:
            raise ConfigError(f"preset {self.name}: the server weights, not the clients")
        return 1 << self.client_weight_bits

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

    def client_bound(self, n_clients: int) -> float:
        """The largest |value| one client may upload. Server weights are each at most 1, so
        n clients share the headroom; client weights add up to at most 1 (decryptors check
        it), so each client may use all of it."""
        return self.headroom if self.weighted_by_clients else self.headroom / n_clients

    def check(self) -> CKKSPreset:
        if self.scale_bits + self.weight_bits + 4 > self.data_bits:
            raise ConfigError(f"preset {self.name}: scale and weight bits leave no headroom")
        if self.weighted_by_clients and self.weight_bits:
            raise ConfigError(f"preset {self.name}: client-weighted sums use no server weights")
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
        CKKSPreset(
            "lean",
            4096,
            (60, 40),
            scale_bits=52,
            weight_bits=0,
            client_weight_bits=30,
            description="N=4096, one 60-bit data prime (100 bits with the special prime): "
            "the clients weight, the server only adds; 8 bytes per value, headroom 22, "
            "flooding error about 1e-4 at 1e6 values (FedAvg-family protocols)",
        ),
    )
}
# Which preset a run gets when it names none is the backend registry's rule
# (``secagg.backends.BACKENDS["ckks"].presets``).


def get_preset(name: str) -> CKKSPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown CKKS preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


def chunks_for(n_values: int, preset: CKKSPreset) -> int:
    return max(1, math.ceil(n_values / preset.values_per_ciphertext))
