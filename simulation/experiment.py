"""The experiment driver: builds clients and server, runs seeds, evaluates.

This is the only place that imports both ``secagg.clients`` and ``secagg.server``: it plays
the part of the network (an in-process transport by default, worker processes with
``workers``, or any transport the caller injects) and of the experimenter, who evaluates the
global model on the pooled test set — data no party of the protocol holds.

It reads nothing from client objects: everything it learns about a run comes through the
server's messages. In server-blind runs the experimenter's copy of the model arrives sealed
for the experimenter's own X25519 key (the server relays bytes it cannot open); DP-SGD's ε
is a number each client reports with its upload; FedDisco's β-VAE is a federated pre-stage
whose model the server hands to the clients in a declared message.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import torch

from secagg.backends import (
    Provision,
    make_client_backend,
    make_server_backend,
    provision,
    public_signers,
)
from secagg.clients.tasks import (
    TASKS,
    ClientData,
    FederatedData,
    Task,
    custom_tasks,
    get_task,
    register_task,
)
from secagg.clients.tasks.tcga_brca import random_client_splits
from secagg.clients.tasks.vae import BetaVAE, autoencoding, reconstruction_score, vae_loss
from secagg.clients.training import LocalTrainer, flat_params, resolve_device
from secagg.errors import ConfigError, RoundAborted
from secagg.plugins import import_user_modules
from secagg.protocols import (
    PROTOCOLS,
    custom_protocols,
    make_client_half,
    make_protocol,
    register_protocol,
)
from secagg.protocols.dec import DEC, data_layout
from secagg.protocols.optimizers import StepSchedule, make_optimizer
from secagg.server.audit import AuditLog
from secagg.server.engine import Server
from secagg.server.transport import InProcessTransport, Transport
from secagg.simulation.config import ExperimentConfig
from secagg.simulation.evaluation import evaluate
from secagg.simulation.privacy import client_level_epsilon, scalar_epsilons, scalar_release_counts
from secagg.simulation.workers import WorkerPoolTransport

if TYPE_CHECKING:  # client-side and key code: imported where a client or key is made, so
    # that a server process running this driver (secagg.flower's ServerApp) loads none of it
    from secagg.clients.policy import ClientPolicy
    from secagg.clients.privacy import PrivateTrainer
    from secagg.clients.runtime import Client


@dataclass
class SeedRun:
    rows: list[dict[str, Any]]  # one per round, round 0 = the initial model
    final_params: np.ndarray
    #: why the run stopped early (a round with no usable client), else None
    aborted: str | None = None
    #: client-level DP: one record per round (``Server.privacy_events``)
    privacy_events: list[dict[str, Any]] = field(default_factory=list)
    #: the protocol's own predictions for the pooled test set after the last round
    #: (Ensemble), else None
    final_predictions: np.ndarray | None = None


@dataclass
class ExperimentResult:
    metrics: pd.DataFrame
    audit: AuditLog
    final_params: dict[int, np.ndarray]  # per seed
    #: seeds whose run was aborted, with the reason
    aborted: dict[int, str] = field(default_factory=dict)
    #: client-level DP per seed: each round's releases and realised multipliers
    privacy_events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def __iter__(self):  # ``metrics, audit = run_experiment(...)`` keeps working
        return iter((self.metrics, self.audit))


# ---- clients ----------------------------------------------------------------------------------
def vae_task(config: ExperimentConfig, data: FederatedData) -> Task:
    """FedDisco's pre-stage task: the β-VAE on the same clients' samples."""
    n_in = data.train[0].x.shape[1]
    return Task(
        "beta-vae",
        "β-VAE on the task's samples",
        lambda: autoencoding(data),
        lambda: BetaVAE(n_in),
        partial(vae_loss, beta=config.vae_beta),
        reconstruction_score,
        "-MSE",
    )


def autoencoder_task(config: ExperimentConfig, data: FederatedData) -> Task:
    """DEC's pre-stage task: the stacked denoising autoencoder on the same clients' samples."""
    from secagg.clients.tasks.dec import make_autoencoder, reconstruction_error

    shape = data_layout(data)
    return Task(
        "autoencoder",
        "stacked denoising autoencoder on the task's samples (DEC's step 1)",
        lambda: autoencoding(data),
        lambda: make_autoencoder(shape["sizes"][0], shape["k"]),
        reconstruction_error,
        reconstruction_score,
        "-MSE",
        optimizer=torch.optim.Adam,
    )


@dataclass
class ClientFactory:
    """Builds a seed's clients (picklable, so worker processes build them too): each loads
    the task's data itself and makes the same clients in any process.

    ``stage``: None for the run itself, or the name of the protocol's pre-stage. The task
    and protocols registered outside secagg that the run uses travel along and are
    registered again in workers (only those: another one need not be importable there).
    """

    config: ExperimentConfig
    seed: int
    stage: str | None = None
    observer_public: bytes | None = None
    custom: tuple[dict, dict] | None = None
    #: each client's identity key, the roster and the decryption budget (the driver
    #: provisions them, as a deployment provisions node keys); never the server's to set
    provisions: dict[str, Provision] | None = None

    def __post_init__(self):
        if self.custom is None:
            used = {self.config.protocol, self.config.protocol_options.get("then")}
            self.custom = (
                {k: v for k, v in custom_tasks().items() if k == self.config.task},
                {k: v for k, v in custom_protocols().items() if k in used},
            )

    def __call__(self, ids: list[str], *, loaded: FederatedData | None = None) -> dict[str, Client]:
        """The clients ``ids`` of this seed. ``loaded``: the task's data as ``task.load()``
        gives it, if the caller has it already (a Flower node's message builds budgets and
        client from one load)."""
        import_user_modules(self.config.imports)  # a worker process's first sight of them
        tasks, protocols = self.custom or ({}, {})
        for name, task in tasks.items():
            register_task(name, task, replace=True)
        for name, spec in protocols.items():
            register_protocol(
                name,
                spec.protocol,
                default_optimizer=spec.default_optimizer,
                summary=spec.summary,
                replace=True,
            )
        config = self.config
        task = get_task(config.task)
        data, validation = seed_data(config, self.seed, loaded or task.load())
        if self.stage is not None:
            task = STAGES[self.stage].task(config, data)
            data, validation = task.load(), [None] * data.n_clients
        policy = self.client_policy(flat_params(task.make_model()).size, data.n_clients)
        return {
            cid: self._build(task, data.train[k], validation[k], k, cid, policy)
            for cid, k in ((c, int(c.rsplit("_", 1)[1])) for c in ids)
        }

    def client_policy(self, n_params: int, n_clients: int) -> ClientPolicy:
        """What each client of this seed (or pre-stage) answers, from this factory's own
        configuration: what a deployment's node provisions itself with (:func:`client_policy`)."""
        config = self.config
        protocol = make_protocol(config.protocol, **config.protocol_options)
        if self.stage is not None:
            spec = STAGES[self.stage]
            config, protocol = spec.configure(config), make_protocol(spec.protocol)
        return client_policy(config, protocol, n_params, n_clients)

    def release_budgets(self, *, loaded: FederatedData | None = None) -> dict[str, Any]:
        """The budgets the driver provisions for this seed's (or pre-stage's) run, computed
        from this factory's own configuration: what a deployment's node provisions itself
        with (:func:`release_budgets`). ``loaded``: the task's data, as for ``__call__``."""
        config = self.config
        protocol = make_protocol(config.protocol, **config.protocol_options)
        task = get_task(config.task)
        loaded = loaded or task.load()
        if self.stage is not None:
            spec = STAGES[self.stage]
            task = spec.task(config, seed_data(config, self.seed, loaded)[0])
            config, protocol = spec.configure(config), make_protocol(spec.protocol)
        data = task.load() if self.stage is not None else loaded
        if self.stage is None:
            data = seed_data(config, self.seed, data)[0]
        return release_budgets(config, protocol, flat_params(task.make_model()).size, data)

    def _noise_seed(self, reproducible: int) -> int:
        """The seed of a client's DP noise (and DP-SGD's sampling): from the run's seed, or
        fresh from the OS CSPRNG when ``dp_noise`` is "os"."""
        return reproducible if self.config.dp_noise == "seeded" else secrets.randbits(63)

    def _build(
        self,
        task: Task,
        part: ClientData,
        validation: ClientData | None,
        k: int,
        cid: str,
        policy: ClientPolicy,
    ) -> Client:
        """Client k: its data, a trainer whose batch order the seed fixes, its halves of the
        backend and of the protocol."""
        from secagg.clients.privacy import make_private
        from secagg.clients.runtime import Client

        config, seed = self.config, self.seed
        local = LocalTrainer(
            task.make_model(),
            part,
            task.loss,
            config.batch_size,
            seed=seed * 1000 + k,
            penalty=task.penalty,
            schedule=task.schedule() if task.schedule is not None else None,
            optimizer=task.optimizer,
            device=resolve_device(config.device),
        )
        trainer: LocalTrainer | PrivateTrainer = local
        protocol, options = config.protocol, config.protocol_options
        if self.stage is not None:
            protocol, options = STAGES[self.stage].protocol, {}
        elif config.dp_sgd is not None:
            trainer = make_private(
                local,
                max_grad_norm=config.dp_sgd["clip"],
                total_steps=config.rounds * local_steps_of(config, part),
                noise_multiplier=config.dp_sgd.get("noise"),
                target_epsilon=config.dp_sgd.get("epsilon"),
                delta=config.dp_delta,
                seed=self._noise_seed(seed * 1000 + k),
            )
        return Client(
            cid,
            trainer,
            make_client_backend(
                config.backend,
                cid,
                config.resolved_backend_options(),
                (self.provisions or {}).get(cid, Provision()),
            ),
            policy=policy,
            protocol=make_client_half(protocol, **options),
            validation=validation,
            seed=self._noise_seed(seed * 1000 + k + 500),
            observer_public=self.observer_public,
        )


