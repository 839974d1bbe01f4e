"""The threshold backend's parameter sets, encoding and upload format (no secret here).

The construction (key-additive RLWE masking with one-time keys, the structure of Willow:
Bell-Clark, Gascón, Li, Raykova, Schoppmann, CRYPTO 2025, with the clients themselves as the
committee, as LERNA (ASIACRYPT 2023) and Flamingo (S&P 2023) do in the cross-silo setting):

- ring R_p = Z_p[X]/(X^N + 1), N = 4096, p one NTT-friendly prime (``secagg.threshold.ring``:
  SEAL's NTT, samplers and PRNG through the native extension);
- every upload has its own fresh ternary key k_i (never used for another upload). Values
  are packed N to a block, scaled by Δ and rounded, and block b is masked as

      b_{i,b} = a_b·k_i + e_{i,b} + round(Δ·x_{i,b})  mod p,

  e from SEAL's centred binomial sampler (σ ≈ 3.2) and a_b uniform, expanded by everyone from
  a public seed (the parameters, the upload's *basis*: round, phase, model and settings,
  ``secagg.clients.policy``; and b). a_b is never sent. In the NTT domain by definition (it
  is uniform either way, as SEAL's seeded encryption takes it);
- the client Shamir-shares k_i coefficient-wise among the c holders (t of c, x_j = 1 + j
  for the j-th holder, sorted): every client of the roster (c = n, the default) or a
  committee of c of them (``holders_of``: the shares of a round are then n·c, not n²), and
  seals share j for holder j alone (X25519 + HKDF + AES-GCM with the
  static pair's key, the parameters, sender, recipient and the upload's blocks bound in),
  in the same upload: shares ride with the upload, no extra round trip. The shares of the
  first t − 1 holders are drawn first, uniformly, as SEAL's expansion of a fresh 32-byte seed
  that is sent instead of the ring element (pseudorandom secret sharing); the polynomial of
  degree < t through (0, k_i) and those points gives the other c − t + 1 shares. Any t − 1
  shares are uniform and independent of k_i either way, as with random coefficients;
- the server forms Σ_i w_i·b_i mod p with integer weights w_i; a holder j that checked the
  release returns s_j = Σ_i w_i·[k_i]_j, one ring element whatever the model's size; with
  t of them the server interpolates K = Σ_i w_i·k_i and unmasks Σ w_i b_i − a·K =
  Σ w_i e_i + Δ·Σ w_i x_i, which decodes to Σ w_i x_i with error Σ w_i (e_i + rounding)/Δ.

Deviations from the prototype and the papers, chosen here:

- the wide preset is one 60-bit prime rather than two 31-bit primes: the same 8 bytes a
  value, no CRT, and SEAL's NTT takes primes up to 60 bits;
- a holder returns s_j, not λ_j·s_j: the Lagrange coefficient is public, and unscaled shares
  let whoever combines them check their consistency when more than t answer;
- keys are one-time per *upload*, not per round, so a protocol that uploads twice in a round
  (RegAgg's sums, XGBoost's levels) never masks two values with one key; a holder's
  "one set per round" rule is kept per upload (``threshold_client``);
- no decryption flooding: no key is ever used twice, and K reveals only the sum it opens;
- every upload ends with one *check block*, a masking of zero under the same key
  (b_c = a_c·k_i + e_i): a sum unmasked with the right K leaves Σ w_i·e_i there, within
  Σ|w_i|·21, and with a wrong K (a lying holder, a dealer whose shares are off their
  polynomial) a·(K − K') across the whole block, uniform. Every data block is then
  range-checked against the headroom: a wrong K shaped to pass the check block
  (K − K' = a_c^{-1}·s, s short) spreads a_b·a_c^{-1}·s over the data blocks, each of
  whose N coefficients lands in the headroom with probability below 1/2 (``check_sum``).
  It costs N coefficients an upload (16 KiB on ``lean``: 0.4 % at 1e6 values).

Security (HomomorphicEncryption.org standard, ternary secrets, classical): N = 4096 allows
log q ≤ 109 for 128-bit security; both presets use far less (32 and 60 bits), so the
RLWE samples are at least as hard as that bound's. The shares are information-theoretic:
t − 1 of them say nothing about a key.

Presets:

- ``lean`` (one 32-bit prime, 4 bytes a value): for protocols that fix their weights before
  the uploads (``Protocol.planned_weights``): each client multiplies its update by its
  planned weight (quantised to 2^-30) before masking and the server only adds, as ckks's
  ``lean``. Δ = 2^26, headroom 16 (the applied weights add up to at most 1, every holder
  checks it): 16·Δ = 2^30 leaves the sign bit and one of margin below p/2. Error:
  Σ_i (e_i + ½)/Δ, half the 31-bit prime's at Δ = 2^25 (which missed 1e-6 at ten clients:
  1.47e-6); ``tests/test_threshold.py`` holds ten clients' sum of 12,288 values under 1e-6.
- ``wide`` (one 60-bit prime, 8 bytes a value): weights chosen after the uploads (LARC,
  FedDisco, RoLePRO), quantised to 2^-16; Δ = 2^38, headroom 16 shared by the clients
  (each checks |x| ≤ 16/n); error at ten clients and 1e6 values max 1.8e-11, RMS 4e-12
  (measured), besides the weights' rounding to 2^-16.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from secagg.errors import ConfigError, MalformedCiphertext, ValueRangeError

#: the ring dimension of every preset
RING_DIM = 4096
#: SEAL's centred binomial error is at most this in absolute value (``sample_poly_cbd``)
ERROR_BOUND = 21
#: what an upload's digest and signature are bound to
_UPLOAD_CONTEXT = b"secagg threshold upload v2"
_PUBLIC_CONTEXT = b"secagg threshold public polynomial v2"
_COMMITTEE_CONTEXT = b"secagg threshold committee v1|"
SIGNATURE_BYTES = 64
#: blocks of zero masked under each upload's key after its data (the sum's own check)
CHECK_BLOCKS = 1
#: AES-GCM's nonce and tag around a sealed share (``secagg.secret.keywrap``)
SEAL_OVERHEAD = 12 + 16


@dataclass(frozen=True)
class ThresholdPreset:
    name: str
    prime_bits: int
    scale_bits: int
    #: server weights are quantised to 2^-weight_bits (0: the clients weight, the server adds)
    weight_bits: int
    description: str
    #: the clients apply their planned weights, quantised to 2^-client_weight_bits
    client_weight_bits: int | None = None
    #: the bound on |Σ w_i x_i| that decodes without wrapping
    headroom: float = 16.0
    ring_dim: int = RING_DIM

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
        if self.client_weight_bits is None:
            raise ConfigError(f"threshold preset {self.name}: the server weights, not the clients")
        return 1 << self.client_weight_bits

    @functools.cached_property
    def prime(self) -> int:
        from secagg.threshold.ring import ntt_prime

        return ntt_prime(self.prime_bits, self.ring_dim)

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    @property
    def coefficient_bytes(self) -> int:
        return 4 if self.prime_bits <= 32 else 8

    def blocks(self, n_values: int) -> int:
        """The data blocks of ``n_values`` values (an upload has one more: the check)."""
        return max(1, -(-n_values // self.ring_dim))

    def upload_blocks(self, n_values: int) -> int:
        """The masked blocks an upload carries: the data blocks and the check block."""
        return self.blocks(n_values) + CHECK_BLOCKS

    def client_bound(self, n_clients: int) -> float:
        """The largest |value| one client may upload: client weights add up to at most 1, so
        each may use the whole headroom; server weights are each at most 1, so n share it."""
        return self.headroom if self.weighted_by_clients else self.headroom / max(n_clients, 1)

    def check(self) -> ThresholdPreset:
        """The headroom and the worst-case noise of a sum of 2^10 uploads fit in (−p/2, p/2]."""
        used = self.scale_bits + self.weight_bits + math.log2(self.headroom)
        noise = math.log2(ERROR_BOUND + 1) + 10 + self.weight_bits
        if max(used, noise) + 1 > self.prime_bits - 1:
            raise ConfigError(f"threshold preset {self.name}: scale and weights leave no room")
        return self

    @functools.cached_property
    def fingerprint(self) -> str:
        """Names the parameters: a client refuses anything made under others."""
        text = f"{self.name}|{self.ring_dim}|{self.prime}|{self.scale_bits}|{self.weight_bits}"
        text += f"|{self.client_weight_bits}|{self.headroom}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PRESETS: dict[str, ThresholdPreset] = {
    p.name: p.check()
    for p in (
        ThresholdPreset(
            "lean",
            prime_bits=32,
            scale_bits=26,
            weight_bits=0,
            client_weight_bits=30,
            description="N=4096, one 32-bit prime: 4 bytes per value, the clients apply "
            "their planned weights, error below 1e-6 at ten clients",
        ),
        ThresholdPreset(
            "wide",
            prime_bits=60,
            scale_bits=38,
            weight_bits=16,
            description="N=4096, one 60-bit prime: 8 bytes per value, weights chosen after "
            "the uploads, error ~1e-10",
        ),
    )
}
# Which preset a run gets when it names none is the backend registry's rule
# (``secagg.backends.BACKENDS["threshold"].presets``).


def get_preset(name: str) -> ThresholdPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown threshold preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]


def quantise(weight: float, weight_bits: int) -> int:
    """The integer a weight becomes: round(w·2^wb), half away from zero."""
    k = int(math.floor(abs(float(weight)) * 2.0**weight_bits + 0.5))
    return -k if weight < 0 else k


def server_weight(weight: float, preset: ThresholdPreset) -> int:
    """The integer the server multiplies an upload by: ``weight`` quantised to the preset's
    2^-weight_bits, within |w| <= 1 (ConfigError otherwise: the headroom, and the bound every
    client holds a release to, ``secagg.backends.coalition``)."""
    w = float(weight)
    if not abs(w) <= 1.0:
        raise ConfigError(f"threshold weighted sums need |w| <= 1 (headroom); got {w}")
    return quantise(w, preset.weight_bits)


def holders_of(roster: object, committee: int = 0) -> list[str]:
    """The key holders in the order their x-coordinates follow (x = 1 + position), sorted,
    so every party numbers them alike without a message: the roster's clients
    (``committee`` 0), or a committee of ``committee`` of them, the first in the order of
    SHA-256 over their names (public: every party picks the same).

    Which clients hold does not change what a coalition of t − 1 learns: the server and any
    t − 1 clients hold at most t − 1 shares of any key, on the committee or off it (off it,
    none). How many hold does: t counts committee members, so a smaller committee withstands
    fewer colluders. It also decides who must be online (t of the committee) and who does
    the holders' work, n sealed shares a release each, so that a round's shares are n·c
    rather than n²."""
    clients = sorted(roster)  # type: ignore[call-overload]
    if not isinstance(committee, int) or not 0 <= committee <= len(clients):
        raise ConfigError(
            f"a threshold committee is 0 (every client of the roster holds shares) or at "
            f"most the roster's {len(clients)} clients, got {committee!r}"
        )
    if committee in (0, len(clients)):
        return clients
    ranked = sorted(clients, key=lambda c: hashlib.sha256(_COMMITTEE_CONTEXT + c.encode()).digest())
    return sorted(ranked[:committee])


def holder_xs(holders: list[str]) -> dict[str, int]:
    """Each holder's x-coordinate: 1 + its position in :func:`holders_of`'s order."""
    return {h: 1 + j for j, h in enumerate(holders)}


def default_t(n: int) -> int:
    """A strict majority: t > n/2, so two disjoint holder sets can never both open."""
    return n // 2 + 1


def check_t(t: int, n: int) -> int:
    """``t`` itself if it is a sound threshold for n holders (0: the default majority)."""
    t = default_t(n) if t == 0 else t
    if not isinstance(t, int) or not 1 <= t <= n:
        raise ConfigError(f"threshold t must lie in [1, {n}] for {n} key holders, got {t!r}")
    return t


# ---- encoding ------------------------------------------------------------------------------
def encode(preset: ThresholdPreset, values: np.ndarray, bound: float, factor: float = 1.0):
    """round(Δ·factor·x) as int64 blocks (blocks, N), zero-padded; ``values`` must be finite
    and within ±``bound`` (ValueRangeError: a value beyond the headroom would wrap)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)) or (x.size and float(np.abs(x).max()) > bound):
        raise ValueRangeError(
            f"values must be finite and within ±{bound:.4g} (the threshold preset's "
            "headroom for this client)"
        )
    out = np.zeros(preset.blocks(x.size) * preset.ring_dim, dtype=np.int64)
    out[: x.size] = np.rint(x * (preset.scale * factor)).astype(np.int64)
    return out.reshape(-1, preset.ring_dim)


