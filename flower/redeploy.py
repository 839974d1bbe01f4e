"""Re-preparing a deployment in place: ``secagg flower prepare DIR --update``.

Where a failed run needs other settings, the deployment is prepared again in its own folder
(:func:`reprepare`): the settings, the App and its pin, each node's bundle and
``deployment.json`` are rewritten; the CA, the SuperLink's certificate and key, the SuperNode
keys, the nodes' keys, rosters, state and privacy ledgers and the experimenter's key stay
byte for byte (``REWRITTEN`` says what changes). :class:`Reprepared` says, per site, which
of its bundle's files changed, so that only those sites take the new bundle (``secagg flower
join``). What cannot be kept safely (other clients, TLS or authentication switched on,
certificates of one's own) is refused before anything is written.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from secagg.errors import ConfigError
from secagg.flower.certificates import check_kept_tls
from secagg.flower.deployment import (
    BUNDLE,
    app_toml,
    assemble,
    client_ids,
    demo_node_toml,
    experiment_file,
    write_bundle,
    write_record,
)
from secagg.flower.experimenter import OBSERVER_PUBLIC, make_experimenter, read_observer_public
from secagg.flower.guard import app_digest, build_app
from secagg.flower.keystore import IDENTITY, ROSTER
from secagg.flower.node import NODE_SETTINGS, check_runs_on_flower
from secagg.runspec import settings as S
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.settings import imports_named_in

#: what ``reprepare`` rewrites: the settings, the App and its pin, each node's bundle files
#: (``write_bundle``) and ``deployment.json``. Everything else stays byte for byte: ``tls/``
#: (the CA every node trusts, the SuperLink's certificate and key), ``auth/`` (the SuperNode
#: keys the SuperLink registered), ``server/signers.json``, the nodes' keys and rosters, their
#: state and privacy ledgers, ``experimenter/`` and ``results/``
REWRITTEN = ("experiment.toml", "app/pyproject.toml", "deployment.json")


@dataclass(frozen=True)
class Reprepared:
    """What :func:`reprepare` did.

    Attributes:
        nodes: each node's folder in the deployment, by client id.
        changed: by client, the files of its bundle that changed (``node.json``,
            ``experiment.toml``, ...); empty where the site keeps the bundle it has.
        keys: ``"nodes"`` (each site made its keys and takes its bundle with ``secagg
            flower join``) or ``"prepared"`` (the node folders hold the keys: a demo).
        previous, experiment: the experiment's name before and after.
    """

    nodes: dict[str, Path]
    changed: dict[str, list[str]]
    keys: str
    previous: str
    experiment: str

    @property
    def rejoin(self) -> list[str]:
        """The clients whose site must take the new bundle."""
        return [cid for cid, names in self.changed.items() if names]


def read_deployment(folder: Path) -> dict[str, Any]:
    """``deployment.json`` of a whole deployment folder (ConfigError for anything else)."""
    folder = Path(folder)
    try:
        spec = json.loads((folder / "deployment.json").read_text())
        spec["clients"] = [str(c) for c in spec["clients"]]
        spec["tls"], spec["auth"] = bool(spec["tls"]), bool(spec["auth"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{folder} is not a prepared deployment (no deployment.json): prepare one with "
            "`secagg flower prepare DIR ...` in a new folder"
        ) from None
    spec["keys"] = spec.get("keys", "prepared")  # older deployments made every key here
    needed = ["experiment.toml", "app/pyproject.toml", "server/signers.json"]
    needed += [f"nodes/{c}/node.json" for c in spec["clients"]]
    needed += ["tls/ca.crt", "tls/server.pem", "tls/server.key"] if spec["tls"] else []
    needed += [f"auth/{c}.pub" for c in spec["clients"]] if spec["auth"] else []
    # the nodes' keys (a demo's) or the rosters of the keys the sites made, which are kept
    held = ROSTER if spec["keys"] == "nodes" else IDENTITY
    needed += [f"nodes/{c}/{held}" for c in spec["clients"]]
    missing = [name for name in needed if not (folder / name).is_file()]
    if missing:
        raise ConfigError(
            f"{folder} is not a whole deployment: it has no {', '.join(missing)}; prepare a "
            "new one in a new folder"
        )
    return spec


def updated_settings(folder: Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a re-prepared deployment: its ``experiment.toml`` with ``given`` (a
    preset's, a file's and flags' settings, layered) over it, as ``secagg run --resume``
    layers a run's. Where ``given`` names another protocol or backend, the old one's own
    settings are dropped, since they would not apply to the new one (with a protocol, its
    server optimizer too: each protocol has its own default)."""
    kept = S.read_file(Path(folder) / "experiment.toml")
    table = S.settings_table()
    dropped: set[str] = set()
    if given.get("protocol", kept.get("protocol")) != kept.get("protocol"):
        dropped |= {"protocol", "server_opt", "protocol_option"}
    if given.get("backend", kept.get("backend")) != kept.get("backend"):
        dropped.add("backend")
    kept = {k: v for k, v in kept.items() if table[k].place not in dropped}
    return S.layer(kept, given)


