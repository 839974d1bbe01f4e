"""Auto-FedRL on a Dirichlet(0.5) split of digits over 8 clients, like the paper's Tables 1–2.

Paper (CIFAR-10, VGG-9, 100 rounds): FedAvg 88.43, FedProx 89.45, Auto-FedRL DS 90.70,
CS 90.85, MLP 91.27 % accuracy; the search takes 42.8 GB / 8.2 s (DS), 3.0 GB / 0.012 s
(CS), 3.1 GB / 0.019 s (MLP). Here: scikit-learn digits (``digits-dir8``), MLP 64-64-10,
20 % of each client's samples held out for validation (every method trains on the same 80 %),
batch 32. FedAvg and FedProx use the centre of Auto-FedRL's search ranges — the paper's
"initial" hyperparameters — so the comparison is the one the paper makes: a fixed starting
point against the agent that moves from it. "FedAvg (tuned)" adds what the paper does not:
the best fixed (client lr, local steps) of a small grid, chosen on separate tuning seeds by
the clients' mean validation loss of the final model — the quantity Auto-FedRL's reward is
built from, no test data. FedProx's μ is chosen the same way from {0.01, 0.1, 1}.

    python -m benchmarks.autofedrl_digits --seeds 0-19 --rounds 50 \
        --methods fedavg,fedprox,fedavg-tuned,ds,cs,mlp --out benchmarks/results --overwrite

Writes autofedrl_digits_runs.csv (per seed), autofedrl_digits_rounds.csv (per round),
autofedrl_digits_tuning.csv, autofedrl_agent_cost.csv, autofedrl_digits.md (tables) and
autofedrl_digits.png (accuracy curves and the CS agent's choices) to ``--out`` (default: a
new folder under results/bench). ``--methods`` runs a part (the differences need fedavg, the
reference; the tuning grid runs only for fedprox and fedavg-tuned); ``--no-agent-cost`` leaves out
Table 2's measurement of the agents alone.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from benchmarks.corrections import holm  # noqa: E402
from benchmarks.options import output_folder, positive, seed_list  # noqa: E402
from benchmarks.reproduce import Check, made_by, shown_path  # noqa: E402
from benchmarks.stats import (  # noqa: E402
    format_difference,
    mean_std,
    paired_difference,
    run_complete,
)
from secagg.clients.tasks import TASKS, get_task, register_task  # noqa: E402
from secagg.clients.training import set_flat_params  # noqa: E402
from secagg.protocols.autofedrl import AutoFedRL  # noqa: E402
from secagg.protocols.hpo_agents import ContinuousAgent, DiscreteAgent, MLPAgent  # noqa: E402
from secagg.simulation.experiment import (  # noqa: E402
    ExperimentConfig,
    hold_out_validation,
    stderr_progress,
)

HERE = Path(__file__).parent
CENTRE_LR, CENTRE_STEPS = (5e-4 + 5e-2) / 2, 21  # centres of the default search ranges
VALIDATION_SHARE = 0.2
BASE = ExperimentConfig(
    task="digits-dir8",
    batch_size=32,
    validation_split=VALIDATION_SHARE,
    client_lr=str(CENTRE_LR),
    local_steps=CENTRE_STEPS,
)
#: the baselines' task: digits-dir8's clients without their validation fifth, the samples
#: autofedrl's validation_split leaves it (a protocol that uses no validation set may not
#: name a validation_split, so the baselines get the same 80 % as their data)
TRAINING_PART = "digits-dir8-training-part"


def training_part():
    """digits-dir8 with each client's validation share held out (the same fixed split the
    engine makes for ``validation_split``)."""
    return hold_out_validation(get_task("digits-dir8").load(), VALIDATION_SHARE)[0]


def register_training_part() -> None:
    """Register the baselines' task, unless it is registered (at import, and again by every
    baseline: a registry restored since the import, as between tests, no longer holds it)."""
    if TRAINING_PART not in TASKS:
        register_task(
            TRAINING_PART,
            replace(
                get_task("digits-dir8"),
                name=TRAINING_PART,
                description="digits-dir8, each client's training samples less its validation fifth",
                load=training_part,
            ),
        )


register_training_part()


def baseline(**settings) -> ExperimentConfig:
    """FedAvg (or FedProx) on the 80 % the agents train on."""
    register_training_part()
    return replace(BASE, protocol="fedavg", task=TRAINING_PART, validation_split=None, **settings)


FEDPROX_MUS = [0.01, 0.1, 1.0]
TUNING_SEEDS = [100, 101, 102]
TUNING_GRID = {"client_lr": [0.025, 0.05, 0.1, 0.2], "local_steps": [21, 40, 80]}
#: ``--methods`` names
METHODS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedavg-tuned": "FedAvg (tuned)",
    "ds": "Auto-FedRL(DS)",
    "cs": "Auto-FedRL(CS)",
    "mlp": "Auto-FedRL(MLP)",
}
OUTPUTS = (
    "autofedrl_digits_runs.csv",
    "autofedrl_digits_rounds.csv",
    "autofedrl_digits_tuning.csv",
    "autofedrl_agent_cost.csv",
    "autofedrl_digits.md",
    "autofedrl_digits.png",
)
#: ``secagg bench autofedrl_digits --check``: seed 0, all 50 rounds, FedAvg at the starting
#: point and the CS and MLP agents (no tuning grid, no agent-cost measurement)
CHECK = Check(
    args=("--seeds", "0", "--methods", "fedavg,cs,mlp", "--no-agent-cost"),
    csv="autofedrl_digits_runs.csv",
    keys=("method", "seed"),
    columns={"final_acc": 1e-9, "avg_acc_last5": 1e-9, "final_test_loss": 1e-6},
    why="plain float64 aggregation of torch CPU training with fixed seeds (the agents draw "
    "from seeded generators): two runs of this subset gave bit-for-bit equal metrics, so "
    "1e-9 on the accuracies; the test loss is a float32 mean, and the committed FedAvg and "
    "MLP-agent losses were scored by older code (up to 1.2e-7 off, the last float32 digits), so "
    "1e-6 on it",
)


def methods(tuned: dict, mu: float) -> dict[str, ExperimentConfig]:
    return {
        "FedAvg": baseline(),
        "FedProx": baseline(fedprox_mu=mu),
        "FedAvg (tuned)": baseline(
            client_lr=str(tuned["client_lr"]),
            local_steps=tuned["local_steps"],
        ),
        **{
            f"Auto-FedRL({a.upper()})": replace(
                BASE, protocol="autofedrl", protocol_options={"agent": a}
            )
            for a in ("ds", "cs", "mlp")
        },
    }


def validation_loss(cfg: ExperimentConfig) -> float:
    """Mean over tuning seeds of the clients' mean validation loss of the final model."""
    task = get_task(cfg.task)
    _, validation = hold_out_validation(get_task(BASE.task).load(), VALIDATION_SHARE)
    model = task.make_model()
    losses = []
    for params in run_complete(cfg).final_params.values():
        set_flat_params(model, params)
        with torch.no_grad():
            losses.append(np.mean([float(task.loss(model(v.x), v.y)) for v in validation]))
    return float(np.mean(losses))


