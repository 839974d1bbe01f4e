"""One configuration language: every setting is a flag and a TOML key of the same name.

``--server-lr 0.1`` on the command line is ``server_lr = 0.1`` in a TOML file; a preset is
such a file, and every run writes its complete settings as ``config.toml`` (and inside
``config.json``), so either reruns it. Values layer, lowest first:

    built-in defaults  <  --preset NAME  <  --config FILE  <  flags

The table of settings is generated: the experiment's own (``SETTINGS`` below), the server
optimizer's, and every registered protocol's and backend's declared options, so a protocol or
backend registered later gets its flags and keys too. A protocol's or backend's setting given
for a run that uses another one is an error that names it, not a silent no-op.

Nothing here imports torch: ``secagg --help`` and ``secagg presets`` answer at once.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from secagg.backends import BACKENDS
from secagg.errors import ConfigError
from secagg.plugins import import_user_modules
from secagg.protocols import PROTOCOLS, make_protocol
from secagg.protocols.pieces import FixedServerStep, piece
from secagg.runspec.config import ExperimentConfig

PRESETS = Path(__file__).parent / "presets"


# ---- value parsers (a flag's string, or a string in TOML) ----------------------------------
def parse_seeds(text: str) -> list[int]:
    """``"42"``, ``"42,43,50"`` or inclusive ranges ``"42-61"``, mixed freely."""
    seeds: list[int] = []
    for item in str(text).split(","):
        lo, sep, hi = item.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(
                f"cannot read seeds {text!r}; write e.g. 42 or 42,43 or 42-61"
            ) from None
        if last < first:
            raise ValueError(f"seed range {item.strip()!r} runs backwards; write {last}-{first}")
        seeds += range(first, last + 1)
    return seeds


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with value read as int, float, true/false, or left a string."""
    key, sep, raw = str(text).partition("=")
    if not sep or not key.strip():
        raise ValueError(f"write protocol options as key=value, got {text!r}")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key.strip(), lowered == "true"
    for cast in (int, float):
        try:
            return key.strip(), cast(raw)
        except ValueError:
            pass
    return key.strip(), raw.strip()


def parse_numbers(text: str) -> dict[str, float]:
    """``clip=1.0,noise=0.8`` -> {"clip": 1.0, "noise": 0.8}."""
    out = {}
    for item in str(text).split(","):
        key, sep, raw = item.partition("=")
        try:
            value = float(raw)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise ValueError(f"write key=number,key=number (e.g. clip=1.0,noise=0.8), got {text!r}")
        out[key.strip()] = value
    return out


def parse_names(text: str) -> list[str]:
    """``"mine"`` or ``"mine,tasks/other.py"`` -> a list of names, order kept."""
    names = [item.strip() for item in str(text).split(",") if item.strip()]
    if not names:
        raise ValueError(f"write module names or .py paths separated by commas, got {text!r}")
    return names


def parse_min_clients(text: str) -> int | str:
    """``"all"`` or a positive integer."""
    if str(text).strip().lower() == "all":
        return "all"
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"write a positive integer or all, got {text!r}") from None
    if value < 1:
        raise ValueError(f"write a positive integer or all, got {text!r}")
    return value


def parse_bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"write true or false, got {text!r}")
    return lowered == "true"


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapped.__name__ = getattr(parse, "__name__", "value")
    return wrapped


