"""Cost per parameter: the ckks and threshold presets next to NVFlare's default, in one run.

    python -m benchmarks.crypto [--sizes 100000,1000000] [--clients 3,6,10] [--repeats 3]
                                [--out DIR]
    secagg bench crypto ...            (the same)

For each model size, client count and configuration (one row each): upload and download bytes
per parameter, encrypt / aggregate / decrypt seconds per million parameters (median of
--repeats), and the relative error ‖dec − exact‖∞ / ‖exact‖∞ of the weighted sum, without
and with noise flooding (rel_error, rel_error_flooded); rel_error_noise is the unflooded
error against Σ (k_i / 2^b)·x_i, the sum of the integer weights the scheme actually adds
(b = 20 on ckks compact and wide, 30 on ckks lean and threshold lean, 16 on threshold
wide; NVFlare multiplies by w_i itself, so there it equals rel_error): the encryption noise
without the weights' rounding, which rel_error includes.
Every configuration sums the same inputs: per model size, one
pseudo-gradient-like vector per client (N(0, 0.01²), one value in a hundred ten times
larger), the first k of them for k clients, with weights drawn from U(1/3, 1) and scaled to
sum to 1; exact is Σ w_i x_i in float64. Encryption is timed on the first client's vector;
aggregation covers loading (checking) every upload and the weighted sum.

``secagg compact`` / ``secagg wide``: the ``ckks`` backend's server-weighted presets (one key
the clients share): the server reads each upload's first polynomials (no seed expansion) and
forms Σ k_i·c0_i; the download is that sum to the decryptor, as plaintexts (one polynomial,
not a whole ciphertext's two); decrypt is the decryptor's whole part (form Σ k_i·a_i from the
seeds, add the server's sum, decrypt).

``secagg threshold lean`` / ``secagg threshold wide``: the ``threshold`` backend
(``secagg.threshold.params``: key-additive RLWE masking, N=4096, each upload under a fresh
one-time key that its client Shamir-shares t of n among the clients, t a strict majority),
run through its real classes: ``make_backends``' server and ``ThresholdClient`` halves,
every request and reply an envelope over an in-process transport. Preset lean (one 31-bit
prime, 4 B a value, Δ = 2^25): each client multiplies its update by its planned weight
(k_i / 2^30, as on ckks's lean) before masking and the server adds the uploads as they
arrive (a running sum); wide (one 60-bit prime, 8 B a value, Δ = 2^38): the clients mask
x_i and the server forms Σ k_i·b_i with k_i = round(w_i·2^16). A reveal gathers every
contributor's consent, every holder returns its share of the key sum Σ k_i·s_i (s_i the
one-time keys; one ring element) and the server interpolates it (checking the shares'
consistency: all n answer here, t would do) and unmasks. The clients' release policy
accepts the benchmark's drawn weights (any share of a sum, sums of one client). Its
columns mean:

- upload_B_per_param: the whole upload (the masked blocks, one sealed key share per holder,
  the signature); upload_masked_B_per_param: the masked blocks alone (this column is the
  threshold's alone), so the shares' part is the difference: n sealed shares of
  N·(4 or 8) + 28 bytes, fixed whatever the model's size;
- download_B_per_param: none (no client receives the sum: the server unmasks it);
- holder_down_B_per_reveal / holder_up_B_per_reveal: one holder's request and answer for a
  reveal, in bytes, envelopes included (flat: the request holds the release, its consents
  and the holder's sealed share from each contributor; the answer one ring element, 16 KiB
  on lean, 32 KiB on wide); these columns are the threshold's alone;
- encrypt_s_per_M: one client's protect (encode, mask, deal and seal the shares, sign);
- aggregate_s_per_M: the server loading (checking) every upload and summing;
- decrypt_s_per_M: the server's part of a reveal (the consents and the holders' answers
  checked, the shares interpolated, the sum unmasked), timed on the holders' recorded
  answers; holder_s_per_reveal: one holder's whole answer in seconds (parse and check the
  release, open its sealed shares, combine them; flat; every holder does this, in
  parallel; the threshold's alone);
- rel_error_noise: against Σ (k_i / 2^b)·x_i, the weights as quantised (b = 30 on lean,
  16 on wide); rel_error against the exact weights (it adds the weights' rounding). No
  flooding: every key is used once.

``secagg lean``: the client-weighted preset (one 60-bit data prime): each client encrypts
its update times its planned weight (k_i / 2^30), the server reads the uploads' first
polynomials and adds them (no seed expansion) and sends the sum as plaintexts (download: 8
B/param); its decrypt is the decryptor's whole part (form (0, Σ a_i) from the seeds, add the
server's sum, decrypt), its flooding is sized for noise multipliers of 1 (``release.py``), its
rel_error_noise is against Σ (k_i / 2^30)·x_i.

The ``secagg`` rows run on the native extension (``secagg/ckks/native.py``: one call encodes,
encrypts and serialises a vector; one expands the seeds; on ``lean`` one opens the sum);
each call uses every core the process may (two here). ``secagg lean (native, one thread)``
is ``secagg lean`` with ``SECAGG_NATIVE_THREADS=1``: the cost per core, as SecAgg+'s masking
runs; ``secagg lean (TenSEAL binding only)`` is ``secagg lean`` with ``SECAGG_NATIVE=off``,
the before, in the same run.

NVFlare's default (``nvflare.app_opt.he``): TenSEAL context N=8192, coeff [60, 40, 40],
scale 2^40, one ``ckks_vector`` per layer (here: the whole vector as one layer), weighted sum
as ``Σ w_i · vec_i`` (TenSEAL rescales after the plaintext product). NVFlare's provisioning
builds the context for symmetric encryption (``NVFlare default``); TenSEAL's own default is
public-key encryption (``NVFlare public-key``, a second row). NVFlare does not flood
decryptions. The ``*_vs_nvflare`` columns compare each row with NVFlare's default row of the
same size and client count (NVFlare / ours: above 1, ours is smaller or faster);
``encrypt_s_per_M_vs_nvflare_pk`` with the public-key row.

``Flower SecAgg+ (m neighbours)``: flwr's own SecAgg+ client code (``secaggplus_mod``'s
stages, ``benchmarks/secaggplus.py``), its masking stage timed as ``encrypt_s_per_M`` (the
counterpart of protect: quantise, add the private mask and one pairwise mask per neighbour,
serialise) and its masked vector as the upload; 2 neighbours (share_num 3, SecAgg+'s sparse
graph) and every other client (SecAgg). ``encrypt_s_per_M_vs_secaggplus`` compares each
row's encryption with the faster of the two (SecAgg+ / ours: 1/3 means ours takes 3 times as
long). SecAgg+ protects against a server that follows the protocol, up to a threshold of
colluding clients; it has no flooding, no checked releases, and its other costs (key
agreement, shares, unmasking) are not in these columns.

Writes crypto.csv and crypto.md into --out: by default a new folder
results/bench/crypto-<YYYYmmdd-HHMMSS> under the current directory, so a run never replaces
earlier results. The committed tables that the README quotes are regenerated with
``--out benchmarks/results --overwrite``.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import tenseal as ts

from benchmarks import secaggplus
from benchmarks.options import output_folder, positive
from benchmarks.reproduce import Check, made_by
from benchmarks.stats import markdown_table
from secagg.backends import make_backends
from secagg.backends.base import applied_weight
from secagg.ckks import native
from secagg.ckks.first_polys import (
    FirstPolynomialSum,
    FreshLevel,
    checked_first_sums,
    first_polynomials,
    load_first_sums,
    plaintext_blobs,
)
from secagg.ckks.flooding import error_bound, flooding_sigma
from secagg.ckks.presets import PRESETS, CKKSPreset
from secagg.ckks.public import CiphertextSum, PublicCKKS, quantise, to_bytes
from secagg.ckks.release import Descriptor, SecondPolynomials
from secagg.ckks.server_sums import expander_for, weighted_firsts
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.server.audit import AuditLog
from secagg.server.exchange import Exchange
from secagg.server.round import RoundContext
from secagg.server.transport import InProcessTransport
from secagg.threshold import params as threshold
from secagg.wire import Envelope

OUTPUTS = ("crypto.csv", "crypto.md")
#: ``secagg bench crypto --check``: the 100,000-parameter rows, every configuration and client
#: count (the same inputs as the full run's: the same generator, drawn for 10 clients), one
#: repeat; bytes and errors only, never timings
CHECK = Check(
    args=("--sizes", "100000", "--clients", "3,6,10", "--repeats", "1"),
    csv="crypto.csv",
    keys=("config", "params", "clients"),
    columns={
        "upload_B_per_param": (0.0, 0.002),
        "upload_masked_B_per_param": (0.0, 0.002),
        "download_B_per_param": (0.0, 0.002),
        "holder_down_B_per_reveal": 0,
        "holder_up_B_per_reveal": 0,
        "rel_error": (0.0, 1.0),
        "rel_error_flooded": (0.0, 1.0),
        "rel_error_noise": (0.0, 1.0),
    },
    why="bytes are the format's (zstd on compact and NVFlare moves them by up to 0.1 %: "
    "the noise it compresses is fresh each run; within 0.2 %); the errors are those of "
    "fresh encryption and flooding noise, so they move run to run (by up to 30 % seen) but "
    "must stay at their order of magnitude: at most twice the committed value",
)
NVFLARE = "NVFlare default"
NVFLARE_PK = "NVFlare public-key"
#: how a row run without the native extension (SECAGG_NATIVE=off) is named, and one whose
#: native calls use one thread (SECAGG_NATIVE_THREADS=1)
TENSEAL_ONLY = "(TenSEAL binding only)"
ONE_THREAD = "(native, one thread)"
SECAGGPLUS = "Flower SecAgg+"
#: SecAgg+'s cheapest useful graph: each client shares with itself and two neighbours
SECAGGPLUS_SHARES = 3
#: the columns in the order the table shows them
COLUMNS = [
    "config",
    "params",
    "clients",
    "upload_B_per_param",
    "upload_masked_B_per_param",
    "download_B_per_param",
    "holder_down_B_per_reveal",
    "holder_up_B_per_reveal",
    "encrypt_s_per_M",
    "aggregate_s_per_M",
    "decrypt_s_per_M",
    "holder_s_per_reveal",
    "rel_error",
    "rel_error_flooded",
    "rel_error_noise",
    "upload_B_per_param_vs_nvflare",
    "encrypt_s_per_M_vs_nvflare",
    "encrypt_s_per_M_vs_nvflare_pk",
    "encrypt_s_per_M_vs_secaggplus",
]


#: columns in bytes, not per parameter: shown as whole numbers
BYTE_COLUMNS = ("holder_down_B_per_reveal", "holder_up_B_per_reveal")


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def relative_error(dec: np.ndarray, exact: np.ndarray) -> float:
    return float(np.max(np.abs(dec - exact)) / np.max(np.abs(exact)))


def weighted(xs: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Σ w_i·x_i in float64: the exact weighted sum."""
    total = np.zeros(xs[0].size)
    for w, x in zip(weights, xs):
        total += w * x
    return total