def tune(rounds: int) -> tuple[dict, float, pd.DataFrame]:
    rows = []
    for lr, steps in itertools.product(*TUNING_GRID.values()):
        cfg = baseline(
            client_lr=str(lr),
            local_steps=steps,
            rounds=rounds,
            seeds=TUNING_SEEDS,
        )
        rows.append(
            {
                "method": "FedAvg",
                "client_lr": lr,
                "local_steps": steps,
                "fedprox_mu": 0.0,
                "val_loss": validation_loss(cfg),
            }
        )
        stderr_progress(f"tuning: {rows[-1]}")
    for mu in FEDPROX_MUS:
        cfg = baseline(fedprox_mu=mu, rounds=rounds, seeds=TUNING_SEEDS)
        rows.append(
            {
                "method": "FedProx",
                "client_lr": CENTRE_LR,
                "local_steps": CENTRE_STEPS,
                "fedprox_mu": mu,
                "val_loss": validation_loss(cfg),
            }
        )
        stderr_progress(f"tuning: {rows[-1]}")
    grid = pd.DataFrame(rows)
    fedavg = grid[grid["method"] == "FedAvg"]
    best = fedavg.loc[fedavg["val_loss"].idxmin()]
    prox = grid[grid["method"] == "FedProx"]
    mu = float(prox.loc[prox["val_loss"].idxmin(), "fedprox_mu"])
    return (
        {"client_lr": float(best["client_lr"]), "local_steps": int(best["local_steps"])},
        mu,
        grid,
    )


def agent_cost(kind: str, dim: int, points: int = 3, steps: int = 20) -> dict:
    """Table 2: the agent's time per round (sample + update) and its peak memory."""
    agents = {
        "cs": lambda: ContinuousAgent(dim, init_sigma=0.66),
        "mlp": lambda: MLPAgent(dim, init_sigma=0.66),
        "ds": lambda: DiscreteAgent(dim, points=points, init_sigma=0.66),
    }
    tracemalloc.start()
    start = time.perf_counter()
    agent = agents[kind]()
    rng = np.random.default_rng(0)
    for _ in range(steps):
        agent.sample()
        agent.step(float(rng.normal(0, 0.01)))
    seconds = (time.perf_counter() - start) / steps
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    name = {
        "cs": "Continuous (CS)",
        "mlp": "Continuous MLP",
        "ds": f"Discrete (DS), {points} points per dim",
    }[kind]
    return {
        "search space": name,
        "dimensions": dim,
        "grid points": points**dim if kind == "ds" else None,
        "peak memory (MB)": peak / 2**20,
        "time per round (ms)": seconds * 1e3,
    }