# ---- the table ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One setting: its key (TOML; the flag is ``--key`` with ``-`` for ``_``), how a string
    is read, where it lands in :class:`ExperimentConfig`, and for whom it applies."""

    key: str
    help: str
    parse: Callable[[str], Any]
    #: what TOML may hold directly (a string is always read with ``parse``)
    toml_types: tuple[type, ...]
    #: the default as ``--help`` shows it
    default: str = ""
    #: "field" (an ExperimentConfig field), "server_opt", "protocol", "backend",
    #: "protocol_option" (generic key=value) or "out"
    place: str = "field"
    #: the field, optimizer key or option key it sets (default: ``key``)
    target: str = ""
    #: the protocols or backends whose option it is (backends may share one, e.g. the
    #: release policy's min_contributors)
    owners: tuple[str, ...] = ()
    choices: tuple[Any, ...] | None = None
    group: str = "experiment"
    #: (owner, default) of a setting several backends share (plain's weight cap is off)
    owner_defaults: tuple[tuple[str, str], ...] = ()
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def is_bool(self) -> bool:
        return self.parse is parse_bool


def _defaults_text(defaults: Iterable[tuple[str, str]]) -> str:
    """``[("plain", "1.0"), ("ckks", "0.5"), ("threshold", "0.5")]`` -> "0.5 on ckks,
    threshold; 1.0 on plain" (one default for all: just it)."""
    by_value: dict[str, list[str]] = {}
    for owner, value in defaults:
        by_value.setdefault(value, []).append(owner)
    if len(by_value) == 1:
        return next(iter(by_value))
    ordered = sorted(by_value.items(), key=lambda kv: -len(kv[1]))
    return "; ".join(f"{value} on {', '.join(owners)}" for value, owners in ordered)


def _s(key, help, parse, toml_types, default="", **kw) -> Setting:
    return Setting(key, help, parse, toml_types, default, **kw)


