"""Comparing run folders side by side: one row per run, paired differences against the first.

A comparison is only as good as its pairing. Runs are paired on the seeds they have in
common (the same seed fixes the initial model, the batch order and, with
``client_split``, the clients' split), so the difference of each run against the first (the
reference) is a paired difference over those seeds, with its 95 % t-interval from
:func:`secagg.simulation.stats.paired_difference`. When seeds share a split
(``client_split_count`` G: seed s trains on split s % G) they are not independent and the
interval is formed over the splits instead ("split-clustered"); a run without split settings
contributes no sharing. Runs on different tasks cannot be compared and are refused.

Each run's status (``run.json``: ``complete``, ``degraded``, ``aborted``, ...; see
``secagg.runspec.status``) is a column of the table. A run that is not complete is
refused, naming its status and why, unless ``include_incomplete`` (``secagg compare
--include-incomplete``): then it is compared, with a warning and its status and problems in
the table's notes. A folder without run.json (written by hand, or by a secagg older than
run.json) has status ``unknown`` and is compared.

:func:`compare_runs` returns the table (and with ``out`` writes ``compare.csv``,
``compare.png`` and ``compare.md``); :func:`format_table` renders it for a terminal.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from secagg.errors import ConfigError  # noqa: E402
from secagg.runspec.status import shorten  # noqa: E402
from secagg.simulation.figures import (  # noqa: E402
    SETUP,
    byte_unit,
    extra_metric_columns,  # noqa: E402
    traffic_by_stage,
)
from secagg.simulation.stats import paired_difference  # noqa: E402

#: metric columns tried, in order, when none is asked for
DEFAULT_METRICS = ("test_pooled", "train_pooled")
#: prefixes of the metric columns of metrics.csv
METRIC_PREFIXES = ("test_", "train_")
CONFIDENCE = 0.95
DPI = 150
COLUMNS = [
    "label",
    "task",
    "protocol",
    "backend",
    "status",
    "n_seeds",
    "metric",
    "round",
    "mean",
    "std",
    "bytes_up",
    "bytes_down",
    "bytes_setup",
    "seconds_round",
    "diff_mean",
    "diff_ci_low",
    "diff_ci_high",
    "n_pairs",
    "n_clusters",
    "p_value",
    "interval",
    "note",
    "path",
]


@dataclass(frozen=True)
class Run:
    """One run folder's tables and settings."""

    label: str
    path: Path
    metrics: pd.DataFrame
    settings: dict[str, Any]
    traffic: pd.DataFrame | None
    #: run.json's status (``unknown`` without one) and the problems behind it
    status: str = "unknown"
    problems: tuple[str, ...] = ()
    #: what the server could form over the whole run (audit_summary.json's ``run_view``)
    run_view: dict[str, Any] | None = None


# ---- loading ------------------------------------------------------------------------------
def read_settings(run_dir: Path) -> dict[str, Any]:
    """The run's flat settings from config.json: its ``"settings"`` entry, or the top level
    in older folders; ``{}`` without a config.json."""
    config = _json_object(Path(run_dir) / "config.json", "a JSON object of settings")
    if config is None:
        return {}
    settings = config.get("settings", config)
    return settings if isinstance(settings, dict) else {}