#: (clients factory, client ids) -> a transport; the default is in-process or workers
TransportFactory = Callable[[ClientFactory, list[str]], Transport]


def default_transport(factory: ClientFactory, ids: list[str]) -> Transport:
    if factory.config.workers:
        return WorkerPoolTransport(
            factory, ids, factory.config.workers, torch_threads=factory.config.threads
        )
    clients = factory(ids)
    return InProcessTransport({cid: c.handle for cid, c in clients.items()})


def seed_data(
    config: ExperimentConfig, seed: int, data: FederatedData
) -> tuple[FederatedData, Sequence[ClientData | None]]:
    """The clients' training data for a seed (its own random split, if the run asks for
    one) and their validation sets."""
    if config.client_split is not None:
        split = seed % config.client_split_count if config.client_split_count else seed
        data = random_client_splits(data, split, config.client_split)
    validation: Sequence[ClientData | None] = [None] * data.n_clients
    if config.validation_split is not None:
        data, validation = hold_out_validation(data, config.validation_split)
    return data, validation


# ---- pre-stages ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """A federated pre-stage a protocol asks for (``Capabilities.pretrain``): its task, the
    protocol and settings it runs with, and the layout the main protocol receives."""

    task: Callable[[ExperimentConfig, FederatedData], Task]
    protocol: str
    configure: Callable[[ExperimentConfig], ExperimentConfig]
    layout: Callable[[FederatedData], dict[str, Any]]
    #: raises ConfigError before training if the task's data cannot carry the stage
    check: Callable[[ExperimentConfig, FederatedData], None]


def check_unit_features(config: ExperimentConfig, data: FederatedData) -> None:
    """The β-VAE's decoder ends in a sigmoid: it reconstructs features in [0, 1] only."""
    x = torch.cat([part.x for part in data.train])
    low, high = float(x.min()), float(x.max())
    if low < 0 or high > 1:
        raise ConfigError(
            f"{config.protocol} pre-trains a beta-VAE whose decoder reconstructs features in "
            f"[0, 1] (a sigmoid output), but task {config.task}'s features span "
            f"[{low:.3g}, {high:.3g}]; use a task with features in [0, 1] (e.g. digits-niid2)"
        )


