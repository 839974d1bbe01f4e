"""Corrections for the benchmarks' families of paired tests and for resampled splits.

- :func:`holm` adjusts a family of p-values (Holm 1979), controlling the family-wise error
  rate without any assumption on how the tests depend on each other.
- :func:`nadeau_bengio` is the corrected resampled t-test (Nadeau & Bengio 2003): a
  difference measured on J random train/test splits of the same data set, whose training
  (and test) sets overlap, so that the J differences are positively correlated and the
  ordinary paired t-test's variance s²/J is too small. It inflates the variance to
  (1/J + n_test/n_train)·s².

Pure functions of their arguments (NumPy and SciPy only).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values, in the order given.

    Holm, S. (1979), "A simple sequentially rejective multiple test procedure",
    Scandinavian Journal of Statistics 6(2), 65–70. With the m p-values sorted ascending,
    p₍₁₎ ≤ … ≤ p₍ₘ₎, the adjusted value of the i-th is max over k ≤ i of min(1, (m − k + 1)
    p₍ₖ₎) (the running maximum keeps the order); a test is rejected at family-wise level α
    when its adjusted p is ≤ α. NaN p-values are left NaN and do not count in m.
    """
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise ValueError("holm takes a 1-D sequence of p-values")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("p-values lie in [0, 1]")
    out = np.full(p.shape, np.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m = valid.size
    if m == 0:
        return out
    order = valid[np.argsort(p[valid], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def nadeau_bengio(
    differences: Sequence[float],
    n_train: int,
    n_test: int,
    confidence: float = 0.95,
) -> dict[str, float]:
    """The corrected resampled t-test for the mean of J paired differences, each measured on
    one random train/test split (n_train training and n_test test cases) of one data set.

    Nadeau, C. and Bengio, Y. (2003), "Inference for the generalization error", Machine
    Learning 52(3), 239–281 (the "corrected resampled t-test"; see also Bouckaert & Frank
    2004): with d̄ and s² the mean and sample variance (ddof 1) of the J differences, the
    variance of d̄ is taken as (1/J + n_test/n_train)·s² instead of s²/J, and
    t = d̄ / √((1/J + n_test/n_train)·s²) is referred to Student's t with J − 1 degrees of
    freedom. With n_test/n_train → 0 it is the ordinary paired t-test.

    Returns ``mean_diff``, ``ci_low``, ``ci_high`` (the corrected ``confidence`` interval),
    ``p`` (two-sided), ``t``, ``se`` and ``n_splits``.
    """
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or d.size < 2:
        raise ValueError("at least two differences (splits) are needed")
    if n_train <= 0 or n_test < 0:
        raise ValueError("n_train must be positive and n_test non-negative")
    j = d.size
    mean = float(d.mean())
    variance = float(d.var(ddof=1))
    se = float(np.sqrt((1.0 / j + n_test / n_train) * variance))
    half = float(stats.t.ppf(0.5 + confidence / 2, j - 1)) * se
    if se > 0:
        t = mean / se
        p = float(2 * stats.t.sf(abs(t), j - 1))
    else:  # every difference equal: no spread to test against
        t = 0.0 if mean == 0 else float(np.copysign(np.inf, mean))
        p = 1.0 if mean == 0 else 0.0
    return {
        "n_splits": j,
        "mean_diff": mean,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "t": float(t),
        "se": se,
        "p": p,
    }