def with_check(messages: np.ndarray) -> np.ndarray:
    """An upload's messages: the encoded data blocks, then the check block (zero)."""
    return np.concatenate([messages, np.zeros((CHECK_BLOCKS, messages.shape[1]), np.int64)])


def check_sum(preset: ThresholdPreset, centred: np.ndarray, multipliers: list[int]) -> str | None:
    """Why an unmasked sum (centred int64 rows: data blocks, then the check block) is not
    the sum of its uploads, or None: the check block must hold only the uploads' noise,
    |Σ m_i·e_i| ≤ Σ|m_i|·21, and every data coefficient must lie within the headroom
    (the values' bound times the scale, plus the noise and rounding). ``multipliers``:
    what the server multiplied each upload by (``release.server_multipliers``)."""
    weight = sum(abs(int(m)) for m in multipliers)
    noise = weight * ERROR_BOUND
    check = centred[-CHECK_BLOCKS:]
    if int(np.abs(check).max(initial=0)) > noise:
        return "its check block does not unmask to noise (a wrong key sum)"
    # client-weighted: Σ applied weights <= 1 plus half a unit each; server-weighted: each
    # |k| <= 2^weight_bits and each client's values within headroom / n
    spread = preset.scale * 2.0**preset.weight_bits * preset.headroom
    bound = spread * (1.0 + len(multipliers) * 2.0**-20) + weight * (ERROR_BOUND + 1)
    if float(np.abs(centred[:-CHECK_BLOCKS]).max(initial=0)) > bound:
        return "a value lies beyond the headroom (a wrong key sum)"
    return None