def quantised_sum(xs: list[np.ndarray], ks: list[int], weight_bits: int) -> np.ndarray:
    """Σ (k_i / 2^weight_bits)·x_i: the sum a scheme with integer weights k_i computes, so
    that the error against it is the encryption's alone, without the weights' rounding."""
    return weighted(xs, [k / 2.0**weight_bits for k in ks])


def bench_preset(
    preset: CKKSPreset, xs: list[np.ndarray], weights: list[float], repeats: int, rounds: int
) -> dict:
    """One ckks preset, as its backend runs it. Server-weighted (compact, wide): clients
    encrypt x_i, the server reads every upload's first polynomials and forms Σ k_i·c0_i
    (natively; on TenSEAL's binding SEAL's own sum, its first polynomials taken out).
    Client-weighted (lean): each client encrypts (k_i / 2^30)·x_i and the server adds the
    first polynomials mod q (``secagg.ckks.first_polys``). Either way it sends the sum as
    plaintexts; decrypt is the decryptor's whole part: load those, form (0, Σ k_i·a_i) from
    the seeds, add, decrypt."""
    n = xs[0].size
    keys = SecretKeyHolder(preset)
    public = PublicCKKS(preset)
    level = FreshLevel(public)
    bound = preset.client_bound(len(xs))
    lean = preset.weighted_by_clients
    ks = [applied_weight(w, preset) if lean else quantise(w, preset.weight_bits) for w in weights]
    unit = preset.client_weight_unit if lean else 1

    def encrypt(x, k):
        return keys.encrypt(x * (k / unit) if lean else x, bound)

    uploads, t_enc = timed(lambda: encrypt(xs[0], ks[0]), repeats)
    all_uploads = [uploads] + [encrypt(x, k) for x, k in zip(xs[1:], ks[1:])]
    expander = None if lean else expander_for(public)

    def aggregate():
        if lean:
            total, seeds = FirstPolynomialSum(level), []
            for u in all_uploads:
                first, seed = first_polynomials(level, u, n)
                total.add(first)
                seeds.append(seed)
            return plaintext_blobs(level, total.total, public.scale), seeds
        if expander is not None:  # the server's native path: no seed expanded
            read = [first_polynomials(level, u, n) for u in all_uploads]
            total = weighted_firsts(expander, [f for f, _ in read], ks)
            return plaintext_blobs(level, total, public.sum_scale), [sd for _, sd in read]
        summed = CiphertextSum(public)
        seeds = []
        for u, w in zip(all_uploads, weights):
            cts, seed = public.load_upload(u, n)
            summed.add(cts, w, consume=True)
            seeds.append(seed)
        first, _, scale = public.aggregate_polynomials([to_bytes(c) for c in summed.result()], n)
        return plaintext_blobs(level, first, scale), seeds

    (agg, seeds), t_agg = timed(aggregate, repeats)
    descriptor = Descriptor(
        "reveal", "bench", 0, n, len(agg), tuple((f"c{i}", k, "") for i, k in enumerate(ks))
    )
    second = SecondPolynomials(keys.public, keys.seeded_template())

    def ciphertexts():
        if native.module() is not None:  # as a decryptor: the native path opens in one call
            first, scale = checked_first_sums(level, agg, n)
            return second.expanded(descriptor, seeds, first, scale)
        return second.build(descriptor, seeds, load_first_sums(level, agg, n))

    def decrypt():
        cts = ciphertexts()
        return keys.open_flooded(cts, n, 0.0)[0]

    dec, t_dec = timed(decrypt, repeats)
    # as a decryptor sizes it: every decryption the shared key may make, each client's
    # budget of one reveal per round times the number of clients (FedAvg opens nothing),
    # and E from what the server multiplied each upload by (1 where the clients weighted)
    error = error_bound(second.factors(descriptor), len(agg) * preset.poly_modulus_degree, 30)
    sigma = flooding_sigma(error, rounds * len(xs), 30)
    flooded, _ = keys.open_flooded(ciphertexts(), n, sigma)
    exact_applied = quantised_sum(xs, ks, preset.client_weight_bits if lean else preset.weight_bits)
    return preset_row(xs, weights, uploads, agg, (t_enc, t_agg, t_dec), dec, flooded, exact_applied)