def check_dec_task(config: ExperimentConfig, data: FederatedData) -> None:
    """DEC's model is its encoder and k centroids for this data: a dec-* task's."""
    shape = data_layout(data)
    expected = shape["n_encoder"] + shape["k"] * shape["sizes"][-1]
    n_params = flat_params(get_task(config.task).make_model()).size
    if n_params != expected:
        dec_tasks = ", ".join(name for name in TASKS if name.startswith("dec-"))
        raise ConfigError(
            f"{config.protocol} clusters with DEC's encoder and centroids ({expected} values "
            f"for this data), but task {config.task}'s model has {n_params}; use a DEC task "
            f"({dec_tasks})"
        )


def pre_stage_config(config: ExperimentConfig, rounds: int, lr: float) -> ExperimentConfig:
    """A pre-stage runs FedAvg on the run's clients for ``rounds`` at client rate ``lr``."""
    return replace(
        config,
        protocol="fedavg",
        # the stage's clients are the run's: the run's preset, not fedavg's default
        backend_options=config.resolved_backend_options(),
        server_opt={},
        protocol_options={},
        rounds=rounds,
        client_lr=str(lr),
        server_lr_schedule=None,
        client_split=None,
        dp_sgd=None,
        client_dp=None,
        scalar_dp=None,
    )


