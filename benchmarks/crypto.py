"""CKKS cost per parameter: our presets next to NVFlare's default, in one run.

    python -m benchmarks.crypto [--sizes 100000,1000000] [--clients 4] [--repeats 3] [--out DIR]
    secagg bench crypto ...            (the same)

For each configuration and model size: upload and aggregate-download bytes per parameter,
encrypt / aggregate / decrypt seconds per million parameters (median of --repeats), and the
aggregate's relative error ‖dec − exact‖∞ / ‖exact‖∞, without and with noise flooding.

NVFlare's default (``nvflare.app_opt.he``): TenSEAL context N=8192, coeff [60, 40, 40],
scale 2^40, public-key encryption, one ``ckks_vector`` per layer (here: the whole vector as
one layer), weighted sum as ``Σ w_i · vec_i`` (TenSEAL rescales after the plaintext product).
NVFlare does not flood decryptions; its "with flooding" column is left empty.

Writes crypto.csv and crypto.md into --out: by default a new folder
results/bench/crypto-<YYYYmmdd-HHMMSS> under the current directory, so a run never replaces
earlier results. The committed tables that the README quotes are regenerated with
``--out benchmarks/results --overwrite``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tenseal as ts

from benchmarks.options import output_folder, positive
from benchmarks.stats import markdown_table
from secagg.ckks.flooding import error_bound, flooding_sigma
from secagg.ckks.presets import PRESETS, CKKSPreset
from secagg.ckks.public import PublicCKKS, quantise, to_bytes
from secagg.ckks.secret import SecretKeyHolder

OUTPUTS = ("crypto.csv", "crypto.md")


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def relative_error(dec: np.ndarray, exact: np.ndarray) -> float:
    return float(np.max(np.abs(dec - exact)) / np.max(np.abs(exact)))


def bench_preset(
    preset: CKKSPreset, xs: list[np.ndarray], weights: list[float], repeats: int, rounds: int
) -> dict:
    n = xs[0].size
    keys = SecretKeyHolder(preset)
    server = PublicCKKS(preset)
    bound = preset.headroom / len(xs)
    uploads, t_enc = timed(lambda: keys.encrypt(xs[0], bound), repeats)
    all_uploads = [uploads] + [keys.encrypt(x, bound) for x in xs[1:]]

    def aggregate():
        loaded = [server.load_ciphertexts(u, n) for u in all_uploads]
        return [to_bytes(c) for c in server.weighted_sum(loaded, weights)]

    agg, t_agg = timed(aggregate, repeats)
    exact = sum(w * x for w, x in zip(weights, xs))
    dec, t_dec = timed(lambda: keys.decrypt(agg, n, server.sum_scale), repeats)
    # as a decryptor sizes it: every decryption the shared key may make, each client's
    # budget of one reveal per round times the number of clients (FedAvg opens nothing)
    # and E from this sum's own integer weights over all its coefficients
    ks = [quantise(w, preset.weight_bits) for w in weights]
    error = error_bound(ks, len(agg) * preset.poly_modulus_degree, 30)
    sigma = flooding_sigma(error, rounds * len(xs), 30)
    flooded, _ = keys.decrypt_flooded(agg, n, server.sum_scale, sigma)
    return {
        "upload_B_per_param": sum(map(len, uploads)) / n,
        "download_B_per_param": sum(map(len, agg)) / n,
        "encrypt_s_per_M": t_enc * 1e6 / n,
        "aggregate_s_per_M": t_agg * 1e6 / n,
        "decrypt_s_per_M": t_dec * 1e6 / n,
        "rel_error": relative_error(dec, exact),
        "rel_error_flooded": relative_error(flooded, exact),
    }


def bench_nvflare(xs: list[np.ndarray], weights: list[float], repeats: int) -> dict:
    n = xs[0].size
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[60, 40, 40]
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
    exact = sum(w * x for w, x in zip(weights, xs))
    dec, t_dec = timed(lambda: np.array(ts.ckks_vector_from(ctx, agg).decrypt()), repeats)
    return {
        "upload_B_per_param": len(upload) / n,
        "download_B_per_param": len(agg) / n,
        "encrypt_s_per_M": t_enc * 1e6 / n,
        "aggregate_s_per_M": t_agg * 1e6 / n,
        "decrypt_s_per_M": t_dec * 1e6 / n,
        "rel_error": relative_error(dec, exact),
        "rel_error_flooded": float("nan"),
    }


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
        + " For each configuration and model size: bytes per parameter up and down, "
        "encrypt / aggregate / decrypt seconds per million parameters, and the aggregate's "
        "relative error without and with noise flooding.",
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
        type=positive,
        default=4,
        help="clients in the weighted sum (default: %(default)s)",
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
    args.out = output_folder(parser, args.out, "crypto", OUTPUTS, args.overwrite)
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    print(f"writing to {args.out}", flush=True)
    rows = []
    rng = np.random.default_rng(0)
    for n in args.sizes:
        # pseudo-gradient-like values: mostly small, a few larger entries
        xs = [
            rng.normal(0, 0.01, n) * rng.choice([1, 10], n, p=[0.99, 0.01])
            for _ in range(args.clients)
        ]
        weights = list(rng.uniform(1 / 3, 1, args.clients))
        configs = {
            f"secagg {p.name}": (
                lambda p=p: bench_preset(p, xs, weights, args.repeats, args.rounds)
            )
            for p in PRESETS.values()
        }
        configs["NVFlare default"] = lambda: bench_nvflare(xs, weights, args.repeats)
        for name, run in configs.items():
            print(f"  {name}, {n:.0e} parameters ...", flush=True)
            rows.append({"config": name, "params": n, **run()})
    table = pd.DataFrame(rows)
    for n, g in table.groupby("params"):
        ref = g[g["config"] == "NVFlare default"].iloc[0]
        for col in ("upload_B_per_param", "encrypt_s_per_M"):
            table.loc[g.index, f"{col}_vs_nvflare"] = ref[col] / g[col]
    table.to_csv(args.out / "crypto.csv", index=False)
    md = markdown_table(table, ".3g")
    (args.out / "crypto.md").write_text(
        "# CKKS cost per parameter (median of repeats; *_vs_nvflare = NVFlare / ours, so "
        "above 1 means ours is smaller or faster)\n\n" + md + "\n"
    )
    print(md)
    return table


if __name__ == "__main__":
    main()
