"""A deployment's folder: what ``secagg flower prepare`` writes for one experiment, and
re-prepares in place for changed settings (``--update``, :func:`reprepare`: the settings,
the App and the node bundles anew, every certificate and key kept).

::

    DIR/experiment.toml          the run's settings (the server's copy)
    DIR/server/signers.json      the clients' public signing keys (the server's roster)
    DIR/app/pyproject.toml       the Flower App that ``flwr run`` submits
    DIR/nodes/<client>/          one folder per SuperNode: copy each to its machine
        node.json (its client, and the digest of the App it runs: guard.py),
        experiment.toml, identity.json (mode 0600)
    DIR/deployment.json          the experiment's name, the App's digest, the clients, TLS and
                                 auth on or off
    DIR/tls/                     the CA certificate and the SuperLink's certificate and key:
                                 a local demo CA's (``--tls``) or the deployment's own
                                 (``--ca-cert``, ``--server-cert``, ``--server-key``)
    DIR/auth/<client>.pub        the SuperNodes' public authentication keys (``--auth``);
                                 each private key is in its node folder (auth.key)
    DIR/observer.pub             server-blind: the experimenter's public key (also in every
                                 node folder); DIR/experimenter/ holds its private key when
                                 ``prepare`` made it (a demo: move it off the server)

With ``--nodes`` (each node made its own keys with ``secagg flower init``), ``nodes/<client>``
holds no ``identity.json`` but ``roster.json``, the rosters assembled from the nodes'
``public.json`` files: a public bundle that the node takes in with ``secagg flower join``,
and ``auth/`` holds the SuperNode keys the nodes made; no private key is made here.

Across machines nothing changes but where the folders go: ``nodes/<client>`` to that
client's machine (its identity file must not leave it afterwards; the node starts with
``secagg flower node``, which runs the App pinned in its ``node.json`` only), ``server``
and ``app`` to the machine that submits the run, and the CA certificate to every SuperNode.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from secagg.errors import ConfigError
from secagg.flower.certificates import make_node_key, make_tls, use_own_tls
from secagg.flower.experimenter import OBSERVER_PUBLIC, make_experimenter, read_observer_public
from secagg.flower.guard import app_digest, build_app
from secagg.flower.keystore import (
    KEYS,
    PUBLIC,
    ROSTER,
    experiment_name,
    read_node_identity,
    read_public,
    write_identity,
    write_node_keys,
    write_roster,
    write_signers,
)
from secagg.flower.node import NODE_SETTINGS, check_runs_on_flower
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.settings import check_keys, from_config, imports_named_in, to_config, to_toml
from secagg.secret.identities import new_identities


def app_pyproject(*, comment: str, name: str, description: str, module: str, config: str) -> str:
    """The pyproject.toml of a Flower App whose ServerApp and ClientApp are ``module``'s
    ``server_app`` and ``client_app``, opening with the line ``# comment``, with the
    run-config section ``config`` (TOML lines)."""
    return f"""\
# {comment}
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "{description}"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "secagg"

[tool.flwr.app.components]
serverapp = "{module}:server_app"
clientapp = "{module}:client_app"

[tool.flwr.app.config]
{config}"""


def app_toml(timeout: float) -> str:
    """The pyproject.toml of a secagg deployment's App: its code is the installed package."""
    return app_pyproject(
        comment="The Flower App of a secagg deployment: its code is the installed secagg package",
        name="secagg-flower",
        description="secagg's protocols over Flower",
        module="secagg.flower.apps",
        config=(
            "# the deployment folder on the machine that submits the run: `flwr run app secagg\n"
            "# --run-config 'deployment=\"/path/to/it\"'` (the App itself names no path: "
            "it can move)\n"
            f'deployment = ""\nout = ""\ntimeout = {float(timeout)}\nconnect-timeout = 120.0\n'
        ),
    )


def client_ids(config: ExperimentConfig) -> list[str]:
    from secagg.clients.tasks import get_task

    return [f"client_{k}" for k in range(get_task(config.task).load().n_clients)]