def pretrain_settings(config: ExperimentConfig) -> tuple[int, float]:
    """DEC's autoencoder stage: its rounds and client rate are protocol options."""
    protocol = make_protocol(config.protocol, **config.protocol_options)
    if not isinstance(protocol, DEC):
        raise ConfigError(f"the autoencoder pre-stage is DEC's, not {config.protocol}'s")
    return protocol.pretrain_rounds, protocol.pretrain_lr


STAGES: dict[str, Stage] = {
    "beta-vae": Stage(
        vae_task,
        "fedavg",
        lambda c: pre_stage_config(c, c.vae_rounds, c.vae_lr),
        lambda data: {"n_in": int(data.train[0].x.shape[1]), "hidden": 32, "latent": 4},
        check_unit_features,
    ),
    "autoencoder": Stage(
        autoencoder_task,
        "fedavg",
        lambda c: pre_stage_config(c, *pretrain_settings(c)),
        data_layout,
        check_dec_task,
    ),
}


# ---- one seed ---------------------------------------------------------------------------------
class Recorder(Protocol):
    """Receives results as they are made (``secagg.simulation.outputs.RunFolder`` writes
    them to disk, so that an interrupted run keeps them)."""

    def on_round(self, seed: int, row: dict[str, Any]) -> None: ...

    def on_seed(self, seed: int, run: SeedRun, audit: AuditLog) -> None: ...


#: (seed, round, global model after that round)
ModelCallback = Callable[[int, int, np.ndarray], None]

#: server-blind runs: the experimenter of a seed, ``(seed) -> observer`` with
#: ``public_bytes`` (the key clients seal the model for) and ``open(blob, context)``, which
#: returns the model's bytes, or None where the experimenter is a party that is not this
#: process and evaluates the sealed copies later (``secagg.flower.experimenter``). Default:
#: ``secagg.sealing.Observer``, a fresh key pair per seed in this process.
ExperimenterFactory = Callable[[int], Any]

#: set by ``secagg.simulation.api``'s SIGINT handler: a Ctrl-C that CPython swallowed (one
#: that lands in an import-lock or finalizer callback is "ignored") still stops the run at
#: the next round or seed
INTERRUPTED = threading.Event()


def stop_if_interrupted() -> None:
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


def run_seed(
    config: ExperimentConfig,
    seed: int,
    audit: AuditLog,
    data: FederatedData | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    transport_factory: TransportFactory | None = None,
    on_round: Callable[[int, dict[str, Any]], None] | None = None,
    signers: Mapping[str, bytes] | None = None,
    on_model: ModelCallback | None = None,
    experimenter: ExperimenterFactory | None = None,
) -> SeedRun:
    """One federated run, evaluated after every round. ``signers``: the clients' public
    signing keys where a deployment provisioned the clients (their nodes hold the private
    keys); without them the driver provisions fresh identities for the run. ``on_model``
    gets (seed, round, global model) after every round (benchmarks that trace the iterates,
    e.g. ADMM's distance to the optimum)."""
    task = get_task(config.task)
    data, _ = seed_data(config, seed, data if data is not None else task.load())
    protocol = make_protocol(config.protocol, **config.protocol_options)
    protocol.seed(seed)
    make_transport = transport_factory or default_transport
    stage = protocol.capabilities.pretrain
    if stage is not None:
        spec = STAGES[stage]
        pre = _run(
            spec.configure(config),
            seed,
            audit,
            spec.task(config, data),
            data,
            make_protocol(spec.protocol),
            ClientFactory(config, seed, stage=stage),
            make_transport,
            progress,
            label=f"{seed}-{stage}",
            signers=signers,
        )
        if pre.aborted:
            return SeedRun(pre.rows[:0], pre.final_params, f"{stage}: {pre.aborted}")
        protocol.use_pretrained(pre.final_params, spec.layout(data))
    observer = None
    if config.server_blind and experimenter is not None:
        observer = experimenter(seed)
    elif config.server_blind:
        from secagg.sealing import Observer  # the experimenter's private key

        observer = Observer()
    factory = ClientFactory(
        config, seed, observer_public=observer.public_bytes if observer else None
    )
    return _run(
        config,
        seed,
        audit,
        task,
        data,
        protocol,
        factory,
        make_transport,
        progress,
        label=str(seed),
        observer=observer,
        on_round=on_round,
        signers=signers,
        on_model=on_model,
    )