def decode(preset: ThresholdPreset, centred: np.ndarray, n_values: int, divisor: float = 1.0):
    """Σ w_i x_i from an unmasked sum (centred int64 blocks; a check block after the data
    is not read)."""
    scale = preset.scale * 2.0**preset.weight_bits * divisor
    return centred.reshape(-1)[:n_values].astype(np.float64) / scale


def public_seed(preset: ThresholdPreset, basis: str) -> bytes:
    """The seed everyone expands the uploads' public polynomials a_b from: the parameters
    and the uploads' basis (so the summed uploads of one release share them)."""
    return hashlib.sha256(
        _PUBLIC_CONTEXT + preset.fingerprint.encode() + b"|" + basis.encode()
    ).digest()


# ---- the upload format ---------------------------------------------------------------------
def share_label(preset: ThresholdPreset, blocks_digest: bytes) -> str:
    """What a sealed key share is bound to, besides sender and recipient (``KeyWrapper``):
    the parameters and the blocks it unmasks."""
    return f"threshold-share|{preset.fingerprint}|{blocks_digest.hex()}"


#: a share sent as the seed it expands from (the t − 1 pseudorandom shares)
SHARE_SEED_BYTES = 32


def sealed_share_bytes(preset: ThresholdPreset, *, seeded: bool = False) -> int:
    """A sealed share's size: a whole ring element, or (``seeded``) a 32-byte seed."""
    body = SHARE_SEED_BYTES if seeded else preset.ring_dim * preset.coefficient_bytes
    return body + SEAL_OVERHEAD


