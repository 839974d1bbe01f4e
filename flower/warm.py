"""A warm executor for a secagg SuperNode: Flower's process per message, without the start.

In its default isolation Flower's SuperNode starts ``flower-superexec``, which polls the
node's Runtime API every second and starts a fresh ``flwr-clientapp`` process for every
message: Python, flwr, torch and secagg are imported each time (seconds per message on a
loaded machine, and a cold start can outlast Flower's window between claiming a message
and its first heartbeat, which loses the message). Here the SuperNode runs with
``--isolation process`` and this module is its executor:

- a *zygote*, forked once Flower's ClientApp runner, torch and secagg's node code are
  imported and before any thread or connection exists, forks one child per task. The child
  runs Flower's own ``flwr-clientapp`` entry point with the arguments Flower's subprocess
  executor would give it (the task's token, the Runtime API, the parent pid), so each
  message still runs in a process of its own, and ``context.state`` lives in the SuperNode
  as before;
- Flower's own SuperExec loop (``run_superexec``) drives it, with this executor in place of
  Flower's subprocess executor. Started by ``secagg.flower.guard`` it is woken through a
  pipe (``--wake-fd``) as the SuperNode stores a task, and polls the Runtime API every
  0.5 s only as a fallback (alone, every 50 ms): six nodes' 50 ms polls took 0.3 of a
  2-core machine's cores while idle.

What a message's process would otherwise do itself, the zygote does once: import what
``flwr-clientapp`` imports only as it runs (httpx's transport), build the node's CKKS
parameters (secagg caches them per process), and freeze its heap out of the garbage
collector's reach (``gc.freeze``: a child's first full collection walked half a million
inherited objects and copied their pages). ``SECAGG_WARM_LOG=1`` logs each message
process's timeline (``trace_clientapp``: Flower's steps, secagg's node work, its CPU
seconds), as the guard and the ServerApp's transport log theirs;
``SECAGG_FLOWER_PROFILE=DIR`` writes a cProfile of the ServerApp, the executor and each
message's process into DIR (``profile_process``).

Only the start changes: the message, the token, the App and its checks are Flower's.
``secagg.flower.guard`` starts this next to the SuperNode (the default of ``secagg flower
node``; ``--cold`` keeps Flower's executor). With ``--node-dir`` the zygote also applies the
node's own settings and loads its task's data once, so that no message loads it again.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import select
import signal
import struct
import sys
import time
import traceback
from typing import Any

from secagg.flower.process import profile_process, shorten_object_pulls

LOG = logging.getLogger(__name__)

#: how often Flower's SuperExec loop asks the SuperNode for a task (flwr's default: 1 s)
POLL_SECONDS = "0.05"
#: ... when the SuperNode wakes it as it stores a task (``--wake-fd``): a fallback only.
#: Six nodes' 50 ms polls of their Runtime APIs cost 0.3 of this machine's 2 cores while
#: idle (measured), a share every message's process then lacks
WOKEN_POLL_SECONDS = "0.5"


#: what a message's process imports on the way to its answer (measured: 2.7 s of imports
#: before the node, 0.9 s more when it first builds a client: opacus, tenseal, SEAL)
WARM_MODULES = (
    "torch",
    "flwr.supernode.cli.flwr_clientapp",
    "secagg.flower.apps",  # the App: node, messages, transport
    "secagg.runspec.provisioning",  # ClientFactory, the task registry
    "secagg.clients.runtime",
    "secagg.clients.privacy",  # opacus (and with it torch.distributed, sympy, scipy)
    "secagg.secret.ckks_client",  # tenseal, SEAL, the native extension
    "secagg.secret.threshold_client",
    "secagg.secret.sealing",
    # what Flower's flwr-clientapp imports only as it runs: the HTTP client of its Runtime API
    # (httpx's transport), the FAB's zip names' codec; and what a node's reply imports
    "httpcore",
    "h11",
    "encodings.cp437",
    "cryptography.hazmat.backends.openssl.backend",
)

#: imported in the zygote where present (secagg's native CKKS extension is optional)
WARM_OPTIONAL_MODULES = ("secagg.ckks._seal_native", "secagg.ckks._seal_public")


def warm_imports() -> None:
    """Import, once in the zygote, what every message's process needs, and take one step
    of each optimizer a task uses on a throwaway model: torch imports its compiler stack
    (torch._dynamo, triton) on a first optimizer step, which cost every training message
    4.5 s (measured, LARC on 2 cores) when each process did it itself."""
    for name in WARM_MODULES:
        importlib.import_module(name)
    for name in WARM_OPTIONAL_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import torch

    torch.set_num_threads(1)  # no intra-op pool before the fork; each message sets its own
    model = torch.nn.Linear(2, 1)
    for optimizer in (torch.optim.SGD, torch.optim.Adam):
        step = optimizer(model.parameters(), lr=0.1)
        step.zero_grad()
        model(torch.zeros(1, 2)).sum().backward()
        step.step()


def warm_backend(config: Any) -> None:
    """Build, once in the zygote, what the node's backend builds once per process and
    shares (``BackendSpec.warm``; ckks: SEAL's context for the node's preset and its
    fingerprint, the native extension's parameters and seed expander). Every message's
    process built them anew (0.08 s per ckks message measured, most of a node's own work
    per message). Public parameters only: no key exists yet."""
    from secagg.backends import backend_spec

    spec = backend_spec(config.backend)
    if spec.warm is not None:
        spec.warm(config.resolved_backend_options())


# ---- the zygote ---------------------------------------------------------------------------
def _read_exact(fd: int, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def zygote_loop(requests: int) -> None:
    """Fork a child per request (a JSON list of ``flwr-clientapp`` arguments) until the
    pipe closes; children are reaped by the kernel (SIGCHLD ignored)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        header = _read_exact(requests, 4)
        if header is None:
            return
        body = _read_exact(requests, struct.unpack(">I", header)[0])
        if body is None:
            return
        args = json.loads(body)
        asked = time.time()
        if os.fork() == 0:
            os.close(requests)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if os.environ.get("SECAGG_WARM_LOG"):
                trace_clientapp(asked)
            profiled = profile_process("clientapp")
            code = run_clientapp(args)
            if profiled is not None:
                profiled()
            os._exit(code)


def run_clientapp(args: list[str]) -> int:
    """Flower's ``flwr-clientapp`` with ``args``, in this (forked) process; its exit code."""
    from flwr.supernode.cli import flwr_clientapp

    sys.argv = ["flwr-clientapp", *args]
    started = time.perf_counter()
    try:
        flwr_clientapp()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a child reports and exits, it never returns
        traceback.print_exc()
        return 1
    finally:
        if os.environ.get("SECAGG_WARM_LOG"):  # a diagnostic: each message process's time
            LOG.info(
                "secagg.flower.warm: message process %s took %.3f s",
                os.getpid(),
                time.perf_counter() - started,
            )
            if _TIMELINE is not None:
                _TIMELINE["end"] = time.time()
                _TIMELINE["cpu"] = sum(os.times()[:2])  # this process's own CPU seconds
                _TIMELINE["modules"] = sorted(set(sys.modules) - _TIMELINE["modules"])
                LOG.info("secagg.flower.warm: timeline %s", json.dumps(_TIMELINE))
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


# ---- a diagnostic: where a message's process spends its time -------------------------------
def trace_clientapp(asked: float) -> None:
    """Log (stderr, one JSON line at exit) when this message's process reached each step of
    Flower's ``run_clientapp``: wall-clock times, so that the SuperNode's and the ServerApp's
    own lines (``SECAGG_WARM_LOG``) line up with them. ``asked``: when the zygote read the
    request. Only wraps Flower's functions; what they do is unchanged."""
    from flwr.supernode.runtime import run_clientapp as flower

    marks: dict[str, Any] = {"pid": os.getpid(), "asked": asked, "forked": time.time()}
    marks["gc"] = {"collections": [0, 0, 0], "seconds": 0.0}
    marks["modules"] = set(sys.modules)
    collecting = [0.0]

    def gc_time(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[0] = time.perf_counter()
        else:
            marks["gc"]["collections"][info["generation"]] += 1
            marks["gc"]["seconds"] += time.perf_counter() - collecting[0]

    gc.callbacks.append(gc_time)

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks[f"{name}<"] = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                marks[f"{name}>"] = time.time()

        return wrapper

    pull = flower.pull_task_input

    def pull_and_name(*args: Any, **kwargs: Any) -> Any:
        got = timed("pull", pull)(*args, **kwargs)
        marks["message"] = got[0].metadata.message_id
        marks["run"] = got[0].metadata.run_id
        return got

    loader = flower.get_load_client_app_fn

    def timed_loader(*args: Any, **kwargs: Any) -> Any:
        load = loader(*args, **kwargs)

        def load_and_time_app(*a: Any, **k: Any) -> Any:
            app = timed("load", load)(*a, **k)
            call = app.__call__
            app.__class__ = type("TimedClientApp", (type(app),), {})
            app.__class__.__call__ = lambda self, **kw: timed("app", call)(**kw)
            return app

        return load_and_time_app

    flower.pull_task_input = pull_and_name
    # secagg's own work on the message: the node's client built, restored, answering, its
    # state exported and written (``node.<step>``)
    from secagg.flower import node

    client_of = node.NodeClient._client

    def timed_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = timed("node.client", client_of)(self, *args, **kwargs)
        for step in ("restore_state", "handle", "export_state"):
            setattr(client, step, timed(f"node.{step}", getattr(client, step)))
        return client

    node.NodeClient.__init__ = timed("node.init", node.NodeClient.__init__)  # type: ignore[method-assign]
    node.NodeClient._client = timed_client  # type: ignore[method-assign]
    node.write_private_bytes = timed("node.write", node.write_private_bytes)
    flower.install_from_fab = timed("install", flower.install_from_fab)
    flower.get_load_client_app_fn = timed_loader
    flower.push_message = timed("push", flower.push_message)
    flower.push_task_output = timed("output", flower.push_task_output)
    client = flower.RuntimeHttpClient
    client.from_server_address = staticmethod(timed("client", client.from_server_address))  # type: ignore[method-assign]
    flower.HeartbeatSender.start = timed("heartbeat", flower.HeartbeatSender.start)  # type: ignore[method-assign]
    flower.flwr_exit = timed("exit", flower.flwr_exit)
    global _TIMELINE
    _TIMELINE = marks


#: this message process's timeline (trace_clientapp), logged as it ends
_TIMELINE: dict[str, Any] | None = None


def freeze_heap() -> None:
    """Move everything the zygote holds out of reach of the garbage collector: a message's
    process would otherwise walk half a million objects (torch, tenseal, flwr) in its first
    full collection, and copy every page it touches from the zygote (0.35 s measured)."""
    gc.collect()
    gc.freeze()


def woken_sleep(wake: int) -> Any:
    """``time`` for Flower's SuperExec loop, whose ``sleep`` ends early when the SuperNode
    writes to ``wake`` (it stored a task)."""

    class WokenSleep:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            if select.select([wake], [], [], seconds)[0]:
                try:
                    os.read(wake, 4096)
                except BlockingIOError:
                    pass

    return WokenSleep()


def start_zygote(close: tuple[int, ...] = ()) -> int:
    """Fork the zygote (closing ``close`` in it); returns the write end of its request pipe."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(write)
        for fd in close:
            os.close(fd)
        try:
            zygote_loop(read)
        finally:
            os._exit(0)
    os.close(read)
    return write


# ---- the executor -------------------------------------------------------------------------
def clientapp_args(spec: Any) -> list[str]:
    """The arguments Flower's subprocess executor starts ``flwr-clientapp`` with
    (``flwr.supercore.superexec.executor.subprocess_executor``), for ``spec``."""
    args = ["--runtime-api-address", spec.runtime_api_address, "--token", spec.token]
    if spec.insecure:
        args.append("--insecure")
    elif spec.root_certificates_path is not None:
        args += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        args += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        args.append("--allow-runtime-dependency-installation")
    return args


def fork_executor(zygote: int) -> Any:
    """Flower's subprocess executor, launching through the zygote instead of ``Popen``."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import LaunchResult
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

    class ForkExecutor(SubprocessExecutor):
        def launch(self, spec: Any) -> Any:
            if spec.task_type != TaskType.CLIENT_APP:  # nothing else runs on a secagg node
                return LaunchResult.failed(f"a secagg node runs ClientApps, not {spec.task_type}")
            body = json.dumps(clientapp_args(spec)).encode()
            os.write(zygote, struct.pack(">I", len(body)) + body)
            return LaunchResult.accepted()

        def close(self) -> None:  # Flower calls it from its exit handler and its loop
            try:
                os.close(zygote)  # the zygote sees the pipe close and exits
            except OSError:
                pass

    return ForkExecutor()


def die_with_parent(parent_pid: int) -> None:
    """End this process (SIGTERM) as soon as the SuperNode that started it dies, from now on,
    warm-up included. Flower's own watch of the parent starts only with its loop, after the
    imports and the node's data (tens of seconds on a loaded machine): a SuperNode the
    SuperLink refused, which ``secagg flower node`` starts again every 3 s, left an executor
    warming up per try beside the live one's (seen in the fault test: the restarted node's
    executor ready 55 s after its start, later than the run's last round). Linux's
    ``PR_SET_PDEATHSIG``; elsewhere only Flower's watch. Not inherited by the zygote or the
    message processes (the kernel clears it at fork)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # it died before the line above
        sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    """``python -m secagg.flower.warm --runtime-api-address HOST:PORT --parent-pid PID
    [--insecure | --root-certificates FILE]``: the warm executor of one SuperNode."""
    parser = argparse.ArgumentParser(prog="python -m secagg.flower.warm")
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--node-dir", help="the node's folder: its settings and data load now")
    parser.add_argument(
        "--wake-fd", type=int, help="a pipe the SuperNode writes to when it stores a task"
    )
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true")
    tls.add_argument("--root-certificates")
    args = parser.parse_args(argv)
    from secagg.logs import to_stderr

    to_stderr()  # the node's log: this process's and its message processes' lines on stderr
    die_with_parent(args.parent_pid)
    warm_imports()
    if args.node_dir:  # the node's own settings applied, its task's data loaded, once
        from secagg.flower.node import NodeClient, preload_task_data

        config = NodeClient(args.node_dir).config
        preload_task_data(config.task)
        warm_backend(config)
    shorten_object_pulls()  # a message's process asks its SuperNode for the message's objects
    freeze_heap()
    wake = () if args.wake_fd is None else (args.wake_fd,)
    zygote = start_zygote(wake)  # before Flower's loop makes threads and connections
    loop = importlib.import_module("flwr.supercore.superexec.run_superexec")
    if args.wake_fd is None:
        os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", POLL_SECONDS)
    else:
        os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", WOKEN_POLL_SECONDS)
        loop.time = woken_sleep(args.wake_fd)  # type: ignore[attr-defined]
    loop.get_executor = lambda *_, **__: fork_executor(zygote)  # type: ignore[attr-defined]
    profile_process("executor")  # after the fork: the zygote is not profiled
    loop.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=args.parent_pid,
    )


if __name__ == "__main__":
    main()