def load_run(run_dir: Path, label: str) -> Run:
    """Read a run folder (metrics.csv, and config.json and traffic.csv if present)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} does not exist or is not a folder")
    path = run_dir / "metrics.csv"
    if not path.is_file():
        raise ConfigError(
            f"{run_dir} has no metrics.csv: it is not a run folder (pass folders written by "
            "`secagg run --out DIR`)"
        )
    metrics = pd.read_csv(path)
    missing = {"seed", "round", "task"} - set(metrics.columns)
    if missing:
        raise ConfigError(f"{path} lacks the columns {sorted(missing)}: not a run's metrics.csv")
    traffic_path = run_dir / "traffic.csv"
    traffic = None
    if traffic_path.is_file() and traffic_path.stat().st_size > 0:
        try:
            traffic = pd.read_csv(traffic_path)
        except pd.errors.EmptyDataError:
            traffic = None
    status, problems = read_status(run_dir)
    summary = _json_object(run_dir / "audit_summary.json", "a run's audit summary") or {}
    view = summary.get("run_view")
    return Run(
        label,
        run_dir,
        metrics,
        read_settings(run_dir),
        traffic,
        status,
        problems,
        view if isinstance(view, dict) else None,
    )


def server_view_cell(view: dict[str, Any] | None) -> str:
    """What the server saw over the whole run, in a table cell: every update when the
    backend reads them (no run view), else the guarantee and the weakest share of any
    combination of the run's releases (``AuditLog.run_view``)."""
    if not view:
        return "–"
    if not view.get("releases"):
        return "no release"
    guarantee = str(view.get("guarantee", "")).split(" ")[0]
    share = view.get("weakest_share")
    return f"{guarantee}, weakest {share:.3g}" if isinstance(share, (int, float)) else guarantee


def read_status(run_dir: Path) -> tuple[str, tuple[str, ...]]:
    """The run's status and its problems from run.json (``unknown`` without one)."""
    state = _json_object(Path(run_dir) / "run.json", "a run's state")
    if state is None:
        return "unknown", ()
    return str(state.get("status", "unknown")), tuple(map(str, state.get("problems", [])))


def _json_object(path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object in ``path`` (None where there is no such file); ConfigError, saying
    what to do, for anything else."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); rewrite it or remove it") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{path} does not hold {what}")
    return value


class IncompleteRunWarning(UserWarning):
    """Runs that are not complete are being compared (``include_incomplete``)."""


def check_statuses(runs: Sequence[Run], include_incomplete: bool) -> None:
    """Refuse runs that are not complete (ConfigError naming each), or with
    ``include_incomplete`` warn of them."""
    incomplete = [r for r in runs if r.status not in ("complete", "unknown")]
    if not incomplete:
        return
    shown = "; ".join(
        f"{r.label} is {r.status}" + (f" ({shorten(r.problems[0], 160)})" if r.problems else "")
        for r in incomplete
    )
    if not include_incomplete:
        raise ConfigError(
            f"not every run is complete: {shown}. Their numbers are not those of the runs "
            "they were configured as; compare them anyway with --include-incomplete "
            "(include_incomplete=True), or rerun them"
        )
    warnings.warn(f"comparing runs that are not complete: {shown}", IncompleteRunWarning, 3)


def unique_labels(labels: Sequence[str]) -> list[str]:
    """The labels with repeats numbered: ``["a", "a"]`` → ``["a", "a (2)"]``."""
    seen: dict[str, int] = {}
    out = []
    taken = set(labels)
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        if seen[label] == 1:
            out.append(label)
            continue
        k = seen[label]
        while f"{label} ({k})" in taken:
            k += 1
        out.append(f"{label} ({k})")
        taken.add(out[-1])
    return out


# ---- choosing what to compare ---------------------------------------------------------------
def metric_columns(metrics: pd.DataFrame) -> list[str]:
    """The metric columns of a metrics.csv (``test_*``, ``train_*``)."""
    return [c for c in metrics.columns if c.startswith(METRIC_PREFIXES)]


def choose_metric(runs: Sequence[Run], metric: str | None) -> str:
    """The asked metric, checked to be in every run, or the first of
    :data:`DEFAULT_METRICS` every run has."""
    common = [c for c in metric_columns(runs[0].metrics) if all(c in r.metrics for r in runs)]
    if metric is None:
        for name in DEFAULT_METRICS:
            if all(name in r.metrics and r.metrics[name].notna().any() for r in runs):
                return name
        raise ConfigError(
            f"no run-wide default metric ({', '.join(DEFAULT_METRICS)}): pass metric=, one of "
            f"{common}"
        )
    lacking = [r.label for r in runs if metric not in r.metrics]
    if lacking:
        raise ConfigError(
            f"metric {metric!r} is not in the metrics.csv of {lacking}; the metric columns all "
            f"runs have are {common}"
        )
    return metric


