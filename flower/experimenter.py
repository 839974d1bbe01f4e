"""The experimenter of a server-blind deployment: a party that is not the ServerApp.

In a server-blind run the clients decrypt and apply every update themselves, and after each
round one of them seals a copy of the global model for the experimenter's X25519 key
(``secagg.secret.sealing``). In simulation the driver holds that key. Over Flower the ServerApp must
not, or the server would read the model:

- the key pair is made where the experimenter works (``secagg flower experimenter DIR``;
  ``prepare`` makes one in the deployment's ``experimenter/`` for a demo, to be moved off
  the SuperLink's machine), and only its public half, ``observer.pub``, goes into the
  deployment;
- every node takes that public key from its own bundle, so a server cannot put a key of
  its own in its place (a node of a server-blind experiment without one refuses to run);
- the ServerApp keeps the sealed copies it relays, unopened, in the run folder's
  ``sealed/`` (:class:`SealedCopies`: no key, nothing opened or evaluated);
- the experimenter evaluates them afterwards where the key is (:func:`open_sealed`,
  ``secagg flower open RUN --key observer.key``): ``RUN/experimenter/metrics.csv`` and the
  models by seed.

This module imports no private-key code at import time (the ServerApp imports it):
:func:`open_sealed` and :func:`make_experimenter` import ``secagg.secret.sealing`` when called.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from secagg.errors import ConfigError
from secagg.flower.keystore import write_private

#: the experimenter's key pair: the private key stays with the experimenter (mode 0600)
OBSERVER_KEY = "observer.key"
#: its public half: in the deployment and in every node's bundle
OBSERVER_PUBLIC = "observer.pub"
SEALED = "sealed"

_SEALED_NAME = re.compile(r"^round-(\d+)--(client_\w+)\.sealed$")


def make_experimenter(folder: Path) -> Path:
    """Make the experimenter's key pair in ``folder``: ``observer.key`` (mode 0600) and
    ``observer.pub``; returns the path of the public file (the one that travels). A
    folder that holds a key already is refused."""
    from secagg.secret.sealing import Observer

    folder = Path(folder)
    if (folder / OBSERVER_KEY).exists():
        raise ConfigError(f"{folder} holds an experimenter key already: it is made once")
    observer = Observer()
    write_private(
        folder / OBSERVER_KEY,
        json.dumps({"x25519_private": base64.b64encode(observer.private_bytes).decode()}),
    )
    public = folder / OBSERVER_PUBLIC
    public.write_text(json.dumps({"x25519": base64.b64encode(observer.public_bytes).decode()}))
    return public


def _key_in(path: Path, field: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(json.loads(Path(path).read_text())[field], validate=True)
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{path} is not an experimenter's {what} (`secagg flower experimenter` makes one)"
        ) from None
    if len(raw) != 32:
        raise ConfigError(f"{path}: an X25519 key is 32 bytes, this one {len(raw)}")
    return raw


def read_observer_public(path: Path) -> bytes:
    """The experimenter's public key from an ``observer.pub`` (ConfigError otherwise)."""
    return _key_in(path, "x25519", "public key (observer.pub)")


class SealedCopies:
    """The ServerApp's stand-in for the experimenter of one seed: it keeps each sealed copy
    of the model in ``folder/seed-<seed>/`` and opens nothing (``open`` returns None, so
    the driver evaluates nothing: ``secagg.simulation.experiment.ExperimenterFactory``)."""

    def __init__(self, folder: Path, seed: int, public_bytes: bytes = b""):
        self.folder = Path(folder) / f"seed-{int(seed)}"
        #: the nodes seal for their own copy of the key; this one is for the record only
        self.public_bytes = public_bytes

    def open(self, blob: bytes, context: str) -> None:
        client, _, round_label = context.partition("/round-")
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"round-{int(round_label)}--{client}.sealed").write_bytes(bytes(blob))
        return None


def open_sealed(run: Path, key: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Open every sealed copy in the run folder ``run`` with the experimenter's private key
    ``key`` and evaluate it as the ServerApp would after each round, on what a deployment's
    coordinator holds (the task's pooled test set, if it declares one; no site's data:
    ``held_by_coordinator``). Writes ``run/experimenter/metrics.csv`` (seed, round and the
    task's test metrics) and ``run/experimenter/models/seed-<seed>.npy`` (the last round's
    model); returns the CSV's path. A copy sealed for another key, or altered, fails with
    one opaque error."""
    import pandas as pd

    from secagg.clients.tasks import get_task
    from secagg.clients.tasks.tcga_brca import held_by_coordinator
    from secagg.runspec.evaluation import evaluate
    from secagg.runspec.provisioning import seed_data
    from secagg.runspec.settings import read_file, to_config
    from secagg.secret.sealing import Observer

    run, out = Path(run), Path(run) / "experimenter"
    config, _ = to_config(read_file(run / "config.toml"))
    observer = Observer(_key_in(key, "x25519_private", "private key (observer.key)"))
    seeds = sorted((int(p.name.removeprefix("seed-")), p) for p in (run / SEALED).glob("seed-*"))
    if not seeds:
        raise ConfigError(f"{run} holds no sealed models: not the folder of a server-blind run")
    task = get_task(config.task)
    declared = task.load()  # declares the sites' parts (lazily for a deployment's task)
    pooled = held_by_coordinator(declared, declared.n_clients)
    rows = []
    for seed, folder in seeds:
        data, _ = seed_data(config, seed, pooled)
        copies = sorted(
            (int(m.group(1)), m.group(2), p)
            for p in folder.iterdir()
            if (m := _SEALED_NAME.match(p.name))
        )
        model = None
        for number, client, path in copies:
            opened = observer.open(path.read_bytes(), f"{client}/round-{number}")
            model = np.frombuffer(opened, dtype="<f8").copy()
            rows.append({"seed": seed, "round": number + 1, **evaluate(task, data, model)})
            if progress:
                progress(f"  seed {seed} round {number + 1}: sealed by {client}, opened")
        if model is not None:
            (out / "models").mkdir(parents=True, exist_ok=True)
            np.save(out / "models" / f"seed-{seed}.npy", model)
    table = out / "metrics.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    return table