def init_node(folder: Path, client_id: str, *, auth: bool = False) -> Path:
    """Make a node's own keys where the node runs: ``keys.json`` (its X25519 and Ed25519
    private keys, mode 0600), with ``auth`` its SuperNode key (``auth.key``, 0600), and
    ``public.json``, the public halves, which is all that leaves the node. Returns the
    path of ``public.json``. A folder that holds keys already is refused (a node's keys
    are made once)."""
    folder = Path(folder).resolve()
    if (folder / KEYS).exists() or (folder / "identity.json").exists():
        raise ConfigError(f"{folder} holds a node's keys already: they are made once")
    if not client_id or not client_id.replace("_", "").isalnum():
        raise ConfigError(f"a client id is letters, digits and _, e.g. client_0; got {client_id!r}")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity = new_identities([client_id])[client_id]
    auth_public = make_node_key(folder / "auth.key").read_text() if auth else None
    return write_node_keys(folder, identity, auth_public)


#: what a node takes in from the coordinator's bundle (all public)
BUNDLE = ("node.json", "experiment.toml", ROSTER, "ca.crt", OBSERVER_PUBLIC)


def join_node(folder: Path, bundle: Path) -> list[str]:
    """Take the coordinator's bundle for this node (``nodes/<client>/`` of a deployment
    prepared with ``--nodes``: settings, pinned App, rosters, CA certificate) into the
    node's own folder, after checking that the rosters hold this node's own public keys.
    A node joins again with its same keys whenever the coordinator re-prepares the
    deployment (``prepare --update``); a bundle that fails a check leaves the one the node
    has in place. Returns the modules the experiment imports that the node's
    ``node.toml`` does not name yet: the node refuses to start until its operator names a
    copy of each (or none)."""
    folder, bundle = Path(folder).resolve(), Path(bundle).resolve()
    own = read_public(folder / PUBLIC)
    spec = json.loads((bundle / "node.json").read_text()) if (bundle / "node.json").exists() else {}
    if spec.get("client") != own["client"]:
        raise ConfigError(
            f"{bundle} is the bundle of {spec.get('client')!r}, this node is {own['client']!r}"
        )
    staged = {name: (bundle / name).read_bytes() for name in BUNDLE if (bundle / name).exists()}
    for name in BUNDLE[:3]:
        if name not in staged:
            raise ConfigError(f"{bundle} has no {name}: not a node bundle of `prepare --nodes`")
    check_roster_holds(staged[ROSTER], own, bundle)
    for name in BUNDLE:  # the folder becomes the bundle: what it no longer has goes
        if name in staged:
            (folder / name).write_bytes(staged[name])
        else:
            (folder / name).unlink(missing_ok=True)
    read_node_identity(folder)  # the rosters name this node's keys, or nothing is run
    return uncovered_imports(folder)


def check_roster_holds(roster: bytes, own: dict[str, Any], bundle: Path) -> None:
    """ConfigError unless the bundle's ``roster.json`` holds the node's own public keys
    (``own``: its ``public.json``) for its client."""
    client = own["client"]
    try:
        rosters = json.loads(roster)
        shown = {
            "x25519": base64.b64decode(rosters["roster"][client], validate=True),
            "ed25519": base64.b64decode(rosters["signers"][client], validate=True),
        }
    except (ValueError, KeyError, TypeError):
        shown = {}
    if any(shown.get(k) != own[k] for k in ("x25519", "ed25519")):
        raise ConfigError(
            f"{bundle}: the roster does not hold this node's own public keys for {client}; "
            "the coordinator must prepare with this node's public.json"
        )


def uncovered_imports(folder: Path) -> list[str]:
    """The modules a node's experiment file imports that its own ``node.toml`` does not
    name (read without importing either)."""
    import tomllib

    from secagg.plugins import module_key

    named = imports_named_in(Path(folder) / "experiment.toml")
    path = Path(folder) / NODE_SETTINGS
    own = tomllib.loads(path.read_text()).get("imports", []) if path.exists() else []
    keys = {module_key(str(n)) for n in own}
    return [n for n in named if module_key(n) not in keys]