def per_seed(metrics: pd.DataFrame, last: int = 5) -> pd.DataFrame:
    rows = []
    for seed, g in metrics[metrics["round"] > 0].groupby("seed"):
        g = g.sort_values("round")
        rows.append(
            {
                "seed": seed,
                "final_acc": g["test_pooled"].iloc[-1],
                "avg_acc_last5": g["test_pooled"].tail(last).mean(),
                "final_test_loss": g["test_loss"].iloc[-1],
            }
        )
    return pd.DataFrame(rows)


def plot(rounds_df: pd.DataFrame, path: Path) -> None:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for method, g in rounds_df.groupby("method", sort=False):
        curve = g.groupby("round")["test_pooled"]
        mean, std = curve.mean(), curve.std()
        ax.plot(mean.index, mean, label=method)
        ax.fill_between(mean.index, mean - std, mean + std, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("pooled test accuracy")
    ax.set_title("digits, Dirichlet(0.5), 8 clients (mean ± std over seeds)")
    ax.legend(fontsize=8)
    cs = rounds_df[(rounds_df["method"] == "Auto-FedRL(CS)") & (rounds_df["round"] > 0)]
    by_round = cs.groupby("round")
    for col, label, scale in (
        ("client_lr", "client lr / 0.05", 0.05),
        ("local_steps", "local steps / 40", 40),
        ("server_lr", "server lr / 1.5", 1.5),
    ):
        if not cs.empty:  # the CS agent ran
            bx.plot(by_round[col].mean().index, by_round[col].mean() / scale, label=label)
    bx.set_xlabel("round")
    bx.set_ylabel("chosen value / top of range (mean over seeds)")
    bx.set_title("Auto-FedRL(CS): the agent's choices")
    bx.set_ylim(0, 1.05)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def command(args: argparse.Namespace, out: Path) -> str:
    """The command that makes these results again (every option spelled out)."""
    folder = shown_path(out)
    argv = ["--seeds", args.seeds, "--rounds", str(args.rounds), "--methods", args.methods]
    argv += ["--no-agent-cost"] if args.no_agent_cost else []
    return shlex.join(["python", "-m", "benchmarks.autofedrl_digits", *argv, "--out", folder]) + (
        " --overwrite" if args.overwrite else ""
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-19", help="e.g. 0-19 or 0,1")
    parser.add_argument("--rounds", type=positive, default=50)
    parser.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated, of {list(METHODS)}"
    )
    parser.add_argument(
        "--no-agent-cost", action="store_true", help="leave out Table 2 (the agents alone)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    seeds = seed_list(parser, args.seeds)
    chosen = set(args.methods.split(","))
    if unknown := sorted(chosen - set(METHODS)):
        parser.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    out = output_folder(parser, args.out, "autofedrl_digits", OUTPUTS, args.overwrite)

    if chosen & {"fedprox", "fedavg-tuned"}:
        tuned, mu, grid = tune(args.rounds)
        print(
            f"tuning grid (seeds {TUNING_SEEDS}):\n{grid.to_string(index=False)}\n"
            f"chosen: FedAvg {tuned}, FedProx mu {mu}",
            flush=True,
        )
    else:  # nothing needs the grid: FedAvg and the agents start from the centre
        tuned, mu, grid = None, None, pd.DataFrame(columns=["method", "val_loss"])
    grid.to_csv(out / "autofedrl_digits_tuning.csv", index=False)
    runs, curves = [], []
    wanted = [METHODS[m] for m in METHODS if m in chosen]
    configs = methods(tuned or {"client_lr": CENTRE_LR, "local_steps": CENTRE_STEPS}, mu or 0.0)
    for method in wanted:
        cfg = replace(configs[method], rounds=args.rounds, seeds=seeds)
        stderr_progress(f"== {method}")
        metrics = run_complete(cfg).metrics.assign(method=method)
        curves.append(metrics)
        runs.append(per_seed(metrics).assign(method=method))
        last = metrics[metrics["round"] == args.rounds]
        stderr_progress(f"   final accuracy {mean_std(last['test_pooled'])}")
    runs_df = pd.concat(runs, ignore_index=True)
    rounds_df = pd.concat(curves, ignore_index=True)
    runs_df.to_csv(out / "autofedrl_digits_runs.csv", index=False)
    rounds_df.to_csv(out / "autofedrl_digits_rounds.csv", index=False)

    base = runs_df[runs_df["method"] == "FedAvg"].sort_values("seed")
    lines = [
        "| method | final accuracy | avg accuracy (last 5) | Δ avg vs FedAvg (95% CI) | "
        "p | Holm p | wins/losses |",
        "|---|---|---|---|---|---|---|",
    ]
    groups = [(m, g.sort_values("seed")) for m, g in runs_df.groupby("method", sort=False)]
    diffs = {
        method: paired_difference(g["avg_acc_last5"], base["avg_acc_last5"])
        for method, g in groups
        if method != "FedAvg" and not base.empty
    }
    # the table's family: every method against FedAvg
    adjusted = dict(zip(diffs, holm([d["p_ttest"] for d in diffs.values()])))
    for method, g in groups:
        cells = ["—"] * 4
        if (d := diffs.get(method)) is not None:
            cells = [
                format_difference(d),
                f"{d['p_ttest']:.2g}",
                f"{adjusted[method]:.2g}",
                f"{d['wins']}/{d['losses']}",
            ]
        lines.append(
            f"| {method} | {mean_std(g['final_acc'])} | "
            f"{mean_std(g['avg_acc_last5'])} | {' | '.join(cells)} |"
        )
    table1 = "\n".join(lines)

    dim = AutoFedRL()._n_dims(8)
    in_run_text = ""
    if "agent_seconds" in rounds_df:  # an agent ran
        last = rounds_df[rounds_df["round"] == args.rounds]
        in_run = last.groupby("method")["agent_seconds"].mean() / args.rounds * 1e3
        in_run_text = "Agent time inside the benchmark runs, per round: " + ", ".join(
            f"{m} {v:.3f} ms" for m, v in in_run.dropna().items()
        )
        in_run_text += "."
    if args.no_agent_cost:
        cost = pd.DataFrame()
        table2 = f"Not measured in this run (`--no-agent-cost`). {in_run_text}"
    else:
        cost = pd.DataFrame(
            [
                agent_cost("ds", dim, 3, steps=5),
                agent_cost("ds", dim, 4, steps=5),
                agent_cost("cs", dim),
                agent_cost("mlp", dim),
            ]
        )
        lines = [
            "| search space | dims | grid points | peak memory (MB) | time per round (ms) |",
            "|---|---|---|---|---|",
        ]
        for r in cost.itertuples(False):
            pts = "—" if pd.isna(r[2]) else f"{int(r[2]):,}"
            lines.append(f"| {r[0]} | {r[1]} | {pts} | {r[3]:.2f} | {r[4]:.3f} |")
        table2 = (
            "\n".join(lines) + "\n\nMeasured on the agent alone (20 sample/update rounds, 5 "
            f"for DS, window 5, tracemalloc peak). {in_run_text}"
        )
    cost.to_csv(out / "autofedrl_agent_cost.csv", index=False)
    plot(rounds_df, out / "autofedrl_digits.png")
    if tuned is None:
        chosen_text = "FedProx and FedAvg (tuned) not run, so no tuning grid."
        grid_md = "not run"
    else:
        chosen_text = (
            f"FedProx μ = {mu:g} (best of {FEDPROX_MUS}); FedAvg (tuned) = client lr "
            f"{tuned['client_lr']}, {tuned['local_steps']} steps; both chosen by the clients' "
            f"mean validation loss of the final model on seeds {TUNING_SEEDS}."
        )
        grid_md = grid.to_string(index=False)
    (out / "autofedrl_digits.md").write_text(
        f"# Auto-FedRL on digits-dir8 ({len(seeds)} seeds, {args.rounds} rounds)\n\n"
        + made_by(command(args, out))
        + "\n\nPooled test accuracy (20 % of every class, held by no client). FedAvg/FedProx "
        f"at the search ranges' centre (client lr {CENTRE_LR:.4g}, {CENTRE_STEPS} local "
        f"steps, server lr 1); {chosen_text} Δ: the paired difference (same seeds) of the "
        "last-5-rounds average accuracy against FedAvg, with its 95% t-interval and paired "
        "t-test p; Holm p: that p adjusted by Holm's method over the table's comparisons (a "
        "difference holds at family-wise level 0.05 when it is below 0.05).\n\n"
        f"{table1}\n\n"
        f"## The agents' cost (Table 2 analogue; {dim} searched dimensions)\n\n{table2}\n\n"
        f"## Tuning grid (clients' mean validation loss, seeds {TUNING_SEEDS})\n\n"
        f"```\n{grid_md}\n```\n"
    )
    print(table1)
    print(table2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
