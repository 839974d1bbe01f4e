"""A SuperNode's secagg client, rebuilt from the node's own directory for every message.

Flower may start a fresh ClientApp process for each message, so nothing is kept in memory:
the client is built from the node's configuration (its client id, its copy of the
experiment's settings, its identity file), restored from the state the previous message
left in the node's directory (``Client.export_state``: keys, model, optimizer copy, data
position), answers, and writes its state back (mode 0600 in folders of mode 0700, through a
fresh temporary, replaced whole: ``keystore.write_private_bytes``) before the reply leaves.
The state lives under ``state/<Flower run>/`` so a new run never picks up an old one's keys.
Nothing of it ever goes to the server.

A node answers only what its own experiment file allows (:meth:`NodeClient.check_request`):
the experiment it names (a digest of the complete settings), one of the file's seeds, the
run itself or its protocol's pre-stage: a request for anything else is refused with
:class:`RequestRefused` before any client, key or budget is made for it. Runs of the same
seed again (a failed run, a new deployment) are the node's privacy ledger's to admit
(``secagg.flower.ledger``): a new Flower run of a seed is admitted before anything is built
for it only while the runs of that seed that released this node's data fit in the node's
own ``runs_per_seed`` (``[privacy]`` of ``node.toml``), and each reply that releases
something is charged there before the reply leaves. A node whose experiment derives DP
noise from the run's seed (``dp_noise = "seeded"``, which the server names) refuses to run
at all (:class:`SeededNoiseRefused`).

Node directory::

    node.json         {"client": "client_0", "experiment": "experiment.toml",
                       "app": the digest of the only Flower App this node runs (guard.py)}
    experiment.toml   the run's settings (the node's own copy)
    identity.json     its private keys and the rosters (mode 0600)
    node.toml         the operator's own settings: environment, imports, [privacy]
    state/<run>/<seed>-<stage>.bin
    privacy-ledger.json   the runs of each seed that released its data (mode 0600; the
                          folder ``[privacy] ledger`` names, else here)
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from secagg.backends import backend_spec
from secagg.errors import ConfigError, MalformedMessage, SecaggError
from secagg.flower.experimenter import OBSERVER_PUBLIC, read_observer_public
from secagg.flower.keystore import (
    IDENTITY,
    KEYS,
    ROSTER,
    experiment_name,
    read_node_identity,
    write_private_bytes,
)
from secagg.flower.ledger import (
    LedgerSettings,
    NodeLedger,
    data_fingerprint,
    line_key,
    released_counts,
)
from secagg.plugins import only_node_modules
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.settings import read_file, to_config


class RequestRefused(SecaggError):
    """A node refuses a request its own experiment file does not allow: another seed, or a
    stage its protocol does not have. Nothing is computed for it and no key is made."""


class SeededNoiseRefused(ConfigError):
    """An experiment whose DP noise comes from the run's seed cannot run over Flower: the
    server names the seed, so it could compute every client's noise and remove it."""


def uses_dp(config: ExperimentConfig) -> bool:
    return any(x is not None for x in (config.client_dp, config.dp_sgd, config.scalar_dp))


def check_runs_on_flower(config: ExperimentConfig) -> ExperimentConfig:
    if config.dp_noise == "seeded" and uses_dp(config):
        raise SeededNoiseRefused(
            "dp_noise = \"seeded\" derives every client's DP noise from the run's seed, "
            "which the server names over Flower, so the server could remove the noise: set "
            'dp_noise = "os" (--dp-noise os) for a deployment'
        )
    return config


def load_experiment(path: Path) -> ExperimentConfig:
    """A deployment's settings file (ConfigError if it is not one Flower can run)."""
    config, _ = to_config(read_file(path))
    return check_runs_on_flower(config)


#: the task's data by task name, loaded in the warm executor's zygote before it forks
#: (secagg.flower.warm), so that every message's process inherits it: each message runs in
#: a process of its own, so no two messages share what a client does to it
_PRELOADED: dict[str, Any] = {}


