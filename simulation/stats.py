"""Statistics for comparing runs: mean ± std over seeds and paired differences.

Seeds are the unit of replication. When seeds share something random (``client_split_count``
splits: seeds s and s + G train on the same split) they are not independent, so
:func:`paired_difference` takes ``clusters`` and then forms its interval over the cluster
means (a t-interval with G − 1 degrees of freedom), not over the seeds: 50 seeds over 10
splits carry the information of about 10, not 50.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def mean_std(values) -> str:
    """``0.7233 ± 0.0872`` (std with ddof 1); a single value has no spread to show."""
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" if v.size > 1 else f"{v.mean():.4f}"


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its two-sided t-interval (nan bounds for fewer than two values)."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float(v.mean()) if v.size else float("nan"), float("nan"), float("nan")
    half = stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def paired_difference(
    treatment,
    control,
    confidence: float = 0.95,
    *,
    clusters: Sequence[object] | None = None,
) -> dict[str, float]:
    """Mean of treatment − control over paired runs, its t-interval and test p-values.

    ``clusters`` (one label per pair, e.g. the split a seed trained on) makes the interval
    and the t-test cluster-level: the differences are averaged within each cluster and the
    cluster means are the sample. ``n_clusters`` reports how many there were.
    """
    d = np.asarray(treatment, dtype=float) - np.asarray(control, dtype=float)
    if d.ndim != 1 or d.size != np.asarray(control).size:
        raise ValueError("treatment and control must be 1-D and of the same length")
    sample = d
    if clusters is not None:
        labels = np.asarray(list(clusters), dtype=object)
        if labels.size != d.size:
            raise ValueError(f"{labels.size} cluster labels for {d.size} pairs")
        sample = np.array([d[labels == c].mean() for c in dict.fromkeys(labels.tolist())])
    mean, low, high = t_interval(sample, confidence)
    return {
        "n_pairs": int(d.size),
        "n_clusters": int(sample.size),
        "mean_diff": float(d.mean()),
        "ci_low": low,
        "ci_high": high,
        "p_ttest": float(stats.ttest_1samp(sample, 0.0).pvalue) if sample.size > 1 else 1.0,
        # the signed-rank test on the (cluster) sample; 1 when every difference is 0
        "p_wilcoxon": (
            float(stats.wilcoxon(sample).pvalue) if sample.size > 1 and np.any(sample != 0) else 1.0
        ),
        "wins": int((d > 0).sum()),
        "losses": int((d < 0).sum()),
    }


def clear_sign(d: dict[str, float]) -> int:
    """+1 if a paired_difference() interval lies above 0, -1 if below, 0 if it holds 0 (no
    clear difference): the one reading of "significant" behind the benchmarks' verdicts."""
    if d["ci_low"] > 0:
        return 1
    return -1 if d["ci_high"] < 0 else 0


def format_difference(d: dict[str, float]) -> str:
    """``+0.0123 [+0.0045, +0.0201]``: a paired_difference() result for a table cell."""
    return f"{d['mean_diff']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
