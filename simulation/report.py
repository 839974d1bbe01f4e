"""A run's tables beyond metrics.csv: traffic, the audit summary, the privacy report, and
the figures (``secagg.simulation.figures``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from secagg.clients.tasks import get_task
from secagg.server.audit import AuditLog
from secagg.simulation.config import ExperimentConfig
from secagg.simulation.figures import write_figures


def traffic_table(audit: AuditLog) -> pd.DataFrame:
    """Bytes per run, round, phase, direction, client, field and kind."""
    rows = pd.DataFrame(audit.traffic())
    if rows.empty:
        return rows
    keys = ["run", "round", "phase", "direction", "peer", "field", "kind"]
    table = rows.groupby(keys, sort=False)["bytes"].agg(["sum", "count"]).reset_index()
    return table.rename(columns={"sum": "bytes", "count": "messages"})


ASSUMPTIONS = [
    "clients are honest: they clip and add their noise share before encrypting",
    "client-level epsilon uses the realised noise multiplier of each round's releases, "
    "accounted jointly (sums of the same noised uploads share their noise); on plain the "
    "server reads every noised upload, so epsilon is per upload (multiplier sigma_c); fewer "
    "surviving clients or uneven weights mean less noise",
    "weights chosen from clients' reports (LARC, CostWAgg, Auto-FedRL) are taken as given; "
    "their own dependence on data is covered only if those scalars are noised (--scalar-dp)",
    "DP-SGD on the Cox loss is indicative: the partial likelihood is not a sum over samples",
    "CKKS flooding noise is extra noise and is not counted",
]


def privacy_report(config: ExperimentConfig, metrics: pd.DataFrame, audit: AuditLog) -> dict:
    """ε per mechanism (final round, per seed), the settings, and what DP does not cover."""
    final = (
        metrics[metrics["round"] == config.rounds].set_index("seed")
        if "round" in metrics
        else pd.DataFrame()
    )
    summary = audit.summary()

    def per_seed(col):
        return {int(s): float(v) for s, v in final[col].items()} if col in final else None

    report = {
        "delta": config.dp_delta,
        "noise_source": (
            "seeded from the run's seed: reproducible simulation, predictable noise (not for "
            "deployment)"
            if config.dp_noise == "seeded"
            else "generators seeded from the OS CSPRNG"
        ),
        "assumptions": ASSUMPTIONS,
        "dp_protected_items": summary["dp_protected_items"],
        "not_dp_protected_items": summary["not_dp_protected_items"],
    }
    if config.client_dp:
        report["client_level"] = {
            **config.client_dp,
            "epsilon_per_seed": per_seed("eps_client_level"),
            "accounted_against": (
                "each noised upload (the server reads them on plain)"
                if config.backend == "plain"
                else "the released sums, each round's jointly (they share the uploads' noise)"
            ),
            "epsilon_against_sums_only_per_seed": per_seed("eps_client_level_sums"),
            "last_realised_noise_multiplier_per_seed": per_seed("noise_multiplier_realised"),
        }
    if config.dp_sgd:
        clients = sorted(
            c[len("eps_dp_sgd_") :]
            for c in final.columns
            if c.startswith("eps_dp_sgd_") and c != "eps_dp_sgd_max"
        )

        def per_client(prefix: str) -> dict[int, dict[str, float]]:
            return {
                int(s): {c: float(row[f"{prefix}{c}"]) for c in clients if f"{prefix}{c}" in row}
                for s, (_, row) in zip(final.index, final.iterrows())
            }  # index: the seeds

        report["dp_sgd"] = {
            **config.dp_sgd,
            "epsilon_per_seed_and_client": per_client("eps_dp_sgd_"),
            "noise_multiplier_per_seed_and_client": per_client("dp_sgd_noise_multiplier_"),
            "sample_rate_per_seed_and_client": per_client("dp_sgd_sample_rate_"),
        }
    if config.scalar_dp:
        report["scalars"] = {
            **config.scalar_dp,
            "worst_client_epsilon_per_seed": per_seed("eps_scalars_max"),
        }
    return report


def write_tables(
    out: Path, config: ExperimentConfig, metrics: pd.DataFrame, audit: AuditLog
) -> None:
    """Every table, the audit summary, the privacy report and the figures of the seeds so
    far (``metrics`` and ``audit.jsonl`` themselves are written as the run goes)."""
    from secagg.simulation.experiment import summarize
    from secagg.simulation.outputs import atomic_text, atomic_write

    summary = summarize(metrics)
    traffic = traffic_table(audit)
    atomic_write(out / "summary.csv", lambda tmp: summary.to_csv(tmp, index=False))
    atomic_write(out / "traffic.csv", lambda tmp: traffic.to_csv(tmp, index=False))
    atomic_text(out / "audit_summary.json", json.dumps(audit.summary(), indent=2) + "\n")
    atomic_text(
        out / "privacy.json",
        json.dumps(privacy_report(config, metrics, audit), indent=2) + "\n",
    )
    write_figures(
        out,
        metrics=metrics,
        summary=summary,
        traffic=traffic,
        title=f"{config.protocol} on {config.backend}, {config.task}",
        metric_name=get_task(config.task).metric_name,
    )