def prepare(
    folder: Path,
    config: ExperimentConfig,
    *,
    tls: bool = False,
    auth: bool = False,
    timeout: float = 120.0,
    hosts: tuple[str, ...] = (),
    publics: tuple[Path, ...] = (),
    own_tls: dict[str, Path] | None = None,
    observer: Path | None = None,
) -> dict[str, Path]:
    """Write a deployment of ``config`` to ``folder`` (new or empty); returns each node's
    directory by client id.

    Parameters:
        tls: make a demo CA and the SuperLink's certificate (``tls/``); each node gets
            the CA certificate.
        auth: SuperNode authentication (the public keys in ``auth/`` for the SuperLink's
            registration). Needs ``tls``.
        timeout: seconds a node has to answer one message (the ServerApp's default).
        hosts: names or addresses of the SuperLink's machine for its certificate, besides
            loopback's.
        publics: the nodes' ``public.json`` files (``secagg flower init`` on each node):
            the rosters are assembled from them and ``nodes/<client>/`` holds only public
            bundles (``secagg flower join``); no private key is made or written here.
            Without them ``prepare`` makes every node's keys itself (a demo on one machine).
        own_tls: the deployment's own CA certificate and the SuperLink's certificate and
            key (``{"ca": ..., "cert": ..., "key": ...}``) instead of a demo CA; checked
            (``certificates.use_own_tls``) and taken into ``tls/``. Implies ``tls``.
        observer: server-blind experiments: the experimenter's ``observer.pub`` (``secagg
            flower experimenter`` where the experimenter works), which goes to every node.
            Without it ``prepare`` makes the key pair in ``experimenter/`` (a demo: move
            that folder off the SuperLink's machine, or the server can read the model).
    """
    tls = tls or own_tls is not None
    if auth and not tls:
        raise ConfigError("SuperNode authentication needs TLS (Flower refuses it without)")
    folder = Path(folder).resolve()
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} is not empty: prepare a deployment in a new folder")
    check_runs_on_flower(config.validate())
    if observer is not None and not config.server_blind:
        raise ConfigError("--observer is the experimenter's key of a server-blind run")
    if observer is not None:
        read_observer_public(observer)  # a public key, before anything is written
    if own_tls is not None:  # checked before anything is written
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            use_own_tls(Path(scratch), **own_tls, hosts=hosts)
    settings, experiment = experiment_file(config)
    ids = client_ids(config)
    shown = assemble(publics, ids, auth=auth) if publics else None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "experiment.toml").write_text(settings)
    observer_file = b""
    if config.server_blind:  # the experimenter's public key, for the record and each node
        made = observer if observer is not None else make_experimenter(folder / "experimenter")
        observer_file = Path(made).read_bytes()
        (folder / OBSERVER_PUBLIC).write_bytes(observer_file)
    identities = new_identities(ids) if shown is None else {}
    signers = {c: p["ed25519"] for c, p in shown.items()} if shown else identities[ids[0]].signers
    write_signers(folder / "server" / "signers.json", signers)
    (folder / "app").mkdir()
    (folder / "app" / "pyproject.toml").write_text(app_toml(timeout))
    # the only App the nodes will run: what `flwr run app/` builds from this folder
    app = app_digest(build_app(folder / "app"))
    nodes = {}
    for cid in ids:
        node = folder / "nodes" / cid
        node.mkdir(parents=True, mode=0o700)
        write_bundle(node, cid, settings=settings, app=app, observer=observer_file)
        if shown is None:
            write_identity(node / "identity.json", identities[cid])
            if config.imports:  # a demo's nodes are the coordinator's: its code is theirs
                (node / NODE_SETTINGS).write_text(demo_node_toml(config.imports))
        else:
            write_roster(
                node / ROSTER,
                {c: p["x25519"] for c, p in shown.items()},
                {c: p["ed25519"] for c, p in shown.items()},
            )
        nodes[cid] = node
    if tls:
        if own_tls is not None:
            ca = use_own_tls(folder / "tls", **own_tls, hosts=hosts)["ca"]
        else:
            ca = make_tls(folder / "tls", ("127.0.0.1", "localhost", "::1", *hosts))["ca"]
        for node in nodes.values():
            (node / "ca.crt").write_bytes(ca.read_bytes())
    if auth:
        (folder / "auth").mkdir()
        for cid, node in nodes.items():
            if shown is None:
                public = make_node_key(node / "auth.key").read_text()
            else:
                public = shown[cid]["auth"]
            (folder / "auth" / f"{cid}.pub").write_text(public)
    keys = "prepared" if shown is None else "nodes"
    write_record(folder, experiment, app, clients=ids, tls=tls, auth=auth, keys=keys)
    return nodes


