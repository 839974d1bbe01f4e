"""A run's clients as each one provisions itself: what the driver, a worker process and a
Flower node all build a client from, with nothing of the server or the driver.

- :class:`ClientFactory` builds a seed's clients (or a pre-stage's) from the run's settings:
  data split, trainer, DP-SGD, the backend's and the protocol's client halves;
- :func:`release_budgets` and :func:`client_policy` are what a client's provisioning allows
  (its decryption, open and share budgets, the phases it answers, the training settings it
  accepts), computed from the client's own copy of the settings, never from the server;
- a protocol's pre-stage (FedDisco's β-VAE, DEC's autoencoder) as the clients train it:
  what it is comes from the protocol's ``PreStage`` piece (:func:`pre_stage`), nothing here
  names one.

``secagg.simulation.experiment`` (the driver) uses them; a Flower node imports this module
and not the driver (``tests/test_layering.py``).
"""

from __future__ import annotations

import importlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from secagg.backends import Provision, make_client_backend
from secagg.clients.tasks import (
    ClientData,
    FederatedData,
    Task,
    custom_tasks,
    get_task,
    register_task,
)
from secagg.clients.tasks.tcga_brca import random_client_splits
from secagg.clients.training import LocalTrainer, flat_params, resolve_device
from secagg.errors import ConfigError, DataNotHeld
from secagg.parts import in_parts, part_bounds, part_lengths
from secagg.plugins import import_user_modules
from secagg.protocols import custom_protocols, make_client_half, make_protocol, register_protocol
from secagg.protocols.pieces import (
    ExtraReleases,
    FederatedInitialisation,
    FixedServerStep,
    PreStage,
    ValidationFeedback,
    piece,
)
from secagg.runspec.config import ExperimentConfig

if TYPE_CHECKING:  # client-side and key code: imported where a client is made
    from secagg.clients.policy import ClientPolicy
    from secagg.clients.privacy import PrivateTrainer
    from secagg.clients.runtime import Client


# ---- clients ----------------------------------------------------------------------------------
@dataclass
class ClientFactory:
    """Builds a seed's clients (picklable, so worker processes build them too): each loads
    the task's data itself and makes the same clients in any process.

    ``stage``: None for the run itself, or the name of the protocol's pre-stage (its
    ``PreStage.pretrain``; the piece says what the stage is). The task
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
            task = stage_task(config, data)
            data, validation = task.load(), [None] * data.n_clients
        # each client's model, of which the first also tells the policy the model's size
        models = {cid: task.make_model() for cid in ids}
        some = next(iter(models.values())) if models else task.make_model()
        policy = self.client_policy(flat_params(some).size, data.n_clients)
        return {
            cid: self._build(task, models[cid], data.train[k], validation[k], k, cid, policy)
            for cid, k in ((c, client_index(c)) for c in ids)
        }

    def client_policy(self, n_params: int, n_clients: int) -> ClientPolicy:
        """What each client of this seed (or pre-stage) answers, from this factory's own
        configuration: what a deployment's node provisions itself with (:func:`client_policy`)."""
        config = self.config
        protocol = make_protocol(config.protocol, **config.protocol_options)
        if self.stage is not None:
            config = stage_config(config, piece(protocol, PreStage))
            protocol = make_protocol(PRE_STAGE_PROTOCOL)
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
            stage = piece(protocol, PreStage)
            task = stage_task(config, seed_data(config, self.seed, loaded)[0], stage)
            config, protocol = stage_config(config, stage), make_protocol(PRE_STAGE_PROTOCOL)
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
        model: torch.nn.Module,
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
            model,
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
            protocol, options = PRE_STAGE_PROTOCOL, {}
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


def client_index(client_id: str) -> int:
    """k of ``client_<k>``: the client's part of the task's data."""
    return int(client_id.rsplit("_", 1)[1])


def seed_data(
    config: ExperimentConfig, seed: int, data: FederatedData
) -> tuple[FederatedData, Sequence[ClientData | None]]:
    """The clients' training data for a seed (its own random split, if the run asks for
    one) and their validation sets. Data that holds no client's training set (a
    deployment's coordinator, ``held_by_coordinator``) comes back as it is: the sites split
    their own, and there is nothing here to split. A site's node (``held_by_site``) splits
    its own part exactly as the simulation splits it: each client's hold-out is drawn from
    its own generator, so no client's split depends on another's data."""
    if not any(part.held for part in data.train):
        return data, [None] * data.n_clients
    if config.client_split is not None:
        if not data.holds_training_data:
            raise DataNotHeld(
                "client_split re-deals every client's samples with one generator across the "
                "clients, so a site's node, which holds only its own partition, cannot make "
                "its part of it: run client_split studies in simulation"
            )
        split = seed % config.client_split_count if config.client_split_count else seed
        data = random_client_splits(data, split, config.client_split)
    validation: Sequence[ClientData | None] = [None] * data.n_clients
    if config.validation_split is not None:
        data, validation = hold_out_validation(data, config.validation_split)
    return data, validation


# ---- pre-stages ------------------------------------------------------------------------------
#: the protocol every pre-stage runs with
PRE_STAGE_PROTOCOL = "fedavg"


def pre_stage(config: ExperimentConfig) -> PreStage:
    """The run's pre-stage: its protocol's ``PreStage`` piece, which says everything about
    it (task, schedule, layout, check); ConfigError if the protocol has none."""
    stage = piece(make_protocol(config.protocol, **config.protocol_options), PreStage)
    if stage is None:
        raise ConfigError(f"{config.protocol} has no pre-stage")
    return stage


def _named(ref: Any) -> Any:
    """A piece's callable: the callable itself, or the one ``"module:function"`` names."""
    if isinstance(ref, str):
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)
    return ref


