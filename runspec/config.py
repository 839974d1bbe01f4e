"""An experiment's configuration: every setting of a run, checked before anything trains.

Light on purpose (no torch): the command line builds, validates and prints configurations
without loading a model. :func:`inapplicable` names the settings that do not apply to the
chosen task, protocol or backend, so that a contradiction fails before training instead of
being ignored.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from secagg.backends import backend_spec, resolve_options
from secagg.clients.tasks import TASKS, get_task
from secagg.dp import ClientDP, ScalarDP
from secagg.errors import ConfigError
from secagg.plugins import import_user_modules, recorded_name
from secagg.protocols import (
    PROTOCOLS,
    default_server_optimizer,
    make_client_half,
    make_protocol,
    protocol_spec,
)
from secagg.protocols.base import Protocol
from secagg.protocols.optimizers import OPTIMIZERS, StepSchedule, make_optimizer
from secagg.protocols.pieces import (
    FixedServerStep,
    ValidationFeedback,
    may_have,
    piece,
    pre_stage_of,
)
from secagg.protocols.registry import check_task
from secagg.server.plan import RunPolicy, TrainingPlan, check_min_clients, check_protocol_run

#: the devices a run may name (whether a GPU is there is checked when clients are built)
DEVICE = re.compile(r"cpu|auto|cuda(:[0-9]+)?")


@dataclass
class ExperimentConfig:
    task: str = "tcga-brca"
    protocol: str = "fedavg"
    backend: str = "plain"
    #: the backend's own options (``secagg.backends.BACKENDS[backend].options``), e.g.
    #: ``{"preset": "wide", "flooding_bits": 30}`` for ckks; defaults fill the rest
    backend_options: dict[str, Any] = field(default_factory=dict)
    rounds: int = 5
    seeds: list[int] = field(default_factory=lambda: [42])
    local_steps: int = 100
    #: local epochs instead of steps (each client: epochs × ceil(n_k / batch) steps)
    local_epochs: int | None = None
    batch_size: int = 8
    client_lr: str = "0.1"  # a StepSchedule: "0.1" or "5e-5@0,5e-6@7"
    server_opt: dict[str, Any] = field(default_factory=dict)  # overrides the protocol default
    protocol_options: dict[str, Any] = field(default_factory=dict)
    #: LARC paper's second protocol: per-client random train/test split with this test share
    client_split: float | None = None
    #: number of distinct splits; run seed s uses split s % client_split_count (None: one each)
    client_split_count: int | None = None
    #: the server never learns the global update; clients apply the optimizer (ckks only)
    server_blind: bool = False
    #: let aggregators that are not sums (median, trimmed mean) see plaintext updates on ckks
    allow_plaintext_updates: bool = False
    #: server learning rate schedule ("0.003@0,0.002@3"); None keeps the optimizer's lr
    server_lr_schedule: str | None = None
    #: FedDisco: rounds of federated β-VAE training before the classifier, and its client lr
    vae_rounds: int = 10
    vae_lr: float = 0.1
    vae_beta: float = 0.1
    #: share of each client's training samples held out as its validation set (Auto-FedRL's
    #: reward); the same fixed split for every seed and protocol
    validation_split: float | None = None
    #: FedProx's proximal weight μ (0: plain local SGD)
    fedprox_mu: float = 0.0
    #: sample-level DP-SGD on every client (Opacus): {"clip": C, "noise": z} or
    #: {"clip": C, "epsilon": ε} (ε for the whole run at dp_delta)
    dp_sgd: dict[str, float] | None = None
    #: client-level DP: {"clip": C, "noise": z*} — clients clip their update to C and add
    #: their share of noise so that K equal weights give multiplier z* on the revealed sum
    client_dp: dict[str, float] | None = None
    #: revealed scalars clipped to [low, high] and noised: {"low", "high", "noise"}
    scalar_dp: dict[str, float] | None = None
    dp_delta: float = 1e-5
    #: where clients' DP noise comes from: "os" (generators seeded from the OS CSPRNG, the
    #: default) or "seeded" (from the run's seed: only to reproduce a simulation bit for
    #: bit; insecure, since anyone who knows the seed can predict and remove the noise)
    dp_noise: str = "os"
    #: fold uploads into a running sum as they arrive, where the protocol's weights allow it
    streaming: bool = True
    #: move the model, uploads and releases in parts of this many values (``secagg.parts``);
    #: 0: the model whole
    part_values: int = 0
    #: run the clients in this many worker processes (in parallel); 0: in this process
    workers: int = 0
    #: seconds a simulated client has to answer one request, from when it is handed the
    #: request (in process or in a worker); one that has not answered by then is a dropout
    #: for that request. 0: no deadline. (Over Flower the App's ``timeout`` sets it.)
    request_timeout: float = 120.0
    #: the fewest clients a round may go on with (an int, or "all": every client of the
    #: run); fewer, and the seed is aborted before anything of that round is released
    min_clients: int | str = 1
    #: torch's intra-op threads per client process (in-process clients share this one)
    threads: int = 1
    #: where clients train and the experimenter evaluates: "cpu", "cuda", "cuda:N", or
    #: "auto" (the first GPU where torch sees one, else the CPU)
    device: str = "cpu"
    #: the researcher's own modules (names or .py paths), imported before anything else is
    #: checked: they register tasks and protocols (``secagg.plugins``)
    imports: list[str] = field(default_factory=list)

    def validate(self) -> ExperimentConfig:
        """Check every setting (ConfigError, naming what to do, at the first problem) and
        return the configuration: its names, its numbers, its DP, how it executes, then
        what the protocol, the backend and the run make of each other."""
        if not isinstance(self.imports, list):
            raise ConfigError(f"imports must be a list of module names, got {self.imports!r}")
        import_user_modules(self.imports)
        # recorded so that the rerun command finds them from any folder
        self.imports = [recorded_name(n) for n in self.imports]
        self._check_names()
        self._check_numbers()
        self._check_dp()
        self._check_execution()
        resolve_options(self.backend, self.backend_options)
        protocol = make_protocol(self.protocol, **self.protocol_options)  # built once
        problems = inapplicable(self, protocol)
        if problems:
            raise ConfigError("; ".join(problems))
        self._check_run(protocol)
        return self

    def _check_names(self) -> None:
        """The task, device, protocol and backend exist, and the protocol fits the task."""
        get_task(self.task)
        if not isinstance(self.device, str) or not DEVICE.fullmatch(self.device):
            raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}")
        protocol_spec(self.protocol)  # an unknown name fails there, naming the choices
        check_task(self.protocol, self.task, list(TASKS))  # e.g. coxph on tcga-brca
        backend_spec(self.backend)  # an unknown name fails there, naming the choices

    def _check_numbers(self) -> None:
        """The training's counts, seeds, splits and FedProx's μ."""
        if self.local_epochs is not None and (
            not isinstance(self.local_epochs, int) or self.local_epochs < 1
        ):
            raise ConfigError(f"local_epochs must be a positive integer, got {self.local_epochs!r}")
        for key in ("rounds", "local_steps", "batch_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        if not self.seeds or not all(isinstance(s, int) for s in self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of integers, got {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds repeat: {self.seeds}")
        if self.client_split is not None and not 0 < self.client_split < 1:
            raise ConfigError(f"client_split must lie in (0, 1), got {self.client_split}")
        if self.validation_split is not None and not 0 < self.validation_split < 1:
            raise ConfigError(f"validation_split must lie in (0, 1), got {self.validation_split}")
        if not isinstance(self.fedprox_mu, (int, float)) or not self.fedprox_mu >= 0:
            raise ConfigError(f"fedprox_mu must be a number >= 0, got {self.fedprox_mu!r}")

    def _check_execution(self) -> None:
        """Where the noise comes from, the workers, deadlines, quorum, threads and splits."""
        if self.dp_noise not in ("seeded", "os"):
            raise ConfigError(f"dp_noise must be 'seeded' or 'os', got {self.dp_noise!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ConfigError(f"workers must be an integer >= 0, got {self.workers!r}")
        timeout = self.request_timeout
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not 0 <= timeout < float("inf")
        ):
            raise ConfigError(
                f"request_timeout must be seconds >= 0 (0: no deadline), got {timeout!r}"
            )
        check_min_clients(self.min_clients)
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ConfigError(f"threads must be an integer >= 1, got {self.threads!r}")
        if self.client_split_count is not None and (
            self.client_split is None or self.client_split_count < 1
        ):
            raise ConfigError("client_split_count needs client_split and must be positive")

    def _check_run(self, protocol: Protocol) -> None:
        """The schedules and the server optimizer parse, the client half builds, and the
        protocol, the backend and the run's policy make a run: the generic checks
        (``check_protocol_run``), the backend's (``BackendSpec.check_run``), then the
        protocol's own (``Protocol.check_run``)."""
        StepSchedule.parse(self.client_lr, "client-lr")
        if self.server_lr_schedule is not None:
            StepSchedule.parse(self.server_lr_schedule, "server-lr")
        make_optimizer({**self.optimizer_config(protocol), "dim": 1})
        make_client_half(self.protocol, **self.protocol_options)
        spec = backend_spec(self.backend)
        check_protocol_run(
            protocol,
            backend=self.backend,
            backend_can_read=spec.server_reads_uploads,
            policy=self.policy(),
            client_dp=self.client_dp is not None,
            validation=self.validation_split is not None,
        )
        spec.check_run(self, protocol.capabilities)
        type(protocol).check_run(self)
        participation = self.resolved_backend_options().get("participation")
        if participation in ("fixed", "groups") and protocol.capabilities.selects_contributors:
            raise ConfigError(
                f"{self.protocol} picks each round's contributors by their data, and "
                f"participation {participation} releases only sums over the run's one "
                "contributor set or its whole groups: run it with --participation per-round "
                "and --client-dp clip=C,noise=Z (client DP then covers the run), or on plain"
            )
        if participation == "per-round" and self.client_dp is None:
            raise ConfigError(
                "participation per-round lets the server choose each round's contributors, "
                "and sums over sets that change give an update by difference once uploads "
                "repeat: it holds only with client-level DP, whose accountant composes every "
                "release of the run. Add --client-dp clip=C,noise=Z, or keep --participation "
                "fixed (the default: a client that does not answer pauses releases)"
            )

    def _check_dp(self) -> None:
        """The three DP settings' keys and values, and δ."""
        if self.dp_sgd is not None:
            if isinstance(self.dp_sgd, dict) and "clip" not in self.dp_sgd:
                raise ConfigError(
                    "dp_sgd needs a per-sample clip norm as well: write clip=C,epsilon=E or "
                    f"clip=C,noise=Z (e.g. clip=1.0,epsilon=3), got {self.dp_sgd!r}"
                )
            _need("dp_sgd", self.dp_sgd, ("clip",), ("noise", "epsilon"))
            if ("noise" in self.dp_sgd) == ("epsilon" in self.dp_sgd):
                raise ConfigError("dp_sgd needs exactly one of noise=z and epsilon=ε")
            if self.fedprox_mu:
                raise ConfigError("FedProx with DP-SGD is not supported")
        _need("client_dp", self.client_dp, ("clip", "noise"))
        _need("scalar_dp", self.scalar_dp, ("low", "high", "noise"))
        if not 0 < self.dp_delta < 1:
            raise ConfigError(f"dp_delta must lie in (0, 1), got {self.dp_delta}")
        self._check_dp_values()

    def _check_dp_values(self) -> None:
        """Each DP setting's values: numbers, in their ranges."""
        for name, spec in (
            ("dp_sgd", self.dp_sgd),
            ("client_dp", self.client_dp),
            ("scalar_dp", self.scalar_dp),
        ):
            for key, v in (spec or {}).items():
                if not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ConfigError(f"{name}: {key} must be a number, got {v!r}")
        if self.client_dp is not None:
            ClientDP(self.client_dp["clip"], self.client_dp["noise"], 1)
        if self.scalar_dp is not None:
            ScalarDP(self.scalar_dp["low"], self.scalar_dp["high"], self.scalar_dp["noise"])
        if self.dp_sgd is not None:
            if not self.dp_sgd["clip"] > 0:
                raise ConfigError(f"dp_sgd: clip must be > 0, got {self.dp_sgd['clip']}")
            # it holds exactly one of the two (checked above)
            level = self.dp_sgd["noise"] if "noise" in self.dp_sgd else self.dp_sgd["epsilon"]
            if not level > 0:
                raise ConfigError("dp_sgd: noise or epsilon must be > 0")

    def optimizer_config(self, protocol: Protocol | None = None) -> dict[str, Any]:
        """The server optimizer's settings: the protocol's default updated by ``server_opt``,
        or the step the protocol fixes (ADMM's z-update; its block count is the run's).
        ``protocol``: the run's, if the caller has it built (else it is built only if its
        class may fix a step)."""
        if protocol is None and may_have(protocol_spec(self.protocol).protocol, FixedServerStep):
            protocol = make_protocol(self.protocol, **self.protocol_options)
        step = piece(protocol, FixedServerStep) if protocol is not None else None
        if step is not None:
            return step.server_step(None)
        cfg = default_server_optimizer(self.protocol)
        if "name" in self.server_opt and self.server_opt["name"] != cfg["name"]:
            cfg = {"name": self.server_opt["name"]}  # a different optimizer: its own defaults
        cfg.update(self.server_opt)
        return cfg

    def policy(self) -> RunPolicy:
        options = self.resolved_backend_options()
        return RunPolicy(
            server_blind=self.server_blind,
            allow_plaintext_updates=self.allow_plaintext_updates,
            streaming=self.streaming,
            part_values=self.part_values,
            min_clients=self.min_clients,
            # the encrypted backends' clients require the cap; plain has it off unless set
            max_weight_share=float(options.get("max_weight_share", 1.0)),
        )

    def plan(self, n_clients: int) -> TrainingPlan:
        return TrainingPlan(
            client_lr=StepSchedule.parse(self.client_lr, "client-lr"),
            local_steps=self.local_steps,
            local_epochs=self.local_epochs,
            prox_mu=float(self.fedprox_mu),
            client_dp=(
                ClientDP(self.client_dp["clip"], self.client_dp["noise"], n_clients)
                if self.client_dp
                else None
            ),
            scalar_dp=(
                ScalarDP(self.scalar_dp["low"], self.scalar_dp["high"], self.scalar_dp["noise"])
                if self.scalar_dp
                else None
            ),
            reports=(
                {
                    "dp_sgd_epsilon": {"delta": self.dp_delta},
                    "dp_sgd_noise_multiplier": {},
                    "dp_sgd_sample_rate": {},
                    "dp_sgd_steps": {},
                }
                if self.dp_sgd
                else {}
            ),
        )

    def resolved_backend_options(self) -> dict[str, Any]:
        """The backend's options with defaults filled in. A backend with presets gives the
        run its default preset by the protocol (:meth:`~secagg.backends.PresetFamily.for_run`:
        the client-weighted one where the protocol fixes its weights before the uploads, the
        run streams and the protocol needs no precise sums — ckks's and threshold's ``lean``
        — else the default: ckks's ``compact``, threshold's ``wide``)."""
        options = dict(self.backend_options)
        if "preset" not in options:
            caps = PROTOCOLS[self.protocol].protocol.capabilities
            preset = backend_spec(self.backend).default_preset(
                streams=caps.streams and self.streaming, precise_sums=caps.precise_sums
            )
            if preset is not None:
                options["preset"] = preset
        return resolve_options(self.backend, options)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "resolved_server_opt": self.optimizer_config(),
            "resolved_backend_options": self.resolved_backend_options(),
        }


