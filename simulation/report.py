"""A run's tables beyond metrics.csv: traffic, the audit summary, the privacy report, and
the figures (``secagg.simulation.figures``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from secagg.backends import backend_spec
from secagg.clients.tasks import get_task
from secagg.protocols import make_protocol
from secagg.runspec.config import ExperimentConfig
from secagg.server.audit import AuditLog
from secagg.simulation.figures import write_figures
from secagg.simulation.privacy import (
    client_level_epsilon,
    composed_epsilon,
    scalar_epsilons,
    scalar_release_counts,
)


def traffic_table(audit: AuditLog) -> pd.DataFrame:
    """Bytes per run, round, stage, phase, direction, client, field and kind.

    Rounds are metrics.csv's: round k (≥ 1) is the traffic of training round k, the one
    metrics.csv's ``bytes_up``/``bytes_down`` of round k count (less the ``observe`` phase,
    the experimenter reading a server-blind model); round 0 is the set-up before the first
    round (``stage`` "setup": key setup, enrolment, a protocol's initialisation), counted in
    no metrics row. A pre-stage run (``"<seed>-<stage>"``) numbers its own rounds the same
    way."""
    rows = pd.DataFrame(audit.traffic())
    if rows.empty:
        return rows
    keys = ["run", "round", "stage", "phase", "direction", "peer", "field", "kind"]
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


PER_SEED = "each seed alone; seeds on the same data compose (see epsilon_composed_over_seeds)"


def privacy_report(config: ExperimentConfig, metrics: pd.DataFrame, audit: AuditLog) -> dict:
    """ε per mechanism: composed over every seed of the run (they all train on the same
    clients' data, so their privacy losses add up) and, labelled so, per seed (final round);
    the settings, and what DP does not cover."""
    final = (
        metrics[metrics["round"] == config.rounds].set_index("seed")
        if "round" in metrics
        else pd.DataFrame()
    )
    summary = audit.summary()
    seeds = seeds_on_the_same_data(config, metrics)

    def per_seed(col):
        return {int(s): float(v) for s, v in final[col].items()} if col in final else None

    private = bool(config.client_dp or config.dp_sgd or config.scalar_dp)
    report = {
        # without DP there is no δ and no noise to speak of
        "delta": config.dp_delta if private else None,
        "noise_source": (
            None
            if not private
            else "seeded from the run's seed: a reproducible simulation only; INSECURE, "
            "whoever knows the seed can predict each client's noise and remove it"
            if config.dp_noise == "seeded"
            else "generators seeded from the OS CSPRNG"
        ),
        "seeds_composed": None
        if not private
        else {
            "seeds": seeds,
            "why": (
                "every seed trains on the same clients' data (with client_split each seed "
                "trains on a random share of each client's samples, so the seeds' training "
                "sets overlap and a client, or a sample, can be in all of them): their "
                "privacy losses add up. epsilon_composed_over_seeds adds the RDP curves of "
                "every mechanism of these seeds (Opacus' RDP accountant) and is the run's "
                "guarantee; the *_per_seed figures are each seed alone"
            ),
        },
        "assumptions": ASSUMPTIONS,
        "dp_protected_items": summary["dp_protected_items"],
        "not_dp_protected_items": summary["not_dp_protected_items"],
    }
    if config.client_dp:
        report["client_level"] = {
            **config.client_dp,
            "epsilon_composed_over_seeds": client_level_composed(
                metrics, seeds, "noise_multiplier_realised", config.dp_delta
            ),
            "epsilon_against_sums_only_composed_over_seeds": client_level_composed(
                metrics, seeds, "noise_multiplier_realised_sums", config.dp_delta
            ),
            "per_seed_figures": PER_SEED,
            "epsilon_per_seed": per_seed("eps_client_level"),
            "accounted_against": (
                "each noised upload (the server reads them on plain)"
                if backend_spec(config.backend).server_reads_uploads
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

        histories, not_composed = dp_sgd_histories(metrics, seeds)
        composed = {c: composed_epsilon(h.values(), config.dp_delta) for c, h in histories.items()}
        report["dp_sgd"] = {
            **config.dp_sgd,
            # a worst client over some clients only could be below the worst: none then
            "worst_client_epsilon_composed_over_seeds": (
                None if not_composed else max(composed.values(), default=None)
            ),
            "epsilon_composed_over_seeds_per_client": composed,
            "composed_from": DP_SGD_COMPOSED_FROM,
            "steps_per_seed_and_client": {
                s: {c: h[s][2] for c, h in histories.items() if s in h} for s in seeds
            },
            "not_composed": not_composed,
            "per_seed_figures": PER_SEED,
            "worst_client_epsilon_per_seed": per_seed("eps_dp_sgd_max"),
            "epsilon_per_seed_and_client": per_client("eps_dp_sgd_"),
            "noise_multiplier_per_seed_and_client": per_client("dp_sgd_noise_multiplier_"),
            "sample_rate_per_seed_and_client": per_client("dp_sgd_sample_rate_"),
        }
    if config.scalar_dp:
        names = audit.dp_protected & set(
            make_protocol(config.protocol, **config.protocol_options).capabilities.client_scalars
        )
        sigma = config.scalar_dp["noise"]
        each = {s: scalar_release_counts(audit.records, str(s), names) for s in seeds}
        counts: Counter = sum(each.values(), Counter())
        composed = scalar_epsilons(counts, sigma, config.dp_delta)
        report["scalars"] = {
            **config.scalar_dp,
            "worst_client_epsilon_composed_over_seeds": max(composed.values(), default=0.0),
            "epsilon_composed_over_seeds_per_client": dict(sorted(composed.items())),
            "per_seed_figures": PER_SEED,
            "worst_client_epsilon_per_seed": per_seed("eps_scalars_max"),
            "epsilon_per_seed_and_client": {
                s: dict(sorted(scalar_epsilons(c, sigma, config.dp_delta).items()))
                for s, c in each.items()
            },
        }
    return report


def seeds_on_the_same_data(config: ExperimentConfig, metrics: pd.DataFrame) -> list[int]:
    """The seeds whose privacy losses compose: every seed that trained so far (aborted ones
    too: what they released counts). With or without ``client_split`` they all train on the
    same clients' samples (a split only holds out a share of each client's samples for
    testing), so none of them is on other data."""
    if "round" not in metrics:
        return []
    trained = set(metrics.loc[metrics["round"] > 0, "seed"].astype(int))
    return [s for s in config.seeds if s in trained]


def client_level_composed(
    metrics: pd.DataFrame, seeds: list[int], column: str, delta: float
) -> float | None:
    """Client-level ε of every round of ``seeds`` together: each round is one Gaussian
    mechanism with the realised multiplier in ``column`` (one privacy event per round)."""
    if column not in metrics:
        return None
    rows = metrics[metrics["seed"].isin(seeds) & (metrics["round"] > 0)]
    events = [{"noise_multiplier": float(z)} for z in rows[column] if not math.isnan(z)]
    return client_level_epsilon(events, delta)


DP_SGD_COMPOSED_FROM = (
    "each client's counted steps (dp_sgd_steps: what its Opacus accountant counted, one "
    "(noise multiplier, sampling rate, steps) entry per seed, the last it reported there), "
    "their RDP curves added: what one accountant fed every seed's steps gives"
)


def dp_sgd_histories(
    metrics: pd.DataFrame, seeds: list[int]
) -> tuple[dict[str, dict[int, tuple[float, float, int]]], dict[str, str]]:
    """Each client's DP-SGD accountant history over ``seeds``, by seed: the (noise
    multiplier, sampling rate, steps) of its last report in each seed where it reported,
    with the steps its accountant counted (``dp_sgd_steps``; a client's z and q never change,
    so this one entry is its accountant's whole history in that seed). A client that
    reported ε in a seed but no counted steps (metrics written before clients reported
    them) gets no history: it is in the second dict, with why; its ε over seeds is not
    composed."""
    prefix = "eps_dp_sgd_"
    clients = sorted(
        c[len(prefix) :] for c in metrics.columns if c.startswith(prefix) and c != "eps_dp_sgd_max"
    )
    histories: dict[str, dict[int, tuple[float, float, int]]] = {}
    missing: dict[str, str] = {}
    for c in clients:
        cols = [f"dp_sgd_noise_multiplier_{c}", f"dp_sgd_sample_rate_{c}", f"dp_sgd_steps_{c}"]
        history: dict[int, tuple[float, float, int]] = {}
        for s in seeds:
            rows = metrics[(metrics["seed"] == s) & (metrics["round"] > 0)]
            rows = rows[rows[f"{prefix}{c}"].notna()]
            if rows.empty:  # no upload of its was taken in this seed: no report either
                continue
            last = rows.iloc[-1]
            if not all(col in last.index and pd.notna(last[col]) for col in cols):
                missing[c] = (
                    f"seed {s}: the client's reports carry no counted steps (dp_sgd_steps; "
                    "metrics written before clients reported them)"
                )
                break
            z, q, steps = (float(last[col]) for col in cols)
            history[s] = (z, q, int(steps))
        else:
            histories[c] = history
    return histories, missing


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