def _run(
    config: ExperimentConfig,
    seed: int,
    audit: AuditLog,
    task: Task,
    data: FederatedData,
    protocol,
    factory: ClientFactory,
    make_transport: TransportFactory,
    progress,
    label: str,
    observer: Any = None,
    on_round: Callable[[int, dict[str, Any]], None] | None = None,
    signers: Mapping[str, bytes] | None = None,
    on_model: ModelCallback | None = None,
) -> SeedRun:
    task_data = task.load() if factory.stage is not None else data
    torch.manual_seed(seed)  # FLamby: the seed fixes the initial model (and the clients'
    initial = flat_params(task.make_model())  # batch order)
    ids = [f"client_{k}" for k in range(task_data.n_clients)]
    if config.backend != "plain" and factory.provisions is None and signers is None:
        factory = replace(
            factory,
            provisions=provision(ids, **release_budgets(config, protocol, initial.size, task_data)),
        )
    transport = make_transport(factory, ids)
    try:
        audit.run = label
        server = Server(
            protocol,
            make_server_backend(
                config.backend,
                config.resolved_backend_options(),
                signers if signers is not None else public_signers(factory.provisions or {}),
            ),
            make_optimizer({**server_step(config, protocol, len(ids)), "dim": initial.size}),
            transport,
            initial,
            plan=config.plan(len(transport.peers)),
            policy=config.policy(),
            server_lr=(
                StepSchedule.parse(config.server_lr_schedule, "server-lr")
                if config.server_lr_schedule
                else None
            ),
            audit=audit,
        )
        return _rounds(
            config,
            seed,
            audit,
            task,
            task_data,
            server,
            protocol,
            progress,
            observer,
            on_round,
            on_model,
        )
    finally:
        close = getattr(transport, "close", None)
        if close is not None:
            close()


def server_step(config: ExperimentConfig, protocol, n_clients: int) -> dict[str, Any]:
    """The server optimizer's config: the run's, or the step the protocol fixes (ADMM's
    z-update, for this run's number of clients; the config refuses optimizer settings)."""
    fixed = protocol.server_step(n_clients)
    return config.optimizer_config() if fixed is None else fixed