def preset_row(xs, weights, uploads, agg, seconds, dec, flooded, exact_applied) -> dict:
    """A ckks row: bytes, seconds per million parameters, errors against the exact sum and
    against the sum of the weights actually applied (``rel_error_noise``)."""
    n = xs[0].size
    exact = weighted(xs, weights)
    t_enc, t_agg, t_dec = seconds
    return {
        "upload_B_per_param": sum(map(len, uploads)) / n,
        "download_B_per_param": sum(map(len, agg)) / n,
        "encrypt_s_per_M": t_enc * 1e6 / n,
        "aggregate_s_per_M": t_agg * 1e6 / n,
        "decrypt_s_per_M": t_dec * 1e6 / n,
        "rel_error": relative_error(dec, exact),
        "rel_error_flooded": relative_error(flooded, exact),
        "rel_error_noise": relative_error(dec, exact_applied),
    }


def bench_nvflare(
    xs: list[np.ndarray], weights: list[float], repeats: int, symmetric: bool = True
) -> dict:
    """NVFlare's TenSEAL set-up: symmetric, as its provisioning builds the context, or
    (``symmetric=False``) public-key encryption, TenSEAL's default."""
    n = xs[0].size
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=8192,
        coeff_mod_bit_sizes=[60, 40, 40],
        encryption_type=(
            ts.ENCRYPTION_TYPE.SYMMETRIC if symmetric else ts.ENCRYPTION_TYPE.ASYMMETRIC
        ),
    )
    ctx.global_scale = 2.0**40
    server_ctx = ts.context_from(ctx.serialize(save_secret_key=False))

    def encrypt(x):
        return ts.ckks_vector(ctx, x.tolist()).serialize()

    upload, t_enc = timed(lambda: encrypt(xs[0]), repeats)
    uploads = [upload] + [encrypt(x) for x in xs[1:]]

    def aggregate():
        vecs = [ts.ckks_vector_from(server_ctx, u) for u in uploads]
        total = vecs[0] * weights[0]
        for v, w in zip(vecs[1:], weights[1:]):
            total += v * w
        return total.serialize()

    agg, t_agg = timed(aggregate, repeats)
    exact = weighted(xs, weights)
    dec, t_dec = timed(lambda: np.array(ts.ckks_vector_from(ctx, agg).decrypt()), repeats)
    return {
        "upload_B_per_param": len(upload) / n,
        "download_B_per_param": len(agg) / n,
        "encrypt_s_per_M": t_enc * 1e6 / n,
        "aggregate_s_per_M": t_agg * 1e6 / n,
        "decrypt_s_per_M": t_dec * 1e6 / n,
        "rel_error": relative_error(dec, exact),
        "rel_error_flooded": float("nan"),
        "rel_error_noise": relative_error(dec, exact),  # no integer weights: the same
    }


