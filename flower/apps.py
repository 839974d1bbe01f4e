"""The Flower apps: ``server_app`` drives secagg's engine, ``client_app`` answers with a
node's secagg client. The Flower App that ``flwr run`` submits names these two
(``[tool.flwr.app.components]``); ``secagg flower prepare`` writes it.

The ServerApp is also where the experimenter sits in this deployment, and it holds only the
coordinator's own test set (``held_by_coordinator``): it scores the global model after every
round on the task's pooled test set, if the task declares one, and writes the run folder as
``secagg run`` does in simulation. It never opens a site's data, nor counts the sites from
it (the clients are the deployment's roster): no ``train_*`` columns, no per-client test
scores (a client's test set is the site's); a task with no pooled test set is not scored
here at all.

A run that ends ``degraded`` or ``aborted`` writes its folder as a complete one does, then
the ServerApp raises (``RunNotComplete``): Flower records it as ``finished:failed``, and
``secagg flower status`` shows secagg's status beside Flower's.

Whatever fails in the ClientApp (secagg's handler, a task's loader parsing the site's file,
Flower's routing) leaves the node as a fixed code (``messages.failure``: a refusal's code,
``request_refused``, or ``internal_error``), never the exception's text or type, which can
quote the site's data; the text and traceback go to the node's own log (its stderr).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from secagg.backends import backend_spec
from secagg.errors import ClientRefused, ConfigError, RunNotComplete, error_code
from secagg.flower import messages
from secagg.flower.keystore import experiment_name, read_signers
from secagg.flower.node import RequestRefused, load_experiment, node_client
from secagg.flower.transport import FlowerNodes, FlowerTransport

#: the node's own log (the ClientApp process's stderr, which the SuperNode's log takes in);
#: the ServerApp's progress (its stderr, which Flower's log of the run takes in)
LOG = logging.getLogger(__name__)


def failure_code(exc: BaseException) -> str:
    """The code a node's failed reply carries for ``exc`` (``messages.FAILURE_CODES``)."""
    if isinstance(exc, ClientRefused):
        return exc.code  # its client logged the detail already
    if isinstance(exc, RequestRefused):
        return "request_refused"
    return error_code(exc)


class CodedClientApp(ClientApp):
    """Flower's ClientApp, but a failure leaves it as a fixed code: Flower would send the
    exception's type and text (``<class 'ValueError'>:<'...'>``) to the ServerApp."""

    def __call__(self, message: Message, context: Context) -> Message:
        show_log()
        try:
            return super().__call__(message, context)
        except Exception as exc:  # noqa: BLE001 - whatever failed, only a code leaves
            code = failure_code(exc)
            meta = message.metadata
            LOG.error(
                "secagg: the ClientApp failed on message %s of Flower run %s; the "
                "coordinator is told %r only",
                meta.message_id,
                meta.run_id,
                code,
                exc_info=exc,
            )
            return messages.failure(message, code)


server_app = ServerApp()
client_app = CodedClientApp()


@client_app.query("secagg")
def answer(message: Message, context: Context) -> Message:
    """One request to this node's client (built from the node's directory, see ``node``)."""
    node_dir = context.node_config.get("node-dir")
    if not node_dir:
        raise RuntimeError(
            "this SuperNode has no node-dir: start it with `secagg flower node "
            "/path/to/nodes/client_0 ...` (secagg flower prepare writes the folder)"
        )
    envelope, run = messages.read_request(message)
    node = node_client(Path(str(node_dir)))
    meta = message.metadata
    return messages.reply(message, node.answer(envelope, run, meta.run_id, meta.dst_node_id))


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    show_log(prefix="[secagg] ")
    cfg = context.run_config
    if not cfg.get("deployment"):
        raise ConfigError(
            "the run names no deployment folder: submit it with `flwr run DIR/app secagg "
            "--run-config 'deployment=\"/path/to/DIR\"'` (`secagg flower commands DIR` prints it)"
        )
    deployment = Path(str(cfg["deployment"]))
    out = Path(str(cfg.get("out") or deployment / "results" / f"run-{context.run_id}"))
    run_on_flower(
        grid,
        deployment=deployment,
        out=out,
        timeout=float(cfg.get("timeout", 120.0)),
        connect_timeout=float(cfg.get("connect-timeout", 120.0)),
        flower_run=context.run_id,
    )