def preload_task_data(task: str) -> None:
    """Load ``task``'s data now, for the processes this one forks (the warm zygote only:
    in-process transports keep loading per message, as a simulation loads per seed)."""
    from secagg.clients.tasks import get_task

    _PRELOADED[task] = get_task(task).load()


def task_data(task: str, client_id: str) -> Any:
    """What ``client_id``'s node holds of the task's data (``held_by_site``: its own
    partition; another site's lazy part is never opened here), from what the zygote
    preloaded, else from ``get_task(task).load()``."""
    from secagg.clients.tasks.tcga_brca import held_by_site
    from secagg.runspec.provisioning import client_index

    if task in _PRELOADED:
        declared = _PRELOADED[task]
    else:
        from secagg.clients.tasks import get_task

        declared = get_task(task).load()
    return held_by_site(declared, client_index(client_id))


#: a node's own settings, written by its operator, never by the coordinator
NODE_SETTINGS = "node.toml"


def read_node_settings(node_dir: Path) -> dict[str, Any]:
    """A node's own ``node.toml`` (empty where there is none), its tables checked by name."""
    import tomllib

    path = Path(node_dir) / NODE_SETTINGS
    if not path.exists():
        return {}
    try:
        settings = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(settings) - {"environment", "imports", "privacy"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown settings {unknown}; it may set environment, imports, privacy"
        )
    return settings


def ledger_settings(node_dir: Path) -> LedgerSettings:
    """``[privacy]`` of a node's ``node.toml``: how many runs of each seed may release its
    data (``runs_per_seed``, default 1) and where its ledger is (``ledger``, default the
    node folder). The operator's, never the server's."""
    table = read_node_settings(node_dir).get("privacy", {})
    return LedgerSettings.from_table(table, Path(node_dir), Path(node_dir) / NODE_SETTINGS)


def apply_node_settings(node_dir: Path) -> list[str]:
    """Apply a node's own ``node.toml`` to this process: ``environment`` (a table of
    strings) is set first, then the modules of ``imports`` are imported (names or .py
    paths), which are returned (``[privacy]`` is the ledger's: :func:`ledger_settings`).
    A node brings its own data and task so: its operator's copy of the task's module
    (which stands in for the module of the same name the experiment names on the
    coordinator's machine: the node imports nothing else,
    ``secagg.plugins.only_node_modules``), and the variables that module reads to find the
    node's data (e.g. ``SITES_DIR``). Nothing here comes from the server."""
    import os

    from secagg.plugins import import_user_modules

    path = Path(node_dir) / NODE_SETTINGS
    settings = read_node_settings(node_dir)
    environment, imports = settings.get("environment", {}), settings.get("imports", [])
    if not isinstance(environment, dict) or not all(
        isinstance(v, str) for v in environment.values()
    ):
        raise ConfigError(f'{path}: environment is a table of strings, e.g. SITES_DIR = "/data"')
    if not isinstance(imports, list) or not all(isinstance(n, str) for n in imports):
        raise ConfigError(f"{path}: imports is a list of module names or .py paths")
    os.environ.update(environment)
    base = Path(node_dir).resolve()
    own = [str(base / n) if n.endswith(".py") and not Path(n).is_absolute() else n for n in imports]
    import_user_modules(own)
    return own


#: what a node's client is built from: a cached NodeClient is reused while none changed
_READS = ("node.json", "experiment.toml", IDENTITY, KEYS, ROSTER, NODE_SETTINGS, OBSERVER_PUBLIC)
_BUILT: dict[Path, tuple[tuple, NodeClient]] = {}


