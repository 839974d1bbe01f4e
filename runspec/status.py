"""A run's status: whether its numbers are the result of the run it was configured as.

Each finished seed leaves an *outcome* (:func:`seed_outcome`, recorded in ``run.json``
under ``finished.<seed>.outcome``): the rounds configured and run, why it stopped early if it
did (a protocol's convergence test, or an abort: the round, stage, phase and reason), the
training rounds each client missed (excluded in some phase of the round, or absent: out of
the run since an earlier round or the set-up) and the rounds that made no update (skipped:
contributors refused the release). :func:`decide` turns the outcomes of every configured seed
into one status, by this rule:

- ``complete``: every seed ran every configured round, or stopped early because its protocol
  converged (ADMM's residuals, the Cox model's Newton step: a stop by design), with every
  client in every round and no round skipped, the pre-stage's rounds included;
- ``degraded``: every seed ran to its end, but some client missed rounds or some round made
  no update: the result is of fewer contributors than configured. The details name the
  seed, the client and the rounds;
- ``aborted``: some seed stopped early without converging (set-up or a round left fewer
  clients than it needs, ``min_clients``; a protocol gave up): the details name the seed,
  the round, the stage, the phase and the reason;
- ``interrupted``: some configured seed has no outcome (the run was stopped; a resumed run
  decides once every seed has one). ``running`` and ``failed`` (an exception ended the
  run) are written by the run itself, not decided here.

``aborted`` outranks ``degraded``. The command line exits with :data:`EXIT_CODES`: 0
complete, 3 aborted, 4 degraded (2 is a usage or configuration error, 130 an interrupted
run); the Python API returns the status on its result and raises for neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from secagg.server.audit import AuditLog

COMPLETE, DEGRADED, ABORTED, INTERRUPTED = "complete", "degraded", "aborted", "interrupted"
#: ``secagg run``'s exit status per status (``secagg flower demo`` uses the same)
EXIT_CODES = {COMPLETE: 0, ABORTED: 3, DEGRADED: 4, INTERRUPTED: 130}
#: characters of one detail shown in the closing line (run.json holds each in full)
SHOWN = 240


def shorten(text: str, limit: int = SHOWN) -> str:
    """``text`` cut to ``limit`` characters (with "…"): a line's worth of a problem."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class RunStatus:
    """The status of a run, why (``problems``: one line per seed and client or abort) and
    what is worth knowing without changing it (``notes``: seeds that converged early)."""

    status: str
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, 1)

    def line(self, limit: int = 3) -> str:
        """The closing line: the status first, then the first problems (shortened)."""
        if not self.problems:
            return self.status
        shown = [shorten(p) for p in self.problems[:limit]]
        more = len(self.problems) - limit
        return (
            f"{self.status}: "
            + "; ".join(shown)
            + (f"; {more} more in run.json" if more > 0 else "")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


@dataclass
class _Outcome:
    """A seed's recorded outcome, read tolerantly (older folders lack some keys)."""

    seed: int
    rounds: int
    ran: int
    stopped: str | None = None
    aborted: dict[str, Any] | None = None
    missed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, seed: int, recorded: Mapping[str, Any]) -> _Outcome:
        return cls(
            seed,
            int(recorded.get("rounds", 0)),
            int(recorded.get("ran", 0)),
            recorded.get("stopped"),
            recorded.get("aborted"),
            list(recorded.get("missed", [])),
            [int(r) for r in recorded.get("skipped", [])],
        )