def upload_bytes(preset: ThresholdPreset, n_values: int, holders: int, t: int) -> int:
    """An upload's size: the masked blocks, t − 1 seeded and c − t + 1 whole sealed shares
    (c ``holders``), and the signature."""
    blocks = preset.upload_blocks(n_values) * preset.ring_dim * preset.coefficient_bytes
    seeded = (t - 1) * sealed_share_bytes(preset, seeded=True)
    whole = (holders - t + 1) * sealed_share_bytes(preset)
    return blocks + seeded + whole + SIGNATURE_BYTES


def digest_preimage(preset: ThresholdPreset, blocks_digest: bytes, sealed: list[bytes]) -> bytes:
    """What an upload's digest hashes: the parameters, its blocks' SHA-256 and each sealed
    share's, in holder order. A holder given its own share and this preimage can check that
    the share belongs to the upload its sender consented to."""
    return (
        _UPLOAD_CONTEXT
        + preset.fingerprint.encode()
        + blocks_digest
        + b"".join(hashlib.sha256(s).digest() for s in sealed)
    )


def upload_message(sender: str, digest: str) -> bytes:
    """What a client signs for each upload it makes."""
    who = sender.encode()
    return _UPLOAD_CONTEXT + len(who).to_bytes(4, "big") + who + digest.encode()