NUM = (int, float)
CORE = (
    _s("task", "the data and model; `secagg run --help` lists them", str, (str,), "tcga-brca"),
    _s(
        "protocol",
        "aggregation algorithm (`secagg protocols` lists them with their settings); the "
        "fed* variants are FedAvg weighting with that server optimizer",
        str,
        (str,),
        "fedavg",
    ),
    _s("backend", "plain, or an encrypted backend", str, (str,), "plain"),
    _s("rounds", "federated rounds (FLamby: 5)", int, (int,), "5"),
    _s(
        "seeds",
        "seeds, e.g. 42 or 42,43 or 42-61; each fixes the initial model, the clients' batch "
        "order and (with client_split) the split",
        parse_seeds,
        (list,),
        "42",
    ),
    _s("local_steps", "client SGD steps per round (FLamby: 100)", int, (int,), "100"),
    _s(
        "local_epochs",
        "client epochs per round instead of local_steps (FedDisco: 10)",
        int,
        (int,),
        "off: local_steps counts",
    ),
    _s("batch_size", "client batch size (FLamby: 8)", int, (int,), "8"),
    _s(
        "client_lr",
        "client learning rate, or a step schedule rate@round,... (RoLePRO OptAlgo A: "
        "5e-5@0,5e-6@7)",
        str,
        (str, int, float),
        "0.1",
    ),
    _s(
        "client_split",
        "split every client's data at random into train/test with this test share (LARC "
        "paper's second protocol: 0.1667); the split follows the seed",
        float,
        NUM,
        "off: the task's own test set",
    ),
    _s(
        "client_split_count",
        "number of distinct client splits: seed s uses split s mod this (needs client_split)",
        int,
        (int,),
        "off: one split per seed",
    ),
    _s(
        "validation_split",
        "hold out this share of each client's training samples as its validation set "
        "(needed by autofedrl; e.g. 0.2)",
        float,
        NUM,
        "off",
    ),
    _s(
        "fedprox_mu",
        "FedProx: clients add mu/2 ||w - W||^2 to their local loss",
        float,
        NUM,
        "0 (plain local SGD)",
    ),
    _s(
        "vae_rounds",
        "FedDisco's beta-VAE pre-stage: federated rounds",
        int,
        (int,),
        "10",
        group="pre-stage",
    ),
    _s("vae_lr", "the beta-VAE's client learning rate", float, NUM, "0.1", group="pre-stage"),
    _s("vae_beta", "the beta-VAE's KL weight beta", float, NUM, "0.1", group="pre-stage"),
    _s(
        "dp_sgd",
        "sample-level DP-SGD on every client with Opacus: a per-sample clip norm C, and "
        "either a noise multiplier Z or a target epsilon E at dp_delta, which each seed's "
        "run meets (a seed is a run of its own; privacy.json also composes the seeds)",
        parse_numbers,
        (dict,),
        "off",
        group="differential privacy",
        metavar="clip=C,noise=Z or clip=C,epsilon=E",
    ),
    _s(
        "client_dp",
        "client-level DP: clients clip their update to C and add noise so that the revealed "
        "sum has multiplier Z with equal weights; the realised multiplier is accounted",
        parse_numbers,
        (dict,),
        "off",
        group="differential privacy",
        metavar="clip=C,noise=Z",
    ),
    _s(
        "scalar_dp",
        "clip every revealed client scalar (delta_loss, val_loss, loss_ratio, discrepancy) "
        "to [L, H] and add N(0, (S(H-L))^2)",
        parse_numbers,
        (dict,),
        "off",
        group="differential privacy",
        metavar="low=L,high=H,noise=S",
    ),
    _s(
        "dp_delta",
        "delta for every epsilon reported",
        float,
        NUM,
        "1e-05",
        group="differential privacy",
    ),
    _s(
        "dp_noise",
        "where clients' DP noise comes from: os, generators seeded by the OS CSPRNG (what "
        "a deployment needs); seeded, from the run's seed, only to reproduce a simulation "
        "bit for bit: INSECURE, whoever knows the seed can predict the noise and remove it",
        str,
        (str,),
        "os",
        choices=("os", "seeded"),
        group="differential privacy",
    ),
    _s(
        "server_opt",
        "server optimizer",
        str,
        (str,),
        "the protocol's (`secagg protocols`)",
        place="server_opt",
        target="name",
        choices=("sgd", "momentum", "adam", "yogi", "adagrad"),
        group="server optimizer",
    ),
    *(
        _s(
            key,
            text,
            float,
            NUM,
            "the protocol's optimizer's",
            place="server_opt",
            target=target,
            group="server optimizer",
        )
        for key, target, text in (
            ("server_lr", "lr", "server learning rate"),
            ("tau", "tau", "adaptivity of adam, yogi and adagrad"),
            ("beta1", "beta1", "first-moment decay of adam and yogi"),
            ("beta2", "beta2", "second-moment decay of adam and yogi"),
            ("momentum", "beta", "beta of the momentum optimizer"),
        )
    ),
    _s(
        "server_lr_schedule",
        "server learning rate per round, rate@round,... (RoLePRO's two phases: 0.003@0,0.002@3)",
        str,
        (str,),
        "off: the optimizer's lr",
        group="server optimizer",
    ),
    _s(
        "protocol_option",
        "a protocol setting as key=value, repeatable (`secagg protocols` lists each "
        "protocol's settings), e.g. alpha=0.5 or then=regagg; in TOML a list of such strings "
        "or a table",
        parse_option,
        (list, dict),
        "none",
        place="protocol_option",
        metavar="KEY=VALUE",
    ),
    _s(
        "server_blind",
        "the server never learns the global update: clients decrypt it and apply the server "
        "optimizer themselves (NVFlare's model; encrypted backends)",
        parse_bool,
        (bool,),
        "false",
        group="run policy (encrypted backends)",
    ),
    _s(
        "allow_plaintext_updates",
        "let aggregators that are not sums (regmedagg, trimmedmean) receive each client's "
        "update in plaintext on ckks; the audit says so",
        parse_bool,
        (bool,),
        "false",
        group="run policy (encrypted backends)",
    ),
    _s(
        "streaming",
        "fold each upload into a running sum as it arrives, where the protocol's weights are "
        "known before the uploads (fedavg, the FedOpt family, autofedrl, rolepro's FedAvg "
        "phase); the others always buffer",
        parse_bool,
        (bool,),
        "true",
        group="server performance",
    ),
    _s(
        "part_values",
        "move the model, each upload and each release in parts of this many values, so the "
        "server holds one part's sum at a time, not the whole model's (streaming runs of "
        "the FedAvg family; every client's provisioning fixes the same parts); 0: whole",
        int,
        (int,),
        "0",
        group="server performance",
    ),
    _s(
        "workers",
        "run the clients in this many worker processes so they train and encrypt in "
        "parallel (at most one per client); 0 runs them one after another in this process",
        int,
        (int,),
        "0",
        group="server performance",
    ),
    _s(
        "min_clients",
        "the fewest clients a round may go on with: a number, or all (every client of the "
        "run: a pilot that must not lose a site); a set-up or a round that leaves fewer "
        "aborts the seed before anything of it is released",
        parse_min_clients,
        (int, str),
        "1",
    ),
    _s(
        "request_timeout",
        "seconds a simulated client has to answer one request once it is handed it (in "
        "process or in a worker); one that has not answered by then is a dropout for that "
        "request and the round goes on without it (0: none; over Flower the deployment's "
        "--timeout applies instead)",
        float,
        NUM,
        "120",
        group="server performance",
    ),
    _s(
        "threads",
        "torch's intra-op threads for each client process (the in-process clients share "
        "the driver's): 1 by default, since many small models train faster on one thread "
        "each and a busy machine is not oversubscribed (measured: 1,000 SGD steps of a "
        "small MLP on a loaded 2-core machine, 0.38 s against 19 s at torch's default)",
        int,
        (int,),
        "1",
        group="server performance",
    ),
    _s(
        "device",
        "where clients train and the model is evaluated: cpu, cuda, cuda:N, or auto (the "
        "first GPU torch sees, else the CPU; the run says which, and config.json records it); "
        "encryption always runs on the CPU",
        str,
        (str,),
        "cpu",
        group="server performance",
    ),
    _s(
        "imports",
        "your own modules to import first, comma-separated names or .py paths: they "
        "register tasks and protocols (the run records them, so its rerun command and "
        "worker processes import them too)",
        parse_names,
        (list,),
        "none",
        group="experiment",
        metavar="MODULES",
    ),
    _s(
        "out",
        "output folder; must be new or empty unless --overwrite or --resume",
        str,
        (str,),
        "results/<task>-<protocol>-<backend>-<date-time>",
        place="out",
        group="output",
    ),
)