def bench_secaggplus(
    xs: list[np.ndarray], weights: list[float], repeats: int, share_num: int
) -> dict:
    """Flower's SecAgg+ client masking (``benchmarks/secaggplus.py``: flwr's own stage
    functions): the counterpart of an encrypting client's protect; nothing else compares."""
    n = xs[0].size
    seconds, upload = secaggplus.mask_seconds(xs[0], len(xs), share_num, repeats)
    return {"upload_B_per_param": upload / n, "encrypt_s_per_M": seconds * 1e6 / n}


class ThresholdRun:
    """The threshold backend's real halves (``make_backends``: a server, one
    ``ThresholdClient`` per client, provisioned with fresh identities and one roster) joined
    by an in-process transport, every request and reply serialised as envelopes, as a run's
    are. Each client's reply to each phase is kept, so that the server's part of a reveal can
    be timed again on the same replies without the clients (``replaying``)."""

    def __init__(self, preset: threshold.ThresholdPreset, clients: int, n: int):
        self.ids = [f"client_{i}" for i in range(clients)]
        self.n = n
        # the benchmark's weights are drawn, not capped: each client accepts any share of
        # the sum (the default caps one at 1/2) and sums of one
        self.server, self.clients = make_backends(
            "threshold",
            self.ids,
            preset=preset.name,
            min_contributors=1,
            max_weight_share=1.0,
        )
        self.requests: dict[tuple[str, str], bytes] = {}
        self.replies: dict[tuple[str, str], bytes] = {}
        self.replaying = False
        self.transport = InProcessTransport({c: partial(self.handle, c) for c in self.ids})
        self.server.setup(self.ctx(), 0)

    def handle(self, client: str, data: bytes) -> bytes:
        env = Envelope.from_bytes(data)
        if self.replaying:
            return self.replies[client, env.phase]
        reply = self.answer(client, data)
        self.requests[client, env.phase], self.replies[client, env.phase] = data, reply
        return reply

    def answer(self, client: str, data: bytes) -> bytes:
        """The client's whole handling of a request: parse it, answer, serialise."""
        env = Envelope.from_bytes(data)
        fields = self.clients[client].handlers()[env.phase](env)
        return Envelope(client, "server", env.round, env.phase, fields).to_bytes()

    def ctx(self) -> RoundContext:
        exchange = Exchange(0, list(self.ids), self.transport, AuditLog())
        return RoundContext(exchange, self.n, self.server, None)

    def protect(self, client: str, x: np.ndarray, weight: float | None) -> bytes:
        """``client``'s upload as it travels: an envelope holding its protected field."""
        field = self.clients[client].protect(x, weight)
        return Envelope(client, "server", 0, "train", {"pseudo_gradient": field}).to_bytes()

    def load(self, data: bytes):
        return self.server.load(Envelope.from_bytes(data), "pseudo_gradient", self.n)


