"""A SuperNode that runs secagg's own App and no other: ``secagg flower node DIR``.

A plain ``flower-supernode`` runs whatever App the SuperLink serves, and hands every App's
ClientApp the node's ``node_config``: a foreign App submitted to the SuperLink runs its own
code on the node, as the node's user, and reads the node's identity file. Flower's
``--trusted-entities`` (1.30 to 1.42) does not close this for a secagg deployment: it
accepts only FABs that carry a signature from the Flower Hub (``valid_license``), and a FAB
that ``flwr run`` submits from a folder never does, so a node with trusted entities refuses
secagg's own App too (``flwr/supernode/start_client_internal.py``, ``_verify_fab``).

So the node enforces it itself. ``secagg flower prepare`` builds the deployment's App with
Flower's own builder (the FAB ``flwr run`` submits) and pins its digest in every node's
``node.json`` (:func:`app_digest`: the FAB's file names, sizes and SHA-256s). This module
runs Flower's SuperNode with one change: before the node accepts a run it has not seen, it
checks that the run's FAB is the pinned App (:func:`check_app`). A run with any other FAB
is answered with Flower's own "invalid FAB" error reply, and nothing of it is stored: no
run, no context (so no ``node_config``, no ``node-dir``), no ClientApp task, so none of its
code ever runs on the node. A run with the pinned FAB goes on exactly as in Flower.

What this does not stop: anything already running on the node's machine as the node's OS
user (it can read every file that user can read, identity file included), or a person who
starts the node with plain ``flower-supernode``. File modes (0600, folder 0700) keep other
OS users out.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from secagg.errors import ConfigError, SecaggError
from secagg.flower.process import shorten_object_pulls

LOG = logging.getLogger(__name__)

#: the most files and bytes a FAB may hold to be looked at (secagg's App is one small file)
MAX_FILES, MAX_BYTES = 16, 1 << 20


class ForeignApp(SecaggError):
    """A run's Flower App is not the secagg App this node was provisioned with."""


def app_digest(fab: bytes) -> str:
    """The digest a node pins: SHA-256 over the FAB's members (name, size, SHA-256 of the
    bytes), in order. It names the App's content, not the zip's bytes, so the same App
    built with another zlib still matches. ForeignApp for what is not a small zip."""
    try:
        with zipfile.ZipFile(io.BytesIO(fab)) as archive:
            members = archive.infolist()
            if len(members) > MAX_FILES or sum(m.file_size for m in members) > MAX_BYTES:
                raise ForeignApp(
                    f"a FAB of {len(members)} files and "
                    f"{sum(m.file_size for m in members)} bytes is not secagg's App"
                )
            listing = [
                [m.filename, m.file_size, hashlib.sha256(archive.read(m)).hexdigest()]
                for m in members
            ]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError):
        raise ForeignApp("the FAB is not a zip archive") from None
    return hashlib.sha256(json.dumps(listing, separators=(",", ":")).encode()).hexdigest()


def build_app(app: Path) -> bytes:
    """The FAB ``flwr run APP`` builds and submits (Flower's own builder)."""
    from flwr.cli.build import build_fab_from_disk

    return build_fab_from_disk(Path(app))


def check_app(fab: bytes, pin: str) -> None:
    """ForeignApp unless ``fab`` is the App whose digest is ``pin``."""
    found = app_digest(fab)
    if found != pin:
        raise ForeignApp(f"App {found[:16]} is not the pinned App {pin[:16]}")


def pinned_app(node_dir: Path) -> str:
    """The App digest in a node folder's ``node.json`` (ConfigError if there is none)."""
    try:
        pin = json.loads((Path(node_dir) / "node.json").read_text())["app"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{node_dir}/node.json pins no App: this node folder was made before secagg "
            "pinned its App; prepare the deployment again (`secagg flower prepare`)"
        ) from None
    if not isinstance(pin, str) or len(pin) != 64:
        raise ConfigError(f"{node_dir}/node.json: 'app' is not an App digest")
    return pin