def _rounds(
    config: ExperimentConfig,
    seed: int,
    audit: AuditLog,
    task: Task,
    data: FederatedData,
    server: Server,
    protocol,
    progress,
    observer: Any,
    on_round: Callable[[int, dict[str, Any]], None] | None = None,
    on_model: ModelCallback | None = None,
) -> SeedRun:
    base = {
        "seed": seed,
        "task": config.task,
        "protocol": config.protocol,
        "backend": config.backend,
    }

    def global_model(number: int) -> np.ndarray | None:
        # the experimenter's view; in server-blind runs the server does not hold the model
        # after round 0: a client seals it for the experimenter's key (None: for an
        # experimenter elsewhere, who evaluates it later)
        if observer is None or number == 0:
            return server.params
        client, blob = server.sealed_model(number - 1)
        opened = observer.open(blob, f"{client}/round-{number - 1}")
        return None if opened is None else np.frombuffer(opened, dtype="<f8").copy()

    if protocol.capabilities.evaluates_on_clients:
        if data.pooled_test is None:
            raise ConfigError(
                f"{config.protocol} scores an evaluation set on the clients; {config.task} has "
                "no pooled test set"
            )
        protocol.use_evaluation_set(data.pooled_test.x.numpy().astype(np.float64))
    try:
        excluded = server.setup(config.rounds)
    except RoundAborted as exc:
        rows = [
            {
                **base,
                "round": 0,
                **evaluate(task, data, server.params, device=resolve_device(config.device)),
            }
        ]
        return _aborted(audit, rows, server.params, exc, progress, seed)
    # after the set-up: a protocol's initialisation (DEC's centroids) is part of round 0's model
    rows = [
        {
            **base,
            "round": 0,
            **evaluate(task, data, server.params, device=resolve_device(config.device)),
        }
    ]
    if on_round:
        on_round(seed, rows[0])
    if excluded and progress:
        progress(f"  key setup excluded {excluded}")
    scalar_releases: Counter = Counter()  # protected scalars each client revealed so far
    scalars = audit.dp_protected & set(protocol.capabilities.client_scalars)
    model: np.ndarray | None = server.params
    for number in range(config.rounds):
        stop_if_interrupted()
        first_record = len(audit.records)
        start = time.perf_counter()
        try:
            report = server.run_round(number)
            wall = time.perf_counter() - start
            model = global_model(number + 1)
        except RoundAborted as exc:
            return _aborted(
                audit, rows, server.params if model is None else model, exc, progress, seed
            )
        records = audit.records[first_record:]
        traffic = [r for r in records if r["event"] == "message" and r["phase"] != "observe"]
        scalar_releases += scalar_release_counts(records, audit.run, scalars)
        row = {
            **base,
            "round": number + 1,
            **(
                {}  # sealed for an experimenter elsewhere: nothing to evaluate here
                if model is None
                else evaluate(
                    task, data, model, protocol.predictions(), device=resolve_device(config.device)
                )
            ),
            "clients": len(report.clients),
            "excluded": len(report.excluded),
            # 1: contributors refused a release, the round made no update (engine._skipped)
            "skipped": int(report.skipped is not None),
            "bytes_up": sum(r["bytes"] for r in traffic if r["direction"] == "received"),
            "bytes_down": sum(r["bytes"] for r in traffic if r["direction"] == "sent"),
            "seconds_round": wall,
            **{f"seconds_{k}": v for k, v in report.seconds.items()},
            **protocol.round_log(),
            **privacy_columns(config, server, report.reports, number, scalar_releases),
        }
        rows.append(row)
        if on_round:
            on_round(seed, row)
        if on_model and model is not None:
            on_model(seed, number + 1, np.array(model, copy=True))
        if progress:
            where = "test" if "test_pooled" in row else "train"
            score = (
                f"{task.metric_name} {row[f'{where}_pooled']:.4f}"
                + "".join(
                    f"  {name} {row[f'{where}_{name}']:.4f}"
                    for name in task.metrics
                    if f"{where}_{name}" in row
                )
                if f"{where}_pooled" in row
                else "model sealed for the experimenter"
            )
            progress(
                f"  seed {seed} round {number + 1}/{config.rounds}: {score}"
                f"  up {row['bytes_up'] / 1e3:.1f} kB  down "
                f"{row['bytes_down'] / 1e3:.1f} kB  {wall:.2f} s"
                + (f"  excluded {report.excluded}" if report.excluded else "")
                + (f"  no update: {report.skipped}" if report.skipped else "")
            )
        done = protocol.finished()
        if done:
            if progress:
                progress(f"  seed {seed} stops after round {number + 1}: {done}")
            break
    return SeedRun(
        rows,
        # the server's own view where the experimenter is elsewhere (the initial model)
        np.array(server.params if model is None else model, copy=True),
        None,
        list(server.privacy_events),
        protocol.predictions(),
    )


def _aborted(
    audit: AuditLog,
    rows: list[dict[str, Any]],
    model: np.ndarray,
    exc: RoundAborted,
    progress,
    seed: int,
) -> SeedRun:
    """A round with no usable client: record it, keep what was measured, stop this seed."""
    protocol_round = exc.round if exc.round is not None else -1
    audit.aborted(protocol_round, exc.phase or "?", str(exc))
    if progress:  # numbered as in the files (set-up is round 0, rounds count from 1)
        where = (
            "set-up" if audit.stage == "setup" else f"round {audit.round_number(protocol_round)}"
        )
        progress(f"  seed {seed} aborted in {where} phase {exc.phase}: {exc}")
    return SeedRun(rows, np.array(model, copy=True), str(exc))


def release_budgets(
    config: ExperimentConfig, protocol, n_params: int, data: FederatedData
) -> dict[str, Any]:
    """What a client's provisioning allows for a run of ``config``: every reveal the run
    makes (none at all in server-blind runs, whose clients then refuse any reveal request),
    the opens, the length of every release, and the releases one upload may enter. A
    deployment's nodes compute the same from their own copy of the configuration."""
    caps = protocol.capabilities
    opens_per_round = caps.opens_per_round + (1 if config.server_blind else 0)
    # threshold holders give a share per opened aggregate: one per client when they differ
    shares = config.rounds * (
        caps.opens_per_round * data.n_clients + (1 if config.server_blind else 0)
    )
    others = tuple(n for n in protocol.release_lengths(data) if n != n_params)
    return {
        "share_budget": shares if caps.distinct_opens else None,
        # every reveal of the run, not ×2 for the check's second decryptor: a client
        # decrypts one release at most once (CKKSServer.reveal asks distinct clients), and
        # the flooding's t = roster × budget covers two (or three) decryptions per reveal
        "decryption_budget": 0
        if config.server_blind
        else config.rounds * caps.reveals_per_round + protocol.initial_reveals(),
        "reveal_length": (n_params, *others) if others else n_params,
        "open_budget": config.rounds * opens_per_round,
        # one upload enters at most one reveal (none server-blind) and the round's opens
        "releases_per_upload": {
            "reveal": 0 if config.server_blind else 1,
            "open": opens_per_round,
        },
    }


