"""``secagg`` command line: run experiments, list presets.

Option values come, lowest priority first, from the built-in defaults, a preset or config
file (TOML, same keys as the options with underscores), and the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from secagg.backends import BACKENDS
from secagg.clients.tasks import TASKS, get_task
from secagg.errors import SecaggError
from secagg.options import Option
from secagg.protocols import PROTOCOLS
from secagg.simulation.experiment import ExperimentConfig

PRESETS = Path(__file__).parent / "presets"

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - exercised on 3.10
    import tomli as tomllib


def parse_seeds(text: str) -> list[int]:
    """``"42"``, ``"42,43,50"`` or ranges ``"42-61"`` (inclusive), mixed freely."""
    seeds: list[int] = []
    try:
        for item in str(text).split(","):
            lo, sep, hi = item.strip().partition("-")
            seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read seeds {text!r}; write e.g. 42 or 42,43 or 42-61"
        ) from None
    return seeds


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with value read as int, float, true/false, or left a string."""
    key, sep, raw = str(text).partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"write protocol options as key=value, got {text!r}")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key.strip(), lowered == "true"
    for cast in (int, float):
        try:
            return key.strip(), cast(raw)
        except ValueError:
            pass
    return key.strip(), raw.strip()


def parse_settings(text: str) -> dict[str, float]:
    """``clip=1.0,noise=0.8`` -> {"clip": 1.0, "noise": 0.8}."""
    out = {}
    for item in str(text).split(","):
        key, sep, raw = item.partition("=")
        try:
            out[key.strip()] = float(raw)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(
                f"write settings as key=number,key=number (e.g. clip=1.0,noise=0.8), got {text!r}"
            )
    return out


