"""The Python API behind ``import secagg``: configure, run, get tables and files back.

    import secagg

    result = secagg.run(protocol="larc", backend="ckks", rounds=5, seeds=[42, 43],
                        out="results/larc")
    result.summary        # mean and std per round (a DataFrame)
    result.files          # the files written to ``out`` (metrics.csv, audit.jsonl, ...)

``register_task`` and ``register_protocol`` add a task or a protocol defined outside
secagg; they reach worker processes too (``workers=N``), as long as what they register is
importable by reference (module-level functions and classes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from secagg.errors import ConfigError
from secagg.server.audit import AuditLog
from secagg.simulation.experiment import (
    ExperimentConfig,
    TransportFactory,
    run_experiment,
    stderr_progress,
    summarize,
)


@dataclass
class RunResult:
    """What a run produced: tables as DataFrames, the audit, the final models, and the files
    written (none without ``out``)."""

    config: ExperimentConfig
    metrics: pd.DataFrame  # one row per seed and round (round 0 = the initial model)
    summary: pd.DataFrame  # mean and std over seeds per round
    traffic: pd.DataFrame  # bytes per round, phase, direction, client and field
    audit: AuditLog
    final_params: dict[int, np.ndarray]
    aborted: dict[int, str] = field(default_factory=dict)  # seed -> why it stopped early
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def audit_summary(self) -> dict[str, Any]:
        """What the server learned in plaintext, declared and undeclared items, DP coverage."""
        return self.audit.summary()


def run(
    config: ExperimentConfig | None = None,
    *,
    out: str | Path | None = None,
    transport: TransportFactory | None = None,
    progress: bool | Callable[[str], None] = False,
    **settings: Any,
) -> RunResult:
    """Run an experiment: every seed of ``config`` (or of an ``ExperimentConfig(**settings)``;
    with both, ``settings`` override ``config``'s fields).

    Parameters:
        config: the experiment; see ``ExperimentConfig`` for every field.
        out: a folder to write metrics.csv, summary.csv, traffic.csv, audit.jsonl,
            audit_summary.json, privacy.json, config.json and convergence.png to.
        transport: ``(clients factory, client ids) -> transport``, replacing the in-process
            (or worker-process) transport, e.g. with a network one.
        progress: True prints progress to stderr; a callable receives each line.
    """
    if config is None:
        config = ExperimentConfig(**settings)
    elif settings:
        unknown = set(settings) - set(ExperimentConfig.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown settings {sorted(unknown)}")
        config = replace(config, **settings)
    report = stderr_progress if progress is True else (progress or None)
    result = run_experiment(config, progress=report, transport_factory=transport)
    from secagg.simulation.report import traffic_table, write_outputs  # matplotlib, lazily

    summary = summarize(result.metrics)
    files: dict[str, Path] = {}
    if out is not None:
        files = write_outputs(Path(out), config, result.metrics, summary, result.audit)
    return RunResult(
        config,
        result.metrics,
        summary,
        traffic_table(result.audit),
        result.audit,
        result.final_params,
        result.aborted,
        files,
    )
