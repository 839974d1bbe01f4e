"""A node's own privacy ledger: how many runs of each seed have released this node's data,
across Flower runs and deployments, against what the node's own ``node.toml`` allows.

Why a ledger at all: every run of a seed gets fresh keys and fresh budgets (decryptions,
opens, shares, scalars, DP), so a server that could start the same seed again and again
would get more releases of the same data than one run's provisioning allows. The rule:

- **What costs.** A run of (seed, stage) costs one *run budget* of that seed once it has
  released anything of this node's data: a consent to a release of a sum holding its upload,
  a decryption, an open or a share it gave, a scalar or validation loss it reported, or an
  update the server sees in plaintext (``plain``, or plaintext updates allowed). Within a
  run the client's own budgets bound every kind of release and its DP ε, so ``n`` charged
  runs release at most ``n`` times what one run may, and their ε composes from ``n`` runs'.
  A run that released nothing costs nothing (it failed during enrolment or key setup, or
  its uploads were never released).
- **Admission.** A new Flower run of a seed reserves one run budget before any key or client
  is made for it, and is admitted only while the seed's charged runs plus this one fit in
  ``runs_per_seed`` (``[privacy]`` of ``node.toml``, default 1: what "one run per seed" was).
  Admitting it *supersedes* every earlier run of that seed: they are answered no more, so
  one that released nothing can never release and its reservation is refunded; one that
  released stays charged. A superseded run's id replayed later is refused.
- **Crash safety.** A reply that releases something is charged in the ledger (one JSON file,
  mode 0600, replaced whole through a fsynced temporary) before its state is written and
  before the reply leaves; a node killed between the two has over-counted, never under-.
  A run charged for a release whose state is gone is answered no more (a fresh client would
  have fresh budgets in the same run), nor one whose state is *behind* its charge (a state
  file rolled back, or its last write lost: the client would sign, decrypt or report again
  what it already did; :meth:`NodeLedger.check_state`).
- **Key.** One ledger file per ledger folder (``[privacy] ledger``; default the node's own
  folder, which ``secagg flower join`` keeps across deployments); in it, one line per
  (task, data fingerprint, seed, stage): the data fingerprint is a digest of the client's
  partition as the node's task loads it, so the same data under a new deployment, a new
  identity or another node folder that names the same ledger folder is counted together,
  and other data starts from nothing. Nothing of it comes from the server.

The accounting is pure functions over the ledger's JSON (:func:`admitted`, :func:`charged`);
:class:`NodeLedger` reads, locks (``fcntl.flock``) and writes it.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from secagg.errors import ClientRefused, ConfigError, SecaggError
from secagg.flower.keystore import write_private_bytes

LEDGER_FILE, LOCK_FILE = "privacy-ledger.json", "privacy-ledger.lock"
VERSION = 1
#: the code a reply refused for a spent budget carries (``messages.FAILURE_CODES``)
BUDGET_SPENT = "privacy_budget_spent"


class PrivacyBudgetSpent(ClientRefused):
    """A node refuses a new run of a seed whose run budgets its own ledger has spent: the
    server learns the code only; the message (the node's log) says what was spent, what is
    left and what to do."""

    def __init__(self, client: str, detail: str):
        SecaggError.__init__(self, detail)
        self.client, self.phase, self.code = client, "admission", BUDGET_SPENT


class RunClosed(ClientRefused):
    """A request of a run this node answers no more: superseded by a later run of the same
    seed, admitted from another node folder, or charged for a release whose state is gone.
    The server learns ``request_refused`` only."""

    def __init__(self, client: str, detail: str):
        SecaggError.__init__(self, detail)
        self.client, self.phase, self.code = client, "admission", "request_refused"


@dataclass(frozen=True)
class LedgerSettings:
    """``[privacy]`` of a node's ``node.toml``: ``runs_per_seed`` (how many runs of each seed
    may release this node's data, across Flower runs and deployments) and ``ledger`` (the
    folder of the ledger file; relative to the node folder; default the node folder)."""

    runs_per_seed: int
    folder: Path

    @classmethod
    def from_table(cls, table: object, node_dir: Path, where: Path) -> LedgerSettings:
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [privacy] is a table (runs_per_seed, ledger)")
        unknown = sorted(set(table) - {"runs_per_seed", "ledger"})
        if unknown:
            raise ConfigError(f"{where}: [privacy] has no {unknown}; it sets runs_per_seed, ledger")
        runs = table.get("runs_per_seed", 1)
        if type(runs) is not int or runs < 0:
            raise ConfigError(f"{where}: privacy.runs_per_seed is a count >= 0, got {runs!r}")
        folder = table.get("ledger", ".")
        if not isinstance(folder, str) or not folder:
            raise ConfigError(f'{where}: privacy.ledger is a folder, e.g. "/var/lib/secagg"')
        return cls(runs, (Path(node_dir) / folder).resolve())


# ---- the accounting (pure) -----------------------------------------------------------------
def stage_name(stage: str | None) -> str:
    return stage or "run"


def run_key(client: str, flower_run: int, seed: int, stage: str | None) -> str:
    return f"{client}|{int(flower_run)}|{seed}|{stage_name(stage)}"


def line_key(task: str, data: str, seed: int, stage: str | None) -> str:
    """What a run budget is counted per: the same data's seed (and stage)."""
    return f"{task}|{data}|{seed}|{stage_name(stage)}"