def choose_round(runs: Sequence[Run], round: int | None) -> int:
    """The asked round, checked to be in every run, or the final round, which must then be
    the same in every run."""
    finals = {r.label: int(r.metrics["round"].max()) for r in runs}
    if round is None:
        if len(set(finals.values())) > 1:
            shown = ", ".join(f"{k}: {v}" for k, v in finals.items())
            raise ConfigError(
                f"the runs end at different rounds ({shown}); pass round= to compare at a "
                f"round all of them reached (at most {min(finals.values())})"
            )
        return next(iter(finals.values()))
    lacking = [r.label for r in runs if not (r.metrics["round"] == round).any()]
    if lacking:
        shown = ", ".join(f"{k}: 0..{finals[k]}" for k in lacking)
        raise ConfigError(f"round {round} is not in every run (rounds of {shown})")
    return int(round)


def check_tasks(runs: Sequence[Run]) -> str:
    """The one task every run trained on (ConfigError otherwise)."""
    tasks = {r.label: sorted(r.metrics["task"].dropna().astype(str).unique()) for r in runs}
    mixed = {k: v for k, v in tasks.items() if len(v) != 1}
    if mixed:
        raise ConfigError(f"each run folder must hold one task; found {mixed}")
    names = {v[0] for v in tasks.values()}
    if len(names) > 1:
        shown = ", ".join(f"{k}: {v[0]}" for k, v in tasks.items())
        raise ConfigError(
            f"runs on different tasks ({shown}) cannot be compared: pass runs of one task"
        )
    return names.pop()


# ---- the numbers ------------------------------------------------------------------------------
def values_at(metrics: pd.DataFrame, metric: str, round: int) -> pd.Series:
    """The metric per seed at ``round`` (seeds without a finite value left out)."""
    rows = metrics[metrics["round"] == round]
    values = rows.set_index("seed")[metric].astype(float)
    return values[np.isfinite(values)].sort_index()


def split_count(settings: dict[str, Any]) -> int | None:
    """G when seeds of the run share splits (``client_split`` and ``client_split_count``
    set): seed s trains on split s % G. None: every seed has its own split or none."""
    if settings.get("client_split") is None:
        return None
    count = settings.get("client_split_count")
    return int(count) if count else None


def seed_clusters(seeds: Sequence[int], counts: Sequence[int | None]) -> list[int] | None:
    """One cluster label per seed such that seeds sharing a split in any run (s % G equal
    for one of the ``counts``) are in one cluster; None when no run shares splits."""
    shared = sorted({int(g) for g in counts if g})
    if not shared:
        return None
    parent = {s: s for s in seeds}

    def root(s):
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for g in shared:
        first: dict[int, int] = {}
        for s in seeds:
            k = s % g
            if k in first:
                parent[root(s)] = root(first[k])
            else:
                first[k] = s
    return [root(s) for s in seeds]


