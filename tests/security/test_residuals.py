"""Issue 46, item 4: the residual hardening, each closed here.

- SEAL's scratch folder in /dev/shm: a process killed with SIGKILL cannot remove its folder
  (one in 20 such folders held a loadable secret key). The next process to make one sweeps
  the folders whose process is gone, never a live one's; secret keys go through an anonymous
  memory file (memfd), never a named one.
- State files: written through a fresh 0600 temporary (O_CREAT|O_EXCL, a unique name),
  fsynced and renamed, in folders made or tightened to 0700, whatever was there before.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from secagg.ckks import public
from secagg.ckks.presets import get_preset
from secagg.flower.keystore import write_private_bytes
from secagg.secret.ckks_keys import SecretKeyHolder

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---- the scratch folder ------------------------------------------------------------------
HOLDER = """
import os, time
from secagg.ckks import public
path, fd = public._create_scratch()
os.write(fd, b"what SEAL wrote there: a secret key, say")
print(public._SCRATCH, flush=True)
time.sleep(120)
"""


def python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, **kw
    )


def holder() -> tuple[subprocess.Popen, str]:
    """A process that holds a scratch file in its folder: (process, folder)."""
    proc = python(HOLDER)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_killed_processs_scratch_folder_is_swept_by_the_next_and_a_live_ones_kept():
    killed, dead_folder = holder()
    live, live_folder = holder()
    try:
        killed.kill()  # SIGKILL: no atexit, no handler
        killed.wait()
        assert os.listdir(dead_folder), "SIGKILL left the folder and its file"
        fresh = python("from secagg.ckks import public; print(public._SCRATCH)")
        out, _ = fresh.communicate(timeout=120)
        assert fresh.returncode == 0
        assert not os.path.exists(dead_folder)  # swept when the new folder was made
        assert os.listdir(live_folder)  # a live process's folder, file and all, is kept
        assert not os.path.exists(out.strip())  # the new one went with its process
    finally:
        live.kill()
        live.wait()
        shutil.rmtree(dead_folder, ignore_errors=True)
        shutil.rmtree(live_folder, ignore_errors=True)


def test_the_sweep_judges_a_folder_by_the_process_that_made_it(tmp_path):
    ns, me = public._pid_namespace(), os.getpid()
    started = public._start_time(me) or 0
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    folders = {
        "dead": (f"secagg-{ns}-{gone.pid}-1-abc", True),
        "pid reused by a later process": (f"secagg-{ns}-{me}-{started + 1}-abc", started > 0),
        "live": (f"secagg-{ns}-{me}-{started}-abc", False),
        "another pid namespace": (f"secagg-{ns + 1}-{gone.pid}-1-abc", False),
        "named as before (no pid)": ("secagg-k2j4_x9a", False),
        "a fork of a dead maker still writes": (f"secagg-{ns}-{gone.pid}-1-abd", False),
    }
    for name, _ in folders.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{gone.pid}-1-0").write_bytes(b"x")
    (tmp_path / folders["a fork of a dead maker still writes"][0] / f"{me}-1-0").write_bytes(b"y")
    (tmp_path / f"secagg-{ns}-{gone.pid}-1-abe").write_bytes(b"a file, not a folder")
    if os.getuid() == 0:  # another user's folder: root can make one to check
        other = tmp_path / f"secagg-{ns}-{gone.pid}-1-abf"
        other.mkdir()
        os.chown(other, 4242, 4242)
    removed = public._sweep_stale(str(tmp_path))
    for what, (name, swept) in folders.items():
        assert (tmp_path / name).exists() != swept, what
    assert sorted(removed) == sorted(str(tmp_path / n) for n, s in folders.values() if s)
    assert (tmp_path / f"secagg-{ns}-{gone.pid}-1-abe").is_file()
    if os.getuid() == 0:
        assert other.exists()


def test_a_forked_child_whose_folder_was_swept_makes_its_own(monkeypatch):
    """A child of a killed maker keeps working after the sweep took the folder."""
    gone_folder = public._SCRATCH + "-gone"
    monkeypatch.setattr(public, "_SCRATCH", gone_folder)
    monkeypatch.setattr(public, "_OWNER", -1)
    path, fd = public._create_scratch()
    try:
        made = public._SCRATCH
        assert made != gone_folder and path.startswith(made + "/") and public._OWNER == os.getpid()
        assert mode(made) == 0o700
    finally:
        os.close(fd)
        public._remove_scratch(path)
        shutil.rmtree(public._SCRATCH, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd_create here")
def test_secret_keys_pass_through_no_named_file(monkeypatch):
    preset = get_preset("compact")
    keys = SecretKeyHolder(preset)
    public.written_header()  # made once per process, through the folder (no key in it)

    def refuse():
        raise AssertionError("a secret key went through a named scratch file")

    monkeypatch.setattr(public, "_create_scratch", refuse)
    exported = keys.export_for_wrapping()
    again = SecretKeyHolder(preset, exported)
    assert again.export_for_wrapping() == exported
    # and what it loaded is the key: it decrypts what the first holder encrypted
    monkeypatch.undo()
    values = np.array([0.25, -0.5, 0.75])
    opened = again.decrypt(keys.encrypt(values, 1.0), 3, 2.0**preset.scale_bits)
    np.testing.assert_allclose(opened, values, atol=1e-6)


# ---- state files -------------------------------------------------------------------------
def test_a_state_write_ends_0600_in_0700_folders_whatever_was_there(tmp_path):
    node = tmp_path / "node"
    state, run = node / "state", node / "state" / "7"
    run.mkdir(parents=True)
    os.chmod(state, 0o755)
    os.chmod(run, 0o755)
    target = run / "3-run.bin"
    # what the writer's fixed temporary name could hold: an earlier crash's, or a planted one
    stale = run / "3-run.bin.tmp"
    stale.write_bytes(b"older state")
    os.chmod(stale, 0o644)
    write_private_bytes(target, b"the client's keys", private_from=state)
    assert target.read_bytes() == b"the client's keys"
    assert mode(target) == 0o600
    assert mode(state) == mode(run) == 0o700
    assert not stale.exists()  # the old writer's leftover (0644, with state in it) is gone
    assert sorted(p.name for p in run.iterdir()) == ["3-run.bin"]  # no temporary left


def test_folders_a_private_write_makes_are_0700_whatever_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        write_private_bytes(tmp_path / "a" / "b" / "key", b"k")
    finally:
        os.umask(previous)
    assert mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == 0o700
    assert mode(tmp_path / "a" / "b" / "key") == 0o600


def test_a_failed_state_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "state" / "1" / "3-run.bin"
    write_private_bytes(target, b"old", private_from=tmp_path / "state")

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_private_bytes(target, b"new", private_from=tmp_path / "state")
    assert target.read_bytes() == b"old"
    assert [p.name for p in target.parent.iterdir()] == ["3-run.bin"]
