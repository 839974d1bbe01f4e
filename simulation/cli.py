"""``secagg`` command line: run experiments, resume them, compare them, list presets.

Every setting is a flag and a TOML key of the same name (``secagg.runspec.settings``);
values layer, lowest first: defaults < ``--preset`` < ``--config`` < flags. This module
imports neither torch nor the experiment driver until a command needs them, so ``--help``,
``--version`` and ``presets`` answer at once.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from secagg.backends import BACKENDS
from secagg.clients.tasks import TASKS
from secagg.errors import SecaggError
from secagg.protocols import PROTOCOLS
from secagg.runspec import settings as S

#: a command-line-friendly ``parse_seeds`` (benchmarks use it as an argparse type)
parse_seeds = S._argparse_type(S.parse_seeds)
BENCHMARKS = {
    "crypto": "cost per parameter of ckks and threshold against NVFlare's TenSEAL set-up "
    "and Flower's SecAgg+",
    "upload_profile": "where one upload's time goes, stage by stage, per CKKS preset",
    "overhead": "end-to-end rounds: time by phase, bytes, peak memory, over model sizes "
    "and client counts",
    "many_clients": "the server's work per client from 100 to 1,000 clients (1e5 "
    "parameters): plain, ckks, and threshold with a committee of 10 key holders",
    "server_memory": "where the server's memory goes in one FedAvg round, per backend: its "
    "peak per parameter and the allocations that hold it",
    "flower": "the same run over a local Flower deployment vs in process: wall time and "
    "bytes per round, Flower's framing per message",
    "flower_load": "many rounds over a local Flower deployment beside busy processes: any "
    "message lost, exclusions, load average",
    "flower_floor": "a bare Flower App echoing a secagg round's messages over a local "
    "deployment vs the round in process: Flower's own floor",
    "admm": "consensus ADMM (ridge, lasso, logistic, SVM) against the centralised optimum "
    "per iteration, over splits and backends",
    "cox_strategies": "federated Cox strategies (Sequential, Weights Averaging, Ensemble) on "
    "8 centres, 4 scenarios, 10 splits, against isolated/centralised bounds and the exact "
    "federated Cox model",
    "xgboost_trees": "federated XGBoost (histograms, top-S) against xgboost hist trained "
    "centrally, over splits and backends",
    "pvi_posterior": "partitioned variational inference against the centralised variational "
    "posterior, over splits and backends",
    "dec": "federated DEC clustering against centralised and per-client DEC (ACC/NMI/ARI), "
    "plain and ckks",
    "savae": "SAVAE (survival VAE) on a good and a bad node: isolated bounds, FedAvg, the joint "
    "pseudo-point prior (c-index, 10 split seeds)",
    "dgd": "deep generative decoder imputing missing entries: federated vs centralised vs "
    "per-client, column mean and k-NN",
    "radialgan": "RadialGAN augmentation of a noisy bad node's digits against the isolated "
    "good/bad bounds",
    "flamby_tcga": "FLamby's FedAvg and FedAdam configs on Fed-TCGA-BRCA over many seeds, beside "
    "FLamby's published runs",
    "idash_larc": "LARC against its FedAdam baseline on the iDASH 2024 variant, paired seeds, "
    "three studies",
    "rolepro_tcga": "RoLePRO's aggregators and two-phase protocol on Fed-TCGA-BRCA against FedAvg",
    "feddisco_digits": "FedDisco-style discrepancy weights on label-skewed digits: an alpha sweep",
    "autofedrl_digits": "Auto-FedRL's agents against FedAvg, FedProx and a tuned FedAvg on digits",
    "dp_tcga": "privacy against utility on Fed-TCGA-BRCA: c-index against epsilon, client-level "
    "DP and DP-SGD",
    "dp_epsilon_joint": "client-level epsilon accounted per release, jointly, and by Google's "
    "accountants",
    "parity": "the same runs on plain and an encrypted backend: the models' largest difference",
    "protocol_parity": "every protocol's short run on an encrypted backend against plain",
    "dominant_weight": "how much of one client's update a deviating server reads from a sum where "
    "it gives that client the largest weight the policy allows",
    "flooding_bound": "the decryption error of weighted sums against the flooding bound E",
    "run_ledger": "the run ledger's checks at 100 clients and 100 rounds, and the rounds "
    "fixed participation pauses at dropout rates 0.05 and 0.2",
}


#: how to list the names an option takes, by its destination (an option with few choices
#: lists them in its error; one with many points to ``PROG --help``)
LISTINGS = {
    "task": "`secagg tasks` lists them",
    "protocol": "`secagg protocols` lists them",
    "preset": "`secagg presets` lists them",
    "show": "`secagg presets` lists them",
}
#: an option with at most this many choices lists them all in its error
FEW = 8


def close_names(given: str, names: Iterable[Any], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The names closest to ``given`` (difflib, ignoring case), best first: what every
    "did you mean" of the command line suggests, for flags, choices and commands alike."""
    by_lower: dict[str, str] = {}
    for name in map(str, names):
        by_lower.setdefault(name.lower(), name)
    found = difflib.get_close_matches(str(given).lower(), by_lower, n=n, cutoff=cutoff)
    return [by_lower[m] for m in found]