def empty_ledger() -> dict[str, Any]:
    return {"version": VERSION, "runs": {}}


def runs_of(ledger: Mapping[str, Any], line: str) -> dict[str, dict[str, Any]]:
    """The runs counted on ``line``, by run key, in the order they were admitted."""
    return {k: r for k, r in ledger["runs"].items() if r["line"] == line}


def costs(record: Mapping[str, Any]) -> bool:
    """Whether a run takes a run budget: it released (for good), or it is open (reserved)."""
    return bool(record["released"] or record["open"])


def spent(ledger: Mapping[str, Any], line: str) -> list[str]:
    """The runs of ``line`` that released this node's data (what it has spent for good)."""
    return [k for k, r in runs_of(ledger, line).items() if r["released"]]


class OverBudget(Exception):
    """A new run does not fit: the runs ``spent`` released, ``allowed`` may in all."""

    def __init__(self, spent: list[str], allowed: int):
        super().__init__(f"{len(spent)} run(s) released, {allowed} allowed")
        self.spent, self.allowed = spent, allowed


def admitted(
    ledger: Mapping[str, Any], key: str, line: str, node: str, allowed: int
) -> dict[str, Any]:
    """The ledger with the new run ``key`` (of ``line``, answered from node folder ``node``)
    admitted and every earlier run of ``line`` superseded; :class:`OverBudget` if the runs
    of ``line`` that released, plus this one, exceed ``allowed``. Superseded runs that
    released nothing cost nothing from now on: they are answered no more."""
    if key in ledger["runs"]:
        raise ValueError(f"run {key} is in the ledger already")
    released = spent(ledger, line)
    if len(released) + 1 > allowed:
        raise OverBudget(released, allowed)
    out = copy.deepcopy(dict(ledger))
    for record in runs_of(out, line).values():
        record["open"] = False
    out["runs"][key] = {"line": line, "node": node, "open": True, "released": False, "counts": {}}
    return out


def charged(ledger: Mapping[str, Any], key: str, counts: Mapping[str, int]) -> dict[str, Any]:
    """The ledger with run ``key`` charged for a release: ``counts`` is what the run has
    released so far, by kind. Only an open run may release (:class:`RunClosed`)."""
    record = ledger["runs"].get(key)
    if record is None or not record["open"]:
        raise RunClosed(
            key.split("|")[0],
            f"run {key} was superseded by a later run of its seed while it answered: its "
            "reply is not sent",
        )
    out = copy.deepcopy(dict(ledger))
    out["runs"][key].update(released=True, counts={k: int(v) for k, v in counts.items() if v})
    return out


def released_counts(client: Any, *, plaintext_updates: bool) -> dict[str, int]:
    """What a client (``secagg.clients.runtime.Client``) has released of its data in its run
    so far, by kind, from its own records (restored with its state): its consents to
    releases, decryptions, opens and shares (the key-holding backends' halves), its
    reported scalars and validation losses, and, where the server sees updates in
    plaintext, the rounds it trained."""
    backend, guard = client.backend, client.guard
    uploads = getattr(backend, "uploads", {}) or {}
    return {
        "consents": sum(sum(kinds.values()) for kinds in uploads.values()),
        "decryptions": int(getattr(backend, "decryptions", 0)),
        "opens": int(getattr(backend, "opens", 0)),
        "shares": int(getattr(backend, "open_shares", 0)),
        "scalars": int(guard.scalars),
        "validation losses": sum(guard.validations.values()),
        "plaintext updates": len(guard.trained) if plaintext_updates else 0,
    }