def _need(name: str, value: Any, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """ConfigError unless ``value`` (None: not set) is a dict of exactly ``keys`` and some
    of ``optional``."""
    if value is None:
        return
    if (
        not isinstance(value, dict)
        or not set(keys) <= set(value)
        or not set(value) <= set(keys) | set(optional)
    ):
        raise ConfigError(
            f"{name} takes {', '.join(keys)}"
            + (f" (and optionally {', '.join(optional)})" if optional else "")
            + f", got {value!r}"
        )


def optimizer_settings(name: str) -> set[str] | None:
    """The hyperparameters server optimizer ``name`` takes (None: not registered)."""
    if name not in OPTIMIZERS:
        return None
    params = inspect.signature(OPTIMIZERS[name].__init__).parameters
    return set(params) - {"self", "dim"}


def _stray_vae_settings(
    config: ExperimentConfig, changed: set[str], pre_stage: str | None
) -> list[str]:
    """The β-VAE settings (this configuration's ``vae_*`` fields, which FedDisco's pre-stage
    reads) given to a run without that pre-stage."""
    stray = sorted(changed & {"vae_rounds", "vae_lr", "vae_beta"})
    if pre_stage == "beta-vae" or not stray:
        return []
    return [
        f"{', '.join(stray)} configure the beta-VAE pre-stage of feddisco; "
        f"{config.protocol} has no beta-VAE pre-stage"
        + (
            " (dec's autoencoder: --dec-pretrain-rounds, --dec-pretrain-lr)"
            if pre_stage == "autoencoder"
            else ""
        )
    ]


def inapplicable(config: ExperimentConfig, protocol: Protocol | None = None) -> list[str]:
    """Settings changed from their defaults that the run would ignore, each named with what
    to do. (A protocol's or backend's own option given for another one is caught where the
    settings are read, :func:`secagg.runspec.settings.to_config`.) ``protocol``: the run's,
    if the caller has it built."""
    default = ExperimentConfig()
    changed = {
        f.name
        for f in fields(ExperimentConfig)
        if f.name not in ("seeds", "server_opt", "protocol_options", "backend_options")
        and getattr(config, f.name) != getattr(default, f.name)
    }
    if protocol is None:
        protocol = make_protocol(config.protocol, **config.protocol_options)
    capabilities, pre_stage = protocol.capabilities, pre_stage_of(protocol)
    out = []
    if config.local_epochs is not None and "local_steps" in changed:
        out.append(
            f"local_steps {config.local_steps} and local_epochs {config.local_epochs} both "
            "set the clients' work per round: give one of them"
        )
    out += _stray_vae_settings(config, changed, pre_stage)
    if config.dp_sgd is None and config.client_dp is None and config.scalar_dp is None:
        stray = sorted(changed & {"dp_delta", "dp_noise"})
        if stray:
            out.append(
                f"{', '.join(stray)} apply only with differential privacy "
                "(dp_sgd, client_dp or scalar_dp), and none is on"
            )
    step = piece(protocol, FixedServerStep)
    fixed = step.server_step(None) if step is not None else None
    if fixed is not None and config.server_opt:
        out.append(
            f"{config.protocol} fixes its server step ({fixed['name']}), so server optimizer "
            f"settings ({', '.join(sorted(config.server_opt))}) do not apply: drop them"
        )
    optimizer = config.optimizer_config(protocol)
    takes = optimizer_settings(optimizer["name"]) or set()
    stray = sorted(set(optimizer) - {"name"} - takes) if takes else []
    if stray:
        flag = {"lr": "server_lr", "beta": "momentum"}
        out.append(
            f"{', '.join(flag.get(k, k) for k in stray)} "
            f"{'does' if len(stray) == 1 else 'do'} not apply to server optimizer "
            f"{optimizer['name']} (it takes {', '.join(flag.get(k, k) for k in sorted(takes))}); "
            "choose another with server_opt"
        )
    if config.validation_split is not None and piece(protocol, ValidationFeedback) is None:
        out.append(
            f"validation_split holds out samples for a protocol that rewards validation loss "
            f"(autofedrl); {config.protocol} would only train on fewer samples"
        )
    if not config.streaming and not capabilities.streams:
        out.append(
            f"streaming off changes nothing for {config.protocol}, which always buffers "
            "its uploads (it weighs them after they arrive)"
        )
    return out