class TaskAfterObjects:
    """The SuperNode's state as Flower's ``_pull_and_store_message`` sees it, with the
    ClientApp task it creates for a message held back until the message's objects are all
    in the object store.

    flwr 1.42 creates the task (which the executor's next ``AcquireTask`` hands out) before
    it pulls the message's objects from the SuperLink: a ClientApp started in between pulls
    the content-less message and then asks for objects that are not there yet, again and
    again (measured: 6.2 object requests for a message of 3 objects), each a request to the
    SuperNode's Runtime API and each wait a back-off that can overshoot the object's
    arrival. Here ``create_task`` only notes what to create (:data:`HELD`, which Flower only
    tests for None and hands back to ``finish_task``, stands for it), :meth:`release`
    creates it once the pull returned with the objects stored, and a ``finish_task`` of the
    held task (Flower's own failure path: the pull of the objects failed) finishes
    nothing, because nothing was created. Flower's code, its order and its checks are
    otherwise unchanged."""

    #: the task id Flower sees for a held task (Flower's ids are unsigned 64-bit)
    HELD = -1

    def __init__(self, state: Any):
        self._state = state
        self.held: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)

    def create_task(self, **asked: Any) -> int:
        self.held = asked
        return self.HELD

    def finish_task(self, task_id: int, *args: Any, **kwargs: Any) -> Any:
        if task_id == self.HELD:
            self.held = None  # never created: nothing to finish
            return True
        return self._state.finish_task(task_id, *args, **kwargs)

    def release(self, message_id: str, object_store: Any) -> bool:
        """Create the held task, if any; False where that fails (as Flower does when its own
        creation fails: the message and its objects deleted, nothing runs)."""
        if self.held is None:
            return True
        asked, self.held = self.held, None
        if self._state.create_task(**asked) is not None:
            return True
        LOG.error("secagg: no task for message %s; dropped", message_id)
        self._state.delete_messages(message_ids=[message_id])
        object_store.delete(message_id)
        return False


def guard_pull(pin: str, pull: Callable[..., int | None]) -> Callable[..., int | None]:
    """Flower's ``_pull_and_store_message`` (``pull``), refusing runs of another App: the
    FAB of a run the node has not accepted is checked as it arrives; a foreign one gets
    Flower's "invalid FAB" error reply and nothing is stored. A message's ClientApp task is
    created only once its objects are stored (:class:`TaskAfterObjects`), and the warm
    executor woken then."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode
    from flwr.supernode import start_client_internal as supernode

    def guarded(*, state: Any, object_store: Any, receive: Any, get_fab: Any, **rest: Any):
        received: list[Message] = []
        tasks = TaskAfterObjects(state)

        def receive_and_remember():
            asked = time.time()
            got = receive()
            if got is not None:
                received.append(got[0])
                if TRACE:
                    _trace("received", got[0].metadata.message_id, asked=asked)
            return got

        def get_pinned_fab(fab_hash: str, run_id: int):
            fab = get_fab(fab_hash, run_id)
            check_app(fab.content, pin)
            return fab

        try:
            run = pull(
                state=tasks,
                object_store=object_store,
                receive=receive_and_remember,
                get_fab=get_pinned_fab,
                **rest,
            )
            if run is not None and not tasks.release(
                received[-1].metadata.message_id, object_store
            ):
                return None
            if TRACE and received:
                _trace("stored", received[-1].metadata.message_id)
            if run is not None:
                wake_executor()
            return run
        except ForeignApp as exc:
            message = received[-1]
            why = f"this SuperNode runs only the secagg App it was provisioned with: {exc}"
            LOG.error("secagg: refused run %s: %s", message.metadata.run_id, why)
            reply = Message(Error(ErrorCode.INVALID_FAB, why), reply_to=message)
            # Flower sends a reply with the time its ClientApp took, kept for messages in
            # its state only: without both flwr 1.30 never sent the reply (its own
            # FAB-verification error reply was lost so) and 1.42 logs an error. The
            # message, as received, has no content; no task is made for it, so nothing
            # ever pulls it (a ClientApp pulls only its own task's run's messages).
            mid = message.metadata.message_id
            state.store_message(message)
            state.record_message_processing_start(mid)
            state.record_message_processing_end(mid)
            supernode._insert_message(reply, state, object_store)
            return message.metadata.run_id

    guarded.secagg_pin = pin  # type: ignore[attr-defined]
    return guarded


#: a diagnostic (``SECAGG_WARM_LOG``): the SuperNode logs when it got each message from the
#: SuperLink and when it sent the reply (wall-clock times, as the warm executor's timeline)
TRACE = bool(os.environ.get("SECAGG_WARM_LOG"))


def _trace(event: str, message_id: str, **times: float) -> None:
    line = {"event": event, "message": message_id, "at": time.time(), **times}
    LOG.info("secagg.flower.guard: trace %s", json.dumps(line))


def trace_pushes() -> None:
    """Log when the SuperNode starts waiting for a reply and when it sends it."""
    from flwr.supernode import start_client_internal as supernode

    push = supernode._push_messages

    def traced(*, send: Any, **rest: Any) -> None:
        waiting, sent = time.time(), []

        def timed_send(message: Any, *args: Any) -> Any:
            sent.append((message.metadata.reply_to_message_id, time.time()))
            return send(message, *args)

        push(send=timed_send, **rest)
        for message_id, start in sent:  # "at": the reply's objects pushed too
            _trace("sent", message_id, waiting=waiting, send=start)

    supernode._push_messages = traced  # type: ignore[assignment]


def install(pin: str) -> None:
    """Make this process's Flower SuperNode run the pinned App only."""
    from flwr.supernode import start_client_internal as supernode

    current = supernode._pull_and_store_message
    original = getattr(current, "secagg_original", current)
    guarded = guard_pull(pin, original)
    guarded.secagg_original = original  # type: ignore[attr-defined]
    supernode._pull_and_store_message = guarded


