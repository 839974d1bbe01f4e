"""Writing a run's results: CSV tables, the audit, the resolved config and a convergence plot."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from clients.tasks import get_task  # noqa: E402
from server.audit import AuditLog  # noqa: E402
from simulation.experiment import ExperimentConfig  # noqa: E402

CURVES = (("test_pooled", "pooled test"), ("test_client_avg", "client-average test"),
          ("train_pooled", "pooled train"))


def traffic_table(audit: AuditLog) -> pd.DataFrame:
    """Bytes per run, round, phase, direction, client, field and kind."""
    rows = pd.DataFrame(audit.traffic())
    if rows.empty:
        return rows
    keys = ["run", "round", "phase", "direction", "peer", "field", "kind"]
    table = rows.groupby(keys, sort=False)["bytes"].agg(["sum", "count"]).reset_index()
    return table.rename(columns={"sum": "bytes", "count": "messages"})


def plot_convergence(summary: pd.DataFrame, path: Path, title: str,
                     metric_name: str = "c-index") -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for col, label in CURVES:
        if f"{col}_mean" not in summary:
            continue
        mean, std = summary[f"{col}_mean"], summary[f"{col}_std"].fillna(0)
        ax.plot(summary["round"], mean, marker="o", label=label)
        ax.fill_between(summary["round"], mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric_name} (mean ± std over seeds)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out: Path, config: ExperimentConfig, metrics: pd.DataFrame,
                  summary: pd.DataFrame, audit: AuditLog) -> None:
    out.mkdir(parents=True, exist_ok=True)
    metrics.to_csv(out / "metrics.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    traffic_table(audit).to_csv(out / "traffic.csv", index=False)
    audit.write(out)
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    plot_convergence(summary, out / "convergence.png",
                     f"{config.protocol} on {config.backend}, {config.task}, "
                     f"{len(config.seeds)} seed(s)", get_task(config.task).metric_name)
