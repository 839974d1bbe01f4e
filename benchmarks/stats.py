"""Small statistics helpers for benchmark tables: mean ± std, paired differences."""

from __future__ import annotations

import numpy as np
from scipy import stats


def mean_std(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" if v.size > 1 else f"{v.mean():.4f}"


def paired_difference(treatment, control, confidence: float = 0.95) -> dict[str, float]:
    """Mean of treatment − control over paired runs, its t-interval and test p-values."""
    d = np.asarray(treatment, dtype=float) - np.asarray(control, dtype=float)
    n = d.size
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / np.sqrt(n)
    return {
        "n_pairs": n,
        "mean_diff": float(d.mean()),
        "ci_low": float(d.mean() - half),
        "ci_high": float(d.mean() + half),
        "p_ttest": float(stats.ttest_1samp(d, 0.0).pvalue),
        "p_wilcoxon": float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0,
        "wins": int((d > 0).sum()),
        "losses": int((d < 0).sum()),
    }


def markdown_table(frame, floatfmt: str = ".6g") -> str:
    """A pandas DataFrame as a GitHub markdown table (no extra dependency)."""

    def cell(v):
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join(lines)


def format_difference(d: dict[str, float]) -> str:
    """``+0.0123 [+0.0045, +0.0201]``: a paired_difference() result for a table cell."""
    return f"{d['mean_diff']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"


def run_complete(config, **kwargs):
    """``run_experiment``, but a seed that was aborted (a round left without usable
    clients) fails the benchmark loudly instead of being scored on its last round."""
    from secagg.simulation.experiment import run_experiment

    result = run_experiment(config, **kwargs)
    if result.aborted:
        raise RuntimeError(f"{config.protocol}: seeds aborted: {result.aborted}")
    return result