@dataclass(frozen=True)
class Upload:
    """One client's upload as it travels: its masked blocks, one sealed key share per holder
    (in holder order) and its signature over the digest."""

    blocks: bytes
    sealed: tuple[bytes, ...]
    signature: bytes

    @property
    def blocks_digest(self) -> bytes:
        return hashlib.sha256(self.blocks).digest()

    def preimage(self, preset: ThresholdPreset) -> bytes:
        return digest_preimage(preset, self.blocks_digest, list(self.sealed))

    def digest(self, preset: ThresholdPreset) -> str:
        return hashlib.sha256(self.preimage(preset)).hexdigest()

    def parts(self) -> list[bytes]:
        return [self.blocks, *self.sealed, self.signature]

    @classmethod
    def from_parts(
        cls, preset: ThresholdPreset, parts: list[bytes], n_values: int, holders: int
    ) -> Upload:
        """An upload from the parts a peer sent: its sizes checked (MalformedCiphertext)."""
        blocks = preset.upload_blocks(n_values)
        if len(parts) != holders + 2:
            raise MalformedCiphertext(
                f"a threshold upload has {holders + 2} parts (blocks, {holders} sealed "
                f"shares, signature), got {len(parts)}"
            )
        body, *sealed, signature = (bytes(p) for p in parts)
        want = blocks * preset.ring_dim * preset.coefficient_bytes
        if len(body) != want:
            raise MalformedCiphertext(
                f"the masked blocks of {n_values} values (and the check block) have {want} "
                f"bytes, got {len(body)}"
            )
        sizes = (sealed_share_bytes(preset), sealed_share_bytes(preset, seeded=True))
        if any(len(s) not in sizes for s in sealed):
            raise MalformedCiphertext(f"a sealed key share has {sizes[0]} or {sizes[1]} bytes")
        if len(signature) != SIGNATURE_BYTES:
            raise MalformedCiphertext("an upload's signature has 64 bytes")
        return cls(body, tuple(sealed), signature)