def node_config(node_dir: Path) -> str:
    """What the guarded SuperNode passes as ``--node-config``."""
    return f'node-dir="{Path(node_dir).resolve()}"'


#: where the SuperNode hands runs to its ClientApp processes (Flower's Runtime API, an HTTP
#: server at ``--host``/``--port``). In Flower's default (subprocess) isolation that API has
#: no authentication: anyone who reaches the port can claim a pending task and pull its
#: message and context. Flower 1.42 binds it to 127.0.0.1 by default (1.30 bound 0.0.0.0);
#: the guard says so explicitly, so that no change of Flower's default exposes it
RUNTIME_HOST = "127.0.0.1"


def supernode_argv(node_dir: Path, flower_args: list[str]) -> list[str]:
    """``flower-supernode``'s arguments for a node folder (ConfigError where they would
    replace what the guard sets). The Runtime API (``--host``; flwr 1.30's
    ``--clientappio-api-address``) listens on loopback unless the arguments say otherwise."""
    names = [arg.split("=", 1)[0] for arg in flower_args]
    for name in names:
        if name in ("--node-config", "--trusted-entities"):
            raise ConfigError(
                f"{name} is set by `secagg flower node` (the node's folder and the App it "
                "pins); leave it out"
            )
    local = [] if "--host" in names else ["--host", RUNTIME_HOST]
    return ["flower-supernode", *flower_args, *local, "--node-config", node_config(node_dir)]


def main(argv: list[str] | None = None) -> None:
    """``python -m secagg.flower.guard DIR [--cold] [flower-supernode options]``: Flower's
    SuperNode for the node folder DIR, running its pinned App only."""
    parser = argparse.ArgumentParser(
        prog="secagg flower node",
        description="Start a Flower SuperNode for a secagg node folder that runs only the "
        "App pinned in the folder; every other option is flower-supernode's.",
    )
    parser.add_argument("folder", type=Path, metavar="DIR")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="Flower's own executor: a fresh flwr-clientapp process per message and the "
        "SuperNode's 3 s poll (default: secagg's warm executor, secagg.flower.warm: a "
        "process per message forked from one that imported everything once, 0.2 s polls)",
    )
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    from secagg.logs import to_stderr

    to_stderr()  # the node's log (its stderr): the supervisor's and the SuperNode's lines
    if args.once:  # the supervised SuperNode itself
        try:
            run_supernode(args.folder, rest, warm=not args.cold)
        except SecaggError as exc:  # a folder or setting the operator must fix: say what
            LOG.error("secagg flower node: error: %s", exc)
            sys.exit(2)
        return
    from secagg.flower.supervise import supervise

    own = [str(args.folder), *(["--cold"] if args.cold else []), *rest, "--once"]
    sys.exit(supervise([sys.executable, "-m", "secagg.flower.guard", *own]))


