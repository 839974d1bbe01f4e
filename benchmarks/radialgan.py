"""RadialGAN federated data augmentation (GenoMed4All D6.2 §5, §6.5.2) on the report's
two-node MNIST experiment (§6.6.2.1), with scikit-learn's 8×8 digits standing in for MNIST.

Per seed: 20 % of every class is held out (clean test digits); a good node holds 500 clean
training digits, a bad node 50 others of which a share (0.5, 0.7, 0.9) of the pixels of every
image is replaced by binary noise (``secagg.protocols.radialgan.corrupt_with_noise``). The bad
node's classifier (multinomial logistic regression, scikit-learn) is trained

- alone on its 50 noisy digits: the report's lower bound ("isolated bad node");
- on its digits and the good node's translated into its domain, G_bad(F_good(x, y)) (Eq. 5.8):
  RadialGAN, trained with ``train_radialgan``; the codes of the augmentation cross through
  the engine's exchange on ``plain`` (``relay_latent_codes``), whose audit is printed;
- on its digits and the good node's real ones: the stand-in the report used because its
  RadialGAN was "not yet completely operative" (not private: raw samples move);

and the good node's classifier on its 500 clean digits is the upper bound ("isolated good
node"). Accuracy on the clean held-out digits (the bad node's classifier also on the same
digits noised like its own, its own domain). Mean ± SD over seeds; paired differences against
the isolated bad node with 95 % t-intervals.

    python -m benchmarks.radialgan --out benchmarks/results
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.options import output_folder, positive
from benchmarks.reproduce import Check, made_by, shown_path
from benchmarks.stats import (
    clear_sign,
    format_difference,
    markdown_table,
    mean_std,
    paired_difference,
)

OUTPUTS = ("radialgan.md", "radialgan.csv")
#: ``secagg bench radialgan --check``: seed 0 at every noise share (about 30 s)
CHECK = Check(
    args=("--seeds", "1"),
    csv="radialgan.csv",
    keys=("share", "seed"),
    columns={
        **{
            f"{arm}{tag}": 1e-12
            for arm in ("good_isolated", "bad_isolated", "bad_radialgan", "bad_real_good")
            for tag in ("", "_noised")
        },
        "translated_label_agreement": 1e-12,
        "bytes_per_step": 0,
    },
    why="the split, the noise and the GAN are seeded, float64 numpy and scikit-learn's lbfgs "
    "are deterministic: the same classifiers, so the same accuracies (ratios of counts); "
    "bytes are counted exactly",
)
SHARES = (0.5, 0.7, 0.9)
N_GOOD, N_BAD, N_CLASSES, N_FEATURES = 500, 50, 10, 64
#: RadialGAN's settings here (see the module docstring of secagg.protocols.radialgan)
GAN = {"hidden": 64, "latent": 16, "warmup": 300, "steps": 1000, "batch": 50, "lam": 1.0}


def digits() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits, pixels / 16 (``secagg.clients.tasks.digits``' scaling)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data / 16.0, data.target.astype(int)


def two_nodes(x: np.ndarray, y: np.ndarray, share: float, seed: int) -> dict[str, Any]:
    """The seed's held-out digits and its good and bad node (bad: noised)."""
    from benchmarks.radialgan_training import corrupt_with_noise

    rng = np.random.default_rng([seed, int(share * 1000)])
    test = np.concatenate(
        [rng.permutation(np.flatnonzero(y == c))[: (y == c).sum() // 5] for c in range(10)]
    )
    train = rng.permutation(np.setdiff1d(np.arange(y.size), test))
    good, bad = train[:N_GOOD], train[N_GOOD : N_GOOD + N_BAD]
    x_bad, _ = corrupt_with_noise(x[bad], share, rng)
    x_test_noised, _ = corrupt_with_noise(x[test], share, rng)
    return {
        "good": (x[good], y[good]),
        "bad": (x_bad, y[bad]),
        "test": (x[test], y[test]),
        "test_noised": (x_test_noised, y[test]),
    }


def accuracy(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> float:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=3000).fit(*train)
    return float(model.score(*test))


# ---- the hand-over through the engine's exchange ----------------------------------------------
class NodeView:
    """The part of a client (``ClientAPI``) a RadialGAN node's half reads: its own samples."""

    def __init__(self, node_id: str, x: np.ndarray, y: np.ndarray):
        self.id, self._x, self._y = node_id, x, y

    def features(self) -> np.ndarray:
        return np.asarray(self._x, dtype=np.float64)

    def labels(self) -> np.ndarray:
        return np.asarray(self._y, dtype=np.float64)


def hand_over(nets: dict, data: dict, source: str, target: str, backend: str = "plain"):
    """Eq. 5.8 for one pair through the engine's exchange: the server asks ``source`` for its
    codes and relays them to ``target`` (real envelopes, audit and backend). Returns the
    target's half (holding the translated samples) and the audit summary."""
    from secagg.backends import make_backends
    from secagg.protocols.radialgan import CAPABILITIES, RadialGANNode, relay_latent_codes
    from secagg.server.audit import AuditLog
    from secagg.server.exchange import Exchange
    from secagg.server.round import RoundContext
    from secagg.server.transport import InProcessTransport
    from secagg.wire import Envelope

    ids = sorted(nets)
    server, _ = make_backends(backend, ids)
    halves = {c: RadialGANNode.holding(nets[c]) for c in ids}
    views = {c: NodeView(c, *data[c]) for c in ids}

    def handler(c: str):
        def handle(raw: bytes) -> bytes:
            env = Envelope.from_bytes(raw)
            reply = halves[c].handlers()[env.phase](views[c], env)
            return Envelope(c, "server", env.round, env.phase, reply).to_bytes()

        return handle

    audit = AuditLog()
    audit.declared = set(CAPABILITIES.reveals)
    exchange = Exchange(0, ids, InProcessTransport({c: handler(c) for c in ids}), audit)
    relay_latent_codes(RoundContext(exchange, 1, server, None), source, target)
    return halves[target], audit.summary()


def run_seed(x: np.ndarray, y: np.ndarray, share: float, seed: int) -> tuple[dict, dict]:
    from benchmarks.radialgan_training import train_radialgan
    from secagg.protocols.radialgan import joint

    nodes = two_nodes(x, y, share, seed)
    start = time.perf_counter()
    trained, exchanged = train_radialgan(
        [joint(*nodes["good"], N_CLASSES), joint(*nodes["bad"], N_CLASSES)],
        n_features=N_FEATURES,
        n_classes=N_CLASSES,
        seed=seed,
        **GAN,
    )
    gan_seconds = time.perf_counter() - start
    half, audit = hand_over(
        {"good": trained[0], "bad": trained[1]},
        {"good": nodes["good"], "bad": nodes["bad"]},
        "good",
        "bad",
    )
    x_aug, y_aug = half.translated_samples()
    x_bad, y_bad = nodes["bad"]
    x_good, y_good = nodes["good"]
    augmented = (np.vstack([x_bad, x_aug]), np.concatenate([y_bad, y_aug]))
    with_real = (np.vstack([x_bad, x_good]), np.concatenate([y_bad, y_good]))
    row = {"share": share, "seed": seed}
    for test in ("test", "test_noised"):
        tag = "" if test == "test" else "_noised"
        row[f"good_isolated{tag}"] = accuracy(nodes["good"], nodes[test])
        row[f"bad_isolated{tag}"] = accuracy(nodes["bad"], nodes[test])
        row[f"bad_radialgan{tag}"] = accuracy(augmented, nodes[test])
        row[f"bad_real_good{tag}"] = accuracy(with_real, nodes[test])
    row["translated_label_agreement"] = float(np.mean(y_aug == y_good))
    row["gan_seconds"] = gan_seconds
    row["bytes_per_step"] = (exchanged.codes_bytes + exchanged.gradient_bytes) / exchanged.steps
    return row, audit


ARMS = {
    "good_isolated": "isolated good node (upper bound)",
    "bad_isolated": "isolated bad node (lower bound)",
    "bad_radialgan": "bad node + RadialGAN augmentation",
    "bad_real_good": "bad node + the good node's real digits (report's stand-in)",
}


def tables(frame: pd.DataFrame) -> tuple[str, str]:
    accuracy_rows, difference_rows = [], []
    for share, part in frame.groupby("share"):
        for arm, label in ARMS.items():
            accuracy_rows.append(
                {
                    "noise share": share,
                    "classifier": label,
                    "clean test": mean_std(part[arm]),
                    "noised test": mean_std(part[f"{arm}_noised"]),
                }
            )
        for arm in ("bad_radialgan", "bad_real_good"):
            for tag, name in (("", "clean test"), ("_noised", "noised test")):
                d = paired_difference(part[f"{arm}{tag}"], part[f"bad_isolated{tag}"])
                difference_rows.append(
                    {
                        "noise share": share,
                        "difference": f"{ARMS[arm]} − isolated bad",
                        "test": name,
                        "mean [95 % CI]": format_difference(d),
                    }
                )
    return markdown_table(pd.DataFrame(accuracy_rows)), markdown_table(
        pd.DataFrame(difference_rows)
    )


def finding(frame: pd.DataFrame) -> str:
    """One sentence per share on §6.6.2.1's expectation, on the clean test digits: does an
    augmentation lift the bad node's classifier above its isolated bound (interval above 0),
    and how much of the way to the good node's does it get?"""
    parts = []
    for share, part in frame.groupby("share"):
        gap = float((part["good_isolated"] - part["bad_isolated"]).mean())
        said = []
        for arm in ("bad_radialgan", "bad_real_good"):
            d = paired_difference(part[arm], part["bad_isolated"])
            verdict = {1: "lifts", 0: "does not lift", -1: "lowers"}[clear_sign(d)]
            said.append(
                f"{ARMS[arm]} {verdict} it ({format_difference(d)}, "
                f"{d['mean_diff'] / gap:.0%} of the way to the good node)"
            )
        parts.append(f"at noise share {share}, " + "; ".join(said))
    return (
        "**Finding (§6.6.2.1: federated augmentation should lift the bad node towards the "
        "good node), clean test digits:** " + "; ".join(parts) + "."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive, default=20)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(parser, args.out, "radialgan", OUTPUTS, args.overwrite)

    x, y = digits()
    rows, audit = [], None
    start = time.perf_counter()
    for share in SHARES:
        for seed in range(args.seeds):
            row, audit = run_seed(x, y, share, seed)
            rows.append(row)
            print(
                f"share {share} seed {seed}: bad {row['bad_isolated']:.3f} "
                f"radialgan {row['bad_radialgan']:.3f} good {row['good_isolated']:.3f} "
                f"({row['gan_seconds']:.1f} s)",
                flush=True,
            )
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "radialgan.csv", index=False)
    accuracies, differences = tables(frame)
    agreement = frame.groupby("share")["translated_label_agreement"].agg(["mean", "std"])
    learned = audit["learned_in_plaintext"] if audit else {}
    text = "\n\n".join(
        [
            "# RadialGAN federated data augmentation (GenoMed4All D6.2 §5, §6.6.2.1)",
            made_by(
                shlex.join(
                    [
                        "python",
                        "-m",
                        "benchmarks.radialgan",
                        "--seeds",
                        str(args.seeds),
                        "--out",
                        shown_path(out),
                        "--overwrite",
                    ]
                )
            ),
            "Scikit-learn "
            f"digits, good node {N_GOOD} clean digits, bad node {N_BAD} digits with the stated "
            "share of pixels replaced by binary noise; logistic-regression classifiers; "
            f"{args.seeds} seeds per share (the split, the noise and the GAN's initialisation "
            f"differ per seed). RadialGAN: {GAN} (Adam lr 1e-3, β₁ 0.5; `warmup` steps of each "
            "node's own autoencoding before the adversarial game). Accuracy mean ± SD.",
            accuracies,
            "Paired differences against the isolated bad node (mean, 95 % t-interval):",
            differences,
            finding(frame),
            "Label agreement of the translated digits (the argmax of G_bad's label output "
            "against the good node's true label; chance 0.1): "
            + ", ".join(
                f"share {s}: {r['mean']:.3f} ± {r['std']:.3f}" for s, r in agreement.iterrows()
            )
            + ".",
            f"Bytes crossing between the nodes per GAN step (codes out, code gradients back): "
            f"{frame['bytes_per_step'].iloc[0]:.0f}. The augmentation's hand-over through the "
            f"engine on plain: the server learned {learned}; undeclared items: "
            f"{audit['undeclared_plaintext_items'] if audit else []}.",
            f"Wall time {time.perf_counter() - start:.0f} s.",
        ]
    )
    (out / "radialgan.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