def paired_columns(
    values: pd.Series,
    reference: pd.Series,
    *,
    counts: Sequence[int | None],
    reference_label: str,
) -> dict[str, Any]:
    """The paired difference of ``values`` − ``reference`` on their common seeds.

    ``counts``: each run's split count (:func:`split_count`); ``reference_label``: named in
    the note when there is no interval. Without two common seeds (or two splits) the
    interval and p-value are NaN and ``note`` says why.
    """
    common = sorted(set(values.index) & set(reference.index))
    clusters = seed_clusters(common, counts)
    n_clusters = len(set(clusters)) if clusters is not None else len(common)
    interval = f"split-clustered ({n_clusters} splits)" if clusters is not None else "per seed"
    out: dict[str, Any] = {
        "diff_mean": np.nan,
        "diff_ci_low": np.nan,
        "diff_ci_high": np.nan,
        "n_pairs": len(common),
        "n_clusters": n_clusters,
        "p_value": np.nan,
        "interval": interval,
        "note": "",
    }
    if not common:
        out.update(
            note=f"no seed in common with {reference_label}: nothing to pair", interval="none"
        )
        return out
    with warnings.catch_warnings():
        # identical differences (a run that is the reference plus a constant) make scipy's
        # t-test warn about precision; the interval then has width 0, which is right
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        d = paired_difference(
            values.loc[common].to_numpy(),
            reference.loc[common].to_numpy(),
            CONFIDENCE,
            clusters=clusters,
        )
    out["diff_mean"] = d["mean_diff"]
    if len(common) < 2:
        out["note"] = f"1 seed in common with {reference_label}: no interval"
    elif d["n_clusters"] < 2:
        out["note"] = f"the {len(common)} common seeds share 1 split: no interval"
    else:
        out.update(diff_ci_low=d["ci_low"], diff_ci_high=d["ci_high"], p_value=d["p_ttest"])
    if out["note"]:
        out["interval"] = "none"
    return out


def _per_round_mean(metrics: pd.DataFrame, column: str, round: int) -> float:
    """Mean of ``column`` over seeds and rounds 1..``round`` (NaN if absent)."""
    if column not in metrics:
        return float("nan")
    rows = metrics[(metrics["round"] >= 1) & (metrics["round"] <= round)]
    values = rows[column].astype(float)
    return float(values.mean()) if values.notna().any() else float("nan")


def _setup_bytes(traffic: pd.DataFrame | None) -> float:
    """Setup bytes (both directions) per seed, mean over seeds; NaN without traffic."""
    if traffic is None:
        return float("nan")
    table = traffic_by_stage(traffic)
    setup = table[table["stage"] == SETUP]
    return float(setup["bytes"].sum()) if not setup.empty else 0.0


def _settings_or_column(run: Run, key: str) -> str:
    if key in run.metrics and run.metrics[key].notna().any():
        return str(run.metrics[key].dropna().iloc[0])
    return str(run.settings.get(key, ""))


def comparison_table(runs: Sequence[Run], *, metric: str, round: int) -> pd.DataFrame:
    """The side-by-side table (see :func:`compare_runs`) for loaded, checked runs."""
    reference = runs[0]
    ref_values = values_at(reference.metrics, metric, round)
    rows = []
    for k, run in enumerate(runs):
        values = values_at(run.metrics, metric, round)
        row: dict[str, Any] = {
            "label": run.label,
            "task": _settings_or_column(run, "task"),
            "protocol": _settings_or_column(run, "protocol"),
            "backend": _settings_or_column(run, "backend"),
            "status": run.status,
            "server_view": server_view_cell(run.run_view),
            "n_seeds": int(values.size),
            "metric": metric,
            "round": int(round),
            "mean": float(values.mean()) if values.size else np.nan,
            "std": float(values.std(ddof=1)) if values.size > 1 else np.nan,
            "bytes_up": _per_round_mean(run.metrics, "bytes_up", round),
            "bytes_down": _per_round_mean(run.metrics, "bytes_down", round),
            "bytes_setup": _setup_bytes(run.traffic),
            "seconds_round": _per_round_mean(run.metrics, "seconds_round", round),
            "path": str(run.path),
        }
        if k == 0:
            row.update(
                diff_mean=np.nan,
                diff_ci_low=np.nan,
                diff_ci_high=np.nan,
                n_pairs=np.nan,
                n_clusters=np.nan,
                p_value=np.nan,
                interval="",
                note="reference",
            )
        else:
            row.update(
                paired_columns(
                    values,
                    ref_values,
                    counts=[split_count(reference.settings), split_count(run.settings)],
                    reference_label=reference.label,
                )
            )
            if not run.settings or not reference.settings:
                missing = "; no config.json: splits assumed per seed"
                row["note"] = (row["note"] + missing).lstrip("; ")
        if run.status not in ("complete", "unknown"):  # the reference's: "reference; ..."
            said = (
                f"{run.status}"
                + (f": {shorten(run.problems[0], 160)}" if run.problems else "")
                + (f" (+{len(run.problems) - 1} more in run.json)" if len(run.problems) > 1 else "")
            )
            row["note"] = f"{row['note']}; {said}".lstrip("; ")
        rows.append(row)
    # the task's other pooled scores, mean and std over seeds at the same round (a task
    # with several metrics: each is compared the same way with metric=)
    others = [
        c
        for c in extra_metric_columns(reference.metrics.columns)
        if c != metric and all(c in run.metrics for run in runs)
    ]
    for row, run in zip(rows, runs):
        for column in others:
            values = values_at(run.metrics, column, round)
            row[column] = float(values.mean()) if values.size else np.nan
            row[f"{column}_std"] = float(values.std(ddof=1)) if values.size > 1 else np.nan
    extra = [c for column in others for c in (column, f"{column}_std")]
    table = pd.DataFrame(rows, columns=COLUMNS + extra)
    return table.astype({"n_pairs": "Int64", "n_clusters": "Int64"})