def data_fingerprint(part: Any) -> str:
    """A digest of one client's partition (``ClientData``: its ``x`` and ``y``, dtype,
    shape and bytes): the same data gives the same ledger line whatever folder, deployment
    or identity it is served from."""
    digest = hashlib.sha256(b"secagg ledger data v1")
    for tensor in (part.x, part.y):
        array = tensor.detach().cpu().contiguous().numpy()
        digest.update(f"{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:32]


# ---- the file ----------------------------------------------------------------------------
class NodeLedger:
    """The ledger of the node ``client`` (whose folder is ``node_dir``) in its settings'
    folder: admits runs (:meth:`admit`) and charges releases (:meth:`charge`), each under
    an exclusive lock of the ledger file, written before the caller replies."""

    def __init__(self, client: str, node_dir: Path, settings: LedgerSettings, node_toml: Path):
        self.client, self.node = client, str(Path(node_dir).resolve())
        self.settings, self.node_toml = settings, node_toml
        self.path = settings.folder / LEDGER_FILE

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        from secagg.flower.keystore import private_folders

        private_folders(self.settings.folder)
        fd = os.open(self.settings.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self.read()
        finally:
            os.close(fd)  # releases the lock

    def read(self) -> dict[str, Any]:
        """The ledger (empty where no file is yet); ConfigError for a file that is not one:
        an unreadable ledger is never taken for an empty one."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return empty_ledger()
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{self.path} is not a readable privacy ledger ({exc}): restore it from a "
                "copy; removing it would forget what this node's data has released"
            ) from None
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise ConfigError(f"{self.path}: not a version-{VERSION} secagg privacy ledger")
        return raw

    def _write(self, ledger: Mapping[str, Any]) -> None:
        text = json.dumps(ledger, indent=1, sort_keys=True) + "\n"
        write_private_bytes(self.path, text.encode(), private_from=self.settings.folder)

    def admit(
        self,
        *,
        flower_run: int,
        seed: int,
        stage: str | None,
        has_state: bool,
        line: Callable[[], str],
        per_run: Callable[[], str] | None = None,
    ) -> None:
        """Admit a request of (Flower run, seed, stage): a run met before must be open,
        answered from this node folder, and, once charged, still have its state
        (``has_state``); a new one is admitted within the budget (``line``: its ledger line,
        computed only for a new run; ``per_run``: what one run may release, for messages),
        or refused with :class:`PrivacyBudgetSpent`."""
        key = run_key(self.client, flower_run, seed, stage)
        what = f"Flower run {flower_run} of seed {seed} ({stage_name(stage)})"
        with self._locked() as ledger:
            record = ledger["runs"].get(key)
            if record is not None:
                if record["node"] != self.node:
                    raise RunClosed(
                        self.client,
                        f"{self.client}: {what} was admitted from node folder "
                        f"{record['node']}, not {self.node}: a run is answered from one folder",
                    )
                if not record["open"]:
                    raise RunClosed(
                        self.client,
                        f"{self.client}: {what} was superseded by a later run of the same "
                        "seed on this node: a node answers only the latest run of a seed",
                    )
                if record["released"] and not has_state:
                    raise RunClosed(
                        self.client,
                        f"{self.client}: {what} released this node's data and its state is "
                        "gone: a fresh client would have fresh budgets in the same run; "
                        "start a new run",
                    )
                return
            of = line()
            try:
                self._write(admitted(ledger, key, of, self.node, self.settings.runs_per_seed))
            except OverBudget as over:
                raise PrivacyBudgetSpent(
                    self.client,
                    self._spent_message(ledger, what, seed, over, per_run() if per_run else ""),
                ) from None

    def check_state(
        self, *, flower_run: int, seed: int, stage: str | None, counts: Mapping[str, int]
    ) -> None:
        """RunClosed if the run's restored state (``counts``: what it says the run released)
        is behind what this ledger charged it for: a state file rolled back (restored from
        a copy, or its last write lost) would let the client sign, decrypt or report again
        what it already did: the run is answered no more, as one whose state is gone."""
        key = run_key(self.client, flower_run, seed, stage)
        with self._locked() as ledger:
            record = ledger["runs"].get(key)
        if record is None:
            return
        behind = {k: n for k, n in record["counts"].items() if int(counts.get(k, 0)) < int(n)}
        if behind:
            raise RunClosed(
                self.client,
                f"{self.client}: the state of Flower run {flower_run} of seed {seed} "
                f"({stage_name(stage)}) is behind what this node's ledger charged it for "
                f"({', '.join(f'{k} {counts.get(k, 0)} < {n}' for k, n in sorted(behind.items()))})"
                ": a rolled-back state would release again what it released; start a new run",
            )

    def charge(
        self, *, flower_run: int, seed: int, stage: str | None, counts: Mapping[str, int]
    ) -> None:
        """Charge run (Flower run, seed, stage) for the release the caller is about to send
        (``counts``: all it has released so far): written before the reply leaves;
        :class:`RunClosed` if a later run superseded it meanwhile (the reply is not sent)."""
        key = run_key(self.client, flower_run, seed, stage)
        with self._locked() as ledger:
            self._write(charged(ledger, key, counts))

    def _spent_message(
        self, ledger: Mapping[str, Any], what: str, seed: int, over: OverBudget, per_run: str
    ) -> str:
        def run_of(key: str) -> str:
            record = ledger["runs"][key]
            counts = ", ".join(f"{n} {k}" for k, n in sorted(record["counts"].items()))
            return f"Flower run {key.split('|')[1]} ({counts or 'released'})"

        done = "; ".join(run_of(k) for k in over.spent) or "none"
        left = max(0, over.allowed - len(over.spent))
        return (
            f"{self.client} refuses {what}: this node's data has released in "
            f"{len(over.spent)} run(s) of seed {seed} ({done}) and its node.toml allows "
            f"{over.allowed} (privacy.runs_per_seed): {left} left, a run needs 1"
            + (f" (a run may release {per_run})" if per_run else "")
            + ". Runs that released nothing cost nothing. To run it again, raise "
            f"runs_per_seed under [privacy] in {self.node_toml} (each run more adds one run's "
            "releases and DP ε of this experiment), or run it on new data; the coordinator "
            f"can change neither. Ledger: {self.path}"
        )