def settings_table() -> dict[str, Setting]:
    """Every setting by key: the experiment's, then each registered protocol's and
    backend's declared options (read now, so later registrations count)."""
    table = {s.key: s for s in CORE}
    for kind, registry in (("protocol", PROTOCOLS), ("backend", BACKENDS)):
        for owner, spec in registry.items():
            for opt in spec.options:
                key = opt.flag.replace("-", "_")
                same = table.get(key)
                if same is not None and (same.place, same.target) == (kind, opt.key):
                    # the same setting in another backend: one flag for both (each backend
                    # resolves its own default where the flag is not given)
                    defaults = same.owner_defaults or ((same.owners[0], same.default),)
                    defaults += ((owner, str(opt.default)),)
                    table[key] = replace(
                        same,
                        owners=(*same.owners, owner),
                        group=f"{same.group}, {owner}",
                        owner_defaults=defaults,
                        default=_defaults_text(defaults),
                    )
                    continue
                if same is not None:
                    raise ConfigError(f"{kind} {owner}'s option {opt.flag} clashes with {key}")
                parse = parse_bool if opt.type is bool else opt.type
                table[key] = Setting(
                    key,
                    opt.help,
                    parse,
                    (bool,) if opt.type is bool else NUM if opt.type is float else (opt.type,),
                    str(opt.default).lower() if opt.type is bool else str(opt.default),
                    place=kind,
                    target=opt.key,
                    owners=(owner,),
                    choices=opt.choices,
                    group=f"{kind} {owner}",
                )
    return table