def compare_runs(
    dirs: Sequence[Path],
    *,
    metric: str | None = None,
    round: int | None = None,
    labels: Sequence[str] | None = None,
    out: Path | None = None,
    include_incomplete: bool = False,
) -> pd.DataFrame:
    """Compare run folders side by side; the first is the reference.

    ``dirs``: run folders (each with a metrics.csv). ``metric``: the metrics.csv column to
    compare (default ``test_pooled`` if every run has it, else ``train_pooled``).
    ``round``: the round to compare at (default the final round, which must then be the
    same in every run). ``labels``: a name per run (default its folder's name; repeats are
    numbered). ``out``: a folder to write ``compare.csv``, ``compare.png`` and
    ``compare.md`` to (created if needed). ``include_incomplete``: compare runs whose
    run.json says other than ``complete`` (degraded, aborted, ...), with a warning; by
    default they are refused.

    Returns one row per run: ``task``, ``protocol``, ``backend``, ``status`` (run.json's),
    ``server_view`` (what the server could form over the whole run: the audit's run view),
    ``n_seeds``, the metric's
    ``mean`` and ``std`` over seeds at ``round``, ``bytes_up``/``bytes_down``/
    ``seconds_round`` per round (mean over seeds and rounds 1..round), ``bytes_setup`` (key
    setup, enrolment and a protocol's initialisation: round 0, once per seed), and against
    the reference on the common seeds ``diff_mean``, ``diff_ci_low``/``diff_ci_high`` (95 %
    t-interval), ``n_pairs``, ``n_clusters``, ``p_value`` (t-test, same sample as the
    interval), ``interval`` ("per seed" or "split-clustered (G splits)") and ``note`` (why an
    interval is missing).
    """
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise ConfigError("compare_runs needs at least one run folder")
    if labels is not None and len(labels) != len(dirs):
        raise ConfigError(f"{len(labels)} labels for {len(dirs)} run folders: give one per run")
    names = list(labels) if labels is not None else [d.resolve().name or str(d) for d in dirs]
    runs = [load_run(d, label) for d, label in zip(dirs, unique_labels(names))]
    check_statuses(runs, include_incomplete)
    check_tasks(runs)
    chosen = choose_metric(runs, metric)
    at = choose_round(runs, round)
    table = comparison_table(runs, metric=chosen, round=at)
    if out is not None:
        write_comparison(Path(out), table, runs)
    return table


# ---- rendering ------------------------------------------------------------------------------
def _bytes_cell(value: float) -> str:
    if not np.isfinite(value):
        return "–"
    unit, scale = byte_unit(value)
    return f"{value / scale:.3g} {unit}"


