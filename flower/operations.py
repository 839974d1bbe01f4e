"""Operating a deployment's runs: ``secagg flower status`` and ``secagg flower stop``.

Both ask the SuperLink through Flower's own CLI (``flwr ls``, ``flwr stop``) on the connection
named ``secagg``: the local demo's while ``secagg flower demo`` runs (``DIR/local/cli``), else
the one in the user's Flower configuration (``secagg flower commands`` prints it). Beside
Flower's view of each run (status, elapsed time, its traffic), ``status`` shows secagg's:
the run's status from its run.json (``running``, ``complete``, ``degraded``, ``aborted``:
Flower says ``finished:failed`` for the last two, see ``secagg.runspec.status``) and
the ServerApp's last progress line (seed, round, metric, bytes), read from the progress log
it writes next to the run's results. The same lines reach ``flwr log RUN secagg``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from secagg.errors import ConfigError, SecaggError
from secagg.flower.launch import BIN, CONNECTION, DeploymentError, json_of
from secagg.runspec.status import shorten


def _check(folder: Path) -> None:
    if not (Path(folder) / "deployment.json").exists():
        raise ConfigError(f"{folder} is not a prepared deployment (no deployment.json)")


def _cli_env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    local = Path(folder) / "local" / "cli"
    if (local / "config.toml").exists():  # a demo's SuperLink (alive while the demo runs)
        env["FLWR_HOME"] = str(local)
    return env


def flwr(folder: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Flower's CLI on the deployment's connection."""
    try:
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            env=_cli_env(folder),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise DeploymentError(f"`flwr {' '.join(args)}` took over {timeout:.0f} s") from None


def runs(folder: Path, run_id: int | None = None) -> list[dict[str, Any]]:
    """Flower's record of the deployment's runs (``flwr ls --format json``), with
    ``progress``: the ServerApp's last progress line for each, where its log is here."""
    _check(folder)
    args = ["ls", CONNECTION, "--format", "json"]
    done = flwr(folder, *args, *(["--run-id", str(run_id)] if run_id is not None else []))
    try:
        listed = json_of(done.stdout)["runs"]
    except (DeploymentError, KeyError):
        raise DeploymentError(
            f"the SuperLink did not answer `flwr {' '.join(args)}`: "
            f"{(done.stdout + done.stderr).strip()[-600:]}\n(a demo's SuperLink lives while "
            "`secagg flower demo` runs; elsewhere configure the connection `secagg` that "
            "`secagg flower commands` prints)"
        ) from None
    for run in listed:
        run["progress"] = last_progress(folder, int(run["run-id"]))
        run["secagg"] = secagg_status(folder, int(run["run-id"]))
    return listed


def _run_files(folder: Path, run_id: int) -> tuple[Path, Path] | None:
    """The progress log and results folder of Flower run ``run_id``: its default results
    folder's (``results/run-<id>``), else the demo's (``results``) where that run wrote it."""
    results = Path(folder) / "results"
    own = results / f"run-{run_id}"
    if own.with_name(own.name + "-progress.log").exists():
        return own.with_name(own.name + "-progress.log"), own
    demo = results.with_name("results-progress.log")
    if demo.exists() and _is_run(demo, run_id):
        return demo, results
    return None


def last_progress(folder: Path, run_id: int) -> str | None:
    """The last line of the ServerApp's progress log for Flower run ``run_id``."""
    found = _run_files(folder, run_id)
    if found is None:
        return None
    lines = [x for x in found[0].read_text().splitlines() if x.strip()]
    return lines[-1].strip() if lines else None


def secagg_status(folder: Path, run_id: int) -> dict[str, Any] | None:
    """secagg's status of Flower run ``run_id`` from its run.json (``status``: running,
    complete, degraded, aborted, interrupted, failed; ``problems``), where it is here."""
    found = _run_files(folder, run_id)
    state = found[1] / "run.json" if found is not None else None
    if state is None or not state.is_file():
        return None
    try:
        document = json.loads(state.read_text())
    except json.JSONDecodeError:
        return None
    return {"status": document.get("status"), "problems": document.get("problems", [])}


def _is_run(log: Path, run_id: int) -> bool:
    """Whether the demo's progress log is Flower run ``run_id``'s (its first line names it:
    ``secagg.flower.apps.run_on_flower``)."""
    with open(log) as fh:
        return fh.readline().startswith(f"Flower run {run_id}:")


def stop(folder: Path, run_id: int) -> str:
    """Stop Flower run ``run_id`` (``flwr stop``); Flower's message."""
    _check(folder)
    done = flwr(folder, "stop", str(run_id), CONNECTION)
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise SecaggError(f"`flwr stop {run_id}` failed: {text[-600:]}")
    return text


_NO_LOG = "no progress log here (it is where the ServerApp runs)"


def format_runs(listed: list[dict[str, Any]]) -> str:
    """One block per run: Flower's status, elapsed time and traffic, then secagg's progress."""
    if not listed:
        return "no runs on this SuperLink yet"
    blocks = []
    for run in listed:
        traffic = run.get("network-traffic", {})
        mine = run.get("secagg")
        status = (
            ""
            if mine is None
            else f"{mine['status']}"
            + (f" ({shorten(mine['problems'][0], 160)})" if mine.get("problems") else "")
            + "; "
        )
        blocks.append(
            f"Flower run {run['run-id']}: {run['status']}, {run.get('elapsed', '?')} elapsed, "
            f"traffic in {traffic.get('inbound-bytes', 0) / 1e6:.2f} MB, out "
            f"{traffic.get('outbound-bytes', 0) / 1e6:.2f} MB\n"
            f"  secagg: {status}{run['progress'] or _NO_LOG}"
        )
    return "\n".join(blocks)
