"""Figures of one run folder: convergence, bytes per round and seconds per round.

A run's numbers end up in papers, so each figure says what it averages over and shows
spread only where there is any: a band of ± std appears only with more than one seed, and
the axis label says how many seeds the mean is over ("1 seed" otherwise).

Conventions the tables follow and these figures rely on:

* ``metrics.csv`` round k is the model after k rounds (round 0: the initial model);
  ``traffic.csv`` round k is the traffic that produced it (its ``bytes_up`` and
  ``bytes_down``), and the bytes bar labelled k shows it.
* Set-up (key setup, enrolment, a protocol's initialisation) runs once before the first
  round: ``traffic.csv`` round 0, ``stage`` "setup". It is counted in no round's
  ``bytes_up``/``bytes_down`` and gets its own "setup" bar. (A ``traffic.csv`` without a
  ``stage`` column, from an older version, numbered rounds from 0 with set-up, told by its
  phases, :data:`SETUP_PHASES`, under round 0; it is read that way.) A pre-stage (run label
  ``"<seed>-<stage>"``, e.g. FedDisco's β-VAE) gets one bar with all its traffic. The
  ``observe`` phase is the experimenter's view of the model, not protocol traffic, and is
  left out.
* ``seconds_<phase>`` columns are server time per phase; ``receive`` (decoding replies)
  is part of the exchange phases' own time, so it is not stacked on top of them.
  ``seconds_round`` is the round's wall time, marked separately: the gap above the stack is
  time outside the named phases.

The ``*_figure`` functions build and return a Figure (tests inspect it); the ``plot_*``
functions save it and close it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from secagg.errors import ConfigError  # noqa: E402

#: the task metric's panels (first row of the convergence figure)
METRIC_PANELS = (
    ("test_pooled", "pooled test"),
    ("test_client_avg", "client-average test"),
    ("train_pooled", "pooled train"),
)
#: the loss panels (second row)
LOSS_PANELS = (("train_loss", "train loss"), ("test_loss", "test loss"))


def extra_metric_columns(columns) -> list[str]:
    """The columns of a task's other metrics (``Task.metrics``) among metrics.csv's (or,
    with their ``_mean`` suffix, summary.csv's): ``test_<name>``, then ``train_<name>``."""
    names = [str(c).removesuffix("_mean") for c in columns]
    own = {"pooled", "loss"}
    found = {
        where: [
            n
            for n in names
            if n.startswith(f"{where}_")
            and n.split("_", 1)[1] not in own
            and not n.split("_", 1)[1].startswith("client_")
            and not n.endswith("_std")
        ]
        for where in ("test", "train")
    }
    return list(dict.fromkeys(found["test"] + found["train"]))


#: phases that run once before the first round (key setup, enrolment): how a traffic.csv
#: without a ``stage`` column (older versions) tells set-up from round 1
SETUP_PHASES = frozenset({"key_hello", "key_generate", "key_install", "key_share", "enroll"})
#: traffic that is not the protocol's (the experimenter reading the model)
EXCLUDED_PHASES = frozenset({"observe"})
#: seconds columns nested inside other phases' time (not stacked)
NESTED_SECONDS = frozenset({"receive"})
SETUP = "setup"
DPI = 150

FIGURE_NAMES = ("convergence.png", "bytes.png", "seconds.png")


# ---- pure helpers ------------------------------------------------------------------------
def seed_note(n_min: int, n_max: int | None = None) -> str:
    """What a curve is: ``"1 seed"`` or ``"mean ± std over 3 seeds"`` (a range when seeds
    dropped out, e.g. aborted runs: ``"mean ± std over 2–3 seeds"``)."""
    n_max = n_min if n_max is None else n_max
    if n_max <= 1:
        return "1 seed"
    count = f"{n_min}–{n_max}" if n_min != n_max else f"{n_max}"
    return f"mean ± std over {count} seeds"


def byte_unit(largest: float) -> tuple[str, float]:
    """A readable decimal unit for values up to ``largest`` bytes: (name, divisor)."""
    if largest >= 1e6:
        return "MB", 1e6
    if largest >= 1e3:
        return "kB", 1e3
    return "B", 1.0


def phase_colors(phases: Sequence[str]) -> dict[str, tuple]:
    """One fixed colour per phase, the same in every panel."""
    cmap = plt.get_cmap("tab10" if len(phases) <= 10 else "tab20")
    return {p: cmap(k % cmap.N) for k, p in enumerate(phases)}


def _is_seed_label(label: str) -> bool:
    return label.lstrip("-").isdigit()


def _rounds_of(traffic: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per traffic row: whether it is set-up, and its round in metrics.csv's numbering.
    A table without a ``stage`` column (older versions) numbered rounds from 0, set-up
    (its phases) under round 0."""
    rounds = traffic["round"].astype(int)
    if "stage" in traffic:
        return (traffic["stage"] == SETUP) | (rounds < 1), rounds
    return traffic["phase"].isin(SETUP_PHASES) | (rounds < 0), rounds + 1


def traffic_by_stage(traffic: pd.DataFrame) -> pd.DataFrame:
    """Mean bytes per stage, direction and phase over the runs that reached the stage.

    Stages, in the order they happen: each pre-stage (``"<name> pre-stage"``), ``"setup"``,
    then the rounds ``"1"``, ``"2"``, ... (metrics.csv numbering). A run that reached a stage
    but sent nothing in one of its phases counts as 0 bytes there. Columns: ``stage``,
    ``direction`` ("up" client → server, "down" server → client), ``phase``, ``bytes``,
    ``n_runs``; empty without traffic.
    """
    columns = ["stage", "direction", "phase", "bytes", "n_runs"]
    if traffic is None or traffic.empty:
        return pd.DataFrame(columns=columns)
    t = traffic[~traffic["phase"].isin(EXCLUDED_PHASES)].copy()
    if t.empty:
        return pd.DataFrame(columns=columns)
    t["run"] = t["run"].astype(str)
    seed_run = t["run"].map(_is_seed_label)
    setup, rounds = _rounds_of(t)
    stage = np.where(setup, SETUP, rounds.astype(str))
    pre_name = t["run"].str.split("-", n=1).str[-1] + " pre-stage"
    t["stage"] = np.where(seed_run, stage, pre_name)

    per_run = t.groupby(["stage", "run", "direction", "phase"], sort=False)["bytes"].sum()
    wide = per_run.unstack(["direction", "phase"], fill_value=0)
    n_runs = wide.groupby(level="stage", sort=False).size()
    mean = wide.groupby(level="stage", sort=False).mean()
    stacked = mean.stack(["direction", "phase"], future_stack=True)
    long = pd.DataFrame({"bytes": stacked}).reset_index()
    long["n_runs"] = long["stage"].map(n_runs)

    pre = sorted({s for s in long["stage"] if s.endswith(" pre-stage")})
    numbered = sorted({s for s in long["stage"] if s.isdigit()}, key=int)
    order = pre + ([SETUP] if SETUP in set(long["stage"]) else []) + numbered
    long["stage"] = pd.Categorical(long["stage"], categories=order, ordered=True)
    phases = list(dict.fromkeys(t["phase"]))  # first seen first
    long["phase"] = pd.Categorical(long["phase"], categories=phases, ordered=True)
    long = long.sort_values(["stage", "direction", "phase"]).reset_index(drop=True)
    return long[columns]


def seconds_by_round(metrics: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean seconds per round (rows, rounds ≥ 1) by phase (columns, nested phases left out)
    and the wall time per round: a frame with ``mean``, ``std`` and ``n_seeds``."""
    rounds = metrics[metrics["round"] >= 1]
    phases = [
        c
        for c in rounds.columns
        if c.startswith("seconds_")
        and c != "seconds_round"
        and c[len("seconds_") :] not in NESTED_SECONDS
    ]
    by_round = rounds.groupby("round")
    stacked = by_round[phases].mean().fillna(0.0) if phases else pd.DataFrame()
    stacked.columns = [c[len("seconds_") :] for c in stacked.columns]
    wall = (
        by_round["seconds_round"].agg(["mean", "std", "count"]).rename(columns={"count": "n_seeds"})
        if "seconds_round" in rounds
        else pd.DataFrame(columns=["mean", "std", "n_seeds"])
    )
    return stacked, wall


def _has_rounds(metrics: pd.DataFrame | None) -> bool:
    return metrics is not None and not metrics.empty and bool((metrics["round"] >= 1).any())


def _integer_rounds(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _outside_legend(ax, handles=None, labels=None, *, title: str | None = None) -> None:
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles,
        labels,
        title=title,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
        fontsize="small",
    )


# ---- figures ------------------------------------------------------------------------------
def convergence_figure(summary: pd.DataFrame, *, title: str, metric_name: str) -> Figure:
    """One panel per curve in summary.csv: the task metric (pooled test, client-average
    test, pooled train) in the first row, the losses in the second.

    ``summary``: summary.csv of one run (``round``, ``n_seeds``, ``<col>_mean``,
    ``<col>_std``). ``title``: the figure's title. ``metric_name``: the task's metric
    (e.g. ``"c_index"``), the first row's axis label. A band of ± std is drawn only where a
    round has more than one seed.
    """
    others = tuple((c, c.replace("_", " ", 1)) for c in extra_metric_columns(summary.columns))
    rows = [
        [(col, label) for col, label in panels if f"{col}_mean" in summary]
        for panels in (METRIC_PANELS, LOSS_PANELS, others)
    ]
    ylabels = [metric_name, "loss", "other metrics"]
    kept = [(panels, y) for panels, y in zip(rows, ylabels) if panels]
    if not kept:
        wanted = [c for c, _ in METRIC_PANELS + LOSS_PANELS]
        raise ConfigError(
            f"summary has none of the curves {wanted} (as <col>_mean); pass a run's summary.csv"
        )
    summary = summary.sort_values("round")
    n = summary["n_seeds"] if "n_seeds" in summary else pd.Series(1, index=summary.index)
    note = seed_note(int(n.min()), int(n.max()))
    ncols = max(len(panels) for panels, _ in kept)
    fig, axes = plt.subplots(
        len(kept), ncols, figsize=(3.4 * ncols, 2.9 * len(kept)), squeeze=False
    )
    x = summary["round"].to_numpy()
    for r, (panels, ylabel) in enumerate(kept):
        for c in range(ncols):
            ax = axes[r, c]
            if c >= len(panels):
                ax.remove()
                continue
            col, label = panels[c]
            mean = summary[f"{col}_mean"].to_numpy(dtype=float)
            std_col = f"{col}_std"
            std = summary[std_col].to_numpy(dtype=float) if std_col in summary else None
            ax.plot(x, mean, marker="o", markersize=3.5, color=f"C{c}")
            if std is not None:
                spread = (n.to_numpy() > 1) & np.isfinite(std)
                if spread.any():
                    ax.fill_between(
                        x,
                        mean - std,
                        mean + std,
                        where=spread,
                        alpha=0.2,
                        color=f"C{c}",
                        linewidth=0,
                    )
            ax.set_title(label, fontsize="medium")
            ax.set_xlabel("round")
            if c == 0:
                ax.set_ylabel(f"{ylabel}\n({note})")
            elif r < 2:  # one metric or the loss per row; the other metrics differ in scale
                ax.sharey(axes[r, 0])
                ax.tick_params(labelleft=False)
            _integer_rounds(ax)
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def bytes_figure(traffic: pd.DataFrame, *, title: str) -> Figure:
    """Bytes per round, stacked by phase: client → server in the top panel, server →
    client in the bottom one, each bar the mean over the runs (seeds) that reached it.

    ``traffic``: traffic.csv of one run. ``title``: the figure's title. Setup traffic and
    pre-stages have their own bars (see the module docstring).
    """
    table = traffic_by_stage(traffic)
    if table.empty:
        raise ConfigError("no traffic to plot: traffic.csv is empty (an aborted run?)")
    stages = list(table["stage"].cat.categories)
    phases = [
        p for p in table["phase"].cat.categories if table.loc[table.phase == p, "bytes"].any()
    ]
    colors = phase_colors(phases)
    totals = table.groupby(["stage", "direction"], observed=True)["bytes"].sum()
    unit, scale = byte_unit(float(totals.max()))
    main = table[table["stage"].isin([s for s in stages if not s.endswith(" pre-stage")])]
    n_runs = int(main["n_runs"].max()) if not main.empty else int(table["n_runs"].max())
    pre_rounds = _pre_stage_rounds(traffic)

    fig, axes = plt.subplots(
        2, 1, figsize=(min(12.0, max(6.0, 1.2 + 0.45 * len(stages))), 5.6), sharex=True
    )
    x = np.arange(len(stages))
    for ax, direction, label in zip(
        axes, ("up", "down"), ("up (client → server)", "down (server → client)")
    ):
        part = table[table["direction"] == direction]
        wide = (
            part.pivot_table(
                index="stage", columns="phase", values="bytes", aggfunc="sum", observed=False
            )
            .reindex(index=stages, columns=phases)
            .fillna(0.0)
        )
        bottom = np.zeros(len(stages))
        for phase in phases:
            values = wide[phase].to_numpy() / scale
            if not values.any():
                continue
            ax.bar(x, values, bottom=bottom, color=colors[phase], label=phase, width=0.7)
            bottom += values
        ax.set_title(label, fontsize="medium", loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[p]) for p in phases]
    _outside_legend(axes[0], handles, phases, title="phase")
    axes[1].set_xticks(x, _stage_ticks(stages, pre_rounds))
    axes[1].set_xlabel("round")
    runs = "1 seed" if n_runs == 1 else f"mean over {n_runs} seeds"
    for ax in axes:
        ax.set_ylabel(f"{unit}\n({runs})")
    fig.suptitle(f"{title}\nbytes per round")
    fig.tight_layout()
    return fig


def _pre_stage_rounds(traffic: pd.DataFrame) -> dict[str, int]:
    """How many rounds each pre-stage ran (the most any of its runs did)."""
    runs = traffic["run"].astype(str)
    setup, numbers = _rounds_of(traffic)
    keep = ~runs.map(_is_seed_label) & ~setup
    pre, numbers = traffic[keep], numbers[keep]
    if pre.empty:
        return {}
    name = pre["run"].astype(str).str.split("-", n=1).str[-1] + " pre-stage"
    rounds = numbers.groupby([name, pre["run"].astype(str)]).nunique()
    return {str(k): int(v) for k, v in rounds.groupby(level=0).max().items()}


def _stage_ticks(stages: Sequence[str], pre_rounds: dict[str, int]) -> list[str]:
    """Tick labels: every round up to 20 rounds, then every k-th (and the first and last);
    setup happens once, a pre-stage bar totals its rounds."""
    rounds = [s for s in stages if s.isdigit()]
    step = max(1, int(np.ceil(len(rounds) / 20)))
    last = rounds[-1] if rounds else None
    labels = []
    for s in stages:
        if s == SETUP:
            labels.append("setup\n(once)")
        elif not s.isdigit():
            n = pre_rounds.get(s, 0)
            labels.append(s.replace(" pre-stage", f"\npre-stage\n(all {n} rounds)"))
        else:
            labels.append(s if int(s) == 1 or int(s) % step == 0 or s == last else "")
    return labels


def seconds_figure(metrics: pd.DataFrame, *, title: str) -> Figure:
    """Server seconds per round stacked by phase (mean over seeds), with the round's wall
    time (``seconds_round``, ± std over seeds when there are several) marked on top.

    ``metrics``: metrics.csv of one run. ``title``: the figure's title.
    """
    if not _has_rounds(metrics):
        raise ConfigError("no round beyond 0 in metrics.csv: nothing to time (an aborted run?)")
    stacked, wall = seconds_by_round(metrics)
    if stacked.empty and wall.empty:
        raise ConfigError("metrics.csv has no seconds_* columns to plot")
    rounds = (stacked.index if not stacked.empty else wall.index).to_numpy()
    colors = phase_colors(list(stacked.columns))
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 2.0 + 0.35 * len(rounds))), 3.8))
    bottom = np.zeros(len(rounds))
    for phase in stacked.columns:
        values = stacked[phase].to_numpy()
        ax.bar(rounds, values, bottom=bottom, color=colors[phase], label=phase, width=0.7)
        bottom += values
    n_seeds = int(wall["n_seeds"].max()) if not wall.empty else metrics["seed"].nunique()
    if not wall.empty:
        mean, std = wall["mean"].to_numpy(), wall["std"].fillna(0.0).to_numpy()
        # no negative seconds: the lower whisker stops at 0
        spread = np.vstack([np.minimum(std, mean), std]) if n_seeds > 1 else None
        ax.errorbar(
            wall.index.to_numpy(),
            mean,
            yerr=spread,
            fmt="o",
            color="black",
            markersize=4,
            capsize=3,
            label="round wall time (± std)" if n_seeds > 1 else "round wall time",
            zorder=3,
        )
    ax.set_xlabel("round")
    runs = "1 seed" if n_seeds == 1 else f"mean over {n_seeds} seeds"
    ax.set_ylabel(f"seconds per round\n({runs})")
    _integer_rounds(ax)
    ax.set_xlim(rounds.min() - 0.6, rounds.max() + 0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    _outside_legend(ax, title="server phase")
    nested = sorted(p for p in NESTED_SECONDS if f"seconds_{p}" in metrics)
    if nested:
        ax.annotate(
            f"{', '.join(nested)}: inside the exchange\nphases' time, not stacked",
            xy=(1.03, 0.0),
            xycoords="axes fraction",
            fontsize="x-small",
            color="dimgray",
            va="bottom",
        )
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    return fig


# ---- files --------------------------------------------------------------------------------
def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def plot_convergence(summary: pd.DataFrame, path: Path, *, title: str, metric_name: str) -> None:
    """Write :func:`convergence_figure` to ``path`` (PNG)."""
    _save(convergence_figure(summary, title=title, metric_name=metric_name), Path(path))


def plot_bytes(traffic: pd.DataFrame, path: Path, *, title: str) -> None:
    """Write :func:`bytes_figure` to ``path`` (PNG)."""
    _save(bytes_figure(traffic, title=title), Path(path))


def plot_seconds(metrics: pd.DataFrame, path: Path, *, title: str) -> None:
    """Write :func:`seconds_figure` to ``path`` (PNG)."""
    _save(seconds_figure(metrics, title=title), Path(path))


def write_figures(
    out_dir: Path,
    *,
    metrics: pd.DataFrame,
    summary: pd.DataFrame,
    traffic: pd.DataFrame | None,
    title: str,
    metric_name: str,
) -> dict[str, Path]:
    """Write the run's figures to ``out_dir`` and return them by file name.

    ``metrics``, ``summary``, ``traffic``: the run's tables (metrics.csv, summary.csv,
    traffic.csv; ``traffic`` may be None or empty). ``title``: the figures' title.
    ``metric_name``: the task's metric. ``convergence.png`` is written whenever a model was
    evaluated (round 0 at least); ``bytes.png`` and ``seconds.png`` only when some round
    beyond 0 ran (and, for bytes, there is traffic). A skipped figure's file left from an
    earlier run in ``out_dir`` is removed so the folder does not show another run's numbers.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    curves = [f"{c}_mean" for c, _ in METRIC_PANELS + LOSS_PANELS]
    if summary is not None and not summary.empty and any(c in summary for c in curves):
        path = out_dir / "convergence.png"
        plot_convergence(summary, path, title=title, metric_name=metric_name)
        files[path.name] = path
    traffic = traffic if traffic is not None else pd.DataFrame()
    ran = _has_rounds(metrics)
    if ran and not traffic_by_stage(traffic).empty:
        path = out_dir / "bytes.png"
        plot_bytes(traffic, path, title=title)
        files[path.name] = path
    if ran and any(c.startswith("seconds_") for c in metrics.columns):
        path = out_dir / "seconds.png"
        plot_seconds(metrics, path, title=title)
        files[path.name] = path
    for name in FIGURE_NAMES:
        if name not in files:
            (out_dir / name).unlink(missing_ok=True)
    return files
