"""Optional experiment trackers: a run's per-round scores written to TensorBoard or MLflow.

A run reports one :class:`RoundRecord` per round (and one for round 0, the initial model);
a *writer* turns each record into the tracker's scalars. The writer protocol is tiny:
``writer(record)`` and ``writer.close(failed=False)``. Two writers come with secagg:

- :class:`TensorBoardWriter`: event files under ``<logdir>/<run_name>/seed-<seed>/`` (one
  series per seed, so the seeds' curves overlay), read with ``tensorboard --logdir <logdir>``;
- :class:`MLflowWriter`: a local MLflow file store (``file://`` URI, no server), one MLflow
  run per seed, read with ``MlflowClient`` or browsed with MLflow's UI, which the
  ``mlflow-skinny`` client installed here lacks: ``pip install mlflow``, then
  ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri file://<tracking_dir>``.

Neither library is a dependency of secagg: ``pip install 'secagg[trackers]'`` (or
``bash scripts/setup.sh``) installs both; a writer whose library is missing raises
:class:`~secagg.errors.ConfigError` naming that command. From the command line,
``--tracker tensorboard,mlflow`` writes them into the run folder (``<out>/tensorboard/``,
``<out>/mlruns/``); from Python, :func:`open_trackers` (or a name of :data:`TRACKERS`) builds
them, and :meth:`RoundRecord.from_row` turns a metrics row of the driver into a record.

Scalar names: ``metrics/<name>`` (every ``test_*``/``train_*`` score), ``traffic/bytes_up``,
``traffic/bytes_down``, ``time/seconds`` (the round's wall time) and ``extra/<name>`` (privacy
ε, seconds per phase, protocol log values); a pre-stage's records (FedDisco's β-VAE, DEC's
autoencoder) get the stage's name in front, ``vae/metrics/train_loss``. The step is the round.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Protocol, Self

from secagg.errors import ConfigError, SecaggError

__all__ = [
    "TRACKERS",
    "INSTALL_HINT",
    "MLflowWriter",
    "RoundRecord",
    "TensorBoardWriter",
    "TrackerClosed",
    "TrackerFactory",
    "Trackers",
    "Writer",
    "mlflow_key",
    "open_trackers",
]

#: what a missing tracker library's error tells the user to run
INSTALL_HINT = "pip install 'secagg[trackers]' (or bash scripts/setup.sh, which installs it)"

#: prefixes of the score columns of a metrics row
METRIC_PREFIXES = ("test_", "train_")
#: the row's columns that are fields of a record, not extras
_FIELD_COLUMNS = frozenset({"seed", "round", "bytes_up", "bytes_down", "seconds_round"})


class TrackerClosed(SecaggError, RuntimeError):
    """A record was given to a writer after its ``close()``."""


# ---- the record ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RoundRecord:
    """What a run reports after a round (and once for round 0, the initial model).

    Parameters:
        seed: the run's seed (one tracker series or run per seed).
        round: 0 for the initial model, k after training round k.
        stage: None for the run itself; the pre-stage's name (``"vae"``) for a protocol's
            pre-training stage, whose rounds count from 0 again.
        metrics: every score of the round (``test_pooled``, ``test_loss``, ``train_pooled``,
            ``test_client_avg``, ``test_auc`` ...); NaN where a score is undefined.
        bytes_up: bytes the server received in the round (0 for round 0).
        bytes_down: bytes the server sent in the round (0 for round 0).
        seconds: the round's wall time (0 for round 0).
        extra: any other numeric column of the round (privacy ε, ``seconds_<phase>``,
            protocol log values, clients/excluded counts).

    The mappings are copied into read-only views, so a record cannot change after it was
    handed to a writer.
    """

    seed: int
    round: int
    stage: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0
    extra: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # frozen: the copies go in through object.__setattr__, as dataclasses do themselves
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @classmethod
    def from_row(cls, row: Mapping[str, Any], stage: str | None = None) -> RoundRecord:
        """A record from a metrics row as the driver makes it (one row of metrics.csv).

        ``test_*``/``train_*`` columns are metrics (NaN kept: an undefined score is still a
        score of the row); ``bytes_up``, ``bytes_down`` and ``seconds_round`` are fields (0
        when absent, as in round 0's row); string columns (task, protocol, backend) are
        dropped; every other finite number goes to ``extra`` (a NaN there is an absent
        value, e.g. no DP noise realised this round, not a measurement).

        Raises:
            ConfigError: the row has no ``seed`` or ``round``.
        """
        for key in ("seed", "round"):
            if not _is_number(row.get(key)):
                raise ConfigError(f"a metrics row needs a numeric {key!r}; got {row.get(key)!r}")
        metrics: dict[str, float] = {}
        extra: dict[str, float] = {}
        for key, value in row.items():
            if key in _FIELD_COLUMNS or not _is_number(value):
                continue  # strings (task, protocol, backend), None and other objects: dropped
            if key.startswith(METRIC_PREFIXES):
                metrics[key] = float(value)
            elif math.isfinite(value):
                extra[key] = float(value)
        return cls(
            seed=int(row["seed"]),
            round=int(row["round"]),
            stage=stage,
            metrics=metrics,
            bytes_up=_count(row.get("bytes_up")),
            bytes_down=_count(row.get("bytes_down")),
            seconds=_seconds(row.get("seconds_round")),
            extra=extra,
        )

    def scalars(self) -> list[tuple[str, float]]:
        """The record as (name, value) pairs, named as the module docstring says.

        Round 0 gets no traffic or time scalars: no round ran, so its zeros are not
        measurements, and a 0 at step 0 would stretch every traffic and time chart down to 0.
        """
        prefix = f"{self.stage}/" if self.stage else ""
        out = [(f"{prefix}metrics/{k}", float(v)) for k, v in self.metrics.items()]
        if self.round != 0:
            out += [
                (f"{prefix}traffic/bytes_up", float(self.bytes_up)),
                (f"{prefix}traffic/bytes_down", float(self.bytes_down)),
                (f"{prefix}time/seconds", float(self.seconds)),
            ]
        out += [(f"{prefix}extra/{k}", float(v)) for k, v in self.extra.items()]
        return out


def _is_number(value: object) -> bool:
    # numbers.Real covers numpy's scalars too (np.int64 is no int); bool is a 0/1 column
    return isinstance(value, numbers.Real)


def _count(value: object) -> int:
    if isinstance(value, numbers.Integral):
        return int(value)
    return int(float(value)) if isinstance(value, numbers.Real) and math.isfinite(value) else 0


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, numbers.Real) and math.isfinite(value) else 0.0


# ---- the writer protocol and the combination ---------------------------------------------------


class Writer(Protocol):
    """What a tracker writer is: called with each record, closed once at the end."""

    def __call__(self, record: RoundRecord) -> None: ...

    def close(self, failed: bool = False) -> None: ...


class _Closing:
    """Context-manager behaviour shared by the writers: leaving the block with an exception
    closes them with ``failed=True``."""

    def close(self, failed: bool = False) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)


class Trackers(_Closing):
    """Several writers as one: each record goes to every writer, ``close`` closes them all.

    Parameters:
        writers: the writers, called in this order.
    """

    def __init__(self, writers: Iterable[Writer] = ()) -> None:
        self.writers: tuple[Writer, ...] = tuple(writers)

    def __call__(self, record: RoundRecord) -> None:
        for writer in self.writers:
            writer(record)

    def log_row(self, row: Mapping[str, Any], *, stage: str | None = None) -> None:
        """Record a metrics row of the driver (see :meth:`RoundRecord.from_row`)."""
        self(RoundRecord.from_row(row, stage=stage))

    def close(self, failed: bool = False) -> None:
        """Close every writer, even when one fails to close; then raise the first error."""
        error: BaseException | None = None
        for writer in self.writers:
            try:
                writer.close(failed=failed)
            except Exception as exc:  # the other writers' files still deserve a close
                error = error or exc
        if error is not None:
            raise error


# ---- TensorBoard -----------------------------------------------------------------------------


class TensorBoardWriter(_Closing):
    """Scalars to TensorBoard event files, one directory per seed.

    Parameters:
        logdir: the folder ``tensorboard --logdir`` is pointed at.
        run_name: a sub-folder for this run (one path component), so several runs can share
            ``logdir``; None writes the seeds directly under ``logdir``.

    Files go to ``<logdir>/<run_name>/seed-<seed>/``: TensorBoard shows each folder as a
    run, so the seeds of a run overlay on one chart. NaN scores are written as NaN
    (TensorBoard shows the point as undefined rather than dropping the round). ``failed`` in
    :meth:`close` changes nothing: event files have no run status.

    Raises:
        ConfigError: the tensorboard package is not installed, or ``run_name`` is not a
            single path component.
    """

    def __init__(self, *, logdir: str | os.PathLike[str], run_name: str | None = None) -> None:
        try:
            # torch's writer imports tensorboard itself; importing it first makes a missing
            # package fail here even when torch.utils.tensorboard was imported before
            import tensorboard  # noqa: F401
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(
                f"the TensorBoard tracker needs the tensorboard package: {INSTALL_HINT}"
            ) from exc
        self._summary_writer = SummaryWriter
        self.folder = Path(logdir) / _path_component(run_name) if run_name else Path(logdir)
        self._writers: dict[int, Any] = {}  # seed -> SummaryWriter, opened on its first record
        self._closed = False

    def __call__(self, record: RoundRecord) -> None:
        if self._closed:
            raise TrackerClosed("TensorBoardWriter: a record after close()")
        writer = self._writers.get(record.seed)
        if writer is None:
            writer = self._summary_writer(log_dir=str(self.folder / f"seed-{record.seed}"))
            self._writers[record.seed] = writer
        for tag, value in record.scalars():
            writer.add_scalar(tag, value, global_step=record.round)
        # a round takes seconds or more: flushing each one lets a live TensorBoard follow
        # the run (SummaryWriter would otherwise wait up to 2 minutes)
        writer.flush()

    def close(self, failed: bool = False) -> None:
        """Flush and close every seed's event file (idempotent)."""
        self._closed = True
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()  # close() flushes


def _path_component(name: str) -> str:
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ConfigError(f"run_name must be one folder name, not a path; got {name!r}")
    return name


# ---- MLflow ----------------------------------------------------------------------------------

#: characters MLflow allows in metric and param names on every OS (mlflow.utils.validation:
#: slashes, alphanumerics, underscores, periods, dashes, spaces; colons everywhere but Windows,
#: so not here: a store written on Linux stays readable on Windows)
_MLFLOW_BAD_CHARACTER = re.compile(r"[^/\w.\- ]")
#: MLflow's limits (mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH)
MLFLOW_MAX_KEY_LENGTH = 250
MLFLOW_MAX_PARAM_LENGTH = 6000


def mlflow_key(name: str) -> str:
    """``name`` as a valid MLflow metric or param name: characters MLflow refuses become
    ``_``, and so do path components it refuses (empty, ``.``, ``..``: MLflow's file store
    treats names as paths and refuses names that normalise to another), cut to 250 chars."""
    # a cut can leave an empty or dotted last component: fix the components again after it
    # (which adds at most one character, hence the cut one short of the limit)
    key = _fix_components(_MLFLOW_BAD_CHARACTER.sub("_", name))
    return _fix_components(key[: MLFLOW_MAX_KEY_LENGTH - 1])


def _fix_components(key: str) -> str:
    return "/".join("_" if part in ("", ".", "..") else part for part in key.split("/"))


class MLflowWriter(_Closing):
    """Metrics and params to a local MLflow file store, one MLflow run per seed.

    Parameters:
        tracking_dir: the store's folder (created if absent); the writer uses the tracking
            URI ``file://<absolute tracking_dir>`` and no server.
        experiment: the MLflow experiment the runs go to (created if absent).
        run_name: each seed's MLflow run is named ``<run_name>-seed-<seed>`` (``seed-<seed>``
            when None).
        params: the run's settings, a flat mapping; logged as params of every seed's run
            (values as strings, cut to MLflow's 6000 characters), with ``seed`` added.

    The writer has its own ``MlflowClient`` and leaves mlflow's global state (tracking URI,
    active run) alone, so writers for different stores do not interfere. It does set two
    environment defaults before importing mlflow, each only when the user has not set it:
    ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses the file store without it: the store
    is "in maintenance mode", the database store needs SQLAlchemy) and
    ``MLFLOW_DISABLE_TELEMETRY=true`` (MLflow 3 otherwise sends usage events to its
    telemetry server; a local store should not reach out).

    Raises:
        ConfigError: mlflow is not installed, the file store is refused (the user set
            ``MLFLOW_ALLOW_FILE_STORE=false``) or ``experiment`` was deleted.
    """

    def __init__(
        self,
        *,
        tracking_dir: str | os.PathLike[str],
        experiment: str = "secagg",
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            # the top-level package first: a missing mlflow fails here even when a submodule
            # below was imported before
            import mlflow  # noqa: F401
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ConfigError(f"the MLflow tracker needs mlflow: {INSTALL_HINT}") from exc
        root = Path(tracking_dir).resolve()
        # the parent only: MLflow lays out a new store itself (with its Default experiment)
        root.parent.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = root.as_uri()  # file:///abs/path, percent-encoded
        try:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            found = self._client.get_experiment_by_name(experiment)
            if found is None:
                self.experiment_id = self._client.create_experiment(experiment)
            elif found.lifecycle_stage != "active":
                raise ConfigError(
                    f"MLflow experiment {experiment!r} in {root} was deleted: restore it "
                    "(mlflow experiments restore) or name another experiment"
                )
            else:
                self.experiment_id = found.experiment_id
        except MlflowException as exc:
            raise ConfigError(f"cannot open the MLflow file store in {root}: {exc}") from exc
        self.run_name = run_name
        self.params = {
            mlflow_key(str(k)): str(v)[:MLFLOW_MAX_PARAM_LENGTH] for k, v in (params or {}).items()
        }
        self.run_ids: dict[int, str] = {}  # seed -> MLflow run id, made on its first record
        self._closed = False

    def _run_id(self, seed: int) -> str:
        run_id = self.run_ids.get(seed)
        if run_id is None:
            name = f"{self.run_name}-seed-{seed}" if self.run_name else f"seed-{seed}"
            run_id = self._client.create_run(self.experiment_id, run_name=name).info.run_id
            self.run_ids[seed] = run_id
            for key, value in {**self.params, "seed": str(seed)}.items():
                self._client.log_param(run_id, key, value)
        return run_id

    def __call__(self, record: RoundRecord) -> None:
        if self._closed:
            raise TrackerClosed("MLflowWriter: a record after close()")
        run_id = self._run_id(record.seed)
        for name, value in record.scalars():
            # NaN is skipped: it marks a score that is undefined this round (an AUC with one
            # class present), not a value; MLflow would show the NaN as the run's latest
            # value of the metric, hiding the last defined one, and its database stores keep
            # NaN only through a side flag. The gap at that step says the same thing.
            if math.isnan(value):
                continue
            self._client.log_metric(run_id, mlflow_key(name), value, step=record.round)

    def close(self, failed: bool = False) -> None:
        """End each seed's run: FINISHED, or FAILED when ``failed`` (idempotent)."""
        self._closed = True
        run_ids, self.run_ids = self.run_ids, {}
        for run_id in run_ids.values():
            self._client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")


# ---- the registry ----------------------------------------------------------------------------


class TrackerFactory(Protocol):
    """Builds a writer that writes under a run's folder."""

    def __call__(self, folder: Path, *, run_name: str, params: Mapping[str, Any]) -> Writer: ...


def _tensorboard(folder: Path, *, run_name: str, params: Mapping[str, Any]) -> Writer:
    # TensorBoard has no params; the run folder's settings files hold them
    return TensorBoardWriter(logdir=Path(folder) / "tensorboard", run_name=run_name)


def _mlflow(folder: Path, *, run_name: str, params: Mapping[str, Any]) -> Writer:
    return MLflowWriter(tracking_dir=Path(folder) / "mlruns", run_name=run_name, params=params)


#: the trackers by name, as ``--tracker`` accepts them
TRACKERS: dict[str, TrackerFactory] = {"tensorboard": _tensorboard, "mlflow": _mlflow}


def tracker_names(names: str | Sequence[str]) -> list[str]:
    """The trackers ``names`` asks for (``"tensorboard,mlflow"`` or a sequence), each once,
    in the order given. ConfigError for an unknown name (the message lists the known ones)."""
    listed = names.split(",") if isinstance(names, str) else list(names)
    names = [n.strip() for n in listed if n.strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ConfigError(f"unknown tracker {unknown[0]!r}; known: {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))


def open_trackers(
    names: str | Sequence[str],
    folder: str | os.PathLike[str],
    *,
    run_name: str,
    params: Mapping[str, Any] | None = None,
) -> Trackers:
    """The writers ``names`` asks for (``"tensorboard,mlflow"`` or a sequence), writing under
    ``folder``, combined.

    Raises:
        ConfigError: an unknown name (the message lists the known ones) or a missing library;
            writers opened before the failing one are closed first.
    """
    writers: list[Writer] = []
    try:
        for name in tracker_names(names):
            writers.append(TRACKERS[name](Path(folder), run_name=run_name, params=params or {}))
    except BaseException:
        Trackers(writers).close(failed=True)
        raise
    return Trackers(writers)
