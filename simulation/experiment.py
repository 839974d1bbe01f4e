"""The in-process experiment driver: builds clients and server, runs seeds, evaluates.

This is the only place that imports both ``clients`` and ``server``: it plays the part of the
network (an in-process transport) and of the experimenter, who may evaluate the global model
on the pooled test set — data no party of the protocol holds.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from functools import partial
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from secagg.clients.privacy import make_private
from secagg.clients.runtime import Client
from secagg.clients.tasks import ClientData, FederatedData, Task, get_task
from secagg.clients.tasks.tcga_brca import random_client_splits
from secagg.clients.tasks.vae import BetaVAE, autoencoding, reconstruction_score, vae_loss
from secagg.clients.training import LocalTrainer, flat_params, set_flat_params
from secagg.protocols import PROTOCOLS, default_server_optimizer, make_protocol
from secagg.protocols.optimizers import StepSchedule, make_optimizer
from secagg.backends import BACKENDS, make_backends
from secagg.ckks.presets import get_preset
from secagg.dp import ClientDP, ScalarDP
from secagg.errors import ConfigError
from secagg.server.audit import AuditLog
from secagg.server.engine import NOISABLE_SCALARS, Server
from secagg.server.transport import InProcessTransport
from secagg.simulation.workers import WorkerPoolTransport
from secagg.simulation.privacy import client_level_epsilon, scalar_epsilons, scalar_release_counts


@dataclass
class ExperimentConfig:
    task: str = "tcga-brca"
    protocol: str = "fedavg"
    backend: str = "plain"
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
    ckks_preset: str = "compact"
    #: statistical security of the noise flooding of revealed aggregates; 0 turns it off
    flooding_bits: int = 30
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
    #: fold uploads into a running sum as they arrive, where the protocol's weights allow it
    streaming: bool = True
    #: run the clients in this many worker processes (in parallel); 0: in this process
    workers: int = 0

    def validate(self) -> "ExperimentConfig":
        get_task(self.task)
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"unknown protocol {self.protocol!r}; choose from "
                              f"{', '.join(PROTOCOLS)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; available: {BACKENDS}")
        if self.local_epochs is not None and (not isinstance(self.local_epochs, int)
                                              or self.local_epochs < 1):
            raise ConfigError(f"local_epochs must be a positive integer, got "
                              f"{self.local_epochs!r}")
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
            raise ConfigError(f"validation_split must lie in (0, 1), got "
                              f"{self.validation_split}")
        if not isinstance(self.fedprox_mu, (int, float)) or not self.fedprox_mu >= 0:
            raise ConfigError(f"fedprox_mu must be a number >= 0, got {self.fedprox_mu!r}")
        self._check_dp()
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ConfigError(f"workers must be an integer >= 0, got {self.workers!r}")
        if self.workers:
            # these read the clients' own state from the driver, which worker processes keep
            for needs, what in ((self.server_blind, "server_blind (the model lives on the "
                                 "clients)"), (self.dp_sgd is not None, "dp_sgd (each "
                                 "client's epsilon)"), (self.protocol == "feddisco",
                                 "feddisco (the VAE encoder is handed to the clients)")):
                if needs:
                    raise ConfigError(f"--workers cannot run {what} yet; use --workers 0")
        if self.client_split_count is not None and (
                self.client_split is None or self.client_split_count < 1):
            raise ConfigError("client_split_count needs client_split and must be positive")
        if self.backend == "ckks":
            get_preset(self.ckks_preset)
        elif self.server_blind:
            raise ConfigError("server_blind needs an encrypted backend (--backend ckks): on "
                              "plain the server reads every upload anyway")
        if not isinstance(self.flooding_bits, int) or not 0 <= self.flooding_bits <= 128:
            raise ConfigError(f"flooding_bits must be an integer in [0, 128], got "
                              f"{self.flooding_bits!r}")
        StepSchedule.parse(self.client_lr)
        if self.server_lr_schedule is not None:
            StepSchedule.parse(self.server_lr_schedule)
        make_optimizer({**self.optimizer_config(), "dim": 1})
        protocol = make_protocol(self.protocol, **self.protocol_options)
        if (protocol.needs_individual_updates and self.backend != "plain"
                and not self.allow_plaintext_updates):
            raise ConfigError(
                f"{self.protocol} needs every client's update in plaintext (it is not a sum), "
                f"so it cannot run on {self.backend} as is; pass --allow-plaintext-updates to "
                "accept that (the audit will then report individual_updates_revealed: true)")
        if self.client_dp is not None and not protocol.client_dp_compatible:
            raise ConfigError(f"{self.protocol}'s update is not one weighted sum of the noised "
                              "uploads, so client-level DP cannot be accounted for it; use "
                              "fedavg, fedadam, larc, costwagg, autofedrl, ...")
        if protocol.observes_validation and self.validation_split is None:
            raise ConfigError(f"{self.protocol} rewards its agent with the clients' validation "
                              "loss: give the clients validation samples with "
                              "--validation-split (e.g. 0.2)")
        if self.server_blind and protocol.server_computes_update:
            raise ConfigError(f"{self.protocol} forms the global update in plaintext on the "
                              "server, so it cannot run server-blind")
        return self

    def _check_dp(self) -> None:
        def need(name, value, keys, optional=()):
            if value is None:
                return
            if not isinstance(value, dict) or not set(keys) <= set(value) \
                    or not set(value) <= set(keys) | set(optional):
                raise ConfigError(f"{name} takes {', '.join(keys)}"
                                  + (f" (and optionally {', '.join(optional)})" if optional
                                     else "") + f", got {value!r}")
        if self.dp_sgd is not None:
            need("dp_sgd", self.dp_sgd, ("clip",), ("noise", "epsilon"))
            if ("noise" in self.dp_sgd) == ("epsilon" in self.dp_sgd):
                raise ConfigError("dp_sgd needs exactly one of noise=z and epsilon=ε")
            if self.fedprox_mu:
                raise ConfigError("FedProx with DP-SGD is not supported")
        need("client_dp", self.client_dp, ("clip", "noise"))
        need("scalar_dp", self.scalar_dp, ("low", "high", "noise"))
        if not 0 < self.dp_delta < 1:
            raise ConfigError(f"dp_delta must lie in (0, 1), got {self.dp_delta}")
        for name, spec in (("dp_sgd", self.dp_sgd), ("client_dp", self.client_dp),
                           ("scalar_dp", self.scalar_dp)):
            for key, v in (spec or {}).items():
                if not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ConfigError(f"{name}: {key} must be a number, got {v!r}")
        if self.client_dp is not None:
            ClientDP(self.client_dp["clip"], self.client_dp["noise"], 1)
        if self.scalar_dp is not None:
            ScalarDP(self.scalar_dp["low"], self.scalar_dp["high"], self.scalar_dp["noise"])
        if self.dp_sgd is not None and not self.dp_sgd["clip"] > 0:
            raise ConfigError(f"dp_sgd: clip must be > 0, got {self.dp_sgd['clip']}")
        if self.dp_sgd is not None and not self.dp_sgd.get("noise",
                                                           self.dp_sgd.get("epsilon")) > 0:
            raise ConfigError("dp_sgd: noise or epsilon must be > 0")

    def optimizer_config(self) -> dict[str, Any]:
        cfg = default_server_optimizer(self.protocol)
        if "name" in self.server_opt and self.server_opt["name"] != cfg["name"]:
            cfg = {"name": self.server_opt["name"]}  # a different optimizer: its own defaults
        cfg.update(self.server_opt)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "resolved_server_opt": self.optimizer_config()}


def evaluate(task: Task, data: FederatedData, params: np.ndarray) -> dict[str, float]:
    """Metric of the global model on the pooled test set, each client's test set, and the
    pooled training set. Client sets where the metric is undefined count as NaN."""
    model = task.make_model()
    set_flat_params(model, params)
    model.eval()

    def score(part: ClientData) -> float:
        with torch.no_grad():
            pred = model(part.x).numpy()
        try:
            return task.metric(part.y.numpy(), pred)
        except ZeroDivisionError:  # lifelines: no admissible pairs in a tiny client set
            return float("nan")

    out = {"train_pooled": score(ClientData.concat(data.train))}
    with torch.no_grad():
        out["train_loss"] = float(task.loss(model(ClientData.concat(data.train).x),
                                            ClientData.concat(data.train).y))
    if data.pooled_test is not None:
        out["test_pooled"] = score(data.pooled_test)
        with torch.no_grad():
            out["test_loss"] = float(task.loss(model(data.pooled_test.x), data.pooled_test.y))
    if data.test is not None:
        pooled_test = ClientData.concat(data.test)
        with torch.no_grad():
            out["test_loss"] = float(task.loss(model(pooled_test.x), pooled_test.y))
        per_client = [score(p) for p in data.test]
        out["test_pooled"] = score(ClientData.concat(data.test))
        out["test_client_avg"] = float(np.nanmean(per_client))
        out.update({f"test_client_{k}": v for k, v in enumerate(per_client)})
    return out


@dataclass
class SeedRun:
    rows: list[dict[str, Any]]  # one per round, round 0 = the initial model
    final_params: np.ndarray


@dataclass
class ExperimentResult:
    metrics: pd.DataFrame
    audit: AuditLog
    final_params: dict[int, np.ndarray]  # per seed

    def __iter__(self):  # ``metrics, audit = run_experiment(...)`` keeps working
        return iter((self.metrics, self.audit))


def pretrain_vae(config: ExperimentConfig, seed: int, audit: AuditLog, data: FederatedData,
                 progress: Callable[[str], None] | None = None) -> Callable:
    """FedDisco's first stage: train the β-VAE with FedAvg on the same clients and backend;
    return its encoder, which every client then holds."""
    n_in = data.train[0].x.shape[1]
    vae_task = Task("vae", "β-VAE on the task's samples", lambda: data,
                    lambda: BetaVAE(n_in), partial(vae_loss, beta=config.vae_beta),
                    reconstruction_score, "-MSE")
    vae_config = replace(config, protocol="fedavg", server_opt={}, protocol_options={},
                         rounds=config.vae_rounds, client_lr=str(config.vae_lr),
                         server_lr_schedule=None, client_split=None)
    run = run_seed(vae_config, seed, audit, autoencoding(data), progress, task=vae_task,
                   label=f"{seed}-vae")
    model = BetaVAE(n_in)
    set_flat_params(model, run.final_params)
    model.eval()

    def encode(x: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return model.encode(x).numpy()
    return encode


def run_seed(config: ExperimentConfig, seed: int, audit: AuditLog,
             data: FederatedData | None = None,
             progress: Callable[[str], None] | None = None, task: Task | None = None,
             label: str | None = None) -> SeedRun:
    """One federated run, evaluated after every round."""
    task = task if task is not None else get_task(config.task)
    data, validation = seed_data(config, seed, data if data is not None else task.load())

    torch.manual_seed(seed)  # FLamby: the seed fixes the initial model (and build_client
    initial = flat_params(task.make_model())  # each client's batch order)
    ids = [f"client_{k}" for k in range(data.n_clients)]
    # with workers, each worker makes its own clients' halves of the backend
    server_backend, client_backends = make_backends(
        config.backend, [] if config.workers else ids, config.ckks_preset)
    if config.workers:
        transport = WorkerPoolTransport(WorkerClients(config, seed), ids, config.workers)
        clients = {}
    else:
        clients = {cid: build_client(config, seed, task, data.train[k], validation[k], k, cid,
                                     client_backends[cid]) for k, cid in enumerate(ids)}
        transport = InProcessTransport({cid: c.handle for cid, c in clients.items()})
    try:
        return _run_rounds(config, seed, audit, task, data, initial, server_backend,
                           transport, clients, progress, label)
    finally:
        if config.workers:
            transport.close()


def build_client(config: ExperimentConfig, seed: int, task: Task, part: ClientData,
                 validation: ClientData | None, k: int, cid: str, backend) -> Client:
    """Client k of a seed: its data, a trainer whose batch order the seed fixes, and its half
    of the backend."""
    trainer = LocalTrainer(task.make_model(), part, task.loss, config.batch_size,
                           seed=seed * 1000 + k)
    if config.dp_sgd is not None:
        trainer = make_private(trainer, max_grad_norm=config.dp_sgd["clip"],
                               total_steps=config.rounds * local_steps_of(config, part),
                               noise_multiplier=config.dp_sgd.get("noise"),
                               target_epsilon=config.dp_sgd.get("epsilon"),
                               delta=config.dp_delta, seed=seed * 1000 + k)
    return Client(cid, trainer, backend, validation, seed=seed * 1000 + k + 500)


@dataclass
class WorkerClients:
    """Builds a seed's clients inside a worker process (picklable): the worker loads the
    task's data itself and makes the same clients the in-process run would."""

    config: ExperimentConfig
    seed: int

    def __call__(self, ids: list[str]) -> dict[str, Client]:
        task = get_task(self.config.task)
        data, validation = seed_data(self.config, self.seed, task.load())
        _, backends = make_backends(self.config.backend, ids, self.config.ckks_preset)
        return {cid: build_client(self.config, self.seed, task, data.train[k], validation[k],
                                  k, cid, backends[cid])
                for cid, k in ((c, int(c.rsplit("_", 1)[1])) for c in ids)}


