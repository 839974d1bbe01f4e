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
  Flower's subprocess executor and a 50 ms poll of the Runtime API.

Only the start changes: the message, the token, the App and its checks are Flower's.
``secagg.flower.guard`` starts this next to the SuperNode (the default of ``secagg flower
node``; ``--cold`` keeps Flower's executor). With ``--node-dir`` the zygote also applies the
node's own settings and loads its task's data once, so that no message loads it again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import struct
import sys
import time
import traceback
from typing import Any

#: how often Flower's SuperExec loop asks the SuperNode for a task (flwr's default: 1 s)
POLL_SECONDS = "0.05"


#: what a message's process imports on the way to its answer (measured: 2.7 s of imports
#: before the node, 0.9 s more when it first builds a client: opacus, tenseal, SEAL)
WARM_MODULES = (
    "torch",
    "flwr.supernode.cli.flwr_clientapp",
    "secagg.flower.apps",  # the App: node, messages, transport
    "secagg.simulation.experiment",  # ClientFactory, the task registry
    "secagg.clients.runtime",
    "secagg.clients.privacy",  # opacus (and with it torch.distributed, sympy, scipy)
    "secagg.backends.ckks_client",  # tenseal, SEAL, the native extension
    "secagg.backends.threshold_client",
    "secagg.sealing",
)


def warm_imports() -> None:
    """Import, once in the zygote, what every message's process needs, and take one step
    of each optimizer a task uses on a throwaway model: torch imports its compiler stack
    (torch._dynamo, triton) on a first optimizer step, which cost every training message
    4.5 s (measured, LARC on 2 cores) when each process did it itself."""
    for name in WARM_MODULES:
        importlib.import_module(name)
    import torch

    torch.set_num_threads(1)  # no intra-op pool before the fork; each message sets its own
    model = torch.nn.Linear(2, 1)
    for optimizer in (torch.optim.SGD, torch.optim.Adam):
        step = optimizer(model.parameters(), lr=0.1)
        step.zero_grad()
        model(torch.zeros(1, 2)).sum().backward()
        step.step()


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
        if os.fork() == 0:
            os.close(requests)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(run_clientapp(args))


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
            print(
                f"secagg.flower.warm: message process {os.getpid()} took "
                f"{time.perf_counter() - started:.3f} s",
                file=sys.stderr,
            )
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def start_zygote() -> int:
    """Fork the zygote; returns the write end of its request pipe."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(write)
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


def main(argv: list[str] | None = None) -> None:
    """``python -m secagg.flower.warm --runtime-api-address HOST:PORT --parent-pid PID
    [--insecure | --root-certificates FILE]``: the warm executor of one SuperNode."""
    parser = argparse.ArgumentParser(prog="python -m secagg.flower.warm")
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--node-dir", help="the node's folder: its settings and data load now")
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true")
    tls.add_argument("--root-certificates")
    args = parser.parse_args(argv)
    warm_imports()
    if args.node_dir:  # the node's own settings applied, its task's data loaded, once
        from secagg.flower.node import NodeClient, preload_task_data

        preload_task_data(NodeClient(args.node_dir).config.task)
    zygote = start_zygote()  # before Flower's loop makes threads and connections
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", POLL_SECONDS)
    loop = importlib.import_module("flwr.supercore.superexec.run_superexec")
    loop.get_executor = lambda *_, **__: fork_executor(zygote)  # type: ignore[attr-defined]
    loop.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=args.parent_pid,
    )


if __name__ == "__main__":
    main()
