"""The Python API behind ``import secagg``: configure, run, get tables and files back.

    import secagg

    result = secagg.run(protocol="larc", backend="ckks", rounds=5, seeds=[42, 43],
                        out="results/larc")
    result.summary        # mean and std per round (a DataFrame)
    result.files          # the files written to ``out`` (metrics.csv, audit.jsonl, ...)

``register_task`` and ``register_protocol`` add a task or a protocol defined outside
secagg; they reach worker processes too (``workers=N``), as long as what they register is
importable by reference (module-level functions and classes).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from secagg.errors import ConfigError
from secagg.protocols.registry import PROTOCOLS
from secagg.runspec.settings import from_config
from secagg.runspec.status import COMPLETE, RunStatus, decide, seed_outcome
from secagg.server.audit import AuditLog
from secagg.simulation.experiment import (
    INTERRUPTED,
    ExperimentConfig,
    ExperimenterFactory,
    SeedRun,
    TransportFactory,
    device_choice,
    run_experiment,
    stderr_progress,
    summarize,
)
from secagg.simulation.outputs import Finished, RunFolder
from secagg.simulation.provenance import provenance
from secagg.simulation.trackers import RoundRecord, Trackers, open_trackers, tracker_names

if TYPE_CHECKING:
    from secagg.clients.tasks import FederatedData
    from secagg.simulation.experiment import ExperimentResult


@dataclass
class RunResult:
    """What a run produced: tables as DataFrames, the audit, the final models, and the files
    written (none without ``out``)."""

    config: ExperimentConfig
    metrics: pd.DataFrame  # one row per seed and round (round 0 = the initial model)
    summary: pd.DataFrame  # mean and std over seeds per round
    traffic: pd.DataFrame  # bytes per round (as in metrics; set-up is 0), stage, phase, peer, field
    audit: AuditLog
    final_params: dict[int, np.ndarray]
    aborted: dict[int, str] = field(default_factory=dict)  # seed -> why it stopped early
    files: dict[str, Path] = field(default_factory=dict)
    #: ``complete``, ``degraded`` or ``aborted``, with the problems that made it so
    #: (``secagg.runspec.status``); the same as the folder's run.json. A run that is not
    #: complete does not raise: check ``result.status.complete`` before using its numbers
    status: RunStatus = field(default_factory=lambda: RunStatus(COMPLETE))
    #: per seed, what ``status`` was decided from (as in run.json)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def audit_summary(self) -> dict[str, Any]:
        """What the server learned in plaintext, declared and undeclared items, DP coverage."""
        return self.audit.summary()


#: the signals a run writing to a folder stops on cleanly: Ctrl-C, and what SLURM, systemd
#: and `kill` send
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


#: the stop signal the running run received last (None: none, or a KeyboardInterrupt that
#: no handler of ours raised, which counts as Ctrl-C)
_received: list[int | None] = [None]


def _catch_sigint() -> dict | None:
    """Ctrl-C (or SIGTERM) raises KeyboardInterrupt and also sets ``INTERRUPTED``, which the
    run checks between rounds (CPython drops a KeyboardInterrupt raised inside some
    callbacks); which signal it was is kept for ``RunInterrupted``. Returns the previous
    handlers (None off the main thread, where signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    INTERRUPTED.clear()
    _received[0] = None

    def handler(signum, frame):
        INTERRUPTED.set()
        _received[0] = signum
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


@dataclass
class Callback:
    """A user's ``on_round`` function as a tracker (nothing to close)."""

    function: Callable[[RoundRecord], None]

    def __call__(self, record: RoundRecord) -> None:
        self.function(record)

    def close(self, failed: bool = False) -> None:
        pass


@dataclass
class Fanout:
    """The run's recorder: the run folder (if any) first, so that what a listener does
    cannot lose a result, then each round as a ``RoundRecord`` to the listeners."""

    folder: RunFolder | None
    listeners: Trackers

    def on_round(self, seed: int, row: dict[str, Any]) -> None:
        if self.folder is not None:
            self.folder.on_round(seed, row)
        if self.listeners.writers:
            self.listeners(RoundRecord.from_row(row))

    def on_seed(self, seed: int, run: SeedRun, audit: AuditLog) -> None:
        if self.folder is not None:
            self.folder.on_seed(seed, run, audit)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run that writes to a folder: what finished is saved
    there, and ``secagg run --resume FOLDER`` (or ``run(out=FOLDER, resume=True)``)
    continues it. ``signal`` is the one that stopped it; ``exit_code`` the shell's status
    for it, 128 + its number: 130 for Ctrl-C (SIGINT), 143 for SIGTERM."""

    def __init__(self, folder: Path, finished: int, total: int, signal_number: int = signal.SIGINT):
        name = signal.Signals(signal_number).name
        super().__init__(f"interrupted ({name}): {finished} of {total} seeds saved in {folder}")
        self.folder, self.finished, self.total = folder, finished, total
        self.signal = signal.Signals(signal_number)

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signal)


def run(
    config: ExperimentConfig | None = None,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    transport: TransportFactory | None = None,
    progress: bool | Callable[[str], None] = False,
    command: list[str] | None = None,
    signers: Mapping[str, bytes] | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
    trackers: str | Sequence[str] = (),
    experimenter: ExperimenterFactory | None = None,
    data: FederatedData | None = None,
    **settings: Any,
) -> RunResult:
    """Run an experiment: every seed of ``config`` (or of an ``ExperimentConfig(**settings)``;
    with both, ``settings`` override ``config``'s fields).

    Parameters:
        config: the experiment; see ``ExperimentConfig`` for every field.
        out: a folder for the results (see ``secagg.simulation.outputs``): new or empty,
            checked before anything trains, and written as the run goes, so that an
            interrupted run keeps its finished seeds; a new run refused (a ConfigError)
            before its first seed records anything leaves no file of its own there.
        overwrite: replace the results of an earlier run in ``out``.
        resume: continue the interrupted run in ``out``: finished seeds are kept, the others
            run; without ``config`` and ``settings`` the folder's own settings are used.
        transport: ``(clients factory, client ids) -> transport``, replacing the in-process
            (or worker-process) transport, e.g. with a network one.
        progress: True prints progress to stderr (and secagg's log lines: ``secagg.logs``);
            a callable receives each line.
        command: the command line config.json records (default: ``sys.argv``).
        signers: the clients' public signing keys, when a deployment provisioned the
            clients on their own nodes (``secagg.flower``); otherwise the run provisions
            fresh identities itself.
        on_round: called with a ``RoundRecord`` (seed, round, metrics, bytes, seconds) for
            the initial model (round 0) and after every round, as the run goes.
        trackers: experiment trackers that get the same records, writing local files under
            ``out`` (which they need): ``"tensorboard"`` (``out/tensorboard/``),
            ``"mlflow"`` (``out/mlruns/``), or both (``"tensorboard,mlflow"``). They need
            the ``trackers`` extra (``pip install 'secagg[trackers]'``).
        experimenter: server-blind runs, ``(seed) -> observer``: who holds the key clients
            seal the model for (``secagg.simulation.experiment.ExperimenterFactory``);
            default a fresh key pair per seed in this process. A deployment's ServerApp
            keeps the sealed copies for the experimenter elsewhere instead.
        data: the task's data as the experimenter holds it: the sets scored after every
            round (default: the task's ``load()``, every set). A deployment's ServerApp
            passes what its coordinator holds (its test set: ``held_by_coordinator``), so
            that no site's data is opened, scored or split there.

    Raises ``RunInterrupted`` (a ``KeyboardInterrupt``; its ``exit_code`` is 130 for Ctrl-C,
    143 for SIGTERM) on Ctrl-C or SIGTERM once the folder is up to date. A run that lost
    clients or seeds does not raise: ``result.status`` says ``complete``, ``degraded`` or
    ``aborted``, and why (``secagg.runspec.status``).
    """
    config = _configured(config, out, resume, settings)
    config.validate()
    if trackers:
        tracker_names(trackers)  # an unknown one is refused before anything is written
        if out is None:
            raise ConfigError("trackers write under the run's folder: pass out=FOLDER")
    # a GPU this process cannot use is refused before the folder is touched (where the
    # clients train here: behind another transport, e.g. Flower's, each node picks its own)
    device = device_choice(config.device, here=transport is None)
    report = stderr_progress if progress is True else (progress or None)
    if progress is True:  # secagg's log lines on stderr, the worker processes' too
        from secagg.logs import ensure_stderr

        ensure_stderr()
    audit = AuditLog()
    folder, finished = None, Finished()
    if out is not None:
        folder, finished = _open_folder(
            Path(out),
            config,
            audit,
            report,
            overwrite=overwrite,
            resume=resume,
            started={**provenance(command), "device": device},
        )
    listeners = Trackers([Callback(on_round)] if on_round is not None else [])
    result = _run_guarded(
        config,
        audit,
        folder,
        listeners,
        trackers,
        resume=resume,
        progress=report,
        transport_factory=transport,
        skip=finished.seeds,
        signers=signers,
        experimenter=experimenter,
        data=data,
    )
    listeners.close()
    from secagg.simulation.report import traffic_table  # matplotlib, lazily

    metrics = _merged_metrics(config, finished.metrics, result.metrics)
    outcomes = _outcomes(config, finished, result.outcomes, metrics, audit)
    status = decide(config.seeds, outcomes)
    if report and status.notes:
        for note in status.notes:
            report(f"note: {note}")
    files: dict[str, Path] = {}
    if folder is not None:
        folder.finish(status)
        files = {
            str(p.relative_to(folder.path)): p
            for p in sorted(folder.path.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        }
    return RunResult(
        config,
        metrics,
        summarize(metrics),
        traffic_table(audit),
        audit,
        {**finished.final_params, **result.final_params},
        {**finished.aborted, **result.aborted},
        files,
        status,
        outcomes,
    )


def _configured(
    config: ExperimentConfig | None, out: str | Path | None, resume: bool, settings: dict
) -> ExperimentConfig:
    """The run's configuration: ``config`` with ``settings`` over it, the settings alone,
    or (resuming with neither) the folder's own."""
    if resume and out is None:
        raise ConfigError("resume needs the folder of the run to continue (out=...)")
    if config is None and not settings and resume:
        return RunFolder.saved_config(Path(out))  # type: ignore[arg-type]
    if config is None:
        return ExperimentConfig(**settings)
    if settings:
        unknown = set(settings) - set(ExperimentConfig.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown settings {sorted(unknown)}")
        return replace(config, **settings)
    return config


def run_guarantee_note(config: ExperimentConfig) -> str:
    """What an encrypted run promises over the whole run, when it is less than one contributor
    set with weights in two directions (``secagg.backends.coalition.RunLedger``): said at
    the run's start; "" otherwise."""
    options = config.resolved_backend_options()
    if "participation" not in options:
        return ""
    if options["participation"] == "per-round":
        return (
            f"note: participation per-round on {config.backend}: each release holds the "
            "per-round rules; over the run, client DP is the guarantee"
        )
    if PROTOCOLS[config.protocol].protocol.capabilities.weights_vary and not config.client_dp:
        return (
            f"note: {config.protocol}'s weights vary with the data every round: on "
            f"{config.backend} the clients keep one contributor set for the run, but against "
            "a server that moves the model by a hair its guarantee is per round; only "
            "--client-dp covers the whole run"
        )
    return ""


def _open_folder(
    out: Path,
    config: ExperimentConfig,
    audit: AuditLog,
    report: Callable[[str], None] | None,
    *,
    overwrite: bool,
    resume: bool,
    started: dict[str, Any],
) -> tuple[RunFolder, Finished]:
    """The results folder, checked and started, and what an interrupted run finished
    there (its audit records go back into ``audit``)."""
    folder, finished = RunFolder.prepare(out, config, overwrite=overwrite, resume=resume)
    try:
        folder.start(started)
    except ConfigError:
        if not resume:  # a resumed folder's files are an earlier run's
            folder.discard()
        raise
    if report:
        report(f"results go to {folder.path}/")
        note = run_guarantee_note(config)
        if note:
            report(note)
    audit.records = list(finished.audit_records)
    for name, items in finished.audit_sets.items():
        getattr(audit, name).update(items)
    if finished.seeds and report:
        report(f"resuming {folder.path}: seeds {finished.seeds} are done")
    return folder, finished


def _run_guarded(
    config: ExperimentConfig,
    audit: AuditLog,
    folder: RunFolder | None,
    listeners: Trackers,
    trackers: str | Sequence[str],
    *,
    resume: bool,
    **run: Any,
) -> ExperimentResult:
    """``run_experiment`` with the trackers open and the folder kept up to date: on Ctrl-C
    or SIGTERM it is marked interrupted (``RunInterrupted``), on another error failed, or
    discarded if a ConfigError refused the run before anything was recorded."""
    previous = _catch_sigint() if folder is not None else None
    try:
        if trackers:
            assert folder is not None  # checked above, before the folder was made
            opened = open_trackers(
                trackers, folder.path, run_name=folder.path.name, params=from_config(config)
            )
            listeners.writers = (*listeners.writers, *opened.writers)
        return run_experiment(config, audit, recorder=Fanout(folder, listeners), **run)
    except KeyboardInterrupt:
        listeners.close(failed=True)
        if folder is None:
            raise
        folder.finish("interrupted")
        raise RunInterrupted(
            folder.path,
            len(folder.finished),
            len(config.seeds),
            _received[0] or signal.SIGINT,
        ) from None
    except BaseException as exc:
        listeners.close(failed=True)
        if folder is None:
            raise
        if isinstance(exc, ConfigError) and not resume and folder.untouched:
            # refused before the first seed recorded anything: nothing of this run is
            # worth keeping, and a "failed" run there would block the same --out
            folder.discard()
        else:
            folder.finish("failed")
        raise
    finally:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)


def _merged_metrics(
    config: ExperimentConfig, finished: pd.DataFrame, new: pd.DataFrame
) -> pd.DataFrame:
    """The metrics of the seeds finished before and now: seeds in the configuration's
    order, rounds in order."""
    metrics = pd.concat([finished, new], ignore_index=True)
    if not metrics.empty:
        order = {s: i for i, s in enumerate(config.seeds)}
        metrics = metrics.sort_values(
            ["seed", "round"], key=lambda c: c.map(order) if c.name == "seed" else c, kind="stable"
        ).reset_index(drop=True)
    return metrics


def _outcomes(
    config: ExperimentConfig,
    finished: Finished,
    new: Mapping[int, Any],
    metrics: pd.DataFrame,
    audit: AuditLog,
) -> dict[int, Any]:
    """Every seed's outcome: this run's, the resumed folder's, and for a seed an older
    secagg finished, one decided from its files."""
    outcomes = {**finished.outcomes, **new}
    for seed in finished.seeds:  # finished by an older secagg: decided from its files
        if seed not in outcomes:
            rows = [
                {str(k): v for k, v in r.items()}
                for r in metrics[metrics["seed"] == seed].to_dict("records")
            ]
            ran = max((int(r["round"]) for r in rows), default=0)
            outcomes[seed] = seed_outcome(
                seed,
                config.rounds,
                rows,
                audit,
                aborted=finished.aborted.get(seed),
                stopped="stopped early (recorded by an older secagg)"
                if ran < config.rounds and seed not in finished.aborted
                else None,
            )
    return outcomes