def seed_data(config: ExperimentConfig, seed: int, data: FederatedData
              ) -> tuple[FederatedData, list[ClientData | None]]:
    """The clients' training data for a seed (its own random split, if the run asks for
    one) and their validation sets."""
    if config.client_split is not None:
        split = seed % config.client_split_count if config.client_split_count else seed
        data = random_client_splits(data, split, config.client_split)
    validation: list[ClientData | None] = [None] * data.n_clients
    if config.validation_split is not None:
        data, validation = hold_out_validation(data, config.validation_split)
    return data, validation


def _run_rounds(config: ExperimentConfig, seed: int, audit: AuditLog, task: Task,
                data: FederatedData, initial: np.ndarray, server_backend, transport,
                clients: dict[str, Client], progress, label) -> SeedRun:
    if config.protocol == "feddisco":
        encoder = pretrain_vae(config, seed, audit, data, progress)
        for client in clients.values():
            client.encoder = encoder
    audit.run = label or str(seed)
    protocol = make_protocol(config.protocol, **config.protocol_options)
    protocol.seed(seed)
    server = Server(
        protocol, server_backend,
        make_optimizer({**config.optimizer_config(), "dim": initial.size}), transport, initial,
        client_lr=StepSchedule.parse(config.client_lr), local_steps=config.local_steps,
        local_epochs=config.local_epochs,
        audit=audit, server_blind=config.server_blind,
        allow_plaintext_updates=config.allow_plaintext_updates,
        server_lr=(StepSchedule.parse(config.server_lr_schedule)
                   if config.server_lr_schedule else None),
        prox_mu=float(config.fedprox_mu),
        client_dp=(ClientDP(config.client_dp["clip"], config.client_dp["noise"],
                            len(transport.peers)) if config.client_dp else None),
        scalar_dp=(ScalarDP(config.scalar_dp["low"], config.scalar_dp["high"],
                            config.scalar_dp["noise"]) if config.scalar_dp else None),
        streaming=config.streaming)
    setup_excluded = server.setup(config.rounds, config.flooding_bits)
    if setup_excluded and progress:
        progress(f"  key setup excluded {setup_excluded}")

    base = {"seed": seed, "task": config.task, "protocol": config.protocol,
            "backend": config.backend}

    def global_model() -> np.ndarray:
        # the experimenter's view; in server-blind runs only the clients hold the model
        if not config.server_blind:
            return server.params
        first = next(c for c in clients if c not in server.left)
        model = clients[first].global_model
        return server.params if model is None else model

    rows = [{**base, "round": 0, **evaluate(task, data, global_model())}]
    scalar_releases: Counter = Counter()  # protected scalars each client revealed so far
    for rnd in range(config.rounds):
        first_record = len(audit.records)
        start = time.perf_counter()
        report = server.run_round(rnd)
        wall = time.perf_counter() - start
        traffic = [r for r in audit.records[first_record:] if r["event"] == "message"]
        scalar_releases += scalar_release_counts(audit.records[first_record:], audit.run,
                                                 audit.dp_protected & set(NOISABLE_SCALARS))
        row = {**base, "round": rnd + 1, **evaluate(task, data, global_model()),
               "clients": len(report.clients), "excluded": len(report.excluded),
               "bytes_up": sum(r["bytes"] for r in traffic if r["direction"] == "received"),
               "bytes_down": sum(r["bytes"] for r in traffic if r["direction"] == "sent"),
               "seconds_round": wall,
               **{f"seconds_{k}": v for k, v in report.seconds.items()},
               **protocol.round_log(),
               **privacy_columns(config, server, clients, rnd, scalar_releases)}
        rows.append(row)
        if progress:
            metric = row.get("test_pooled", row["train_pooled"])
            progress(f"  seed {seed} round {rnd + 1}/{config.rounds}: {task.metric_name} "
                     f"{metric:.4f}  up {row['bytes_up'] / 1e3:.1f} kB  down "
                     f"{row['bytes_down'] / 1e3:.1f} kB  {wall:.2f} s"
                     + (f"  excluded {report.excluded}" if report.excluded else ""))
    return SeedRun(rows, global_model().copy())