def _stamp(node_dir: Path) -> tuple:
    out = []
    for name in _READS:
        try:
            st = (node_dir / name).stat()
        except FileNotFoundError:
            continue
        out.append((name, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


def node_client(node_dir: Path | str) -> NodeClient:
    """The NodeClient of ``node_dir``, built once per process while the files it read stay
    as they were (the warm zygote builds it before it forks, so a message's process starts
    with the node's settings parsed and checked)."""
    key = Path(node_dir).resolve()
    stamp = _stamp(key)
    cached = _BUILT.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    node = NodeClient(key)
    _BUILT[key] = (stamp, node)
    return node


class NodeClient:
    """The client of the node whose directory is ``node_dir``."""

    def __init__(self, node_dir: Path | str):
        self.dir = Path(node_dir)
        try:
            layout = json.loads((self.dir / "node.json").read_text())
            self.client_id = str(layout["client"])
            experiment = self.dir / str(layout.get("experiment", "experiment.toml"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{self.dir} is not a secagg node directory ({exc}); make one with "
                "`secagg flower prepare`"
            ) from None
        # the node's own code and data come first; the experiment's imports are not run
        self.own_modules = apply_node_settings(self.dir)
        with only_node_modules(self.own_modules):
            self.config = load_experiment(experiment)
        self.experiment = experiment_name(self.config)
        self.identity = read_node_identity(self.dir)
        self.ledger = NodeLedger(
            self.client_id, self.dir, ledger_settings(self.dir), self.dir / NODE_SETTINGS
        )
        self.observer_public()  # a server-blind node without the experimenter's key stops here
        if self.identity.client_id != self.client_id:
            raise ConfigError(
                f"{self.dir}: node.json names {self.client_id}, identity.json holds the keys "
                f"of {self.identity.client_id}"
            )

    def answer(
        self, envelope: bytes | None, run: dict[str, Any], flower_run: int, node_id: int
    ) -> bytes:
        """The reply to one request (a hello when ``envelope`` is None: which client this
        node is, signed over the server's nonce and this node's id)."""
        if run.get("experiment") != self.experiment:
            raise ConfigError(
                f"{self.client_id} is configured for experiment {self.experiment}, the server "
                f"runs {run.get('experiment')!r}: give the node the server's settings"
            )
        if envelope is None:
            return self._hello(str(run.get("hello", "")), node_id)
        seed, stage = self.check_request(run, flower_run)
        path = self.state_path(flower_run, seed, stage)
        # admitted (or refused) by the node's ledger before any key or client is made; the
        # data's fingerprint is taken only where a new run asks for admission
        self.ledger.admit(
            flower_run=flower_run,
            seed=seed,
            stage=stage,
            has_state=path.exists(),
            line=lambda: line_key(self.config.task, self.data_fingerprint(), seed, stage),
            per_run=lambda: self.per_run(seed, stage),
        )
        client = self._client(seed, stage)
        previous = path.read_bytes() if path.exists() else None
        if previous is not None:
            client.restore_state(previous)
        plaintext = (
            backend_spec(self.config.backend).server_reads_uploads
            or self.config.allow_plaintext_updates
        )
        before = released_counts(client, plaintext_updates=plaintext)
        # a state rolled back behind what the ledger charged would release again: refused
        self.ledger.check_state(flower_run=flower_run, seed=seed, stage=stage, counts=before)
        reply = client.handle(envelope)
        after = released_counts(client, plaintext_updates=plaintext)
        if after != before:  # this reply releases something: charged before it leaves
            self.ledger.charge(flower_run=flower_run, seed=seed, stage=stage, counts=after)
        state = client.export_state()
        # a message that changed nothing is not written and synced again (a 1e6 model's
        # state is 16 MB); today every round's phase changes it (counters, consents), only
        # enrolment does not
        if state != previous:
            write_private_bytes(path, state, private_from=self.dir / "state")
        return reply

    @property
    def stages(self) -> set[str | None]:
        """What this node's experiment runs per seed: the run (None) and its protocol's
        pre-stage, if it has one."""
        from secagg.protocols import make_protocol
        from secagg.protocols.pieces import pre_stage_of

        return {
            None,
            pre_stage_of(make_protocol(self.config.protocol, **self.config.protocol_options)),
        }

    def check_request(self, run: dict[str, Any], flower_run: int) -> tuple[int, str | None]:
        """(seed, stage) of a request, if this node's own experiment file allows it:
        RequestRefused otherwise (nothing is built for it). Whether this Flower run may run
        that seed is the ledger's to say (:meth:`answer`)."""
        seed, stage = run.get("seed"), run.get("stage") or None
        if type(seed) is not int:
            raise MalformedMessage("a request names no seed")
        if seed not in self.config.seeds:
            raise RequestRefused(
                f"{self.client_id} serves the seeds of its experiment file "
                f"{sorted(self.config.seeds)}, not seed {seed}"
            )
        if stage not in self.stages:
            raise RequestRefused(
                f"{self.client_id}'s experiment ({self.config.protocol}) has no stage {stage!r}"
            )
        return seed, stage

    def _hello(self, nonce: str, node_id: int) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from secagg.flower.transport import hello_message

        if len(nonce) < 32:
            raise MalformedMessage("a hello without the server's nonce")
        key = Ed25519PrivateKey.from_private_bytes(self.identity.ed25519_private)
        signature = key.sign(hello_message(self.experiment, nonce, node_id, self.client_id))
        return json.dumps(
            {"client": self.client_id, "signature": base64.b64encode(signature).decode()}
        ).encode()

    def state_path(self, flower_run: int, seed: int, stage: str | None) -> Path:
        return self.dir / "state" / str(int(flower_run)) / f"{seed}-{stage or 'run'}.bin"

    def observer_public(self) -> bytes | None:
        """Server-blind experiments: the experimenter's public key, from this node's own
        bundle (``observer.pub``), never from the server, which could otherwise have the
        model sealed for a key of its own."""
        if not self.config.server_blind:
            return None
        path = self.dir / OBSERVER_PUBLIC
        if not path.exists():
            raise ConfigError(
                f"{self.dir} runs a server-blind experiment but holds no {OBSERVER_PUBLIC}, "
                "the experimenter's public key to seal the model for: take it from the "
                "coordinator's bundle (secagg flower join)"
            )
        return read_observer_public(path)

    def data_fingerprint(self) -> str:
        """A digest of this node's client's partition, as the node's task loads it (the
        ledger counts runs per data: ``secagg.flower.ledger``)."""
        from secagg.runspec.provisioning import client_index

        with only_node_modules(self.own_modules):
            loaded = task_data(self.config.task, self.client_id)
        return data_fingerprint(loaded.train[client_index(self.client_id)])

    def per_run(self, seed: int, stage: str | None) -> str:
        """What one run of (seed, stage) may release, as this node provisions it (for the
        ledger's messages)."""
        from secagg.runspec.provisioning import ClientFactory

        with only_node_modules(self.own_modules):
            factory = ClientFactory(self.config, seed, stage=stage)
            budgets = factory.release_budgets(loaded=task_data(self.config.task, self.client_id))
        dp = [
            name
            for name, on in (
                ("client-level DP", self.config.client_dp),
                ("DP-SGD", self.config.dp_sgd),
                ("scalar DP", self.config.scalar_dp),
            )
            if on is not None
        ]
        return (
            f"{budgets['decryption_budget']} reveal(s) and {budgets['open_budget']} open(s) "
            f"over {self.config.rounds} round(s)"
            + (f", with the ε of its {', '.join(dp)}" if dp else ", without DP")
        )

    def _client(self, seed: int, stage: str | None):
        import torch

        from secagg.runspec.provisioning import ClientFactory

        # the run's intra-op threads (1 by default), as in-process clients and workers
        # train: several nodes on one machine would otherwise each take every core
        torch.set_num_threads(self.config.threads)
        with only_node_modules(self.own_modules):
            factory = ClientFactory(
                self.config, seed, stage=stage, observer_public=self.observer_public()
            )
            # one load per message, for both uses
            loaded = task_data(self.config.task, self.client_id)
            budgets = factory.release_budgets(loaded=loaded)
            provision = self.identity.provision(**budgets)
            factory = replace(factory, provisions={self.client_id: provision})
            client = factory([self.client_id], loaded=loaded)[self.client_id]
        # this process answers one message: seeds it committed for its next upload would die
        # with it (they are never written to the state), and decryptors would expand a check
        # for uploads that will not use them
        client.backend.commits_ahead = False
        return client