def experiment_file(config: ExperimentConfig) -> tuple[str, str]:
    """The experiment's settings file (the server's copy and every node's) and the
    experiment's name as the server and the nodes compute it: from the file as they read
    it. A configuration built from flags may digest otherwise (its backend's options not
    yet spelled out), and the same settings must keep the same name, or a re-prepared
    deployment would send every site a new bundle for nothing."""
    import tomllib

    body = to_toml(from_config(config))
    as_read, _ = to_config(check_keys(tomllib.loads(body), "experiment.toml"))
    name = experiment_name(as_read)
    return to_toml(from_config(config), comment=f"experiment {name}"), name


def demo_node_toml(imports: list[str]) -> str:
    """A demo node's ``node.toml``: the coordinator's modules, since its nodes are the
    coordinator's own."""
    return (
        "# this node's own code (a node imports no module its experiment names\n"
        "# unless it is named here)\nimports = " + json.dumps(imports) + "\n"
    )


def write_bundle(node: Path, client: str, *, settings: str, app: str, observer: bytes) -> None:
    """What the coordinator writes into a node's folder for one experiment: ``node.json``
    (its client and the pinned App), ``experiment.toml`` and, server-blind (``observer``
    not empty), the experimenter's public key, which the node seals for (from its own
    bundle, never from the server)."""
    layout = {"client": client, "experiment": "experiment.toml", "app": app}
    (node / "node.json").write_text(json.dumps(layout, indent=1) + "\n")
    (node / "experiment.toml").write_text(settings)
    if observer:
        (node / OBSERVER_PUBLIC).write_bytes(observer)
    else:  # an experiment that is not server-blind seals for no one
        (node / OBSERVER_PUBLIC).unlink(missing_ok=True)


def write_record(
    folder: Path,
    experiment: str,
    app: str,
    *,
    clients: list[str],
    tls: bool,
    auth: bool,
    keys: str,
) -> None:
    """``deployment.json``: what ``demo``, ``commands`` and ``prepare --update`` read."""
    record = {
        "experiment": experiment,
        "app": app,
        "clients": clients,
        "tls": tls,
        "auth": auth,
        "keys": keys,
    }
    (folder / "deployment.json").write_text(json.dumps(record))


def assemble(publics: tuple[Path, ...], ids: list[str], *, auth: bool) -> dict[str, dict]:
    """The nodes' public keys by client, one file per client of the experiment: each
    client exactly once, no stranger, a SuperNode key with ``auth``."""
    shown: dict[str, dict] = {}
    for path in publics:
        public = read_public(path)
        if public["client"] in shown:
            raise ConfigError(f"two public.json files for {public['client']} ({path})")
        shown[public["client"]] = public
    missing, strangers = sorted(set(ids) - set(shown)), sorted(set(shown) - set(ids))
    if missing or strangers:
        raise ConfigError(
            f"the experiment's clients are {', '.join(ids)}: "
            + (f"no public.json for {', '.join(missing)}" if missing else "")
            + ("; " if missing and strangers else "")
            + (f"{', '.join(strangers)} is not one of them" if strangers else "")
        )
    if auth and any(p["auth"] is None for p in shown.values()):
        lacking = sorted(c for c, p in shown.items() if p["auth"] is None)
        raise ConfigError(
            f"--auth: {', '.join(lacking)} made no SuperNode key (secagg flower init --auth)"
        )
    keys = [p[k] for p in shown.values() for k in ("x25519", "ed25519")]
    if len(set(keys)) != len(keys):
        raise ConfigError("two nodes show the same public key: each node makes its own")
    return {c: shown[c] for c in ids}