def bench_threshold(
    preset: threshold.ThresholdPreset, xs: list[np.ndarray], weights: list[float], repeats: int
) -> dict:
    """The threshold backend as a round runs it, through its real classes (``ThresholdRun``):
    every client masks its vector under a fresh one-time key and deals its shares, sealed, in
    the upload (``ThresholdClient.protect``); the server loads (checks) every upload and sums
    them; a reveal gathers the consents, every holder returns its one share of the key sum
    and the server interpolates it and unmasks."""
    n = xs[0].size
    run = ThresholdRun(preset, len(xs), n)
    ids = run.ids
    # on lean the clients apply their planned weights; on wide the server weights
    planned = weights if preset.weighted_by_clients else [None] * len(xs)
    first, t_enc = timed(lambda: run.protect(ids[0], xs[0], planned[0]), repeats)
    uploads = [first] + [run.protect(c, x, w) for c, x, w in zip(ids[1:], xs[1:], planned[1:])]

    def aggregate():
        if preset.weighted_by_clients:  # the streaming sum: the server only adds
            total = run.server.running_sum(n)
            for data, w in zip(uploads, weights):
                total.add(run.load(data), w)
            return total.result(sum(weights))
        return run.server.weighted_sum([run.load(data) for data in uploads], weights)

    handle, t_agg = timed(aggregate, repeats)
    dec, _ = run.server.reveal(run.ctx(), handle, "global_update")  # the real exchange, once
    holder = (ids[0], "decrypt_share")
    _, t_holder = timed(lambda: run.answer(ids[0], run.requests[holder]), repeats)
    run.replaying = True  # the server's part again, on the holders' recorded replies

    def server_part():
        return run.server.reveal(run.ctx(), handle, "global_update")[0]

    again, t_dec = timed(server_part, repeats)
    assert np.array_equal(again, dec)
    parts = [bytes(p) for p in Envelope.from_bytes(first).ciphertext_parts("pseudo_gradient")]
    if preset.weighted_by_clients:
        ks = [applied_weight(w, preset) for w in weights]
        bits = preset.client_weight_bits or 0
    else:
        ks = [threshold.quantise(w, preset.weight_bits) for w in weights]
        bits = preset.weight_bits
    return {
        # blocks, a sealed share per holder, the signature
        "upload_B_per_param": sum(map(len, parts)) / n,
        "upload_masked_B_per_param": len(parts[0]) / n,
        "holder_down_B_per_reveal": len(run.requests[holder]),
        "holder_up_B_per_reveal": len(run.replies[holder]),
        "encrypt_s_per_M": t_enc * 1e6 / n,
        "aggregate_s_per_M": t_agg * 1e6 / n,
        "decrypt_s_per_M": t_dec * 1e6 / n,
        "holder_s_per_reveal": t_holder,
        "rel_error": relative_error(dec, weighted(xs, weights)),
        "rel_error_flooded": float("nan"),
        "rel_error_noise": relative_error(dec, quantised_sum(xs, ks, bits)),
    }