def _p_cell(p: float) -> str:
    if not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def table_cells(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of a comparison table (shared by terminal and markdown)."""
    metric = str(df["metric"].iloc[0]) if len(df) else "metric"
    at = int(df["round"].iloc[0]) if len(df) else 0
    ref = str(df["label"].iloc[0]) if len(df) else ""
    header = [
        "run",
        "protocol",
        "backend",
        "status",
        "over the run",
        "seeds",
        f"{metric} @ round {at}",
        f"Δ vs {ref} [95% CI]",
        "p",
        "up/round",
        "down/round",
        "setup",
        "s/round",
        "interval",
    ]
    others = [c for c in extra_metric_columns(df.columns) if f"{c}_std" in df]
    header += [f"{c} @ round {at}" for c in others]
    rows = []
    for _, r in df.iterrows():
        value = f"{r['mean']:.4f}" if np.isfinite(r["mean"]) else "–"
        if np.isfinite(r["std"]):
            value += f" ± {r['std']:.4f}"
        if str(r["note"]).startswith("reference"):
            diff = "(reference)"
        elif np.isfinite(r["diff_mean"]):
            diff = f"{r['diff_mean']:+.4f}"
            if np.isfinite(r["diff_ci_low"]):
                diff += f" [{r['diff_ci_low']:+.4f}, {r['diff_ci_high']:+.4f}]"
        else:
            diff = "–"
        seconds = f"{r['seconds_round']:.3g}" if np.isfinite(r["seconds_round"]) else "–"
        rows.append(
            [
                str(r["label"]),
                str(r["protocol"]),
                str(r["backend"]),
                str(r["status"]),
                str(r.get("server_view", "–")),
                str(r["n_seeds"]),
                value,
                diff,
                _p_cell(r["p_value"]),
                _bytes_cell(r["bytes_up"]),
                _bytes_cell(r["bytes_down"]),
                _bytes_cell(r["bytes_setup"]),
                seconds,
                str(r["interval"]),
                *(_mean_std_cell(r[c], r[f"{c}_std"]) for c in others),
            ]
        )
    return header, rows


def _mean_std_cell(mean: float, std: float) -> str:
    if not np.isfinite(mean):
        return "–"
    return f"{mean:.4f}" + (f" ± {std:.4f}" if np.isfinite(std) else "")


def _notes(df: pd.DataFrame) -> list[str]:
    return [
        f"{r['label']}: {str(r['note']).removeprefix('reference; ')}"
        for _, r in df.iterrows()
        if r["note"] not in ("", "reference")
    ]


def format_table(df: pd.DataFrame) -> str:
    """The comparison table as aligned plain text for a terminal (notes below it)."""
    header, rows = table_cells(df)
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    head = "  ".join(cell.ljust(w) for cell, w in zip(header, widths)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([head, rule, *lines, *(f"note: {n}" for n in _notes(df))])


def markdown_table(df: pd.DataFrame) -> str:
    """The comparison table in markdown, with a caption saying how Δ was computed."""
    header, rows = table_cells(df)
    align = ["---" if k < 4 else "---:" for k in range(len(header))]
    align[-1] = "---"
    lines = ["| " + " | ".join(row) + " |" for row in [header, align, *rows]]
    ref = df["label"].iloc[0] if len(df) else ""
    caption = (
        f"Mean ± std over seeds at the compared round. Δ: paired difference against {ref} on "
        "the seeds both runs have, with its 95% t-interval (over splits when seeds share a "
        "split) and the t-test p-value. Bytes and seconds: mean per round over seeds; setup: "
        "key setup and enrolment, once per seed."
    )
    notes = [f"- {n}" for n in _notes(df)]
    return "\n".join([*lines, "", caption, *([""] + notes if notes else [])]) + "\n"


def compare_figure(runs: Sequence[Run], table: pd.DataFrame) -> Figure:
    """The metric per round for every run (mean, ± std band with more than one seed), and
    bytes and seconds per round per run as bars."""
    metric, at = str(table["metric"].iloc[0]), int(table["round"].iloc[0])
    fig, axes = plt.subplots(
        1, 3, figsize=(13.5, 4.0), gridspec_kw={"width_ratios": [1.5, 1.0, 0.8]}
    )
    ax = axes[0]
    for k, run in enumerate(runs):
        stats = run.metrics.groupby("round")[metric].agg(["mean", "std", "count"])
        x = stats.index.to_numpy()
        ax.plot(x, stats["mean"], marker="o", markersize=3, color=f"C{k}", label=run.label)
        spread = (stats["count"] > 1).to_numpy() & np.isfinite(stats["std"].to_numpy())
        if spread.any():
            ax.fill_between(
                x,
                stats["mean"] - stats["std"],
                stats["mean"] + stats["std"],
                where=spread,
                alpha=0.18,
                color=f"C{k}",
                linewidth=0,
            )
    ax.axvline(at, color="gray", linestyle=":", linewidth=1)
    n = table["n_seeds"]
    spread_note = (
        "1 seed" if n.max() <= 1 else "mean ± std over seeds" if n.min() > 1 else "mean (± std)"
    )
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} ({spread_note})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.set_title(f"{metric} per round", fontsize="medium")

    x = np.arange(len(runs))
    colors = [f"C{k}" for k in range(len(runs))]
    ax = axes[1]
    up, down = table["bytes_up"].to_numpy(float), table["bytes_down"].to_numpy(float)
    largest = np.nanmax(np.concatenate([up, down])) if np.isfinite(up).any() else 1.0
    unit, scale = byte_unit(largest)
    width = 0.38
    bars_up = ax.bar(x - width / 2, up / scale, width, color=colors, label="up")
    bars_down = ax.bar(
        x + width / 2, down / scale, width, color=colors, hatch="//", alpha=0.6, label="down"
    )
    for bars in (bars_up, bars_down):
        ax.bar_label(bars, fmt="%.3g", fontsize="x-small", padding=1)
    ax.set_ylabel(f"{unit} per round\n(mean over seeds)")
    _log_if_wide(ax, np.concatenate([up, down]) / scale)
    ax.set_title("bytes per round: up (solid), down (hatched)", fontsize="medium")
    ax.set_xticks(x, [r.label for r in runs], rotation=20, ha="right")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)

    ax = axes[2]
    seconds = table["seconds_round"].to_numpy(float)
    bars = ax.bar(x, seconds, 0.6, color=colors)
    ax.bar_label(bars, fmt="%.3g", fontsize="x-small", padding=1)
    ax.set_ylabel("seconds per round\n(mean over seeds)")
    _log_if_wide(ax, seconds)
    ax.set_title("wall time per round", fontsize="medium")
    ax.set_xticks(x, [r.label for r in runs], rotation=20, ha="right")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)

    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="lower center",
        ncol=min(len(runs), 6),
        frameon=False,
        bbox_to_anchor=(0.5, -0.02),
    )
    fig.suptitle(f"{table['task'].iloc[0]}: {metric} at round {at}")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _log_if_wide(ax, values: np.ndarray) -> None:
    """A log axis when the bars span more than a factor 20 (else the small ones vanish)."""
    v = values[np.isfinite(values) & (values > 0)]
    if v.size and v.max() / v.min() > 20:
        ax.set_yscale("log")
        # bars grow from a power of ten below the smallest, so short bars stay visible
        ax.set_ylim(bottom=10 ** np.floor(np.log10(v.min()) - 0.5))
        ax.set_ylabel(ax.get_ylabel() + ", log scale")


def write_comparison(out: Path, table: pd.DataFrame, runs: Sequence[Run]) -> dict[str, Path]:
    """Write ``compare.csv``, ``compare.png`` and ``compare.md`` to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = {name: out / name for name in ("compare.csv", "compare.png", "compare.md")}
    table.to_csv(files["compare.csv"], index=False)
    fig = compare_figure(runs, table)
    fig.savefig(files["compare.png"], dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    files["compare.md"].write_text(markdown_table(table))
    return files
