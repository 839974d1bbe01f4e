"""secagg's warm executor for a SuperNode (``secagg.flower.warm``): it starts each message's
process the way Flower's own executor does, only forked from a warm one."""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import pytest

pytest.importorskip("flwr")

from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec.executor import subprocess_executor  # noqa: E402
from flwr.supercore.superexec.executor.types import ExecutionSpec  # noqa: E402

from secagg.flower import process, warm  # noqa: E402


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


# ---- what shortens a message's way (secagg.flower.warm, .guard) ----------------------------
def test_a_woken_executor_stops_sleeping_when_the_supernode_stores_a_task():
    """The SuperExec loop's sleep ends as soon as the SuperNode writes to the wake pipe (it
    would sleep a minute otherwise), and the pipe is drained for the next wait."""
    read, write = os.pipe()
    try:
        os.set_blocking(read, False)
        os.write(write, b"!!")  # two tasks stored while the loop was asking
        warm.woken_sleep(read).sleep(60)
        with pytest.raises(BlockingIOError):
            os.read(read, 1)
        assert warm.woken_sleep(read).monotonic() > 0  # the rest is the time module's
    finally:
        os.close(read)
        os.close(write)


def test_the_guard_wakes_the_executor_and_never_blocks_on_it(monkeypatch):
    from secagg.flower import guard

    read, write = os.pipe()
    try:
        os.set_blocking(write, False)
        monkeypatch.setattr(guard, "_WAKE", write)
        guard.wake_executor()
        assert os.read(read, 16) == b"!"
        for _ in range(100_000):  # a pipe that is full: the executor is awake anyway
            guard.wake_executor()
    finally:
        os.close(read)
        os.close(write)
    monkeypatch.setattr(guard, "_WAKE", None)
    guard.wake_executor()  # no executor (--cold): nothing to wake


def test_the_supernode_polls_the_superlink_and_its_own_state_each_at_its_own_pace(monkeypatch):
    import time as real_time

    from flwr.supernode import start_client_internal as supernode

    from secagg.flower import guard

    slept: list[float] = []
    monkeypatch.setattr(supernode, "time", supernode.time)  # restored after the test
    monkeypatch.setattr(real_time, "sleep", slept.append)
    guard.shorten_polls(seconds=0.2, reply=0.02)
    supernode.time.sleep(3)  # flwr's idle poll of the SuperLink
    supernode.time.sleep(0.5)  # flwr's wait for its ClientApp's reply
    supernode.time.sleep(0.01)
    assert slept == [0.2, 0.02, 0.01]


def test_flower_asks_again_for_a_missing_object_sooner_its_limits_unchanged(monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils as objects

    pulls = (objects.pull_objects, objects.pull_and_inflate_object_from_tree)
    before = [dict(p.__kwdefaults__) for p in pulls]
    for p in pulls:  # restored after the test
        monkeypatch.setattr(p, "__kwdefaults__", dict(p.__kwdefaults__))
    process.shorten_object_pulls(0.05)
    for p, old in zip(pulls, before, strict=True):
        assert p.__kwdefaults__ == {**old, "initial_backoff": 0.05}
    process.shorten_object_pulls(5)  # never longer than Flower's own
    assert all(p.__kwdefaults__["initial_backoff"] == 0.05 for p in pulls)


def test_the_zygote_builds_the_nodes_ckks_parameters_once_for_its_children():
    from types import SimpleNamespace

    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import params_fingerprint

    warm.warm_backend(SimpleNamespace(backend="plain"))  # nothing to build
    params_fingerprint.cache_clear()
    config = SimpleNamespace(backend="ckks", resolved_backend_options=lambda: {"preset": "lean"})
    warm.warm_backend(config)
    assert params_fingerprint.cache_info().currsize == 1
    params_fingerprint(get_preset("lean"))
    assert params_fingerprint.cache_info().hits == 1  # a message's process finds it built


def test_the_zygote_freezes_its_heap_so_that_children_do_not_collect_it():
    import gc

    try:
        warm.freeze_heap()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_zygote_closes_what_it_is_told_to(tmp_path, monkeypatch):
    """The zygote closes the wake pipe (only the executor's loop reads it): no message's
    process holds it."""
    out = tmp_path / "fds"

    def record(args: list[str]) -> int:
        held = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                held.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # the listing's own descriptor, closed by now
                pass
        # written aside and renamed: the test polls for the file, and must not read it
        # between its creation and its content
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(held))
        partial.rename(out)
        return 0

    monkeypatch.setattr(warm, "run_clientapp", record)
    read, write = os.pipe()
    wake = f"pipe:[{os.fstat(read).st_ino}]"
    pipe = warm.start_zygote((read, write))
    executor = warm.fork_executor(pipe)
    try:
        executor.launch(spec())
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        executor.close()
        os.close(read)
        os.close(write)
    assert wake not in json.loads(out.read_text())