def reprepare(
    folder: Path,
    config: ExperimentConfig,
    *,
    tls: bool | None = None,
    auth: bool | None = None,
    timeout: float | None = None,
    hosts: tuple[str, ...] = (),
    publics: tuple[Path, ...] = (),
    own_tls: dict[str, Path] | None = None,
    observer: Path | None = None,
) -> Reprepared:
    """Re-prepare the deployment in ``folder`` for ``config`` in place: new settings, App
    and node bundles, with everything the SuperLink and the sites hold kept (``REWRITTEN``
    says what is rewritten). No private key is read or overwritten; one is made only where
    the experiment turns server-blind without ``observer``: the experimenter's, in
    ``experimenter/``, as ``prepare`` makes it.

    It refuses, with ConfigError and before anything is written, what cannot keep them:
    a folder that is not a deployment; an experiment with other clients; TLS or SuperNode
    authentication switched on (``tls``, ``auth``: None keeps the deployment's); other
    certificates (``own_tls``), or a kept certificate that is no longer valid or does not
    name every one of ``hosts``; ``publics`` (the sites' ``public.json``) that differ from
    the rosters, or given to a deployment whose keys were made here; an ``observer`` key
    other than the deployment's. ``timeout`` None keeps the App's."""
    folder = Path(folder).resolve()
    spec = read_deployment(folder)
    check_runs_on_flower(config.validate())
    _check_keeps(folder, spec, config, tls=tls, auth=auth, own_tls=own_tls, hosts=hosts)
    if publics:
        _check_same_sites(folder, spec, publics)
    observer_file = _observer_for(folder, config, observer)
    settings, experiment = experiment_file(config)
    app_text = app_toml(timeout if timeout is not None else _app_timeout(folder))
    app = _app_digest_of(folder / "app", app_text)
    nodes = {cid: folder / "nodes" / cid for cid in spec["clients"]}
    before = {cid: _bundle_of(node) for cid, node in nodes.items()}
    previous_imports = imports_named_in(folder / "experiment.toml")
    if config.server_blind and not (folder / OBSERVER_PUBLIC).exists():
        made = observer if observer is not None else make_experimenter(folder / "experimenter")
        observer_file = Path(made).read_bytes()
        (folder / OBSERVER_PUBLIC).write_bytes(observer_file)
    (folder / "experiment.toml").write_text(settings)
    (folder / "app" / "pyproject.toml").write_text(app_text)
    for cid, node in nodes.items():
        write_bundle(node, cid, settings=settings, app=app, observer=observer_file)
        if spec["keys"] == "prepared":
            _refresh_demo_node_toml(node, previous_imports, config.imports)
    write_record(
        folder,
        experiment,
        app,
        clients=spec["clients"],
        tls=spec["tls"],
        auth=spec["auth"],
        keys=spec["keys"],
    )
    return Reprepared(
        nodes=nodes,
        changed={
            cid: [n for n in BUNDLE if before[cid].get(n) != _bundle_of(node).get(n)]
            for cid, node in nodes.items()
        },
        keys=spec["keys"],
        previous=str(spec.get("experiment", "")),
        experiment=experiment,
    )


def _check_keeps(
    folder: Path,
    spec: dict[str, Any],
    config: ExperimentConfig,
    *,
    tls: bool | None,
    auth: bool | None,
    own_tls: dict[str, Path] | None,
    hosts: tuple[str, ...],
) -> None:
    """ConfigError where the new settings cannot keep what the deployment's nodes and
    SuperLink hold."""
    new = "prepare a new deployment in a new folder (secagg flower prepare NEWDIR ...)"
    ids = client_ids(config)
    if ids != spec["clients"]:
        raise ConfigError(
            f"the experiment's clients would be {', '.join(ids)}, the deployment's are "
            f"{', '.join(spec['clients'])}: its rosters, SuperNode keys and bundles are those "
            f"clients'; {new}"
        )
    for name, wanted in (("TLS", tls), ("SuperNode authentication", auth)):
        has = spec["tls"] if name == "TLS" else spec["auth"]
        if wanted is not None and wanted != has:
            raise ConfigError(
                f"the deployment has {name} {'on' if has else 'off'}; re-preparing keeps "
                f"it so (every SuperNode was started for it): {new}"
            )
    if own_tls is not None:
        raise ConfigError(
            "re-preparing keeps the deployment's CA and the SuperLink's certificate (tls/): "
            f"every node trusts that CA. For other certificates, {new} with --ca-cert, "
            "--server-cert and --server-key, and every site takes its new bundle"
        )
    if spec["tls"]:
        try:
            check_kept_tls(folder / "tls", hosts)
        except ConfigError as exc:
            raise ConfigError(f"{folder / 'tls'} cannot be kept: {exc}; {new}") from None


