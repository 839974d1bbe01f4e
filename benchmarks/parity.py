"""Parity: the same runs on ``plain`` and an encrypted backend give the same model up to
CKKS precision.

    python -m benchmarks.parity [--seeds 42-46] [--preset compact] [--flooding-bits 30]
    python -m benchmarks.parity --backend threshold [--preset wide]

For LARC and FedAdam on Fed-TCGA-BRCA, prints and writes (into ``--out``, by default
benchmarks/results/) the max |Δparam| between backends after the last round and the c-index
of both, per seed (``parity_<preset>_flood<bits>.md`` and ``.csv`` for ckks,
``parity_threshold_<preset>.md`` and ``.csv``). Each Markdown file opens with how it was
made.

On threshold, ``wide`` (the default: weights chosen after the uploads) runs both protocols;
``lean`` (the clients apply planned weights, the server only adds) runs only the protocols
that stream, FedAdam: LARC weighs its uploads after they arrive, which ``lean`` cannot sum.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.reproduce import Check, made_by, seeds_text
from benchmarks.stats import (
    markdown_table,
    run_complete,
)
from secagg.backends import backend_spec
from secagg.protocols import make_protocol
from secagg.simulation.cli import parse_seeds
from secagg.simulation.experiment import ExperimentConfig
from secagg.threshold.params import get_preset as threshold_preset

HERE = Path(__file__).parent


def default_preset(backend: str) -> str:
    """The backend's preset for protocols that weigh their uploads after they arrive."""
    presets = backend_spec(backend).presets
    assert presets is not None
    return presets.default


#: ``secagg bench parity --check``: seed 42 on ckks compact with 30 flooding bits (about 30 s)
#: the results files it writes, one per run's arguments (the reference page lists them)
RESULTS = "parity_*.md"

CHECK = Check(
    args=("--seeds", "42", "--preset", "compact", "--flooding-bits", "30"),
    csv="parity_compact_flood30.csv",
    keys=("protocol", "seed"),
    columns={
        "c_index_plain": 1e-12,
        "c_index_ckks": 0.005,
        "max_abs_diff_weights": 1e-4,
        "same_c_index_4dp": 0,
    },
    why="plain is deterministic; ckks adds fresh encryption and flooding noise each run, so "
    "its model is plain's to ~1e-5 (fedadam) and 1e-7 (larc) but not the same twice: the "
    "gap must stay at CKKS precision (1e-4) and the c-index within a few of the test set's "
    "pair orderings (0.005) of the committed one; within the fresh run, plain's and ckks' "
    "c-index must be equal to 4 decimals, as the results page says",
)
CONFIGS = {
    "fedadam": ExperimentConfig(protocol="fedadam", client_lr="0.01"),
    "larc": ExperimentConfig(protocol="larc", client_lr="0.1"),
}


def runs_on(protocol: str, backend: str, preset: str) -> bool:
    """Whether ``protocol`` can run on this preset: a client-weighted threshold preset
    (``lean``) needs weights planned before the uploads, as a streaming protocol has them."""
    if backend != "threshold" or not threshold_preset(preset).weighted_by_clients:
        return True
    return make_protocol(protocol).capabilities.streams


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-46"))
    parser.add_argument("--backend", choices=("ckks", "threshold"), default="ckks")
    defaults = {b: default_preset(b) for b in ("ckks", "threshold")}
    parser.add_argument(
        "--preset",
        help=f"the backend's preset ({defaults['ckks']} / {defaults['threshold']} by default; on "
        "threshold, lean runs the streaming protocols only)",
    )
    parser.add_argument("--flooding-bits", type=int, default=30, help="ckks only")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    encrypted = args.backend
    preset = args.preset or defaults[encrypted]
    words = ["python", "-m", "benchmarks.parity", "--seeds", seeds_text(args.seeds)]
    words += ["--backend", encrypted, "--preset", preset]
    if encrypted == "ckks":
        words += ["--flooding-bits", str(args.flooding_bits)]
    command = shlex.join([*words, "--out", str(args.out)])
    options = (
        {"preset": preset, "flooding_bits": args.flooding_bits}
        if encrypted == "ckks"
        else {"preset": preset}
    )
    rows = []
    skipped = [name for name in CONFIGS if not runs_on(name, encrypted, preset)]
    for name, base in CONFIGS.items():
        if name in skipped:
            continue
        encrypted_run = replace(base, backend=encrypted, backend_options=options)
        cap = {"max_weight_share": encrypted_run.policy().max_weight_share}
        runs = {
            b: run_complete(
                replace(
                    base,
                    backend=b,
                    seeds=args.seeds,
                    # plain with the encrypted backend's weight cap: the same algorithm
                    backend_options=cap if b == "plain" else options,
                )
            )
            for b in ("plain", encrypted)
        }
        for seed in args.seeds:
            final = {
                b: r.metrics[
                    (r.metrics["seed"] == seed) & (r.metrics["round"] == base.rounds)
                ].iloc[0]
                for b, r in runs.items()
            }
            diff = np.abs(runs["plain"].final_params[seed] - runs[encrypted].final_params[seed])
            rows.append(
                {
                    "protocol": name,
                    "seed": seed,
                    "max_abs_param_diff": float(diff.max()),
                    # the last parameter is nn.Linear's bias, which the Cox partial likelihood
                    # ignores: its true gradient is 0, so Adam turns any noise there into steps
                    "max_abs_diff_weights": float(diff[:-1].max()),
                    "c_index_plain": final["plain"]["test_pooled"],
                    f"c_index_{encrypted}": final[encrypted]["test_pooled"],
                    "same_c_index_4dp": round(final["plain"]["test_pooled"], 4)
                    == round(final[encrypted]["test_pooled"], 4),
                }
            )
    table = pd.DataFrame(rows)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    md = markdown_table(table)
    if encrypted == "ckks":
        name = f"parity_{preset}_flood{args.flooding_bits}.md"
        title = f"plain vs ckks (preset {preset}, flooding {args.flooding_bits} bits)"
    else:
        name = f"parity_threshold_{preset}.md"
        title = f"plain vs threshold (preset {preset}: {threshold_preset(preset).description})"
    table.to_csv(out / name.replace(".md", ".csv"), index=False)
    notes = [made_by(command)]
    if skipped:
        notes.append(
            f"Not run on {preset}: {', '.join(skipped)} (weights chosen after the uploads; "
            "this preset needs them planned before, as a streaming protocol plans them)."
        )
    (out / name).write_text(f"# Parity {title}\n\n" + "\n\n".join(notes) + "\n\n" + md + "\n")
    print(md)


if __name__ == "__main__":
    main()
