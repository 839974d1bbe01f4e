"""A deployment's folder: what ``secagg flower prepare`` writes, once, for one experiment.

::

    DIR/experiment.toml          the run's settings (the server's copy)
    DIR/server/signers.json      the clients' public signing keys (the server's roster)
    DIR/app/pyproject.toml       the Flower App that ``flwr run`` submits
    DIR/nodes/<client>/          one folder per SuperNode: copy each to its machine
        node.json (its client, and the digest of the App it runs: guard.py),
        experiment.toml, identity.json (mode 0600)
    DIR/deployment.json          the experiment's name, the App's digest, the clients, TLS and
                                 auth on or off
    DIR/tls/                     a local demo CA and the SuperLink's certificate (``--tls``)
    DIR/auth/<client>.pub        the SuperNodes' public authentication keys (``--auth``);
                                 each private key is in its node folder (auth.key)

Across machines nothing changes but where the folders go: ``nodes/<client>`` to that
client's machine (its identity file must not leave it afterwards; the node starts with
``secagg flower node``, which runs the App pinned in its ``node.json`` only), ``server``
and ``app`` to the machine that submits the run, and the CA certificate to every SuperNode.
"""

from __future__ import annotations

import json
from pathlib import Path

from secagg.backends import new_identities
from secagg.errors import ConfigError
from secagg.flower.certificates import make_node_key, make_tls
from secagg.flower.guard import app_digest, build_app
from secagg.flower.keystore import experiment_name, write_identity, write_signers
from secagg.flower.node import check_runs_on_flower
from secagg.simulation.config import ExperimentConfig
from secagg.simulation.settings import from_config, to_toml

APP_TOML = """\
# The Flower App of a secagg deployment: its code is the installed secagg package
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "secagg-flower"
version = "1.0.0"
description = "secagg's protocols over Flower"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "secagg"

[tool.flwr.app.components]
serverapp = "secagg.flower.apps:server_app"
clientapp = "secagg.flower.apps:client_app"

[tool.flwr.app.config]
deployment = "{deployment}"
out = ""
timeout = {timeout}
connect-timeout = 120.0
"""


def client_ids(config: ExperimentConfig) -> list[str]:
    from secagg.clients.tasks import get_task

    return [f"client_{k}" for k in range(get_task(config.task).load().n_clients)]


def prepare(
    folder: Path,
    config: ExperimentConfig,
    *,
    tls: bool = False,
    auth: bool = False,
    timeout: float = 120.0,
    hosts: tuple[str, ...] = (),
) -> dict[str, Path]:
    """Write a deployment of ``config`` to ``folder`` (new or empty); returns each node's
    directory by client id.

    Parameters:
        tls: make a demo CA and the SuperLink's certificate (``tls/``); each node gets
            the CA certificate.
        auth: make each SuperNode's authentication key (in its node folder; the public
            keys also in ``auth/`` for the SuperLink's registration). Needs ``tls``.
        timeout: seconds a node has to answer one message (the ServerApp's default).
        hosts: names or addresses of the SuperLink's machine for its certificate, besides
            loopback's.
    """
    if auth and not tls:
        raise ConfigError("SuperNode authentication needs TLS (Flower refuses it without)")
    folder = Path(folder).resolve()
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} is not empty: prepare a deployment in a new folder")
    check_runs_on_flower(config.validate())
    settings = to_toml(from_config(config), comment=f"experiment {experiment_name(config)}")
    ids = client_ids(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "experiment.toml").write_text(settings)
    identities = new_identities(ids)
    write_signers(folder / "server" / "signers.json", identities[ids[0]].signers)
    (folder / "app").mkdir()
    (folder / "app" / "pyproject.toml").write_text(
        APP_TOML.format(deployment=folder, timeout=float(timeout))
    )
    # the only App the nodes will run: what `flwr run app/` builds from this folder
    app = app_digest(build_app(folder / "app"))
    nodes = {}
    for cid in ids:
        node = folder / "nodes" / cid
        node.mkdir(parents=True, mode=0o700)
        layout = {"client": cid, "experiment": "experiment.toml", "app": app}
        (node / "node.json").write_text(json.dumps(layout, indent=1) + "\n")
        (node / "experiment.toml").write_text(settings)
        write_identity(node / "identity.json", identities[cid])
        nodes[cid] = node
    if tls:
        ca = make_tls(folder / "tls", ("127.0.0.1", "localhost", "::1", *hosts))["ca"]
        for node in nodes.values():
            (node / "ca.crt").write_bytes(ca.read_bytes())
    if auth:
        (folder / "auth").mkdir()
        for cid, node in nodes.items():
            public = make_node_key(node / "auth.key")
            (folder / "auth" / f"{cid}.pub").write_bytes(public.read_bytes())
    (folder / "deployment.json").write_text(
        json.dumps(
            {
                "experiment": experiment_name(config),
                "app": app,
                "clients": ids,
                "tls": tls,
                "auth": auth,
            }
        )
    )
    return nodes