def load_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SecaggError(f"config file {path} does not exist; `secagg presets` lists presets")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SecaggError(f"{path} is not valid TOML: {exc}") from None
    known = set(ExperimentConfig.__dataclass_fields__) | {"out"}
    unknown = set(values) - known
    if unknown:
        raise SecaggError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
    if isinstance(values.get("seeds"), str):
        values["seeds"] = parse_seeds(values["seeds"])
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="secagg",
        description="Federated aggregation algorithms on plaintext and encrypted backends, "
        "with byte accounting and an audit of what the server saw.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run an experiment over one or more seeds",
        description="Run a federated experiment in-process and write metrics.csv, "
        "summary.csv, traffic.csv, audit.jsonl, audit_summary.json and "
        "convergence.png to --out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = run.add_mutually_exclusive_group()
    src.add_argument("--preset", help="a named preset from `secagg presets`")
    src.add_argument("--config", type=Path, help="a TOML file with the same keys as the options")
    run.add_argument(
        "--task",
        choices=list(TASKS),
        help="; ".join(f"{k}: {v.description}" for k, v in TASKS.items()),
    )
    run.add_argument(
        "--protocol",
        choices=list(PROTOCOLS),
        help="aggregation algorithm (`secagg protocols` lists them with their "
        "settings); the fed* variants are FedAvg weighting with that server "
        "optimizer",
    )
    run.add_argument(
        "--backend",
        choices=list(BACKENDS),
        help="; ".join(f"{k}: {v.summary}" for k, v in BACKENDS.items()),
    )
    run.add_argument("--rounds", type=int, help="federated rounds (FLamby: 5)")
    run.add_argument(
        "--seeds",
        type=parse_seeds,
        help="seeds, e.g. 42 or 42,43 or 42-61; each seed fixes the initial model "
        "and the clients' batch order",
    )
    run.add_argument("--local-steps", type=int, help="client SGD steps per round (FLamby: 100)")
    run.add_argument(
        "--local-epochs", type=int, help="client epochs per round instead of steps (FedDisco: 10)"
    )
    run.add_argument("--batch-size", type=int, help="client batch size (FLamby: 8)")
    run.add_argument(
        "--client-lr",
        help="client learning rate, or a step schedule rate@round,... "
        "(RoLePRO OptAlgo A: 5e-5@0,5e-6@7)",
    )
    run.add_argument(
        "--client-split",
        type=float,
        help="split every client's data at random into train/test with this test "
        "share (LARC paper's second protocol: 0.1667); split seed = run seed",
    )
    run.add_argument(
        "--validation-split",
        type=float,
        help="hold out this share of each client's training samples as its "
        "validation set (needed by autofedrl; e.g. 0.2)",
    )
    run.add_argument(
        "--fedprox-mu", type=float, help="FedProx: clients add mu/2 ||w - W||^2 to their local loss"
    )
    dp = run.add_argument_group("differential privacy (README, 'Differential privacy')")
    dp.add_argument(
        "--dp-sgd",
        type=parse_settings,
        metavar="clip=C,noise=Z|epsilon=E",
        help="sample-level DP-SGD on every client with Opacus: per-sample clip "
        "norm and a noise multiplier, or a target epsilon for the whole run",
    )
    dp.add_argument(
        "--client-dp",
        type=parse_settings,
        metavar="clip=C,noise=Z",
        help="client-level DP: clients clip their update to C and add noise so "
        "that the revealed sum has multiplier Z with equal weights; the "
        "realised multiplier is accounted",
    )
    dp.add_argument(
        "--scalar-dp",
        type=parse_settings,
        metavar="low=L,high=H,noise=S",
        help="clip every revealed client scalar (delta_loss, val_loss, loss_ratio, "
        "discrepancy) to [L, H] and add N(0, (S(H-L))^2)",
    )
    dp.add_argument("--dp-delta", type=float, help="delta for every epsilon reported (1e-5)")
    dp.add_argument(
        "--dp-noise",
        choices=["seeded", "os"],
        help="clients' DP noise from the run's seed (reproducible simulation; default) or "
        "from generators seeded by the OS CSPRNG (what a deployment needs)",
    )
    opt = run.add_argument_group("server optimizer (defaults depend on --protocol)")
    opt.add_argument("--server-opt", choices=["sgd", "momentum", "adam", "yogi", "adagrad"])
    opt.add_argument("--server-lr", type=float)
    opt.add_argument("--tau", type=float, help="adaptivity for adam/yogi/adagrad")
    opt.add_argument("--beta1", type=float)
    opt.add_argument("--beta2", type=float)
    opt.add_argument("--momentum", type=float, help="beta of the momentum optimizer")
    run.add_argument(
        "--protocol-option",
        type=parse_option,
        action="append",
        metavar="KEY=VALUE",
        help="a protocol setting, repeatable (`secagg protocols` lists each "
        "protocol's settings), e.g. alpha=0.5 or then=regagg",
    )
    for name, spec in PROTOCOLS.items():
        if spec.options:
            add_options(run.add_argument_group(f"protocol {name}"), spec.options, "popt")
    for name, bspec in BACKENDS.items():
        if bspec.options:
            add_options(run.add_argument_group(f"backend {name}"), bspec.options, "bopt")
    enc = run.add_argument_group("run policy (encrypted backends)")
    enc.add_argument(
        "--server-blind",
        action="store_true",
        default=None,
        help="the server never learns the global update: clients decrypt it and "
        "apply the server optimizer themselves (NVFlare's model)",
    )
    enc.add_argument(
        "--allow-plaintext-updates",
        action="store_true",
        default=None,
        help="let aggregators that are not sums (regmedagg, trimmedmean) receive "
        "each client's update in plaintext on ckks; the audit says so",
    )
    perf = run.add_argument_group("server performance")
    perf.add_argument(
        "--no-streaming",
        dest="streaming",
        action="store_false",
        default=None,
        help="keep every upload until the protocol sums them, instead of folding "
        "each into a running sum as it arrives (streaming is on by default "
        "for protocols whose weights are known before the uploads: fedavg, the FedOpt "
        "family, autofedrl, rolepro's FedAvg phase; the others always buffer)",
    )
    perf.add_argument(
        "--workers",
        type=int,
        help="run the clients in this many worker processes, so they train and "
        "encrypt in parallel (e.g. the number of cores); 0 (default) runs "
        "them one after another in this process; every mode runs in workers",
    )
    opt.add_argument(
        "--server-lr-schedule",
        help="server learning rate per round, rate@round,... (RoLePRO's two "
        "phases: 0.003@0,0.002@3)",
    )
    run.add_argument(
        "--out", type=Path, help="output folder (default results/<protocol>-<backend>)"
    )
    run.add_argument("--quiet", action="store_true", help="no progress output")

    sub.add_parser("presets", help="list the bundled experiment presets")
    sub.add_parser("protocols", help="list the registered protocols and their settings")
    bench = sub.add_parser(
        "bench",
        help="run a benchmark: crypto (CKKS cost per parameter "
        "against NVFlare's default) or overhead (end-to-end "
        "rounds: time by phase, bytes, peak memory, over "
        "model sizes and client counts); "
        "`secagg bench NAME --help` for its options",
        add_help=False,
    )
    bench.add_argument("name", choices=["crypto", "overhead"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def add_options(group, options: tuple[Option, ...], prefix: str) -> None:
    """One flag per declared option; its value lands in ``<prefix>__<key>``."""
    for opt in options:
        dest = f"{prefix}__{opt.key}"
        # SUPPRESS: an option not given is absent (the registry's default applies later)
        if opt.type is bool:
            group.add_argument(
                f"--{opt.flag}",
                dest=dest,
                action="store_true",
                default=argparse.SUPPRESS,
                help=opt.help,
            )
        else:
            group.add_argument(
                f"--{opt.flag}",
                dest=dest,
                type=opt.type,
                choices=opt.choices,
                metavar=None if opt.choices else opt.key.upper(),
                default=argparse.SUPPRESS,
                help=f"{opt.help} (default {opt.default})",
            )


def prefixed(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    return {
        k.split("__", 1)[1]: v
        for k, v in vars(args).items()
        if k.startswith(f"{prefix}__") and v is not None
    }


def config_from_args(args: argparse.Namespace) -> tuple[ExperimentConfig, Path]:
    values: dict[str, Any] = {}
    if args.preset:
        values = load_config_file(PRESETS / f"{args.preset}.toml")
    elif args.config:
        values = load_config_file(args.config)
    for key in (
        "task",
        "protocol",
        "backend",
        "rounds",
        "seeds",
        "local_steps",
        "local_epochs",
        "batch_size",
        "client_lr",
        "client_split",
        "server_blind",
        "allow_plaintext_updates",
        "server_lr_schedule",
        "validation_split",
        "fedprox_mu",
        "dp_sgd",
        "client_dp",
        "scalar_dp",
        "dp_delta",
        "dp_noise",
        "streaming",
        "workers",
    ):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    server_opt = dict(values.get("server_opt", {}))
    for arg, key in (
        ("server_opt", "name"),
        ("server_lr", "lr"),
        ("tau", "tau"),
        ("beta1", "beta1"),
        ("beta2", "beta2"),
        ("momentum", "beta"),
    ):
        if getattr(args, arg) is not None:
            server_opt[key] = getattr(args, arg)
    values["server_opt"] = server_opt
    protocol_options = dict(values.get("protocol_options", {}))
    protocol_options.update(dict(args.protocol_option or []))
    protocol_options.update(prefixed(args, "popt"))
    values["protocol_options"] = protocol_options
    values["backend_options"] = {**values.get("backend_options", {}), **prefixed(args, "bopt")}
    out = args.out or values.pop("out", None)
    values.pop("out", None)
    values["client_lr"] = str(values.get("client_lr", ExperimentConfig.client_lr))
    config = ExperimentConfig(**values).validate()
    out = Path(out) if out else Path("results") / f"{config.protocol}-{config.backend}"
    return config, out


def cmd_run(args: argparse.Namespace) -> int:
    from secagg.simulation.api import run

    config, out = config_from_args(args)
    result = run(config, out=out, progress=not args.quiet)
    for seed, reason in result.aborted.items():
        print(f"seed {seed} was aborted: {reason}", file=sys.stderr)
    summary = result.summary
    final = summary[summary["round"] == summary["round"].max()].iloc[0]
    metric = "test_pooled" if "test_pooled_mean" in summary else "train_pooled"
    name = get_task(config.task).metric_name
    print(
        f"{config.protocol} on {config.backend}, {len(config.seeds)} seed(s), "
        f"{config.rounds} rounds: {metric} {name} {final[f'{metric}_mean']:.4f} ± "
        f"{final[f'{metric}_std'] if len(config.seeds) > 1 else 0:.4f}; "
        f"bytes/round up {final['bytes_up_mean']:.0f}, down {final['bytes_down_mean']:.0f}"
    )
    print(f"results in {out}/")
    return 0


def cmd_protocols(_: argparse.Namespace) -> int:
    import inspect

    for name, spec in PROTOCOLS.items():
        params = [
            p
            for p in inspect.signature(spec.protocol.__init__).parameters.values()
            if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        settings = ", ".join(f"{p.name}={p.default!r}" for p in params) or "none"
        print(f"{name:14s} {spec.summary}\n{'':14s} settings: {settings}")
    return 0


def cmd_presets(_: argparse.Namespace) -> int:
    for path in sorted(PRESETS.glob("*.toml")):
        first = path.read_text().splitlines()[0].lstrip("# ")
        print(f"{path.stem:24s} {first}")
    return 0


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
    importlib.import_module(f"benchmarks.{args.name}").main(args.rest)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {
            "run": cmd_run,
            "presets": cmd_presets,
            "protocols": cmd_protocols,
            "bench": cmd_bench,
        }[args.command](args)
    except SecaggError as exc:
        print(f"secagg: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