#: the longest the warm SuperNode sleeps between polls of the SuperLink when it has no
#: message (flwr's start_client_internal: 3 s; every message waits for on average half of it)
NODE_POLL_SECONDS = 0.2
#: the longest it sleeps while it waits for its ClientApp's reply, or for the reply's objects
#: (flwr: 0.5 s; a look at its own in-memory state, no request to anyone)
REPLY_POLL_SECONDS = 0.02


def shorten_polls(seconds: float = NODE_POLL_SECONDS, reply: float = REPLY_POLL_SECONDS) -> None:
    """Cap the sleeps of this process's SuperNode loop: its idle poll of the SuperLink (a
    fixed 3 s in flwr) at ``seconds``, its waits for a reply (0.5 s) at ``reply``."""
    import time

    from flwr.supernode import start_client_internal as supernode

    class ShortSleeps:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(wanted: float) -> None:
            time.sleep(min(wanted, seconds if wanted >= 1 else reply))

    supernode.time = ShortSleeps()  # type: ignore[assignment]


#: the write end of the pipe that wakes the warm executor (secagg.flower.warm) when a task
#: is stored, so that it asks the Runtime API for it at once instead of polling it
_WAKE: int | None = None


def wake_executor() -> None:
    if _WAKE is None:
        return
    try:
        os.write(_WAKE, b"!")
    except (BlockingIOError, BrokenPipeError):  # full: it is awake; gone: Flower's to see
        pass


def start_warm_executor(argv: list[str], node_dir: Path) -> None:
    """Start ``secagg.flower.warm`` for the SuperNode ``argv`` describes (its Runtime API's
    host, port and TLS), tied to this process (it exits when this one does)."""
    import subprocess

    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT

    def value(flag: str, default: Any = None) -> Any:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else default

    host, port = value("--host", RUNTIME_HOST), value("--port", SUPERNODE_UVICORN_DEFAULT_PORT)
    host = f"[{host}]" if ":" in host else host
    ca = value("--ssl-ca-certfile")
    tls = ["--root-certificates", ca] if ca else ["--insecure"]
    global _WAKE
    wake, _WAKE = os.pipe()
    os.set_blocking(_WAKE, False)
    subprocess.Popen(  # noqa: S603 - our own module, our own arguments
        [sys.executable, "-m", "secagg.flower.warm", "--runtime-api-address", f"{host}:{port}"]
        + ["--parent-pid", str(os.getpid()), "--node-dir", str(Path(node_dir).resolve()), *tls]
        + ["--wake-fd", str(wake)],
        pass_fds=(wake,),
    )
    os.close(wake)


def run_supernode(node_dir: Path, flower_args: list[str], *, warm: bool = True) -> None:
    # a hospital's node reports nothing to Flower's telemetry (it would from every
    # message's process), unless its operator says otherwise
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from secagg.flower.node import NodeClient

    NodeClient(node_dir)  # the folder is a node's, its experiment one this node may run
    pin = pinned_app(node_dir)
    if warm and any(a.split("=", 1)[0] == "--isolation" for a in flower_args):
        raise ConfigError(
            "--isolation is set by the warm executor (process); pass --cold to use "
            "Flower's own executor with an isolation of your choice"
        )
    argv = supernode_argv(node_dir, [*flower_args, *(["--isolation", "process"] if warm else [])])
    install(pin)
    from secagg.flower.supervise import exit_when_refused, shorten_heartbeats

    shorten_heartbeats()  # a dead node is offline after 20 s, not 60 (supervise.py)
    exit_when_refused()  # a restart refused while the old session counts: try again
    if TRACE:
        trace_pushes()
    if warm:
        shorten_polls()
        shorten_object_pulls()
        start_warm_executor(argv, node_dir)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = argv
    flower_supernode()


if __name__ == "__main__":  # one copy of this module's classes: the package's
    from secagg.flower import guard

    guard.main()
