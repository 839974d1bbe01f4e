"""Flooding bound: the decryption error of a weighted sum of uploads against the old and new E.

    python -m benchmarks.flooding_bound [--trials 50] [--preset compact] [--out flooding.csv]

Six clients upload fresh seeded encryptions of zeros (one chunk); the server forms their
weighted sum; decrypting it leaves only its error Σ k_i e_i, whose Euclidean norm over all N
coefficients is measured (Parseval on the decoded values, mean over --trials). Against it:

- E_old = n · 2^weight_bits · 19.2, the bound before issue 12 (one coefficient, worst weights);
- E_new = ``flooding.error_bound(k, N)``, over every coefficient, from the sum's own weights;

the statistical security each actually gives at s = 30 (``realised_security_bits``: below 30
when E underestimates the error), and what each costs in precision: the flooding noise's σ on
each decoded value (at the sum's scale), sized for t = 6 clients × (5 reveals + 5 opens).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from secagg.ckks.flooding import error_bound, flooding_sigma, realised_security_bits, slot_sigma
from secagg.ckks.presets import get_preset
from secagg.ckks.public import quantise, to_bytes
from secagg.ckks.secret import SecretKeyHolder

N_CLIENTS = 6
DECRYPTIONS = N_CLIENTS * (5 + 5)
SECURITY_BITS = 30
WEIGHTINGS = {
    "fedavg": [1 / N_CLIENTS] * N_CLIENTS,
    "larc": [1 / 3, 0.5, 0.8, 1.0, 1.0, 1.0],
    "one-hot-ish": [1.0] + [0.01] * (N_CLIENTS - 1),
    "all-max": [1.0] * N_CLIENTS,
}


def realised_norm(keys: SecretKeyHolder, weights: list[float]) -> float:
    """‖Σ k_i e_i‖₂ of one weighted sum of fresh encryptions of zeros (one chunk)."""
    public, n = keys.public, keys.preset.poly_modulus_degree
    uploads = [public.load_ciphertexts(keys.encrypt(np.zeros(n), 1.0), n) for _ in weights]
    total = public.weighted_sum(uploads, weights)
    values = keys.decrypt([to_bytes(ct) for ct in total], n, None)
    return public.sum_scale * math.sqrt(2.0 / n * float(np.sum(values**2)))


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--preset", default="compact")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as CSV")
    args = parser.parse_args(argv)

    preset = get_preset(args.preset)
    keys = SecretKeyHolder(preset)
    n, scale = preset.poly_modulus_degree, keys.public.sum_scale
    e_old = N_CLIENTS * 2.0**preset.weight_bits * 19.2
    rows = []
    for name, weights in WEIGHTINGS.items():
        realised = float(np.mean([realised_norm(keys, weights) for _ in range(args.trials)]))
        e_new = error_bound([quantise(w, preset.weight_bits) for w in weights], n, SECURITY_BITS)
        rows.append(
            {
                "weighting": name,
                "realised": realised,
                "E_old": e_old,
                "E_new": e_new,
                "realised/E_old": realised / e_old,
                "realised/E_new": realised / e_new,
                "bits_old": realised_security_bits(e_old, realised, SECURITY_BITS),
                "bits_new": realised_security_bits(e_new, realised, SECURITY_BITS),
                **{
                    f"flood_sigma_{k}": slot_sigma(
                        flooding_sigma(e, DECRYPTIONS, SECURITY_BITS), n, scale
                    )
                    for k, e in (("old", e_old), ("new", e_new))
                },
            }
        )
    table = pd.DataFrame(rows)
    print(
        f"preset {preset.name} (N={n}), {N_CLIENTS} clients, 1 chunk, {args.trials} trials; "
        f"security s={SECURITY_BITS}; flooding σ per decoded value at the sum scale "
        f"2^{preset.scale_bits + preset.weight_bits}, t={DECRYPTIONS} decryptions"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out is not None:
        table.to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