def inputs(n: int, clients: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """``clients`` pseudo-gradient-like vectors of ``n`` values (mostly small, a few larger
    entries) and raw weights in [1/3, 1]; a run with k clients takes the first k of each."""
    xs = [rng.normal(0, 0.01, n) * rng.choice([1, 10], n, p=[0.99, 0.01]) for _ in range(clients)]
    return xs, rng.uniform(1 / 3, 1, clients)


def measure(xs: list[np.ndarray], raw_weights: np.ndarray, repeats: int, rounds: int) -> list[dict]:
    """One row per configuration for these clients: the weights scaled to sum to 1."""
    weights = list(raw_weights / raw_weights.sum())
    configs: dict[str, Callable[[], dict]] = {
        f"secagg {p.name}": partial(bench_preset, p, xs, weights, repeats, rounds)
        for p in PRESETS.values()
    }
    # the native rows above use every core; lean on one (the cost per core, as SecAgg+'s
    # masking runs) and, the before, on TenSEAL's binding alone
    lean = partial(bench_preset, PRESETS["lean"], xs, weights, repeats, rounds)
    configs[f"secagg lean {ONE_THREAD}"] = partial(with_native, "on", 1, lean)
    configs[f"secagg lean {TENSEAL_ONLY}"] = partial(with_native, "off", None, lean)
    for share_num in sorted({min(SECAGGPLUS_SHARES, len(xs)), len(xs)}):
        if share_num >= 2:
            name = f"{SECAGGPLUS} ({share_num - 1} neighbour{'s' if share_num > 2 else ''})"
            configs[name] = partial(bench_secaggplus, xs, weights, repeats, share_num)
    configs[NVFLARE] = lambda: bench_nvflare(xs, weights, repeats)
    configs[NVFLARE_PK] = lambda: bench_nvflare(xs, weights, repeats, symmetric=False)
    for p in threshold.PRESETS.values():
        configs[f"secagg threshold {p.name}"] = partial(bench_threshold, p, xs, weights, repeats)
    rows = []
    for name, run in configs.items():
        print(f"  {name}, {xs[0].size:.0e} parameters, {len(xs)} clients ...", flush=True)
        rows.append({"config": name, "params": xs[0].size, "clients": len(xs), **run()})
    return rows


def with_native(mode: str, threads: int | None, run: Callable[[], dict]) -> dict:
    with native.chosen(mode, threads):
        return run()


def table(rows: list[dict]) -> pd.DataFrame:
    """The rows with the columns in order (a configuration without a column gets NaN) and
    each row's ratios to NVFlare's row of the same size and client count."""
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    for _, g in frame.groupby(["params", "clients"], sort=False):
        ref = g[g["config"] == NVFLARE].iloc[0]
        for col in ("upload_B_per_param", "encrypt_s_per_M"):
            frame.loc[g.index, f"{col}_vs_nvflare"] = ref[col] / g[col]
        masking = g[g["config"].str.startswith(SECAGGPLUS)]
        if len(masking):  # the cheapest SecAgg+ graph: the strictest comparison
            fastest = masking["encrypt_s_per_M"].min()
            frame.loc[g.index, "encrypt_s_per_M_vs_secaggplus"] = fastest / g["encrypt_s_per_M"]
        public_key = g[g["config"] == NVFLARE_PK]
        if len(public_key):
            ref_pk = public_key.iloc[0]["encrypt_s_per_M"]
            frame.loc[g.index, "encrypt_s_per_M_vs_nvflare_pk"] = ref_pk / g["encrypt_s_per_M"]
    return frame


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated client counts, each at least 1, no repeats."""
    try:
        numbers = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        numbers = [0]
    if not numbers or min(numbers) < 1 or len(set(numbers)) != len(numbers):
        raise argparse.ArgumentTypeError(f"not a list of distinct client counts: {text!r}")
    return numbers


def sizes(text: str) -> list[int]:
    """An argparse type: comma-separated parameter counts, each at least 1."""
    try:
        numbers = [float(v) for v in text.split(",") if v.strip()]  # 1e6 is fine too
    except ValueError:
        numbers = [0.5]
    if not numbers or not all(v.is_integer() and v >= 1 for v in numbers):
        raise argparse.ArgumentTypeError(f"not a list of whole parameter counts: {text!r}")
    return [int(v) for v in numbers]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked, with the output folder chosen and created: every argument error
    ends the run here (exit status 2), before anything is measured."""
    parser = argparse.ArgumentParser(
        prog="secagg bench crypto",
        description=__doc__.splitlines()[0]
        + " For each model size, client count and configuration (the ckks presets, the "
        "threshold backend, NVFlare's default): bytes per parameter up and down (and, for "
        "threshold, one key holder's bytes per reveal), encrypt / aggregate / decrypt seconds "
        "per million parameters, and the weighted sum's relative error without and with "
        "noise flooding; the module's docstring (benchmarks/crypto.py) defines each column.",
        epilog="Writes " + " and ".join(OUTPUTS) + " into --out. The committed tables that "
        "the README quotes are regenerated with --out benchmarks/results --overwrite.",
    )
    parser.add_argument(
        "--sizes",
        type=sizes,
        default="100000,1000000",
        help="model sizes in parameters, comma separated (default: %(default)s)",
    )
    parser.add_argument(
        "--clients",
        type=counts,
        default="3,6,10",
        help="client counts, comma separated: each configuration sums that many uploads, "
        "and on threshold each client is a key holder (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=positive,
        default=3,
        help="timings are the median of this many repeats (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=positive,
        default=5,
        help="rounds in each client's decryption budget, which sizes the flooding noise "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="folder for crypto.csv and crypto.md (default: a new folder "
        "results/bench/crypto-YYYYmmdd-HHMMSS under the current directory); "
        "--out benchmarks/results regenerates the committed tables (with --overwrite)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let --out be a folder that already holds crypto.csv or crypto.md, and replace "
        "them (default: refuse)",
    )
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.out = output_folder(parser, args.out, "crypto", OUTPUTS, args.overwrite)
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    print(f"writing to {args.out}", flush=True)
    rows = []
    rng = np.random.default_rng(0)
    for n in args.sizes:
        xs, raw_weights = inputs(n, max(args.clients), rng)
        for k in args.clients:
            rows += measure(xs[:k], raw_weights[:k], args.repeats, args.rounds)
    result = table(rows)
    result.to_csv(args.out / "crypto.csv", index=False)
    # a column a configuration does not have reads as a dash, not as "nan"; bytes as counted
    shown = result.astype(object).where(result.notna(), "–")
    for col in BYTE_COLUMNS:
        shown[col] = [v if v == "–" else int(v) for v in shown[col]]
    md = markdown_table(shown, ".3g")
    (args.out / "crypto.md").write_text(
        "# Cost per parameter: ckks, threshold, NVFlare, SecAgg+ (median of repeats; "
        "*_vs_nvflare = NVFlare / ours, so above 1 means ours is smaller or faster)\n\n"
        + made_by(f"python -m benchmarks.crypto {shlex.join(args.argv)}")
        + "\n\n"
        "Weighted sums of the same inputs in every configuration (weights sum to 1). "
        "`secagg threshold *`: masks under one-time keys Shamir-shared t of n among the "
        "clients (t a strict majority); upload is the masked blocks with one sealed key share "
        "per holder, upload_masked the blocks alone; holder_down / holder_up are one holder's "
        "request and answer per reveal in bytes (flat in the model's size), holder_s its "
        "seconds; decrypt is the server's part of a reveal (check the answers, interpolate "
        "the key sum, unmask); `python -m benchmarks.crypto --help` and the module's "
        "docstring say more.\n\n" + md + "\n"
    )
    print(md)
    return result


if __name__ == "__main__":
    main()
