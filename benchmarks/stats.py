"""Helpers for benchmark tables; the statistics themselves live in ``secagg.simulation.stats``."""

from __future__ import annotations

from secagg.simulation.stats import clear_sign, format_difference, mean_std, paired_difference

__all__ = [
    "clear_sign",
    "format_difference",
    "markdown_table",
    "mean_std",
    "paired_difference",
    "run_complete",
]


def markdown_table(frame, floatfmt: str = ".6g") -> str:
    """A pandas DataFrame as a GitHub markdown table (no extra dependency)."""

    def cell(v):
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join(lines)


def run_complete(config, **kwargs):
    """``run_experiment``, but a seed that was aborted (a round left without usable
    clients) fails the benchmark loudly instead of being scored on its last round."""
    from secagg.simulation.experiment import run_experiment

    result = run_experiment(config, **kwargs)
    if result.aborted:
        raise RuntimeError(f"{config.protocol}: seeds aborted: {result.aborted}")
    return result