# ---- reading values -----------------------------------------------------------------------
def coerce(setting: Setting, value: Any, where: str) -> Any:
    """A value from a file, checked and converted like the flag would be."""
    if isinstance(value, str) and str not in setting.toml_types:
        try:
            value = setting.parse(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {setting.key}: {exc}") from None
    elif isinstance(value, bool) and bool not in setting.toml_types:
        raise ConfigError(f"{where}: {setting.key} must be {_kinds(setting)}, got {value!r}")
    elif not isinstance(value, setting.toml_types):
        raise ConfigError(f"{where}: {setting.key} must be {_kinds(setting)}, got {value!r}")
    if setting.key == "client_lr":
        value = str(value)
    if setting.key == "seeds" and not all(
        isinstance(s, int) and not isinstance(s, bool) for s in value
    ):
        raise ConfigError(f"{where}: seeds must be integers, got {value!r}")
    if setting.place == "protocol_option":
        items = value.items() if isinstance(value, dict) else [parse_option(v) for v in value]
        value = dict(items)
    if setting.choices is not None and value not in setting.choices:
        raise ConfigError(
            f"{where}: {setting.key} must be one of {', '.join(map(str, setting.choices))}, "
            f"got {value!r}"
        )
    return value


def _kinds(setting: Setting) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    names.update({list: "a list", dict: "a table"})
    return " or ".join(dict.fromkeys(names[t] for t in setting.toml_types))


def read_file(path: Path) -> dict[str, Any]:
    """Settings from a TOML file (a preset, or a run's config.toml) or a run's config.json."""
    path = Path(path)
    if path.is_dir():
        for name in ("config.toml", "config.json"):
            if (path / name).is_file():
                return read_file(path / name)
        raise ConfigError(f"{path} is a folder without config.toml or config.json")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; `secagg presets` lists presets")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(values, dict) or not isinstance(values.get("settings"), dict):
            raise ConfigError(f"{path} is not a secagg run's config.json (no 'settings')")
        values = values["settings"]
    else:
        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return check_keys(values, str(path))


def imports_named_in(path: Path) -> list[str]:
    """The ``imports`` a settings file (or run folder) names, read before anything else in
    it is checked: the rest may name what they register. Nothing if there is no such file
    (reading it later says what is wrong)."""
    path = Path(path)
    if path.is_dir():
        path = next(
            (path / n for n in ("config.toml", "config.json") if (path / n).is_file()), path
        )
    try:
        text = path.read_text()
        values = (
            json.loads(text).get("settings", {}) if path.suffix == ".json" else tomllib.loads(text)
        )
    except (OSError, ValueError, AttributeError):
        return []
    names = values.get("imports", []) if isinstance(values, dict) else []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


#: the nested tables of earlier versions, and where their keys went
_OLD_TABLES = {
    "server_opt": "server_opt (the name), server_lr, tau, beta1, beta2, momentum",
    "protocol_options": "the protocol's flags (e.g. larc_q) or protocol_option",
    "backend_options": "the backend's flags (e.g. ckks_preset, flooding_bits)",
}


def check_keys(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Known keys with checked values; unknown keys fail with the nearest names.

    The user modules the values name are imported first: a protocol they register brings
    settings of its own."""
    imports = values.get("imports")
    if imports is not None:
        import_user_modules(coerce(next(s for s in CORE if s.key == "imports"), imports, where))
    table = settings_table()
    out: dict[str, Any] = {}
    problems = []
    for key, value in values.items():
        if key in _OLD_TABLES and isinstance(value, dict):
            problems.append(
                f"[{key}] is no longer a table: keys are the flag names, write "
                f"{_OLD_TABLES[key]} at the top level"
            )
        elif key not in table:
            near = difflib.get_close_matches(key, table, n=3)
            problems.append(
                f"unknown setting {key!r}" + (f" (did you mean {', '.join(near)}?)" if near else "")
            )
        else:
            out[key] = coerce(table[key], value, where)
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return out


def preset_names() -> list[str]:
    """The bundled presets' names, sorted (``secagg presets``)."""
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def preset_path(name: str) -> Path:
    path = PRESETS / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; the presets are: {', '.join(preset_names())}")
    return path


def preset_summary(name: str) -> str:
    """What a bundled preset runs: its file's first line, a comment."""
    return preset_path(name).read_text().splitlines()[0].lstrip("# ")


def layer(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win; ``protocol_option`` tables merge key by key."""
    merged: dict[str, Any] = {}
    for values in layers:
        for key, value in values.items():
            if key == "protocol_option":
                value = {**merged.get(key, {}), **value}
            merged[key] = value
    return merged


# ---- settings <-> ExperimentConfig --------------------------------------------------------
def to_config(values: Mapping[str, Any]) -> tuple[ExperimentConfig, str | None]:
    """The configuration the settings describe (validated), and the ``out`` setting.

    A setting of a protocol or backend the run does not use is an error naming it."""
    table = settings_table()
    protocol = values.get("protocol", ExperimentConfig.protocol)
    backend = values.get("backend", ExperimentConfig.backend)
    kwargs: dict[str, Any] = {}
    server_opt: dict[str, Any] = {}
    protocol_options: dict[str, Any] = dict(values.get("protocol_option", {}))
    backend_options: dict[str, Any] = {}
    wrong = []
    for key, value in values.items():
        s = table[key]
        if s.place == "field":
            kwargs[s.target or key] = value
        elif s.place == "server_opt":
            server_opt[s.target] = value
        elif s.place == "protocol":
            if protocol not in s.owners:
                wrong.append(f"{s.flag} ({key}) is a setting of protocol {'/'.join(s.owners)}")
            protocol_options[s.target] = value
        elif s.place == "backend":
            if backend not in s.owners:
                wrong.append(f"{s.flag} ({key}) is a setting of backend {'/'.join(s.owners)}")
            backend_options[s.target] = value
    if wrong:
        raise ConfigError(
            f"settings that do not apply to protocol {protocol} on backend {backend}: "
            + "; ".join(wrong)
            + ". Remove them, or choose the protocol/backend they belong to"
        )
    config = ExperimentConfig(
        **kwargs,
        server_opt=server_opt,
        protocol_options=protocol_options,
        backend_options=backend_options,
    )
    return config.validate(), values.get("out")


def from_config(config: ExperimentConfig) -> dict[str, Any]:
    """The complete settings of ``config``, resolved (the protocol's optimizer and the
    backend's option defaults spelled out): what reruns it exactly, as flat keys."""
    table = settings_table()
    by_target = {
        (s.place, owner, s.target or s.key): s.key
        for s in table.values()
        if s.place in ("field", "server_opt", "protocol", "backend")
        for owner in (s.owners or (None,))
    }
    values: dict[str, Any] = {}
    for f in fields(ExperimentConfig):
        key = by_target.get(("field", None, f.name))
        value = getattr(config, f.name)
        if key is not None and value is not None:
            values[key] = value
    # a protocol that fixes its own server step (ADMM's z-update) takes its settings from
    # the protocol options, not from server_opt
    protocol = make_protocol(config.protocol, **config.protocol_options)
    if piece(protocol, FixedServerStep) is None:
        for name, value in config.optimizer_config().items():
            values[by_target[("server_opt", None, name)]] = value
    generic = {}
    for name, value in config.protocol_options.items():
        key = by_target.get(("protocol", config.protocol, name))
        if key is None:
            generic[name] = value
        else:
            values[key] = value
    if generic:
        values["protocol_option"] = generic
    for name, value in config.resolved_backend_options().items():
        values[by_target[("backend", config.backend, name)]] = value
    return values


def to_toml(values: Mapping[str, Any], *, comment: str = "") -> str:
    """The settings as a TOML file (flat keys; the few values TOML writes as tables are
    inline tables)."""

    def literal(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            if math.isinf(v):
                return "inf" if v > 0 else "-inf"
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(literal(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {literal(x)}" for k, x in v.items()) + " }"
        raise ConfigError(f"cannot write {v!r} to TOML")

    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + "".join(f"{k} = {literal(v)}\n" for k, v in values.items())


# ---- command line -------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser, choices: Mapping[str, Iterable[str]]) -> None:
    """One flag per setting; a flag not given is absent from the namespace (so layers
    below it show through). ``choices`` adds the registries' names (task, protocol ...)."""
    groups: dict[str, Any] = {"experiment": parser}
    for s in settings_table().values():
        if s.group not in groups:
            groups[s.group] = parser.add_argument_group(s.group)
        group = groups[s.group]
        help_text = f"{s.help} (default: {s.default})"
        if s.is_bool:
            group.add_argument(
                s.flag,
                dest=s.key,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        options = list(choices.get(s.key, s.choices or ())) or None
        group.add_argument(
            s.flag,
            *(["--import"] if s.key == "imports" else []),  # the word a user types
            dest=s.key,
            type=_argparse_type(s.parse),
            choices=options,
            metavar=s.metavar or (None if options else s.key.upper()),
            action="append" if s.place == "protocol_option" else "store",
            default=argparse.SUPPRESS,
            help=help_text,
        )


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    table = settings_table()
    values = {k: v for k, v in vars(args).items() if k in table}
    if "protocol_option" in values:
        values["protocol_option"] = dict(values["protocol_option"])
    return values