def either(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)


def unknown_name(what: str, given: str, names: Iterable[Any], listing: str | None = None) -> str:
    """``unknown task 'tcga-brcaa'; did you mean tcga-brca? (`secagg tasks` lists them)``:
    the closest names and how to list them all (or, where they are few, all of them)."""
    names = [str(n) for n in names]
    close = close_names(given, names)
    text = f"{what} {given!r}" + (f"; did you mean {either(close)}?" if close else "")
    if listing is None and len(names) <= FEW:
        listing = f"choose from {', '.join(names)}"
    return text + (f" ({listing})" if listing else "")


class SuggestingParser(argparse.ArgumentParser):
    """The parser of every ``secagg`` command (the top one, each sub-command, ``flower``'s):
    no abbreviated flags (``--local-step`` is not ``--local-steps``), and short errors that
    name the closest valid names: a mistyped flag ("did you mean --rounds?"), an option's
    value (``--task``, ``--backend``, ``--ckks-preset`` ...) or a command (``secagg rnu``),
    with how to list them, not the whole usage and every choice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            scope = self._command(parsed) or self
            known = sorted(
                o for a in scope._actions for o in a.option_strings if o.startswith("--")
            )
            message = f"unrecognized arguments: {' '.join(extras)}"
            for token in extras:
                flag = token.split("=", 1)[0]
                close = close_names(flag, known, n=2, cutoff=0.75)
                if flag.startswith("--") and close:
                    message += f"\n  {flag}: did you mean {either(close)}?"
            scope.error(message)
        return parsed

    def _command(self, parsed: argparse.Namespace) -> argparse.ArgumentParser | None:
        """The innermost sub-command's parser ``parsed`` chose, if any."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest or "", None) or "")
                if isinstance(chosen, SuggestingParser):
                    return chosen._command(parsed) or chosen
                return chosen
        return None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(
                None,
                unknown_name(
                    "unknown command", value, action.choices, f"`{self.prog} --help` lists them"
                ),
            )
        choices = list(action.choices)
        listing = LISTINGS.get(action.dest)
        if listing is None and len(choices) > FEW:
            listing = f"`{self.prog} --help` lists them"
        raise argparse.ArgumentError(
            action, unknown_name("invalid choice", value, choices, listing)
        )

    def error(self, message: str) -> NoReturn:
        """The message, under a usage line short enough not to bury it (``secagg run``'s
        full usage is tens of lines: ``--help`` shows it)."""
        usage = self.format_usage()
        if usage.count("\n") > 3:
            usage = f"usage: {self.prog} ... (`{self.prog} --help` explains every option)\n"
        self._print_message(usage, sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="secagg",
        description="Federated aggregation algorithms on plaintext and encrypted backends, "
        "with byte accounting and an audit of what the server saw.",
    )
    parser.add_argument(
        "--version", action="store_true", help="print secagg's version (and git commit)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SuggestingParser)

    run = sub.add_parser(
        "run",
        help="run an experiment over one or more seeds",
        description="Run a federated experiment in-process. Results go to --out as the run "
        "goes (metrics.csv after every round; every table, the audit, the figures and the "
        "seed's model after every seed), so Ctrl-C loses only the seed in progress and "
        "--resume continues. Every flag is also a TOML key (--server-lr: server_lr); "
        "values layer: defaults < --preset < --config < flags. Exit status: 0 complete "
        "(every seed ran every round with every client), 4 degraded (some client missed "
        "rounds, or a round made no update), 3 aborted (a seed stopped early), 2 a usage or "
        "configuration error, 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM; run.json "
        "records the same status.",
    )
    run.add_argument(
        "--preset",
        choices=S.preset_names(),
        metavar="NAME",
        help="a bundled preset (`secagg presets` lists them)",
    )
    run.add_argument(
        "--config",
        type=Path,
        help="a TOML file of settings (keys are the flag names), a run's config.toml or "
        "config.json, or a run folder: reruns that run",
    )
    run.add_argument(
        "--resume",
        type=Path,
        metavar="FOLDER",
        help="continue the interrupted run in FOLDER with its own settings: finished "
        "seeds are kept, a seed in progress restarts",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of an earlier run in --out (only files secagg wrote)",
    )
    run.add_argument(
        "--show-config",
        action="store_true",
        help="print the resolved settings as TOML and exit without running",
    )
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument(
        "--tracker",
        metavar="NAMES",
        default="",
        help="also log every round to experiment trackers, as local files in the run "
        "folder: tensorboard (OUT/tensorboard/, `tensorboard --logdir OUT/tensorboard`), "
        "mlflow (OUT/mlruns/, `mlflow ui --backend-store-uri OUT/mlruns`), or "
        "tensorboard,mlflow; needs `pip install 'secagg[trackers]'`",
    )
    add_settings(run)

    presets = sub.add_parser("presets", help="list the bundled presets, or show one")
    presets.add_argument(
        "--show", choices=S.preset_names(), metavar="NAME", help="print the preset's settings"
    )
    listings = (
        sub.add_parser("protocols", help="list the registered protocols and their settings"),
        sub.add_parser("tasks", help="list the registered tasks (data, model, metric)"),
    )
    for listing in listings:  # what your own modules register is listed too
        listing.add_argument(
            "--import",
            "--imports",
            dest="imports",
            metavar="MODULES",
            help="your own modules (names or .py paths, comma-separated) to import first",
        )
    compare = sub.add_parser(
        "compare",
        help="compare finished runs side by side, with paired differences",
        description="A table of the runs' status, final metric (mean ± std over seeds), "
        "bytes and seconds per round, and each run's paired difference against the first on "
        "the seeds they share (split-clustered when the seeds share client splits); with "
        "--out, also compare.csv, compare.md and compare.png. A run that is not complete "
        "(run.json) is refused unless --include-incomplete.",
    )
    compare.add_argument("folders", nargs="+", type=Path, metavar="FOLDER")
    compare.add_argument("--metric", help="metric column (default: test_pooled, else train_pooled)")
    compare.add_argument("--round", type=int, help="round to compare (default: the last)")
    compare.add_argument("--out", type=Path, help="write compare.csv/.md/.png here")
    compare.add_argument(
        "--include-incomplete",
        action="store_true",
        help="compare runs whose run.json says degraded, aborted, interrupted or failed "
        "(refused otherwise), with a warning and their status in the table",
    )
    bench = sub.add_parser(
        "bench",
        help="run a benchmark: "
        + "; ".join(f"{k} ({v})" for k, v in BENCHMARKS.items())
        + "; `secagg bench NAME --help` for its options",
        description="Run a benchmark from a source checkout: "
        + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items())
        + ". Options after NAME go to the benchmark (`secagg bench NAME --help`); "
        "`secagg bench NAME --check` re-runs the subset it declares and compares it with its "
        "committed results (exit status 1 if a value differs beyond its tolerance).",
    )
    bench.add_argument(
        "name", choices=list(BENCHMARKS), metavar="NAME", help="the benchmark (listed above)"
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own options")
    from secagg.flower.cli import add_parser as add_flower

    add_flower(sub, add_settings)
    return parser


def add_settings(parser: argparse.ArgumentParser) -> None:
    """Every experiment setting as a flag (``secagg run``'s, also ``flower prepare``'s)."""
    S.add_arguments(
        parser, {"task": list(TASKS), "protocol": list(PROTOCOLS), "backend": list(BACKENDS)}
    )


def cmd_flower(args: argparse.Namespace) -> int:
    from secagg.flower.cli import run

    return run(args, resolve_settings)


# ---- run ----------------------------------------------------------------------------------
def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the resumed folder's, a preset's, a file's and the flags'."""
    layers = []
    if args.resume is not None:
        if args.overwrite:
            raise SecaggError("--overwrite and --resume contradict each other: choose one")
        if not (args.resume / "config.json").is_file():
            raise SecaggError(f"{args.resume} holds no run to resume (no config.json)")
        layers.append(S.read_file(args.resume / "config.json"))
    if args.preset:
        layers.append(S.read_file(S.preset_path(args.preset)))
    if args.config:
        layers.append(S.read_file(args.config))
    layers.append(S.flag_values(args))
    values = S.layer(*layers)
    check_names(values)
    return values


def check_names(values: dict[str, Any]) -> None:
    """The task, protocol and backend a preset or file names, checked against the registries
    as they are now (with what ``--import`` and entry points registered), with the closest
    names where one is unknown (a flag's value was checked by the parser already)."""
    for key, registry in (("task", TASKS), ("protocol", PROTOCOLS), ("backend", BACKENDS)):
        name = values.get(key)
        if isinstance(name, str) and name not in registry:
            raise SecaggError(
                unknown_name(f"unknown {key}", name, registry, LISTINGS.get(key))
                + " (your own: --import MODULE, or imports = [...] in the config)"
            )


def cmd_run(args: argparse.Namespace) -> int:
    values = resolve_settings(args)
    config, out = S.to_config(values)
    if args.show_config:
        print(S.to_toml(S.from_config(config)), end="")
        return 0
    if args.resume is not None:
        if out is not None and Path(out) != args.resume:
            raise SecaggError(f"--resume {args.resume} and --out {out} name different folders")
        out = args.resume
    from secagg.simulation.api import RunInterrupted, run
    from secagg.simulation.outputs import default_folder

    folder = Path(out) if out is not None else default_folder(config)
    try:
        result = run(
            config,
            out=folder,
            overwrite=args.overwrite,
            resume=args.resume is not None,
            progress=not args.quiet,
            command=args.argv,
            trackers=args.tracker,
        )
    except RunInterrupted as stop:
        by = "" if stop.signal == signal.SIGINT else f" by {stop.signal.name}"
        print(
            f"secagg: interrupted{by}; {stop.finished} of {stop.total} seeds finished and are "
            f"saved in {stop.folder}/; continue with: secagg run --resume {stop.folder}",
            file=sys.stderr,
        )
        return stop.exit_code  # 130 for Ctrl-C, 143 for SIGTERM, as the shell counts them
    status = result.status
    for problem in status.problems:  # each in full; the closing line shortens them
        print(f"{status.status}: {problem}", file=sys.stderr)
    if status.status != "aborted":  # an aborted seed's scores are no result
        print(("" if status.complete else f"{status.status} run, ") + final_line(result))
    print(f"results in {folder}/")
    if not status.complete:  # last, where a script or a reader looks
        print(f"{status.line()} (exit status {status.exit_code})")
    return status.exit_code


def final_line(result) -> str:
    config, summary = result.config, result.summary
    if summary.empty:
        return f"{config.protocol} on {config.backend}: no seed got past its first round"
    from secagg.clients.tasks import get_task

    final = summary[summary["round"] == summary["round"].max()].iloc[0]
    metric = "test_pooled" if "test_pooled_mean" in summary else "train_pooled"
    # one seed has no spread to show ("± 0.0000" would claim one)
    spread = f" ± {final[f'{metric}_std']:.4f}" if final["n_seeds"] > 1 else ""
    bytes_part = (
        f"; bytes/round up {final['bytes_up_mean']:.0f}, down {final['bytes_down_mean']:.0f}"
        if "bytes_up_mean" in final
        else ""
    )
    where = metric.split("_", 1)[0]
    others = "".join(  # the task's other metrics, on the same pooled set
        f", {where}_{name} {final[f'{where}_{name}_mean']:.4f}"
        + (f" ± {final[f'{where}_{name}_std']:.4f}" if final["n_seeds"] > 1 else "")
        for name in get_task(config.task).metrics
        if f"{where}_{name}_mean" in final
    )
    return (
        f"{config.protocol} on {config.backend}, {int(final['n_seeds'])} seed(s), round "
        f"{int(final['round'])}: {metric} {get_task(config.task).metric_name} "
        f"{final[f'{metric}_mean']:.4f}{spread}{others}{bytes_part}"
    )


# ---- listings -----------------------------------------------------------------------------
def cmd_protocols(_: argparse.Namespace) -> int:
    from secagg.protocols.registry import protocol_settings

    for name, spec in PROTOCOLS.items():
        known = protocol_settings(name)
        settings = (
            "any keyword"
            if known is None
            else ", ".join(f"{k}={v!r}" for k, v in known.items()) or "none"
        )
        flags = ", ".join(f"--{o.flag}" for o in spec.options)
        print(f"{name:14s} {spec.summary}\n{'':14s} settings: {settings}")
        if flags:
            print(f"{'':14s} flags: {flags}")
        if spec.tasks:  # it trains only these (a run on another task is refused)
            print(f"{'':14s} tasks: {', '.join(spec.tasks)}")
        over_run = (
            "weights vary with the data: per round; client DP covers the run"
            if spec.protocol.capabilities.weights_vary
            else "one contributor set, weights within two directions"
        )
        print(f"{'':14s} encrypted, over the whole run: {over_run}")
    return 0


def cmd_tasks(_: argparse.Namespace) -> int:
    for name, task in TASKS.items():
        also = "".join(f", {m}" for m in task.metrics)
        print(f"{name:28s} {task.description} (metric: {task.metric_name}{also})")
    print(
        "\n`secagg run --task NAME` runs one; your own: `--import MODULE` "
        "(docs/tutorials/own-model.md walks through one)"
    )
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    if args.show:
        print(S.preset_path(args.show).read_text(), end="")
        return 0
    for name in S.preset_names():
        print(f"{name:24s} {S.preset_summary(name)}")
    print("\n`secagg presets --show NAME` prints one; `secagg run --preset NAME` runs it")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import warnings

    from secagg.simulation.compare import IncompleteRunWarning, compare_runs, format_table

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IncompleteRunWarning)
        table = compare_runs(
            args.folders,
            metric=args.metric,
            round=args.round,
            out=args.out,
            include_incomplete=args.include_incomplete,
        )
    for warning in caught:
        if issubclass(warning.category, IncompleteRunWarning):
            print(f"secagg: warning: {warning.message}", file=sys.stderr)
        else:  # anything else as Python would have shown it
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    print(format_table(table))
    if args.out:
        print(f"written to {args.out}/")
    return 0


# ---- benchmarks ---------------------------------------------------------------------------
def benchmarks_root() -> Path:
    """The source checkout whose ``benchmarks/`` folder holds the benchmark scripts: they
    ship with the repository, not in the wheel."""
    import secagg

    for candidate in (Path.cwd(), Path(secagg.__file__).resolve().parents[1]):
        if (candidate / "benchmarks" / "__init__.py").is_file():
            return candidate
    raise SecaggError(
        "the benchmarks ship with secagg's source repository, not with the "
        "installed package: run `secagg bench` from a checkout"
    )


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    root = str(benchmarks_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"benchmarks.{args.name}")
    if "--check" not in args.rest:
        module.main(args.rest)
        return 0
    from benchmarks import reproduce

    check = getattr(module, "CHECK", None)
    if check is None or len(args.rest) > 1:
        raise SecaggError(
            f"--check takes no other option, and {args.name} "
            + (
                f"declares no CHECK ({getattr(module, 'NO_CHECK', 'none written yet')})"
                if check is None
                else "runs its declared subset"
            )
        )
    table = reproduce.run_check(args.name, check, module.main)
    print(reproduce.report(args.name, check, table))
    return 0 if reproduce.reproduces(table) else 1


def load_user_code(argv: list[str]) -> None:
    """Import what the command line names before the parser is built, so that the tasks
    protocols and backends a user module (``--import``, a ``--config`` file's or a resumed
    run's ``imports``) or an installed package (entry points) registers are valid choices."""
    from secagg.backends import load_backend_entry_points
    from secagg.clients.tasks import load_task_entry_points
    from secagg.plugins import import_user_modules
    from secagg.protocols.registry import load_protocol_entry_points

    load_task_entry_points()
    load_protocol_entry_points()
    load_backend_entry_points()
    scan = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    scan.add_argument("--import", "--imports", dest="imports", action="append", default=[])
    scan.add_argument("--config", type=Path)
    scan.add_argument("--resume", type=Path)
    known, _ = scan.parse_known_args(argv)
    names = [n for value in known.imports for n in S.parse_names(value)]
    for path in (known.resume, known.config):
        if path is not None:
            names += S.imports_named_in(path)
    import_user_modules(names)


def configure_logging(args: argparse.Namespace) -> None:
    """The one place the command line says where the library's log lines go: stderr, the
    message only (as the lines read when they were printed); ``--quiet`` keeps warnings and
    errors only."""
    from secagg.logs import to_stderr

    to_stderr(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    try:
        load_user_code(sys.argv[1:] if argv is None else argv)
    except (SecaggError, ValueError) as exc:
        print(f"secagg: error: {exc}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = ["secagg", *(sys.argv[1:] if argv is None else argv)]
    configure_logging(args)
    if args.version:
        from secagg.simulation.provenance import version_line

        print(version_line())
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return {
            "run": cmd_run,
            "presets": cmd_presets,
            "protocols": cmd_protocols,
            "tasks": cmd_tasks,
            "compare": cmd_compare,
            "bench": cmd_bench,
            "flower": cmd_flower,
        }[args.command](args)
    except SecaggError as exc:
        print(f"secagg: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("secagg: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