def run_on_flower(
    grid: Any,
    *,
    deployment: Path,
    out: Path,
    timeout: float,
    connect_timeout: float,
    flower_run: int | None = None,
) -> None:
    """The experiment of ``deployment`` over the SuperNodes ``grid`` reaches; results in
    ``out`` (the run folder of ``secagg run``, plus ``flower.json``), progress also in
    ``<out>-progress.log``.

    A run that is not complete (``degraded``: some site missed rounds; ``aborted``: a seed
    stopped early; ``secagg.runspec.status``) raises ``RunNotComplete`` once every file is
    written, so that Flower marks the run ``finished:failed``; run.json and flower.json say
    which and why."""
    import secagg
    from secagg.clients.tasks import get_task
    from secagg.clients.tasks.tcga_brca import held_by_coordinator

    out.parent.mkdir(parents=True, exist_ok=True)
    config = load_experiment(deployment / "experiment.toml")
    experiment = experiment_name(config)
    roster = read_signers(deployment / "server" / "signers.json")
    signers = roster if backend_spec(config.backend).keyed else None
    ids = roster_clients(roster, deployment / "server" / "signers.json")
    held = held_by_coordinator(get_task(config.task).load(), len(ids))
    log = out.with_name(out.name + "-progress.log")

    log.write_text("")  # this run's, from its first line (`secagg flower status` reads it)

    def say(line: str) -> None:  # the ServerApp's stderr goes to Flower's log: keep a copy
        secagg_progress(line)
        with open(log, "a") as f:
            f.write(line + "\n")

    nodes = FlowerNodes(grid, ids, experiment, roster, log=say)
    say(
        (f"Flower run {flower_run}: " if flower_run is not None else "")
        + f"waiting for {len(ids)} SuperNodes (experiment {experiment})"
    )
    if held.pooled_test is None:
        say(
            f"the coordinator holds no test set of {config.task} (it declares no pooled_test): "
            "the rounds are not scored here; score models/ where a test set is held"
        )
    nodes.wait_for_all(connect_timeout)
    say("nodes: " + ", ".join(f"{c}={n}" for c, n in sorted(nodes.node_of.items())))
    transports: list[FlowerTransport] = []

    def transport(factory, run_ids):
        made = FlowerTransport(
            nodes,
            run={"experiment": experiment, "seed": factory.seed, "stage": factory.stage or ""},
            timeout=timeout,
        )
        transports.append(made)
        return made

    experimenter = None
    if config.server_blind:  # the key is the experimenter's, elsewhere: keep what is sealed
        from secagg.flower.experimenter import SEALED, SealedCopies

        def experimenter(seed: int) -> SealedCopies:
            return SealedCopies(out / SEALED, seed)

    result = secagg.run(
        config,
        experimenter=experimenter,
        out=out,
        overwrite=True,
        transport=transport,
        progress=say,
        signers=signers,
        command=["flwr run", str(deployment)],
        data=held,
    )
    framing = (
        {k: sum(t.framing[k] for t in transports) for k in transports[0].framing}
        if transports
        else {}
    )
    (out / "flower.json").write_text(
        json.dumps(
            {
                "experiment": experiment,
                "nodes": nodes.node_of,
                "framing": framing,
                "aborted": {str(s): r for s, r in result.aborted.items()},
                # secagg's status of the run, as in run.json (secagg.runspec.status)
                "status": result.status.status,
                "problems": list(result.status.problems),
                # what this process imported of secagg: the test checks that no secret-key
                # module is among them
                "secagg_modules": sorted(m for m in sys.modules if m.startswith("secagg")),
            },
            indent=1,
        )
    )
    if config.server_blind:
        say(
            f"the models are sealed for the experimenter in {out / 'sealed'}: open them "
            f"where the key is, with `secagg flower open {out} --key observer.key`"
        )
    status = result.status
    if status.complete:
        say(f"done: results in {out}")
        return
    for problem in status.problems:
        say(f"{status.status}: {problem}")
    say(f"{status.line()}; results in {out}")
    # Flower records a ServerApp that raises as finished:failed, with this message
    raise RunNotComplete(f"secagg run {status.line()} (results in {out})", status.status)


def roster_clients(roster: dict[str, bytes], path: Path) -> list[str]:
    """The deployment's clients, ``client_0`` ... ``client_<n-1>``, from its roster (a
    ConfigError where the roster's names are not that)."""
    ids = [f"client_{k}" for k in range(len(roster))]
    if not ids or set(roster) != set(ids):
        raise ConfigError(
            f"{path} names clients {sorted(roster)}; a deployment's are client_0 ... "
            "client_<n-1>, one each: prepare the deployment again with `secagg flower prepare`"
        )
    return ids


def secagg_progress(line: str) -> None:
    LOG.info("%s", line)


def show_log(prefix: str = "") -> None:
    """In Flower's ``flwr-clientapp`` and ``flwr-serverapp`` processes, which run this App
    and nothing else: secagg's log lines on the process's stderr, which Flower takes into the
    node's log (a ClientApp) or its log of the run (the ServerApp, each line marked
    ``[secagg]``). Once per process, where no secagg entry point (the warm executor, whose
    message processes run flwr-clientapp's code) did so; elsewhere (the App called in a test,
    or by another program) the logging is that program's."""
    from secagg.logs import stderr_level, to_stderr

    if stderr_level() is None and sys.argv[0].endswith(("flwr-clientapp", "flwr-serverapp")):
        to_stderr(prefix=prefix)