def client_policy(
    config: ExperimentConfig, protocol, n_params: int, n_clients: int
) -> ClientPolicy:
    """What a client of a run of ``config`` answers (``secagg.clients.policy``): the engine
    phases the run uses, the training settings and DP of ``config`` (as the server's plan
    has them), what ``protocol`` varies per round, its scalar and validation budgets, and
    the server optimizer it steps or evaluates itself. A deployment's nodes compute the same
    from their own copy of the configuration; nothing of it comes from the server."""
    from secagg.clients.policy import ClientPolicy

    caps = protocol.capabilities
    phases = {"enroll", "train"}
    if caps.observes_validation:
        phases.add("validate")
    if config.server_blind:
        phases |= {"apply", "observe"}
    if config.allow_plaintext_updates:
        phases.add("plaintext_update")
    validations = config.rounds + 1 if caps.observes_validation else 0
    return ClientPolicy(
        phases=frozenset(phases),
        rounds=config.rounds,
        plan=config.plan(n_clients),
        varies=protocol.varied_settings(),
        # each declared scalar once a round, and the initial validation
        scalar_budget=(config.rounds + 1) * len(caps.client_scalars),
        max_validations=validations,
        server_optimizer={**server_step(config, protocol, n_clients), "dim": n_params},
    )


def local_steps_of(config: ExperimentConfig, part: ClientData) -> int:
    """A client's SGD steps per round (for DP-SGD's target-ε calibration)."""
    if config.local_epochs:
        return config.local_epochs * -(-len(part) // config.batch_size)
    return config.local_steps


def privacy_columns(
    config: ExperimentConfig,
    server: Server,
    reports: dict[str, dict[str, float]],
    number: int,
    scalar_releases: Counter,
) -> dict[str, float]:
    """ε spent up to round ``number``, per mechanism (worst client where it differs by
    client). DP-SGD's ε is what each client reported with its upload this round."""
    out: dict[str, float] = {}
    if config.client_dp is not None:
        events = server.privacy_events
        out["eps_client_level"] = client_level_epsilon(events, config.dp_delta)
        # what a server that sees only the released sums (an encrypted backend) would get
        out["eps_client_level_sums"] = client_level_epsilon(
            [{"noise_multiplier": e["sums_multiplier"]} for e in events], config.dp_delta
        )
        out["noise_multiplier_realised"] = min(
            (e["noise_multiplier"] for e in server.privacy_events if e["round"] == number),
            default=float("nan"),
        )
        out["noise_multiplier_realised_sums"] = min(
            (e["sums_multiplier"] for e in server.privacy_events if e["round"] == number),
            default=float("nan"),
        )
    if config.dp_sgd is not None:
        per_client = {
            f"eps_dp_sgd_{cid}": r["dp_sgd_epsilon"] for cid, r in sorted(reports.items())
        }
        out["eps_dp_sgd_max"] = max(per_client.values(), default=float("nan"))
        out.update(per_client)
        for cid, r in sorted(reports.items()):  # what each client's ε rests on
            out[f"dp_sgd_noise_multiplier_{cid}"] = r["dp_sgd_noise_multiplier"]
            out[f"dp_sgd_sample_rate_{cid}"] = r["dp_sgd_sample_rate"]
    if config.scalar_dp is not None:
        eps = scalar_epsilons(scalar_releases, config.scalar_dp["noise"], config.dp_delta)
        out["eps_scalars_max"] = max(eps.values(), default=0.0)
    return out


def hold_out_validation(
    data: FederatedData, share: float, seed: int = 0
) -> tuple[FederatedData, list[ClientData]]:
    """Split each client's training samples into training and validation (a fixed split:
    every seed and protocol sees the same one)."""
    rng = np.random.default_rng(seed)
    train, validation = [], []
    for part in data.train:
        order = torch.from_numpy(rng.permutation(len(part)))
        n_val = max(1, int(round(share * len(part))))
        if n_val >= len(part):
            raise ConfigError(
                f"validation_split {share} leaves a client of {len(part)} "
                "samples nothing to train on"
            )
        # subset, not x[order]: a Dataset-backed client stays one (nothing materialised)
        validation.append(part.subset(order[:n_val]))
        train.append(part.subset(order[n_val:]))
    return replace(data, train=train), validation


def summarize(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds, per protocol/backend/round."""
    keys = ["task", "protocol", "backend", "round"]
    if metrics.empty:  # every seed stopped before its first evaluation
        return pd.DataFrame(columns=["n_seeds", *keys])
    value_cols = [
        c
        for c in metrics.columns
        if c not in keys + ["seed"] and pd.api.types.is_numeric_dtype(metrics[c])
    ]
    grouped = metrics.groupby(keys, sort=False)[value_cols]
    out = grouped.mean().add_suffix("_mean").join(grouped.std(ddof=1).add_suffix("_std"))
    out.insert(0, "n_seeds", metrics.groupby(keys, sort=False)["seed"].nunique())
    ordered = ["n_seeds"] + [f"{c}_{s}" for c in value_cols for s in ("mean", "std")]
    return out[ordered].reset_index()


def run_experiment(
    config: ExperimentConfig,
    audit: AuditLog | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    transport_factory: TransportFactory | None = None,
    recorder: Recorder | None = None,
    skip: Sequence[int] = (),
    signers: Mapping[str, bytes] | None = None,
    experimenter: ExperimenterFactory | None = None,
) -> ExperimentResult:
    """Every seed of ``config`` but those in ``skip`` (finished before: a resumed run);
    ``transport_factory`` replaces the in-process (or worker) transport, e.g. with a network
    one; ``recorder`` receives each round's row and each finished seed; ``signers``: the
    clients' public signing keys when a deployment provisioned them (see ``run_seed``)."""
    config.validate()
    audit = audit if audit is not None else AuditLog()
    data = get_task(config.task).load()
    check_data(config, data, progress)
    if config.dp_sgd is not None and config.dp_sgd.get("epsilon") is not None and progress:
        progress(
            f"calibrating DP-SGD noise to epsilon {config.dp_sgd['epsilon']} for each "
            "client's sampling rate (one RDP solve per distinct rate, a few seconds each)"
        )
    with torch_threads(config.threads):
        return _run_seeds(
            config,
            audit,
            data,
            progress,
            transport_factory,
            recorder,
            skip,
            signers,
            experimenter,
        )


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` for the run's in-process clients, and
    restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run_seeds(
    config: ExperimentConfig,
    audit: AuditLog,
    data: FederatedData,
    progress: Callable[[str], None] | None,
    transport_factory: TransportFactory | None,
    recorder: Recorder | None,
    skip: Sequence[int],
    signers: Mapping[str, bytes] | None,
    experimenter: ExperimenterFactory | None = None,
) -> ExperimentResult:
    rows: list[dict[str, Any]] = []
    final: dict[int, np.ndarray] = {}
    aborted: dict[int, str] = {}
    events: dict[int, list[dict[str, Any]]] = {}
    for i, seed in enumerate(config.seeds):
        if seed in skip:
            continue
        stop_if_interrupted()
        if progress:
            progress(
                f"[{i + 1}/{len(config.seeds)}] {config.protocol} on {config.backend}, "
                f"task {config.task}, seed {seed}"
            )
        run = run_seed(
            config,
            seed,
            audit,
            data,
            progress,
            transport_factory=transport_factory,
            on_round=recorder.on_round if recorder else None,
            signers=signers,
            experimenter=experimenter,
        )
        rows += run.rows
        final[seed] = run.final_params
        events[seed] = run.privacy_events
        if run.aborted:
            aborted[seed] = run.aborted
        if recorder:
            recorder.on_seed(seed, run, audit)
    metrics = pd.DataFrame(rows)
    return ExperimentResult(metrics, audit, final, aborted, events)


def check_data(
    config: ExperimentConfig, data: FederatedData, progress: Callable[[str], None] | None
) -> None:
    """What only the data can tell, before anything trains: a pre-stage's needs, and more
    worker processes than clients (the extra ones would idle)."""
    stage = PROTOCOLS[config.protocol].protocol.capabilities.pretrain
    if stage is not None:
        STAGES[stage].check(config, data)
    if config.workers > data.n_clients and progress:
        progress(
            f"note: workers {config.workers} > {data.n_clients} clients on {config.task}; "
            f"using {data.n_clients} worker processes"
        )


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