def rounds_text(rounds: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` as "rounds 2-4, 7" (one round: "round 2")."""
    spans: list[list[int]] = []
    for r in sorted(rounds):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return ("round " if len(rounds) == 1 else "rounds ") + text


def _where(abort: Mapping[str, Any]) -> str:
    """Where a seed stopped: "round 0 (set-up, phase setup)", "round 3 (phase train)", with
    the pre-stage named where it was there."""
    stage = abort.get("pre_stage")
    round_ = abort.get("round")
    place = "set-up" if abort.get("stage") == "setup" else None
    inside = ", ".join(
        x for x in (place, f"phase {abort['phase']}" if abort.get("phase") else None) if x
    )
    text = f"round {round_}" if round_ is not None else "an unknown round"
    text += f" ({inside})" if inside else ""
    return f"its {stage} pre-stage, {text}" if stage else text


def decide(seeds: Sequence[int], outcomes: Mapping[int, Mapping[str, Any]]) -> RunStatus:
    """The status of a run of ``seeds`` from each seed's recorded outcome (see the module's
    docstring for the rule). Pure: it reads nothing but its arguments."""
    aborted, degraded, notes, missing = [], [], [], []
    for seed in seeds:
        if seed not in outcomes:
            missing.append(seed)
            continue
        o = _Outcome.of(seed, outcomes[seed])
        if o.aborted is not None:
            aborted.append(f"seed {seed} in {_where(o.aborted)}: {o.aborted.get('reason', '?')}")
        elif o.ran < o.rounds and not o.stopped:
            aborted.append(f"seed {seed} stopped after round {o.ran} of {o.rounds}")
        elif o.ran < o.rounds:
            notes.append(f"seed {seed} converged after round {o.ran} of {o.rounds}: {o.stopped}")
        if o.aborted is not None or o.ran < o.rounds and not o.stopped:
            continue  # the abort's reason names the clients it lost
        for m in o.missed:
            of = f"of seed {seed}" + (f"'s {m['stage']} pre-stage" if m.get("stage") else "")
            degraded.append(f"{m['client']} missed {rounds_text(m['rounds'])} {of}")
        if o.skipped:
            degraded.append(f"{rounds_text(o.skipped)} of seed {seed} made no update (skipped)")
    if aborted:
        return RunStatus(ABORTED, tuple(aborted + degraded), tuple(notes))
    if missing:
        return RunStatus(
            INTERRUPTED, (f"seeds {missing} did not run",) + tuple(degraded), tuple(notes)
        )
    if degraded:
        return RunStatus(DEGRADED, tuple(degraded), tuple(notes))
    return RunStatus(COMPLETE, (), tuple(notes))


def seed_outcome(
    seed: int,
    rounds: int,
    rows: Sequence[Mapping[str, Any]],
    audit: AuditLog,
    *,
    aborted: str | None = None,
    stopped: str | None = None,
) -> dict[str, Any]:
    """What ``decide`` needs of one finished seed, from what the run recorded: its metrics
    rows (round 0 = the initial model), the audit (its runs ``"<seed>"`` and a pre-stage's
    ``"<seed>-<stage>"``), the abort reason (``SeedRun.aborted``) and the convergence reason
    (``SeedRun.stopped``). JSON-ready: it is written to ``run.json``."""
    runs = {str(seed)} | {r["run"] for r in audit.records if r["run"].startswith(f"{seed}-")}

    def stage_of(run: str) -> str | None:
        return None if run == str(seed) else run.split("-", 1)[1]

    missed = [
        {"client": m["peer"], "rounds": list(m["rounds"]), "stage": stage_of(m["run"])}
        for m in audit.rounds_missed()
        if m["run"] in runs
    ]
    abort = None
    if aborted is not None:
        records = [r for r in audit.records if r["event"] == "aborted" and r["run"] in runs]
        last = records[-1] if records else {}
        reason = str(last.get("reason", aborted))
        # the engine's reason opens with its own round index ("round 0: ..." for round 1)
        reason = reason.removeprefix(f"round {last.get('protocol_round')}: ")
        abort = {
            "round": last.get("round"),
            "stage": last.get("stage"),
            "phase": last.get("phase"),
            "pre_stage": stage_of(last["run"]) if last else None,
            "reason": reason,
        }
    trained = [r for r in rows if int(r.get("round", 0)) >= 1]
    return {
        "rounds": int(rounds),
        "ran": max((int(r["round"]) for r in trained), default=0),
        "stopped": stopped,
        "aborted": abort,
        "missed": missed,
        "skipped": [int(r["round"]) for r in trained if _truthy(r.get("skipped"))],
    }


def _truthy(value: Any) -> bool:
    try:
        return bool(value) and float(value) == float(value)  # NaN (a column absent) is not
    except (TypeError, ValueError):
        return False