# ---- large messages: how an envelope travels, what its framing costs to count -------------
@pytest.fixture
def task_identity(monkeypatch):
    """Flower's Message needs the run and node of the process it is made in."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 2), ("_task_id", 3)):
        monkeypatch.setattr(TaskIdentity, name, value)


def flower_framing(message) -> int:
    """Flower's own count (what ``framing_bytes`` counted before: it serialised everything)."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )

    from secagg.flower import messages

    header = message_to_proto(remove_content_from_message(message)).ByteSize()
    tree = get_object_tree(message).ByteSize()
    objects = sum(len(o.deflate()) for o in get_all_nested_objects(message).values())
    envelope = messages._envelope(message)
    return header + tree + objects - (len(envelope) if envelope is not None else 0)


def sent_and_received(message):
    """``message`` as the other end inflates it from the objects Flower sends."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    objects = {i: o.deflate() for i, o in get_all_nested_objects(message).items()}
    return inflate_object_from_contents(message.object_id, objects)


CHUNK = 5 * 1024 * 1024  # Flower's array chunk


@pytest.mark.parametrize(
    "size",
    [0, 127, 128, 16384, (1 << 20) - 1, 1 << 20, CHUNK, CHUNK + 1, 2 * CHUNK + 1],
)
def test_an_envelope_of_any_size_arrives_whole_and_its_framing_is_flowers_count(
    task_identity, size
):
    """Small envelopes travel as bytes in the ``secagg`` record, large ones (from 1 MiB) as
    an Array Flower slices into chunks; either way the other end reads the same bytes, and
    ``framing_bytes``, which never serialises the envelope, equals Flower's own count
    (varint and chunk boundaries included)."""
    from secagg.flower import messages

    envelope = os.urandom(size)
    ask = messages.request(7, envelope, {"seed": 3, "stage": ""}, ttl=60)
    answer = messages.reply(ask, envelope)
    assert (messages.ENVELOPE_RECORD in ask.content) == (size >= messages.LARGE)
    assert messages.read_request(sent_and_received(ask)) == (envelope, {"seed": 3, "stage": ""})
    assert messages.read_reply(sent_and_received(answer)) == envelope
    for message in (ask, answer):
        assert messages.framing_bytes(message) == flower_framing(message)
    hello = messages.request(7, None, {"hello": "n" * 32}, ttl=60)
    assert messages.framing_bytes(hello) == flower_framing(hello)


def test_an_envelope_array_that_is_not_its_bytes_as_they_are_is_malformed(task_identity):
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    from secagg.errors import MalformedMessage
    from secagg.flower import messages

    def carrying(array, **fields) -> Message:
        records = {
            messages.RECORD: ConfigRecord({"run": "{}", **fields}),
            messages.ENVELOPE_RECORD: ArrayRecord({messages.ENVELOPE: array}),
        }
        return Message(RecordDict(records), 7, messages.MESSAGE_TYPE, ttl=60)

    data = bytes(range(16))
    assert messages.read_request(carrying(Array("uint8", (16,), "bytes", data)))[0] == data
    for odd in (
        carrying(Array("float32", (4,), "bytes", data)),
        carrying(Array("uint8", (16,), "numpy.ndarray", data)),
        carrying(Array("uint8", (15,), "bytes", data)),
        carrying(Array("uint8", (16,), "bytes", data), envelope=data),  # twice
    ):
        with pytest.raises(MalformedMessage):
            messages.read_request(odd)


def test_a_process_is_profiled_only_where_asked(tmp_path, monkeypatch):
    """``SECAGG_FLOWER_PROFILE`` (a diagnostic, like ``SECAGG_WARM_LOG``) names a folder that
    each profiled process writes its cProfile statistics into."""
    import pstats

    monkeypatch.delenv("SECAGG_FLOWER_PROFILE", raising=False)
    assert process.profile_process("serverapp") is None
    monkeypatch.setenv("SECAGG_FLOWER_PROFILE", str(tmp_path))
    done = process.profile_process("serverapp")
    sum(range(1000))
    done()
    (written,) = tmp_path.iterdir()
    assert written.name == f"serverapp-{os.getpid()}.prof"
    assert pstats.Stats(str(written)).total_calls > 0


def test_the_executor_ends_with_its_supernode_even_while_it_warms_up(tmp_path):
    """An executor whose SuperNode died (a start the SuperLink refused) does not go on
    importing torch and loading data beside the next try's executor: it ends with its parent
    at once, wherever it is (``die_with_parent``), where Flower's own watch of the parent
    starts only with its loop."""
    import signal
    import subprocess
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    child = (
        "import os, sys, time; from secagg.flower.warm import die_with_parent; "
        "die_with_parent(os.getppid()); print(os.getpid(), flush=True); time.sleep(600)"
    )
    parent = (  # the SuperNode: starts the executor, then is killed
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
        "stdout=subprocess.PIPE, text=True); print(p.stdout.readline().strip(), flush=True); "
        "import time; time.sleep(600)"
    )
    supernode = subprocess.Popen(
        [sys.executable, "-c", parent, child], stdout=subprocess.PIPE, text=True
    )
    executor = int(supernode.stdout.readline())

    def alive(pid: int) -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        return "\nState:\tZ" not in status

    try:
        assert alive(executor)
        supernode.send_signal(signal.SIGKILL)
        supernode.wait()
        for _ in range(600):  # the kernel signals it at once; wait however loaded the machine is
            if not alive(executor):
                break
            time.sleep(0.1)
        assert not alive(executor)
    finally:  # nothing of the test outlives it
        for pid in (executor, supernode.pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
