"""A run's output folder: checked before anything trains, written as the run goes, resumable.

What is written when:

- before training: ``config.json`` (settings, resolved settings, provenance), ``config.toml``
  (the settings alone: ``secagg run --config DIR/config.toml`` reruns the run) and
  ``run.json`` (status and finished seeds; each finished seed's ``outcome``, and at the end
  the run's status with its ``problems``, ``notes`` and ``exit_code``:
  ``secagg.runspec.status``);
- after every round: ``metrics.csv`` (finished seeds and the rounds of the seed in progress);
- after every seed: every table, the audit, the figures, and the seed's final model
  (``models/seed-<s>.npy``, exact float64 parameters, and ``models/seed-<s>.pt``, a torch
  ``state_dict``; :func:`load_model` rebuilds the model).

Every file is replaced atomically (written aside, then renamed), so an interrupted run leaves
complete files. ``resume`` continues from the finished seeds; a seed in progress restarts
from its beginning, which gives exactly the uninterrupted result because each seed depends on
nothing but its own number.

The folder must be new or empty. A folder holding a run needs ``overwrite`` (which removes
only the files secagg writes, and refuses a folder with anything else in it) or ``resume``.
A new run refused before its first seed records anything (``RunFolder.discard``) removes the
files it wrote and the folders it made, so that it blocks nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from secagg.errors import ConfigError
from secagg.runspec.config import ExperimentConfig
from secagg.runspec.settings import from_config, to_config, to_toml
from secagg.runspec.status import RunStatus
from secagg.simulation.provenance import changed_data, data_provenance

if TYPE_CHECKING:
    import torch

    from secagg.server.audit import AuditLog
    from secagg.simulation.experiment import SeedRun

#: every file secagg writes into a run folder (``overwrite`` removes only these)
RUN_FILES = (
    "metrics.csv",
    "summary.csv",
    "traffic.csv",
    "audit.jsonl",
    "audit_summary.json",
    "privacy.json",
    "config.json",
    "config.toml",
    "run.json",
    "convergence.png",
    "bytes.png",
    "seconds.png",
    "flower.json",  # a run over Flower: its framing counts (secagg.flower.apps)
    "tensorboard",  # --tracker tensorboard (secagg.simulation.trackers)
    "mlruns",  # --tracker mlflow
    "sealed",  # server-blind over Flower: the experimenter's sealed models (flower.experimenter)
    "experimenter",  # what the experimenter opened of them (secagg flower open)
)
MODELS = "models"
FORMAT = 1  # of config.json and run.json


def default_folder(config: ExperimentConfig, root: Path = Path("results")) -> Path:
    """``results/<task>-<protocol>-<backend>-<YYYYmmdd-HHMMSS>`` under the working
    directory, with ``-2``, ``-3`` ... if that exists: every run gets its own."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{config.task}-{config.protocol}-{config.backend}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` then rename over ``path``: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def atomic_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def check_writable(path: Path) -> None:
    """Fail now, before training, if ``path`` cannot become a run folder."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} is a file, not a folder; choose a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".secagg-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write results to {path}: {exc.strerror or exc}") from None


def is_run_file(path: Path) -> bool:
    return path.name in RUN_FILES or path.name == MODELS or path.name.startswith(".")


@dataclass
class Finished:
    """What a folder holds of an interrupted run: the finished seeds' rows, audit records,
    models and privacy events."""

    seeds: list[int] = field(default_factory=list)
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    audit_records: list[dict[str, Any]] = field(default_factory=list)
    audit_sets: dict[str, list[str]] = field(default_factory=dict)
    final_params: dict[int, np.ndarray] = field(default_factory=dict)
    aborted: dict[int, str] = field(default_factory=dict)
    #: per seed, what its status is decided from (``secagg.runspec.status``); a seed
    #: finished by an older secagg has none
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    privacy_events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


#: the lock file of a run folder: one process writes a folder at a time
LOCK = ".secagg.lock"


def lock_folder(path: Path):
    """An exclusive lock on ``path``'s run (``flock`` on its lock file, released when the
    file is closed, by the run or by the process ending); ConfigError naming the other
    process if one holds it."""
    import fcntl

    file = open(path / LOCK, "a+")  # held open for the run's lifetime
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "another process"
        file.close()
        raise ConfigError(
            f"{path} is in use by another secagg run ({holder}); wait for it to end, or "
            "choose another --out"
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"pid {os.getpid()}")
    file.flush()
    return file


class RunFolder:
    """The folder of one run; :meth:`prepare` checks it before training."""

    def __init__(self, path: Path, config: ExperimentConfig):
        self.path = Path(path)
        self.config = config
        self._lock: Any = None  # the open lock file (``lock_folder``)
        self._created: Path | None = None  # the outermost folder prepare() made, if any
        self.rows: list[dict[str, Any]] = []  # every row written so far (finished + current)
        self.finished: dict[int, dict[str, Any]] = {}
        self._audit_written = 0

    # ---- before training ------------------------------------------------------------------
    @classmethod
    def prepare(
        cls,
        path: Path | None,
        config: ExperimentConfig,
        *,
        overwrite: bool = False,
        resume: bool = False,
    ) -> tuple[RunFolder, Finished]:
        """Check ``path`` (None: a new default folder) and make it ready: a new run, a
        replaced one (``overwrite``) or a continued one (``resume``, which must find the
        same settings there)."""
        if overwrite and resume:
            raise ConfigError("--overwrite and --resume contradict each other: choose one")
        path = default_folder(config) if path is None else Path(path)
        created = None  # the outermost folder this run makes (``discard`` removes it)
        for parent in (path, *path.parents):
            if parent.exists():
                break
            created = parent
        check_writable(path)
        folder = cls(path, config)
        folder._created = created
        folder._lock = lock_folder(path)  # held until finish() or this process ends
        entries = [p for p in path.iterdir() if p.name not in (".secagg-write-test", LOCK)]
        if resume:
            return folder, folder._resume(config)
        if entries and not overwrite:
            raise ConfigError(
                f"{path} already holds files ({', '.join(sorted(p.name for p in entries)[:4])}"
                f"{' ...' if len(entries) > 4 else ''}); pass --overwrite to replace a run's "
                "results, --resume to continue an interrupted run, or choose another --out"
            )
        foreign = [p.name for p in entries if not is_run_file(p)]
        if foreign:
            raise ConfigError(
                f"--overwrite refuses {path}: it holds files secagg did not write "
                f"({', '.join(sorted(foreign)[:4])}); choose another --out"
            )
        for p in entries:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return folder, Finished()

    @staticmethod
    def saved_config(path: Path) -> ExperimentConfig:
        """The configuration a run folder was started with."""
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ConfigError(f"{path} holds no run to resume (no config.json)")
        try:
            settings = json.loads(file.read_text())["settings"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(f"{file} is not a secagg run's config.json") from None
        from secagg.runspec.settings import check_keys

        return to_config(check_keys(settings, str(file)))[0]

    def _resume(self, config: ExperimentConfig) -> Finished:
        mine, theirs = from_config(config), from_config(self.saved_config(self.path))
        # the worker and thread counts change how fast, not what (up to torch's float
        # reductions): a resumed run may use others
        differ = sorted(
            k
            for k in (set(mine) | set(theirs)) - {"workers", "threads"}
            if mine.get(k) != theirs.get(k)
        )
        if differ:
            raise ConfigError(
                f"--resume: {self.path} was started with other settings ({', '.join(differ)}); "
                "resume with no settings (they are read from the folder) or the same ones"
            )
        recorded = json.loads((self.path / "config.json").read_text()).get("provenance", {})
        changed = changed_data(recorded.get("data"), self.data_now)
        if changed:
            raise ConfigError(
                f"--resume: the task's data changed since {self.path} was started ("
                + "; ".join(changed)
                + "): its finished seeds trained on other data. Restore the data, or start "
                "a new run in another folder"
            )
        state_file = self.path / "run.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            raise ConfigError(f"{state_file} is missing or damaged; cannot resume") from None
        finished = Finished()
        self.finished = {int(s): v for s, v in state.get("finished", {}).items()}
        seeds = [s for s in config.seeds if s in self.finished]
        finished.seeds = seeds
        finished.audit_sets = state.get("audit_sets", {})
        metrics_file = self.path / "metrics.csv"
        if seeds and metrics_file.is_file():
            metrics = pd.read_csv(metrics_file)
            finished.metrics = metrics[metrics["seed"].isin(seeds)].reset_index(drop=True)
            self.rows = [
                {str(k): v for k, v in r.items()} for r in finished.metrics.to_dict("records")
            ]
        audit_file = self.path / "audit.jsonl"
        if audit_file.is_file():
            with open(audit_file) as fh:
                finished.audit_records = [json.loads(line) for line in fh if line.strip()]
            if any("stage" not in r for r in finished.audit_records):
                # its rounds are the engine's (from 0, set-up under round 0): the new seeds'
                # records would number them otherwise (set-up 0, round k as in metrics.csv)
                raise ConfigError(
                    f"--resume: {audit_file} was written by an older secagg that numbered "
                    "audit rounds differently; rerun the run with --overwrite"
                )
            self._audit_written = len(finished.audit_records)
        for s in seeds:
            info = self.finished[s]
            finished.final_params[s] = np.load(self.path / MODELS / f"seed-{s}.npy")
            if info.get("aborted"):
                finished.aborted[s] = info["aborted"]
            if info.get("outcome") is not None:
                finished.outcomes[s] = info["outcome"]
            finished.privacy_events[s] = info.get("privacy_events", [])
        return finished

    @cached_property
    def data_now(self) -> dict[str, Any] | None:
        """The task's data sources as they are now (``Task.sources``), or None; hashed once
        per run start (a resume compares them and then records them)."""
        from secagg.clients.tasks import get_task

        return data_provenance(get_task(self.config.task))

    # ---- during the run -------------------------------------------------------------------
    def start(self, provenance: dict[str, Any]) -> None:
        settings = from_config(self.config)
        # where the task's data came from, where it says (Task.sources)
        provenance = {**provenance, "data": self.data_now}
        document = {
            "format": FORMAT,
            "settings": settings,
            "resolved": self.config.to_dict(),
            "provenance": provenance,
        }
        if (self.path / "config.json").is_file():  # resumed: keep the first start's record
            first = json.loads((self.path / "config.json").read_text())
            document["provenance"] = first.get("provenance", {})
            document["resumed"] = [*first.get("resumed", []), provenance]
        atomic_text(self.path / "config.json", json.dumps(document, indent=2) + "\n")
        atomic_text(
            self.path / "config.toml",
            to_toml(settings, comment="rerun with: secagg run --config THIS_FILE --out NEW"),
        )
        self._state("running")

    def _state(
        self, status: str, audit: AuditLog | None = None, detail: RunStatus | None = None
    ) -> None:
        document: dict[str, Any] = {
            "format": FORMAT,
            "status": status,
            "seeds": self.config.seeds,
            "finished": {str(s): v for s, v in self.finished.items()},
            "updated_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if detail is not None:  # the run is over and decided (secagg.runspec.status)
            document["exit_code"] = detail.exit_code
            document["problems"] = list(detail.problems)
            document["notes"] = list(detail.notes)
        if audit is not None:
            document["audit_sets"] = {
                "declared": sorted(audit.declared),
                "dp_protected": sorted(audit.dp_protected),
                "infrastructure": sorted(audit.infrastructure),
            }
        elif (self.path / "run.json").is_file():
            document["audit_sets"] = json.loads((self.path / "run.json").read_text()).get(
                "audit_sets", {}
            )
        atomic_text(self.path / "run.json", json.dumps(document, indent=2) + "\n")

    def on_round(self, seed: int, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._write_metrics()

    def _write_metrics(self) -> None:
        frame = pd.DataFrame(self.rows)
        atomic_write(self.path / "metrics.csv", lambda tmp: frame.to_csv(tmp, index=False))

    def on_seed(self, seed: int, run: SeedRun, audit: AuditLog) -> None:
        """A seed finished: its model, the audit so far, every table and figure."""
        from secagg.simulation.report import write_tables

        self._save_model(seed, run.final_params)
        new = audit.records[self._audit_written :]
        with open(self.path / "audit.jsonl", "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in new)
        self._audit_written = len(audit.records)
        self.finished[seed] = {
            "aborted": run.aborted,
            "outcome": run.outcome,
            "privacy_events": run.privacy_events,
        }
        # rows of seeds that did not finish (an earlier attempt's) are not results
        done = set(self.finished)
        self.rows = [r for r in self.rows if r["seed"] in done]
        self._write_metrics()
        write_tables(self.path, self.config, pd.DataFrame(self.rows), audit)
        self._state("running", audit)

    def finish(self, status: str | RunStatus) -> None:
        """The run is over: ``status`` is its decided status (``complete``, ``degraded``,
        ``aborted``, with its problems) or how it ended early (``interrupted``,
        ``failed``)."""
        if isinstance(status, RunStatus):
            self._state(status.status, detail=status)
        else:
            self._state(status)
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.close()  # closing the file releases its lock

    @property
    def untouched(self) -> bool:
        """Nothing of a seed recorded yet: the folder holds only this run's start files."""
        return not self.rows and not self.finished

    def discard(self) -> None:
        """Undo a new run refused before its first seed recorded anything (``--device
        cuda`` without a GPU, a task's data a protocol cannot use ...): remove the files it
        wrote (config.json, config.toml, run.json, a tracker's folder), and the folders
        ``prepare`` made for it, so that the same ``--out`` takes the next run as if this
        one had never started. Anything else in the folder stays, and so does the folder
        then; a resumed run is never discarded (its files are an earlier run's)."""
        if not self.untouched:
            raise ConfigError(f"{self.path} holds a seed's results: it is not discarded")
        for name in RUN_FILES:
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists() or p.is_symlink():
                p.unlink(missing_ok=True)
        for p in self.path.glob(".*.tmp"):  # an atomic write cut short
            p.unlink(missing_ok=True)
        lock, self._lock = self._lock, None
        try:
            if self._created is None:
                return  # the folder was there before: its lock file may be others' too
            (self.path / LOCK).unlink(missing_ok=True)
            (self.path / ".secagg-write-test").unlink(missing_ok=True)
            for folder in (self.path, *self.path.parents):  # up to the one this run made
                try:
                    folder.rmdir()  # only if empty
                except OSError:
                    break
                if folder == self._created:
                    break
        finally:
            if lock is not None:
                lock.close()

    def _save_model(self, seed: int, params: np.ndarray) -> None:
        import torch

        from secagg.clients.tasks import get_task
        from secagg.clients.training import set_flat_params

        models = self.path / MODELS
        models.mkdir(exist_ok=True)
        atomic_write(models / f"seed-{seed}.npy", lambda tmp: _save_npy(tmp, params))
        model = get_task(self.config.task).make_model()
        set_flat_params(model, params)
        atomic_write(models / f"seed-{seed}.pt", lambda tmp: torch.save(model.state_dict(), tmp))


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as fh:  # np.save on a name would append ".npy"
        np.save(fh, np.asarray(array, dtype=np.float64))


def load_model(folder: str | Path, seed: int | None = None) -> torch.nn.Module:
    """The final model of a run's ``seed`` (default: its first finished seed), rebuilt
    from the task (which must be registered in this process) and its saved parameters."""
    from secagg.clients.tasks import get_task
    from secagg.clients.training import set_flat_params

    folder = Path(folder)
    config = RunFolder.saved_config(folder)
    saved = sorted(int(p.stem.split("-", 1)[1]) for p in (folder / MODELS).glob("seed-*.npy"))
    if not saved:
        raise ConfigError(f"{folder} holds no saved model (no finished seed)")
    seed = saved[0] if seed is None else seed
    if seed not in saved:
        raise ConfigError(f"{folder} has no model for seed {seed}; it has seeds {saved}")
    model = get_task(config.task).make_model()
    set_flat_params(model, np.load(folder / MODELS / f"seed-{seed}.npy"))
    model.eval()
    return model
