"""Where one upload's time goes, per preset, in one run: client, server and decryptor stages.

    python -m benchmarks.upload_profile [--params 1000000] [--clients 10] [--repeats 5]
                                        [--out DIR]
    secagg bench upload_profile ...       (the same)

For each CKKS preset, ``--clients`` clients' updates of ``--params`` values go through the
backend's own functions, stage by stage, each timed separately (median of ``--repeats``):

- client: ``prepare`` (float64, bound check, the client's weight on ``lean``), ``encode``
  (SEAL's CKKS encoder, chunk by chunk), ``encrypt`` (seeded symmetric encryption),
  ``serialise`` (SEAL's save through the scratch file, with its zstd), ``seeds`` (the
  client's own record of its upload's seeds);
- server, per upload: ``load`` (checks, then SEAL's load, which expands the seed, on
  ``compact`` and ``wide``; the first polynomials read out of the checked bytes on ``lean``,
  and on the native path on every preset, no seed expanded, ``secagg.ckks.server_sums``) and
  ``add`` (the weighted fold on ``compact`` and ``wide``, the sum mod q on ``lean``); the
  sum released is its first polynomials on every preset;
- decryptor, per reveal: ``aggregate`` (loading the server's first polynomials),
  ``second polynomial`` (expanding every contributor's seeds into the polynomial it
  decrypts with), ``decrypt`` (flooding and decoding).

Each preset runs twice, on TenSEAL's binding alone (``SECAGG_NATIVE=off``, the stages
above) and on the native extension (``secagg/ckks/native.py``): there the client's encode,
encrypt and serialise are one call (then packed, 48 bits a coefficient, where every data
prime is below 2^48: ``compact``, ``secagg.ckks.packing``), or the same
split in time (``secagg.secret.ckks_masks``): the masks, made while the client trains, and the
online encode + add + serialise, each timed on its own (the upload the later stages use is
the one-call one); the decryptor reads the server's first polynomials out of their checked
bytes (``first_polys.checked_first_sums``, every preset), expands the seeds in one call and
opens the aggregate in one more, and opens it split in time
as well: the flooding noise encoded ahead (beside the precomputed check, while it trains)
and the opening that only adds it (``SecretKeyCKKS.encode_noise``); ``--no-native`` skips
the second run.

Writes upload_profile.csv and upload_profile.md into --out (default: a new folder
results/bench/upload_profile-<date-time>); ``--out benchmarks/results --overwrite``
regenerates the committed one.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import tenseal.sealapi as seal

from benchmarks.options import output_folder, positive
from benchmarks.reproduce import Check, made_by
from benchmarks.stats import markdown_table
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
from secagg.ckks.flooding import csprng_normal, error_bound, flooding_sigma, slot_sigma
from secagg.ckks.packing import packs
from secagg.ckks.presets import PRESETS, CKKSPreset, chunks_for
from secagg.ckks.public import (
    HEADER_BYTES,
    SEED_INFO_BYTES,
    CiphertextSum,
    PublicCKKS,
    ciphertext_raw_bytes,
    inflate,
    quantise,
    to_bytes,
    upload_chunks,
    upload_seeds,
)
from secagg.ckks.release import Descriptor, SecondPolynomials
from secagg.ckks.server_sums import expander_for, weighted_firsts
from secagg.secret.ckks_keys import SecretKeyHolder

OUTPUTS = ("upload_profile.csv", "upload_profile.md")
#: ``secagg bench upload_profile --check``: the committed size, one repeat; the byte rows
#: only (every other row is a time)
CHECK = Check(
    args=("--repeats", "1"),
    csv="upload_profile.csv",
    keys=("stage (seconds)",),
    rows="`stage (seconds)` in ['upload bytes per value', 'aggregate bytes per value']",
    columns={
        f"{preset} ({path})": (0.0, 0.002)
        for preset in ("compact", "wide", "lean")
        for path in ("TenSEAL", "native")
    },
    why="bytes per value are the format's; zstd (TenSEAL's binding, every preset) moves them "
    "by up to 0.05 % (the noise it compresses is fresh each run): within 0.2 %",
)


def median_seconds(fn: Callable[[], object], repeats: int) -> tuple[object, float]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def client_stages(keys: SecretKeyHolder, x: np.ndarray, weight: float | None, repeats: int):
    """The client's protect, stage by stage (what ``SecretKeyHolder.encrypt`` and
    ``CKKSClient.protect`` do, split): (stage seconds, the upload's parts)."""
    preset = keys.preset
    per, half = preset.values_per_ciphertext, preset.values_per_ciphertext // 2
    seconds: dict[str, float] = {}

    def prepare():
        values = keys.checked(x, preset.headroom)
        if weight is not None:
            values = values * (applied_weight(weight, preset) / preset.client_weight_unit)
        chunks = np.zeros(chunks_for(values.size, preset) * per)
        chunks[: values.size] = values
        rows = chunks.reshape(-1, per)
        return [(r[:half] + 1j * r[half:]).tolist() for r in rows]

    lists, seconds["client: prepare"] = median_seconds(prepare, repeats)

    def encode():
        out = []
        for values in lists:
            pt = seal.Plaintext()
            keys._encoder.encode(values, keys.public.scale, pt)
            out.append(pt)
        return out

    plains, seconds["client: encode"] = median_seconds(encode, repeats)
    cts, seconds["client: encrypt"] = median_seconds(
        lambda: [keys._encryptor.encrypt_symmetric(pt) for pt in plains], repeats
    )
    parts, seconds["client: serialise"] = median_seconds(
        lambda: [to_bytes(ct) for ct in cts], repeats
    )
    most = ciphertext_raw_bytes(preset.poly_modulus_degree, keys.public.n_primes, True)
    _, seconds["client: seeds"] = median_seconds(
        lambda: b"".join(
            inflate(memoryview(p)[HEADER_BYTES:], most, "own")[-SEED_INFO_BYTES:] for p in parts
        ),
        repeats,
    )
    return seconds, parts


def native_client_stages(keys: SecretKeyHolder, x: np.ndarray, weight: float | None, repeats: int):
    """The client's protect on the native path: the checks and the weight, then one native
    call (encode, encrypt, serialise: ``native.py``), packed where the preset's primes allow
    (``compact``), the seeds."""
    preset = keys.preset
    seconds: dict[str, float] = {}

    def prepare():
        values = keys.checked(x, preset.headroom)
        if weight is not None:
            values = values * (applied_weight(weight, preset) / preset.client_weight_unit)
        return values

    values, seconds["client: prepare"] = median_seconds(prepare, repeats)
    encryptor = keys._native()
    blob, seconds["client: encode + encrypt + serialise (one native call)"] = median_seconds(
        lambda: encryptor.encrypt(values, keys.public.scale, native.threads()), repeats
    )
    # the same upload split in time (``secagg.secret.ckks_masks``): the masks, made beside
    # training, then the online encode + add + save; timed apart, each on fresh masks
    chunks = chunks_for(values.size, preset)
    _, seconds["client: masks (offline, beside training)"] = median_seconds(
        lambda: encryptor.masks(chunks, native.threads()).wipe(), repeats
    )
    online = []
    for _ in range(repeats):
        masks = encryptor.masks(chunks, native.threads())
        start = time.perf_counter()
        encryptor.encrypt_masked(masks, values, keys.public.scale, native.threads())
        online.append(time.perf_counter() - start)
    seconds["client: encode + add + serialise, masks made (online)"] = statistics.median(online)
    size = encryptor.ciphertext_bytes
    parts, pack_seconds = median_seconds(lambda: upload_chunks(blob, size, preset), repeats)
    if packs(preset.coeff_bits):
        seconds["client: pack (48 bits a coefficient)"] = pack_seconds
    most = ciphertext_raw_bytes(preset.poly_modulus_degree, keys.public.n_primes, True)
    _, seconds["client: seeds"] = median_seconds(lambda: upload_seeds(parts, most), repeats)
    return seconds, parts


def profile(
    preset: CKKSPreset, n: int, clients: int, repeats: int, native_path: bool = False
) -> dict[str, float]:
    """One preset's stages, on TenSEAL's binding alone or (``native_path``) on the native
    extension where secagg uses it."""
    with native.chosen("on" if native_path else "off"):
        return _profile(preset, n, clients, repeats, native_path)


def _profile(
    preset: CKKSPreset, n: int, clients: int, repeats: int, native_path: bool
) -> dict[str, float]:
    rng = np.random.default_rng(0)
    xs = [rng.normal(0, 0.01, n) for _ in range(clients)]
    weights = [1.0 / clients] * clients
    keys = SecretKeyHolder(preset)
    public = PublicCKKS(preset)
    lean = preset.weighted_by_clients
    stages = native_client_stages if native_path else client_stages
    row, first_parts = stages(keys, xs[0], weights[0] if lean else None, repeats)
    uploads = [first_parts]
    for x, w in zip(xs[1:], weights[1:]):
        uploads.append(stages(keys, x, w if lean else None, 1)[1])
    level = FreshLevel(public)
    ks_sum = [quantise(w, preset.weight_bits) for w in weights]
    # the server, per upload
    if lean or native_path:  # first polynomials read out of the checked bytes, no seed expanded
        loaded, t_load = median_seconds(lambda: first_polynomials(level, uploads[0], n), repeats)
        firsts = [loaded] + [first_polynomials(level, u, n) for u in uploads[1:]]
        if lean:

            def fold():
                total = FirstPolynomialSum(level)
                for first, _ in firsts:
                    total.add(first.copy())  # a running sum takes its upload over
                return total.total

        else:
            expander = expander_for(public)

            def fold():
                return weighted_firsts(expander, [f for f, _ in firsts], ks_sum)

        total, t_fold = median_seconds(fold, repeats)
        aggregate = plaintext_blobs(level, total, public.scale if lean else public.sum_scale)
        seeds = [s for _, s in firsts]
    else:
        _, t_load = median_seconds(lambda: public.load_upload(uploads[0], n), repeats)

        loaded_cts = [public.load_upload(u, n)[0] for u in uploads]

        def fold_cts():  # multiplies into copies: the engine's fold works in place, a bit less
            total = CiphertextSum(public)
            for cts, w in zip(loaded_cts, weights):
                total.add(cts, w)
            return total.result()

        cts, t_fold = median_seconds(fold_cts, repeats)
        first, _, scale = public.aggregate_polynomials([to_bytes(ct) for ct in cts], n)
        aggregate = plaintext_blobs(level, first, scale)  # what the server releases
        seeds = [public.load_upload(u, n)[1] for u in uploads]
    row["server: load, per upload"] = t_load
    row["server: add, per upload"] = t_fold / clients
    # the decryptor, per reveal: the server's first polynomials, its own second
    ks = [applied_weight(w, preset) if lean else quantise(w, preset.weight_bits) for w in weights]
    chunks = chunks_for(n, preset)
    d = Descriptor(
        "reveal", "profile", 0, n, chunks, tuple((f"c{i}", k, "") for i, k in enumerate(ks))
    )
    second = SecondPolynomials(keys.public, keys.seeded_template())
    if native_path:
        (first, scale), row["decryptor: aggregate"] = median_seconds(
            lambda: checked_first_sums(level, aggregate, n), repeats
        )
        cts, row["decryptor: second polynomial"] = median_seconds(
            lambda: second.expanded(d, seeds, first, scale), repeats
        )
    else:
        sums, row["decryptor: aggregate"] = median_seconds(
            lambda: load_first_sums(level, aggregate, n), repeats
        )
        cts, row["decryptor: second polynomial"] = median_seconds(
            lambda: second.build(d, seeds, sums), repeats
        )
    multipliers = [1] * clients if lean else ks
    sigma = flooding_sigma(error_bound(multipliers, chunks * preset.poly_modulus_degree), clients)
    if native_path:  # the native open changes nothing it is given
        _, row["decryptor: decrypt"] = median_seconds(
            lambda: keys.open_flooded(cts, n, sigma), repeats
        )
        ahead, online = noise_ahead(keys, cts, n, sigma, repeats)
        row["decryptor: flooding noise encoded (offline, beside the check)"] = ahead
        row["decryptor: decrypt, noise encoded ahead (online)"] = online
    else:
        _, row["decryptor: decrypt"] = median_seconds(
            lambda: keys.open_flooded(
                second.build(d, seeds, load_first_sums(level, aggregate, n)), n, sigma
            ),
            repeats,
        )
        # the decrypt timing above reloads what it floods (flooding changes the ciphertexts)
        row["decryptor: decrypt"] -= (
            row["decryptor: aggregate"] + row["decryptor: second polynomial"]
        )
    row["upload bytes per value"] = sum(map(len, uploads[0])) / n
    row["aggregate bytes per value"] = sum(map(len, aggregate)) / n
    return row


def noise_ahead(keys: SecretKeyHolder, aggregate, n: int, coeff_sigma: float, repeats: int):
    """The decryptor's opening split in time (``secagg.secret.ckks_masks.PendingCheck``): its
    flooding noise encoded ahead, and the opening that adds it (medians of ``repeats``; each
    opening uses a fresh encoding, once)."""
    encryptor = keys.native_encryptor()
    sigma = slot_sigma(coeff_sigma, keys.preset.poly_modulus_degree, aggregate.scale)
    size = len(aggregate.first) * keys.preset.values_per_ciphertext
    offline, online = [], []
    for _ in range(repeats):
        normals = csprng_normal(size)
        start = time.perf_counter()
        flooding = encryptor.encode_noise(sigma * normals, aggregate.scale, native.threads())
        offline.append(time.perf_counter() - start)
        made_for = (sigma, aggregate.scale)
        start = time.perf_counter()
        keys.open_flooded(aggregate, n, coeff_sigma, normals, (flooding, made_for))
        online.append(time.perf_counter() - start)
    return statistics.median(offline), statistics.median(online)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="secagg bench upload_profile",
        description=__doc__.splitlines()[0]
        + " Each stage of protect, the server's load and add, and the decryptor's part, "
        "timed on their own for every CKKS preset (seconds, medians of --repeats).",
    )
    parser.add_argument("--params", type=positive, default=1_000_000, help="values per update")
    parser.add_argument("--clients", type=positive, default=10, help="uploads in the sum")
    parser.add_argument("--repeats", type=positive, default=5, help="repeats per stage")
    parser.add_argument(
        "--no-native",
        dest="native",
        action="store_false",
        help="profile TenSEAL's binding only (default: each preset on both paths)",
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier outputs")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.out = output_folder(parser, args.out, "upload_profile", OUTPUTS, args.overwrite)
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    print(f"writing to {args.out}", flush=True)
    rows = {}
    for preset in PRESETS.values():
        print(f"  {preset.name} ...", flush=True)
        rows[f"{preset.name} (TenSEAL)"] = profile(preset, args.params, args.clients, args.repeats)
        if args.native:
            print(f"  {preset.name}, native ...", flush=True)
            rows[f"{preset.name} (native)"] = profile(
                preset, args.params, args.clients, args.repeats, native_path=True
            )
    frame = pd.DataFrame(rows)
    # the stages in the order they happen: the native call where encode, encrypt and
    # serialise are on TenSEAL's path
    stages = list(frame.index)
    tenseal = rows[next(k for k in rows if k.endswith("(TenSEAL)"))]
    native_stages = [s for s in stages if s not in tenseal]
    rest = [s for s in stages if s not in native_stages]
    at = rest.index("client: seeds") if "client: seeds" in rest else len(rest)
    # the decryptor's opening split in time follows its opening in one piece
    opening = [s for s in native_stages if s.startswith("decryptor:")]
    native_stages = [s for s in native_stages if s not in opening]
    after = rest.index("decryptor: decrypt") + 1 if "decryptor: decrypt" in rest else len(rest)
    frame = frame.reindex(rest[:at] + native_stages + rest[at:after] + opening + rest[after:])
    frame.index.name = "stage (seconds)"
    frame.to_csv(args.out / "upload_profile.csv")
    # a stage a path does not have reads as a dash, not as "nan"
    shown = frame.reset_index().astype(object)
    md = markdown_table(shown.where(shown.notna(), "–"), ".3g")
    (args.out / "upload_profile.md").write_text(
        f"# Where one upload's time goes ({args.params:.0e} values, {args.clients} clients; "
        f"medians of {args.repeats})\n\n"
        + made_by(f"python -m benchmarks.upload_profile {shlex.join(args.argv)}")
        + "\n\n`python -m benchmarks.upload_profile --help` says what each stage is.\n\n"
        + md
        + "\n"
    )
    print(md)
    return frame


if __name__ == "__main__":
    main()
