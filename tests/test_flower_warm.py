"""secagg's warm executor for a SuperNode (``secagg.flower.warm``): it starts each message's
process the way Flower's own executor does, only forked from a warm one."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest

pytest.importorskip("flwr")

from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec.executor import subprocess_executor  # noqa: E402
from flwr.supercore.superexec.executor.types import ExecutionSpec  # noqa: E402

from secagg.flower import warm  # noqa: E402


def spec(**changes) -> ExecutionSpec:
    fields = dict(
        task_type=TaskType.CLIENT_APP,
        runtime_api_address="127.0.0.1:9094",
        token="t0ken",
        insecure=False,
        root_certificates_path="/certs/ca.crt",
        runtime_dependency_install=False,
        parent_pid=4242,
        suppress_output=False,
        task_id=7,
    )
    return ExecutionSpec(**{**fields, **changes})


@pytest.mark.parametrize(
    "changes",
    [{}, {"insecure": True}, {"parent_pid": None}, {"runtime_dependency_install": True}],
    ids=["tls", "insecure", "no-parent", "dependencies"],
)
def test_a_message_process_gets_the_arguments_flowers_own_executor_gives(monkeypatch, changes):
    """Flower's subprocess executor is the reference: a release of flwr that changes what it
    passes to flwr-clientapp fails here rather than on a node."""
    started: list[list[str]] = []
    monkeypatch.setattr(
        subprocess_executor.subprocess, "Popen", lambda args, **_: started.append(args)
    )
    subprocess_executor.SubprocessExecutor().launch(spec(**changes))
    (flower_args,) = started
    assert flower_args[0] == "flwr-clientapp"
    assert warm.clientapp_args(spec(**changes)) == flower_args[1:]


def test_the_zygote_forks_one_process_per_task_with_its_arguments(tmp_path, monkeypatch):
    """Through the real pipe and fork: each request becomes a child that runs the ClientApp
    entry point with that request's arguments (recorded here instead of run)."""
    out = tmp_path / "ran"
    out.mkdir()

    def record(args: list[str]) -> int:
        (out / f"{os.getpid()}.json").write_text(json.dumps(args))
        return 0

    monkeypatch.setattr(warm, "run_clientapp", record)
    pipe = warm.start_zygote()
    executor = warm.fork_executor(pipe)
    try:
        assert executor.launch(spec(token="first")).status == "accepted"
        assert executor.launch(spec(token="second", insecure=True)).status == "accepted"
        deadline = time.monotonic() + 30
        while len(list(out.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        executor.close()
        executor.close()  # Flower closes from its exit handler and its loop: both are fine
    runs = sorted(json.loads(p.read_text()) for p in out.iterdir())
    assert len({p.name for p in out.iterdir()}) == 2  # two processes
    assert runs == sorted(
        [
            warm.clientapp_args(spec(token="first")),
            warm.clientapp_args(spec(token="second", insecure=True)),
        ]
    )


def test_the_warm_executor_runs_client_apps_only(monkeypatch):
    read, write = os.pipe()
    try:
        result = warm.fork_executor(write).launch(spec(task_type=TaskType.SERVER_APP))
        assert result.status == "failed" and "ClientApps" in (result.message or "")
        os.set_blocking(read, False)
        with pytest.raises(BlockingIOError):  # nothing was sent to the zygote
            os.read(read, 4)
    finally:
        os.close(read)
        os.close(write)


def test_the_pipe_frames_requests_by_length():
    read, write = os.pipe()
    body = json.dumps(["--token", "x" * 70000]).encode()  # beyond one pipe buffer read
    if os.fork() == 0:
        os.write(write, struct.pack(">I", len(body)) + body)
        os._exit(0)
    os.close(write)
    header = warm._read_exact(read, 4)
    assert header is not None
    assert warm._read_exact(read, struct.unpack(">I", header)[0]) == body
    assert warm._read_exact(read, 1) is None  # the writer closed: the zygote would exit
    os.close(read)


@pytest.mark.slow
def test_the_zygote_has_what_a_training_message_imports_before_it_forks():
    """A first optimizer step imports torch's compiler stack (torch._dynamo): done in every
    message's own process it cost 4.5 s per training message. The zygote takes that step
    itself (in a process of its own here: it sets torch's threads)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from secagg.flower import warm\n"
        "warm.warm_imports()\n"
        "print(all(m in sys.modules for m in warm.WARM_MODULES), 'torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
