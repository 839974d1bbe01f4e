"""The experiment driver: builds clients and server, runs seeds, evaluates.

This is the only place that imports both ``secagg.clients`` and ``secagg.server``: it plays
the part of the network (an in-process transport by default, worker processes with
``workers``, or any transport the caller injects) and of the experimenter, who evaluates the
global model on the sets it holds — data no party of the protocol holds. In simulation that
is every set of the task; a deployment's ServerApp passes only what its coordinator holds
(``held_by_coordinator``: its test set, no site's data), and the driver then neither scores
nor splits the clients' training data.

It reads nothing from client objects: everything it learns about a run comes through the
server's messages. In server-blind runs the experimenter's copy of the model arrives sealed
for the experimenter's own X25519 key (the server relays bytes it cannot open); DP-SGD's ε
is a number each client reports with its upload; FedDisco's β-VAE is a federated pre-stage
whose model the server hands to the clients in a declared message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import torch

from secagg.backends import (
    backend_spec,
    make_server_backend,
    provision,
    public_signers,
)
from secagg.clients.tasks import (
    FederatedData,
    Task,
    get_task,
)
from secagg.clients.training import flat_params, resolve_device
from secagg.errors import ConfigError, RoundAborted
from secagg.protocols import (
    make_protocol,
    protocol_spec,
)
from secagg.protocols.optimizers import StepSchedule, make_optimizer
from secagg.protocols.pieces import ClientEvaluation, Convergence, PreStage, may_have, piece
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.evaluation import evaluate
from secagg.runspec.provisioning import (  # noqa: F401 - re-exported: the driver's names
    PRE_STAGE_PROTOCOL,
    ClientFactory,
    check_stage,
    client_policy,
    hold_out_validation,
    local_steps_of,
    pre_stage_config,
    release_budgets,
    seed_data,
    server_step,
    stage_config,
    stage_task,
)
from secagg.runspec.status import rounds_text, seed_outcome
from secagg.server.audit import AuditLog
from secagg.server.engine import Server
from secagg.server.transport import InProcessTransport, Transport
from secagg.simulation.privacy import client_level_epsilon, scalar_epsilons, scalar_release_counts
from secagg.simulation.workers import WorkerPoolTransport

if TYPE_CHECKING:  # client-side and key code: imported where a client or key is made, so
    # that a server process running this driver (secagg.flower's ServerApp) loads none of it
    pass

LOG = logging.getLogger(__name__)


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
    #: why the protocol stopped before the last round by design (``Convergence``), else None
    stopped: str | None = None
    #: what ``secagg.runspec.status.decide`` needs of this seed (``seed_outcome``), set
    #: once the seed is over
    outcome: dict[str, Any] | None = None


@dataclass
class ExperimentResult:
    metrics: pd.DataFrame
    audit: AuditLog
    final_params: dict[int, np.ndarray]  # per seed
    #: seeds whose run was aborted, with the reason
    aborted: dict[int, str] = field(default_factory=dict)
    #: client-level DP per seed: each round's releases and realised multipliers
    privacy_events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: per seed, what the run's status is decided from (``secagg.runspec.status``)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __iter__(self):  # ``metrics, audit = run_experiment(...)`` keeps working
        return iter((self.metrics, self.audit))


#: (clients factory, client ids) -> a transport; the default is in-process or workers
TransportFactory = Callable[[ClientFactory, list[str]], Transport]


def default_transport(factory: ClientFactory, ids: list[str]) -> Transport:
    config = factory.config
    deadline = float(config.request_timeout) or None  # 0: no deadline
    if config.workers:
        return WorkerPoolTransport(
            factory, ids, config.workers, torch_threads=config.threads, deadline=deadline
        )
    clients = factory(ids)
    return InProcessTransport({cid: c.handle for cid, c in clients.items()}, deadline=deadline)


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
#: ``secagg.secret.sealing.Observer``, a fresh key pair per seed in this process.
ExperimenterFactory = Callable[[int], Any]

#: set by ``secagg.simulation.api``'s SIGINT handler: a Ctrl-C that CPython swallowed (one
#: that lands in an import-lock or finalizer callback is "ignored") still stops the run at
#: the next round or seed
INTERRUPTED = threading.Event()


@dataclass(frozen=True)
class SeedContext:
    """What the runs of one seed share (its pre-stage's and its main run): the seed, the
    audit they write, how the server reaches the clients, the clients' public signing keys
    where a deployment provisioned them, and whom to tell of each round."""

    seed: int
    audit: AuditLog
    make_transport: TransportFactory
    progress: Callable[[str], None] | None = None
    signers: Mapping[str, bytes] | None = None
    on_round: Callable[[int, dict[str, Any]], None] | None = None
    on_model: ModelCallback | None = None


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
    shared = SeedContext(
        seed,
        audit,
        transport_factory or default_transport,
        progress,
        signers,
        on_round,
        on_model,
    )
    pre_stage = piece(protocol, PreStage)
    if pre_stage is not None:
        stage = pre_stage.pretrain
        pre = _run(
            replace(shared, on_round=None, on_model=None),  # rows of the main run only
            stage_config(config, pre_stage),
            stage_task(config, data, pre_stage),
            data,
            make_protocol(PRE_STAGE_PROTOCOL),
            ClientFactory(config, seed, stage=stage),
            label=f"{seed}-{stage}",
        )
        if pre.aborted:
            return SeedRun(pre.rows[:0], pre.final_params, f"{stage}: {pre.aborted}")
        pre_stage.use_pretrained(pre.final_params, pre_stage.pre_stage_layout(data))
    observer = None
    if config.server_blind and experimenter is not None:
        observer = experimenter(seed)
    elif config.server_blind:
        from secagg.secret.sealing import Observer  # the experimenter's private key

        observer = Observer()
    factory = ClientFactory(
        config, seed, observer_public=observer.public_bytes if observer else None
    )
    return _run(shared, config, task, data, protocol, factory, label=str(seed), observer=observer)


def _run(
    shared: SeedContext,
    config: ExperimentConfig,
    task: Task,
    data: FederatedData,
    protocol,
    factory: ClientFactory,
    label: str,
    observer: Any = None,
) -> SeedRun:
    """One federated run of ``config`` (a seed's main run, or its pre-stage's)."""
    seed, signers = shared.seed, shared.signers
    task_data = task.load() if factory.stage is not None else data
    torch.manual_seed(seed)  # FLamby: the seed fixes the initial model (and the clients'
    initial = flat_params(task.make_model())  # batch order)
    ids = [f"client_{k}" for k in range(task_data.n_clients)]
    if backend_spec(config.backend).keyed and factory.provisions is None and signers is None:
        factory = replace(
            factory,
            provisions=provision(ids, **release_budgets(config, protocol, initial.size, task_data)),
        )
    transport = shared.make_transport(factory, ids)
    try:
        shared.audit.run = label
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
            audit=shared.audit,
        )
        return _rounds(shared, config, task, task_data, server, protocol, observer)
    finally:
        close = getattr(transport, "close", None)
        if close is not None:
            close()


def _rounds(
    shared: SeedContext,
    config: ExperimentConfig,
    task: Task,
    data: FederatedData,
    server: Server,
    protocol,
    observer: Any,
) -> SeedRun:
    seed, audit, progress = shared.seed, shared.audit, shared.progress
    on_round, on_model = shared.on_round, shared.on_model
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

    scoring = piece(protocol, ClientEvaluation)
    if scoring is not None:
        if data.pooled_test is None:
            raise ConfigError(
                f"{config.protocol} scores an evaluation set on the clients; {config.task} has "
                "no pooled test set"
            )
        scoring.use_evaluation_set(data.pooled_test.x.numpy().astype(np.float64))
    convergence = piece(protocol, Convergence)

    def predictions() -> np.ndarray | None:
        # the protocol's own scores of the evaluation set (Ensemble), else the global model's
        return scoring.predictions() if scoring is not None else None

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
    done: str | None = None
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
                    task, data, model, predictions(), device=resolve_device(config.device)
                )
            ),
            "clients": len(report.clients),
            "excluded": len(report.excluded),
            # 1: contributors refused a release, the round made no update (engine._skipped)
            "skipped": int(report.skipped is not None),
            # clients whose weight the run's cap (max_weight_share) lowered or raised
            "weights_capped": len(report.capped),
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
                if model is None
                else "not scored (no set held)"
            )
            progress(
                f"  seed {seed} round {number + 1}/{config.rounds}: {score}"
                f"  up {row['bytes_up'] / 1e3:.1f} kB  down "
                f"{row['bytes_down'] / 1e3:.1f} kB  {wall:.2f} s"
                + (f"  excluded {report.excluded}" if report.excluded else "")
                + (f"  no update: {report.skipped}" if report.skipped else "")
                + (
                    f"  weights capped at {server.policy.max_weight_share:g}: "
                    + ", ".join(
                        f"{c} {asked:.3f}->{used:.3f}"
                        for c, (asked, used) in sorted(report.capped.items())
                    )
                    if report.capped
                    else ""
                )
            )
        done = convergence.finished() if convergence is not None else None
        if done:
            if progress:
                progress(f"  seed {seed} stops after round {number + 1}: {done}")
            break
    if progress:
        for row in audit.rounds_missed():
            if row["run"] == audit.run:
                progress(f"  seed {seed}: {row['peer']} missed {rounds_text(row['rounds'])}")
    return SeedRun(
        rows,
        # the server's own view where the experimenter is elsewhere (the initial model)
        np.array(server.params if model is None else model, copy=True),
        None,
        list(server.privacy_events),
        predictions(),
        stopped=done or None,
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
            # the steps its accountant counted: what ε over seeds is composed from
            out[f"dp_sgd_steps_{cid}"] = r["dp_sgd_steps"]
    if config.scalar_dp is not None:
        eps = scalar_epsilons(scalar_releases, config.scalar_dp["noise"], config.dp_delta)
        out["eps_scalars_max"] = max(eps.values(), default=0.0)
    return out


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
    data: FederatedData | None = None,
) -> ExperimentResult:
    """Every seed of ``config`` but those in ``skip`` (finished before: a resumed run);
    ``transport_factory`` replaces the in-process (or worker) transport, e.g. with a network
    one; ``recorder`` receives each round's row and each finished seed; ``signers``: the
    clients' public signing keys when a deployment provisioned them (see ``run_seed``);
    ``data``: the task's data as the experimenter holds it, the sets it scores (default
    ``task.load()``: all of them; a deployment's coordinator: ``held_by_coordinator``)."""
    config.validate()
    # a GPU this process cannot use, for clients built here: refused before anything runs
    device = device_choice(config.device, here=transport_factory is None)
    if progress and config.device == "auto" and transport_factory is None:
        progress(device_line(device))
    audit = audit if audit is not None else AuditLog()
    data = data if data is not None else get_task(config.task).load()
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
    outcomes: dict[int, dict[str, Any]] = {}
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
        run.outcome = seed_outcome(
            seed, config.rounds, run.rows, audit, aborted=run.aborted, stopped=run.stopped
        )
        outcomes[seed] = run.outcome
        rows += run.rows
        final[seed] = run.final_params
        events[seed] = run.privacy_events
        if run.aborted:
            aborted[seed] = run.aborted
        if recorder:
            recorder.on_seed(seed, run, audit)
    metrics = pd.DataFrame(rows)
    return ExperimentResult(metrics, audit, final, aborted, events, outcomes)


def device_choice(name: str, *, here: bool = True) -> dict[str, str]:
    """Which torch device a run's ``device`` setting picks in this process (``setting``,
    ``used``), and for ``auto`` why (``why``); a ConfigError for a GPU this process cannot
    use, before anything is written or trained. config.json's provenance records it
    (``device``). ``here=False``: the clients train elsewhere (behind a transport such as
    Flower's), where each picks its own; nothing is checked here."""
    if not here:
        return {
            "setting": name,
            "why": "the clients train behind the run's transport, each on its own machine's device",
        }
    device = resolve_device(name)
    choice = {"setting": name, "used": str(device)}
    if name == "auto":
        if device.type == "cuda":
            choice["why"] = (
                f"the first of the {torch.cuda.device_count()} CUDA GPU(s) torch sees: "
                f"{torch.cuda.get_device_name(device)}"
            )
        elif not torch.backends.cuda.is_built():
            choice["why"] = "torch sees no CUDA GPU: this torch is built without CUDA"
        else:
            choice["why"] = "torch sees no CUDA GPU in this process"
    return choice


def device_line(choice: Mapping[str, str]) -> str:
    """``device auto: cpu (torch sees no CUDA GPU ...)``: the progress line of ``auto``."""
    why = f" ({choice['why']})" if choice.get("why") else ""
    return f"device {choice['setting']}: {choice['used']}{why}"


def check_data(
    config: ExperimentConfig, data: FederatedData, progress: Callable[[str], None] | None
) -> None:
    """What only the data can tell, before anything trains: a pre-stage's needs, and more
    worker processes than clients (the extra ones would idle)."""
    cls = protocol_spec(config.protocol).protocol
    if not (may_have(cls, PreStage) or may_have(cls, ClientEvaluation)):
        protocol = None  # nothing to ask a built one: its class says it has neither piece
    else:
        protocol = make_protocol(config.protocol, **config.protocol_options)
    stage = piece(protocol, PreStage) if protocol is not None else None
    if stage is not None:
        check_stage(config, data, stage)
    evaluates = protocol is not None and piece(protocol, ClientEvaluation) is not None
    if evaluates and data.pooled_test is None:
        raise ConfigError(
            f"{config.protocol} scores an evaluation set on the clients; {config.task} has "
            "no pooled test set"
        )
    if config.workers > data.n_clients and progress:
        progress(
            f"note: workers {config.workers} > {data.n_clients} clients on {config.task}; "
            f"using {data.n_clients} worker processes"
        )


def stderr_progress(line: str) -> None:
    from secagg.logs import ensure_stderr

    ensure_stderr()  # asked for on stderr (secagg.run(progress=True)): shown there
    LOG.info("%s", line)
