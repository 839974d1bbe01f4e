"""Write the walkthrough's data: one CSV per hospital site, and the experimenter's test set.

The samples are scikit-learn's breast cancer set (bundled with scikit-learn: nothing is
downloaded), standardised, shuffled with a fixed seed, and dealt to four sites of unequal
size; a fifth of them is held out as ``test.csv``, which no site holds.

    python examples/own_model/make_sites.py [FOLDER]    # default: examples/own_model/sites
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer

#: the sites' shares of the training samples (unequal on purpose: FedAvg weighs by size)
SHARES = (0.4, 0.3, 0.2, 0.1)


def main(folder: Path) -> None:
    data = load_breast_cancer()
    x = (data.data - data.data.mean(axis=0)) / data.data.std(axis=0)
    frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(x.shape[1])])
    frame["label"] = data.target
    frame = frame.sample(frac=1.0, random_state=7).reset_index(drop=True)
    n_test = len(frame) // 5
    folder.mkdir(parents=True, exist_ok=True)
    frame.iloc[:n_test].to_csv(folder / "test.csv", index=False)
    train = frame.iloc[n_test:]
    cuts = np.cumsum([0, *(round(s * len(train)) for s in SHARES[:-1]), len(train)])
    cuts[-1] = len(train)
    for k in range(len(SHARES)):
        train.iloc[cuts[k] : cuts[k + 1]].to_csv(folder / f"site_{k}.csv", index=False)
    print(
        f"wrote {len(SHARES)} sites ({', '.join(map(str, np.diff(cuts)))} samples) and "
        f"test.csv ({n_test}) to {folder}/"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "sites")