def _check_same_sites(folder: Path, spec: dict[str, Any], publics: tuple[Path, ...]) -> None:
    """The sites' ``public.json`` files given again must be the ones the rosters and
    ``auth/`` were made from (re-preparing keeps both)."""
    if spec["keys"] != "nodes":
        raise ConfigError(
            f"{folder}'s keys were made by prepare, not on its nodes: --nodes would replace "
            "them; prepare a new deployment in a new folder with --nodes"
        )
    shown = assemble(publics, spec["clients"], auth=spec["auth"])
    for cid, public in shown.items():
        node = folder / "nodes" / cid
        roster = json.loads((node / ROSTER).read_text())
        kept = {
            "x25519": base64.b64decode(roster["roster"][cid]),
            "ed25519": base64.b64decode(roster["signers"][cid]),
        }
        auth_kept = (folder / "auth" / f"{cid}.pub").read_text() if spec["auth"] else None
        if any(kept[k] != public[k] for k in kept) or (
            spec["auth"] and auth_kept != public["auth"]
        ):
            raise ConfigError(
                f"{cid}'s public.json is not the one the deployment's rosters hold (the site "
                "made new keys?): re-preparing keeps the rosters and SuperNode keys; prepare "
                "a new deployment in a new folder with every site's current public.json"
            )


def _observer_for(folder: Path, config: ExperimentConfig, observer: Path | None) -> bytes:
    """The experimenter's public key the node bundles carry (b"" where the experiment is
    not server-blind). A deployment that has one keeps it; ``observer`` may only name the
    same key."""
    if observer is not None and not config.server_blind:
        raise ConfigError("--observer is the experimenter's key of a server-blind run")
    if observer is not None:
        read_observer_public(observer)  # a public key, before anything is written
    kept = folder / OBSERVER_PUBLIC
    if observer is not None and kept.exists() and kept.read_bytes() != observer.read_bytes():
        raise ConfigError(
            f"{observer} is not the deployment's experimenter key ({kept}): re-preparing keeps "
            "it, so the experimenter keeps opening the sealed models with its own key; prepare "
            "a new deployment in a new folder for another experimenter"
        )
    return kept.read_bytes() if config.server_blind and kept.exists() else b""


def _app_timeout(folder: Path) -> float:
    """The per-message timeout the deployment's App sets (its ``pyproject.toml``)."""
    import tomllib

    try:
        app = tomllib.loads((folder / "app" / "pyproject.toml").read_text())
        return float(app["tool"]["flwr"]["app"]["config"]["timeout"])
    except (OSError, ValueError, KeyError, TypeError):
        return 120.0


def _app_digest_of(app: Path, pyproject: str) -> str:
    """The digest of the App ``app/`` becomes with ``pyproject`` as its pyproject.toml,
    built in a copy (nothing is written to ``app`` until every check has passed)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "app"
        shutil.copytree(app, copy)
        (copy / "pyproject.toml").write_text(pyproject)
        return app_digest(build_app(copy))


def _bundle_of(node: Path) -> dict[str, Any]:
    """What a node's bundle pins, file by file: the settings as read (a comment is not a
    change), ``node.json`` as read, the other files' bytes."""
    import tomllib

    readers: dict[str, Callable[[bytes], Any]] = {
        "experiment.toml": lambda data: tomllib.loads(data.decode()),
        "node.json": json.loads,
    }
    pinned: dict[str, Any] = {}
    for name in BUNDLE:
        if (node / name).exists():
            data = (node / name).read_bytes()
            try:
                pinned[name] = readers.get(name, bytes)(data)
            except ValueError:  # unreadable: compared as bytes (and so changed)
                pinned[name] = data
    return pinned


def _refresh_demo_node_toml(node: Path, previous: list[str], imports: list[str]) -> None:
    """A demo node's ``node.toml`` follows the experiment's imports while it is the one
    ``prepare`` wrote; one its operator edited is theirs, and left as it is."""
    path = node / NODE_SETTINGS
    current = path.read_text() if path.exists() else None
    if current is not None and current != demo_node_toml(previous):
        return
    if imports:
        path.write_text(demo_node_toml(imports))
    elif current is not None:
        path.unlink()