def stage_task(
    config: ExperimentConfig, data: FederatedData, stage: PreStage | None = None
) -> Task:
    """The pre-stage's task on a seed's ``data`` (``PreStage.pre_stage_task``)."""
    stage = stage if stage is not None else pre_stage(config)
    return _named(type(stage).pre_stage_task)(config, data)


def check_stage(
    config: ExperimentConfig, data: FederatedData, stage: PreStage | None = None
) -> None:
    """ConfigError before training if the task's data cannot carry the run's pre-stage
    (``PreStage.pre_stage_check``)."""
    stage = stage if stage is not None else pre_stage(config)
    check = type(stage).pre_stage_check
    if check is not None:
        _named(check)(config, data)


def stage_config(config: ExperimentConfig, stage: PreStage | None = None) -> ExperimentConfig:
    """The pre-stage's configuration: FedAvg on the run's clients for the rounds and client
    rate the piece's schedule gives."""
    return pre_stage_config(config, *pretrain_settings(config, stage))


def pre_stage_config(config: ExperimentConfig, rounds: int, lr: float) -> ExperimentConfig:
    """A pre-stage runs FedAvg on the run's clients for ``rounds`` at client rate ``lr``."""
    return replace(
        config,
        protocol=PRE_STAGE_PROTOCOL,
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


def pretrain_settings(config: ExperimentConfig, stage: PreStage | None = None) -> tuple[int, float]:
    """A pre-stage's rounds and client rate, as its protocol schedules it (DEC's options,
    FedDisco's the run's β-VAE settings)."""
    stage = stage if stage is not None else pre_stage(config)
    return stage.pre_stage_schedule(config)


def server_step(config: ExperimentConfig, protocol, n_clients: int) -> dict[str, Any]:
    """The server optimizer's config: the run's, or the step the protocol fixes (ADMM's
    z-update, for this run's number of clients; the config refuses optimizer settings)."""
    step = piece(protocol, FixedServerStep)
    return config.optimizer_config(protocol) if step is None else step.server_step(n_clients)


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
    extra = piece(protocol, ExtraReleases)
    try:
        lengths = extra.release_lengths(data) if extra is not None else ()
    except DataNotHeld as exc:
        raise DataNotHeld(
            f"{config.protocol} sizes its releases from every client's data "
            "(ExtraReleases.release_lengths), and this process does not hold them all (a "
            "site's node holds only its own partition of a task whose parts are lazy, a "
            "coordinator none): run it on a task whose load() holds every part in memory, "
            "or in simulation"
        ) from exc
    # a run in parts reveals each part of the update, one part long (``secagg.parts``)
    parts = len(part_bounds(n_params, config.part_values))
    model_lengths = part_lengths(n_params, config.part_values)
    others = tuple(n for n in lengths if n not in model_lengths)
    initialisation = piece(protocol, FederatedInitialisation)
    initial_reveals = initialisation.initial_reveals() if initialisation is not None else 0
    return {
        "share_budget": shares if caps.distinct_opens else None,
        # every reveal of the run, not ×2 for the check's second decryptor: a client
        # decrypts one release at most once (CKKSServer.reveal asks distinct clients), and
        # the flooding's t = roster × budget covers two (or three) decryptions per reveal
        "decryption_budget": 0
        if config.server_blind
        else config.rounds * caps.reveals_per_round * parts + initial_reveals,
        "reveal_length": ((*model_lengths, *others) if others or parts > 1 else n_params),
        "open_budget": config.rounds * opens_per_round,
        # one upload enters at most one reveal (none server-blind) and the round's opens
        "releases_per_upload": {
            "reveal": 0 if config.server_blind else 1,
            "open": opens_per_round,
        },
        # the run ledger holds weight rows over the run, or per model where they vary
        "weights_vary": caps.weights_vary,
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
    feedback = piece(protocol, ValidationFeedback) is not None
    phases = {"enroll", "train"}
    if feedback:
        phases.add("validate")
    if config.server_blind:
        phases |= {"apply", "observe"}
    if config.allow_plaintext_updates:
        phases.add("plaintext_update")
    if in_parts(n_params, config.part_values):
        phases |= {"model_part", "upload_part"}
    validations = config.rounds + 1 if feedback else 0
    return ClientPolicy(
        phases=frozenset(phases),
        rounds=config.rounds,
        plan=config.plan(n_clients),
        varies=protocol.varied_settings(),
        # each declared scalar once a round, and the initial validation
        scalar_budget=(config.rounds + 1) * len(caps.client_scalars),
        max_validations=validations,
        server_optimizer={**server_step(config, protocol, n_clients), "dim": n_params},
        part_values=config.part_values if in_parts(n_params, config.part_values) else 0,
    )


def local_steps_of(config: ExperimentConfig, part: ClientData) -> int:
    """A client's SGD steps per round (for DP-SGD's target-ε calibration)."""
    if config.local_epochs:
        return config.local_epochs * -(-len(part) // config.batch_size)
    return config.local_steps


def hold_out_validation(
    data: FederatedData, share: float, seed: int = 0
) -> tuple[FederatedData, list[ClientData | None]]:
    """Split each client's training samples into training and validation (a fixed split:
    every seed and protocol sees the same one). Client k's split comes from a generator of
    its own (``default_rng([seed, k])``), so a site's node makes its own without reading
    another's data; a part not held here stays as it is, with no validation set."""
    train: list[ClientData] = []
    validation: list[ClientData | None] = []
    for k, part in enumerate(data.train):
        if not part.held:
            train.append(part)
            validation.append(None)
            continue
        rng = np.random.default_rng([seed, k])
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