def local_steps_of(config: ExperimentConfig, part: ClientData) -> int:
    """A client's SGD steps per round (for DP-SGD's target-ε calibration)."""
    if config.local_epochs:
        return config.local_epochs * -(-len(part) // config.batch_size)
    return config.local_steps


def privacy_columns(config: ExperimentConfig, server: Server, clients: dict, rnd: int,
                    scalar_releases: Counter) -> dict[str, float]:
    """ε spent up to round ``rnd``, per mechanism (worst client where it differs by client)."""
    out: dict[str, float] = {}
    if config.client_dp is not None:
        out["eps_client_level"] = client_level_epsilon(server.privacy_events, config.dp_delta)
        out["noise_multiplier_realised"] = min(
            (e["noise_multiplier"] for e in server.privacy_events if e["round"] == rnd),
            default=float("nan"))
    if config.dp_sgd is not None:
        per_client = {f"eps_dp_sgd_{cid}": c.trainer.epsilon(config.dp_delta)
                      for cid, c in clients.items()}
        out["eps_dp_sgd_max"] = max(per_client.values())
        out.update(per_client)
    if config.scalar_dp is not None:
        eps = scalar_epsilons(scalar_releases, config.scalar_dp["noise"], config.dp_delta)
        out["eps_scalars_max"] = max(eps.values(), default=0.0)
    return out


def hold_out_validation(data: FederatedData, share: float, seed: int = 0
                        ) -> tuple[FederatedData, list[ClientData]]:
    """Split each client's training samples into training and validation (a fixed split:
    every seed and protocol sees the same one)."""
    rng = np.random.default_rng(seed)
    train, validation = [], []
    for part in data.train:
        order = torch.from_numpy(rng.permutation(len(part)))
        n_val = max(1, int(round(share * len(part))))
        if n_val >= len(part):
            raise ConfigError(f"validation_split {share} leaves a client of {len(part)} "
                              "samples nothing to train on")
        validation.append(ClientData(part.x[order[:n_val]], part.y[order[:n_val]]))
        train.append(ClientData(part.x[order[n_val:]], part.y[order[n_val:]]))
    return replace(data, train=train), validation


def summarize(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds, per protocol/backend/round."""
    keys = ["task", "protocol", "backend", "round"]
    value_cols = [c for c in metrics.columns if c not in keys + ["seed"]
                  and pd.api.types.is_numeric_dtype(metrics[c])]
    grouped = metrics.groupby(keys, sort=False)[value_cols]
    out = grouped.mean().add_suffix("_mean").join(grouped.std(ddof=1).add_suffix("_std"))
    out.insert(0, "n_seeds", metrics.groupby(keys, sort=False)["seed"].nunique())
    ordered = ["n_seeds"] + [f"{c}_{s}" for c in value_cols for s in ("mean", "std")]
    return out[ordered].reset_index()


def run_experiment(config: ExperimentConfig, audit: AuditLog | None = None,
                   progress: Callable[[str], None] | None = None) -> ExperimentResult:
    config.validate()
    audit = audit if audit is not None else AuditLog()
    data = get_task(config.task).load()
    rows: list[dict[str, Any]] = []
    final = {}
    for i, seed in enumerate(config.seeds):
        if progress:
            progress(f"[{i + 1}/{len(config.seeds)}] {config.protocol} on {config.backend}, "
                     f"task {config.task}, seed {seed}")
        run = run_seed(config, seed, audit, data, progress)
        rows += run.rows
        final[seed] = run.final_params
    return ExperimentResult(pd.DataFrame(rows), audit, final)


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
