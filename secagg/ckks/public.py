"""The public half of CKKS: parameters, ciphertext (de)serialisation and weighted sums.

Nothing here can decrypt: no function takes or produces a secret key.

Bytes from a client (or a server, for a decryptor) are checked here before SEAL sees them.
SEAL 4.1 trusts sizes inside its own format: a header's ``size`` sets a buffer SEAL
allocates, a zstd body is inflated without bound, and a ciphertext claiming size 0 turns off
the bound on its data array, so a 65 KB upload could make it allocate gigabytes. So an upload
is inflated here into a buffer of the largest size a ciphertext of the preset can have (or,
sent uncompressed, as the native path sends ``lean``'s, taken at no more than that size, or
sent packed, as it sends ``compact``'s, unpacked to no more than that size), its layout is
checked field by field, and SEAL loads the checked, uncompressed bytes.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import itertools
import math
import os
import re
import shutil
import signal
import stat
import struct
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tenseal.sealapi as seal
import zstandard

from secagg.ckks.packing import PACKED_BYTES, pack_words, packs, unpack_words
from secagg.ckks.presets import CKKSPreset, chunks_for
from secagg.errors import ConfigError, MalformedCiphertext, WrongContext

# SEAL's Python binding (de)serialises through files only: keep them in memory-backed /dev/shm
# when the machine has it, and delete each file as soon as it has been read. Names come from a
# counter (no uuid, no pathlib: this runs once per ciphertext chunk, hundreds of times per
# million parameters), with the process and thread ids so that no two writers share a file
# (a forked child inherits the counter). Files are created 0600 by us, never by SEAL: they hold
# ciphertexts. Secret keys go through an anonymous memory file instead (``private=True``:
# memfd_create, named to SEAL as /proc/self/fd/N), which no folder lists and which the kernel
# frees with the process, however it ends; only where the system has none do they take the
# folder too. A process killed by SIGKILL cannot remove its folder: the next process to make
# one removes the folders of this user whose process is gone (``_sweep_stale``). A folder's
# name says whose it is: secagg-<pid namespace>-<pid>-<the process's start time>-<random>.
_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_NAMED = re.compile(r"secagg-(\d+)-(\d+)-(\d+)-[A-Za-z0-9_]+")
_FOLDER_LOCK = threading.Lock()


def _pid_namespace() -> int:
    """This process's pid namespace (an inode number; 0 where /proc does not say): a pid
    names a process only within its namespace, and /dev/shm may be shared across them."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22): with
    the pid it names one process, not whichever reuses the pid later. None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the name, which may hold ")"
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, started: int) -> bool:
    """Whether the process that made a folder still runs (in doubt: yes)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone's process has the pid; check its start below
        pass
    now = _start_time(pid)
    return now is None or started == 0 or now == started


def _sweep_stale(root: str) -> list[str]:
    """Remove the scratch folders in ``root`` that this user's processes of this pid
    namespace left when they were killed (SIGKILL, a crash, a lost machine): their process
    is gone, or its pid now names a process started later. A folder of a live process, of
    another user or namespace, or named otherwise (older secagg versions) is left alone, and
    so is one where a live process (a fork of its maker) still has a file. Returns what was
    removed."""
    namespace, uid = _pid_namespace(), os.getuid()
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _NAMED.fullmatch(name)
        if match is None or int(match[1]) != namespace:
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        if _alive(int(match[2]), int(match[3])):
            continue
        try:  # files are named <pid>-<thread>-<n>, after the process that wrote them
            writers = {int(f.split("-", 1)[0]) for f in os.listdir(path) if f[:1].isdigit()}
        except (OSError, ValueError):
            continue
        maker, started = int(match[2]), int(match[3])
        if any(_alive(w, started if w == maker else 0) for w in writers):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def _make_folder() -> str:
    """A new scratch folder for this process (0700), after sweeping the stale ones."""
    _sweep_stale(_ROOT)
    pid = os.getpid()
    prefix = f"secagg-{_pid_namespace()}-{pid}-{_start_time(pid) or 0}-"
    return tempfile.mkdtemp(prefix=prefix, dir=_ROOT)


_OWNER = os.getpid()
_SCRATCH = _make_folder()
_NAMES = itertools.count()
_LIVE: set[str] = set()  # scratch files that exist right now, of this process and its forks


def _scratch_path() -> str:
    return f"{_SCRATCH}/{os.getpid()}-{threading.get_ident()}-{next(_NAMES)}"


def _create_scratch() -> tuple[str, int]:
    """A new scratch file, readable by this user only; (path, open descriptor for writing).
    A forked child whose parent was killed may find the folder swept: it makes its own."""
    global _SCRATCH, _OWNER
    path = _scratch_path()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:
        with _FOLDER_LOCK:
            if not os.path.isdir(_SCRATCH):
                _SCRATCH, _OWNER = _make_folder(), os.getpid()
        path = _scratch_path()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    _LIVE.add(path)
    return path, fd


def _remove_scratch(path: str) -> None:
    _LIVE.discard(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_all_scratch() -> None:
    """Remove this process's scratch files (a forked child's set still names its parent's
    files, which are not its to remove), and the folder if this process made it."""
    mine = f"{_SCRATCH}/{os.getpid()}-"
    for path in list(_LIVE):  # a copy: another thread may be adding to the set
        if path.startswith(mine):
            _remove_scratch(path)
    if os.getpid() == _OWNER:
        shutil.rmtree(_SCRATCH, ignore_errors=True)


def _on_fatal_signal(signum: int, frame) -> None:
    """SIGTERM (or SIGINT without Python's handler) would end the process without atexit:
    clean up, then die of the signal as the default action would."""
    _remove_all_scratch()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup() -> None:
    atexit.register(_remove_all_scratch)
    # Only where the signal would kill the process outright: Python's SIGINT handler raises
    # KeyboardInterrupt, which unwinds through the try/finally of every save and load and then
    # runs atexit; a handler someone else installed (or SIG_IGN) is theirs to keep.
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _on_fatal_signal)


_install_cleanup()


def _memory_file() -> int | None:
    """An anonymous memory file (memfd, mode 0600) SEAL can open as /proc/self/fd/N, or None
    where the system has none (not Linux, no /proc)."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        fd = os.memfd_create("secagg-private", os.MFD_CLOEXEC)
    except OSError:
        return None
    os.fchmod(fd, 0o600)
    if not os.path.exists(f"/proc/self/fd/{fd}"):
        os.close(fd)
        return None
    return fd


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts, at = [], 0
    while at < size:
        part = os.pread(fd, size - at, at)
        if not part:
            break
        parts.append(part)
        at += len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def to_bytes(obj, *, private: bool = False) -> bytes:
    """SEAL object -> bytes (SEAL's own format, zstd-compressed: the binding's ``save`` takes
    no compression mode). ``private``: the object is secret (a key): it goes through an
    anonymous memory file, never a named one, where the system allows."""
    fd = _memory_file() if private else None
    if fd is not None:
        try:
            obj.save(f"/proc/self/fd/{fd}")  # SEAL opens it anew and truncates it
            return _read_all(fd)
        finally:
            os.close(fd)
    path, fd = _create_scratch()
    try:
        os.close(fd)  # SEAL opens the file by name and truncates it: its mode stays 0600
        obj.save(path)
        with open(path, "rb") as f:
            return f.read()
    finally:
        _remove_scratch(path)


def from_bytes(obj, context: seal.SEALContext, data: bytes | memoryview, *, private: bool = False):
    """Load bytes (or a view into a received message) into a fresh SEAL object; SEAL
    validates them against the context. Bytes from another party go through
    :func:`checked_blob` first: SEAL's own checks do not bound what it allocates.
    ``private`` as for :func:`to_bytes`."""
    fd = _memory_file() if private else None
    if fd is not None:
        try:
            _write_all(fd, data)
            obj.load(context, f"/proc/self/fd/{fd}")
            return obj
        finally:
            os.close(fd)
    path, fd = _create_scratch()
    try:
        with open(fd, "wb") as f:
            f.write(data)
        obj.load(context, path)
        return obj
    finally:
        _remove_scratch(path)


#: what SEAL's binding raises for bytes it cannot load (pybind11 maps std::logic_error to
#: RuntimeError, out_of_range to IndexError, bad_alloc to MemoryError, ...)
SEAL_LOAD_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, MemoryError, OverflowError)


# ---- SEAL's serialisation format, checked before SEAL reads untrusted bytes -------------------
#: SEALHeader: magic, header size, version major, minor, compression mode, reserved, total size
_HEADER = struct.Struct("<HBBBBHQ")
HEADER_BYTES = _HEADER.size
SEAL_MAGIC = 0xA15E
COMPR_NONE, COMPR_ZSTD = 0, 2
#: secagg's own mode in a SEAL header (SEAL writes 0, 1 and 2 only): the body is an
#: uncompressed one whose coefficient array travels 48 bits a coefficient (``packing``);
#: :func:`raw_body` unpacks it before anything reads it, so SEAL never sees this mode
COMPR_PACKED = 0x30
_COMPR_NAMES = {0: "none", 1: "zlib", 2: "zstd", COMPR_PACKED: "packed"}
#: a packed body opens with where its packed array starts (after this) and how many
#: coefficients it holds
PACKED_HEAD = struct.Struct("<II")
#: a ciphertext's metadata: parms_id, is_ntt_form, size, N, coeff_modulus_size, scale,
#: correction factor; then its data (a DynArray: nested header, count, count uint64s) and, in
#: a seeded ciphertext, the PRNG info (nested header, PRNG type, 64-byte seed) for the second
#: polynomial
_CT_META = struct.Struct("<32sBQQQdQ")
_COUNT = struct.Struct("<Q")
#: where a ciphertext's coefficients start in its raw body (after its metadata and its data
#: array's header and count)
CIPHERTEXT_DATA = _CT_META.size + _HEADER.size + _COUNT.size
_PRNG_INFO_BYTES = _HEADER.size + 1 + 64
#: a plaintext's metadata (a secret key is one): parms_id, coefficient count, scale; then its
#: data (a DynArray: nested header, count, count uint64s)
PLAINTEXT_META = struct.Struct("<32sQd")
#: the layouts, for modules that read SEAL's format too (``first_polys``, ``secret``)
SEAL_HEADER, CIPHERTEXT_META, COUNT = _HEADER, _CT_META, _COUNT
#: what names a seeded ciphertext's second polynomial: its PRNG type byte and 64-byte seed
SEED_INFO_BYTES = 1 + 64


@dataclass(frozen=True)
class SEALHeader:
    magic: int
    header_size: int
    version: tuple[int, int]
    compr_mode: int
    reserved: int
    size: int


def read_header(data: bytes | memoryview, offset: int = 0, what: str = "SEAL object") -> SEALHeader:
    if len(data) < offset + _HEADER.size:
        raise MalformedCiphertext(
            f"{what} has {max(len(data) - offset, 0)} bytes where a {_HEADER.size}-byte SEAL "
            "header should be (empty or truncated)"
        )
    magic, header_size, major, minor, mode, reserved, size = _HEADER.unpack_from(data, offset)
    return SEALHeader(magic, header_size, (major, minor), mode, reserved, size)


@functools.cache
def written_header() -> SEALHeader:
    """The header this SEAL build writes (version, compression mode), read off a saved
    ciphertext: uploads must look like what our own clients write."""
    return read_header(to_bytes(seal.Ciphertext()))


def check_header(header: SEALHeader, nbytes: int, compr_mode: int, what: str) -> None:
    """``header`` must be one this build writes, with ``compr_mode``, for exactly ``nbytes``."""
    ours = written_header()
    if header.magic != SEAL_MAGIC or header.header_size != _HEADER.size or header.reserved:
        raise MalformedCiphertext(f"{what} has no valid SEAL header")
    if header.version != ours.version:
        raise MalformedCiphertext(
            f"{what} was written by SEAL {header.version[0]}.{header.version[1]}; this build "
            f"reads and writes {ours.version[0]}.{ours.version[1]}"
        )
    if header.compr_mode != compr_mode:
        raise MalformedCiphertext(
            f"{what} has compression mode {header.compr_mode} "
            f"({_COMPR_NAMES.get(header.compr_mode, 'unknown')}); here SEAL writes only "
            f"{compr_mode} ({_COMPR_NAMES[compr_mode]})"
        )
    if header.size != nbytes:
        raise MalformedCiphertext(f"{what} claims {header.size} bytes but has {nbytes}")


def zstd_bound(n: int) -> int:
    """zstd's worst-case compressed size of n bytes (ZSTD_COMPRESSBOUND in zstd.h)."""
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


def inflate(body: bytes | memoryview, max_bytes: int, what: str) -> bytes:
    """A zstd body inflated to at most ``max_bytes``: read through a bounded stream, so a body
    that would inflate to more is refused after ``max_bytes + 1`` bytes, whatever its frame
    headers claim (a one-shot decompress would allocate what the header says)."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(body))) as reader:
            out = reader.read(max_bytes + 1)
            if len(out) <= max_bytes and reader.read(1):
                out += b"\0"  # more frames follow: too long all the same
    except zstandard.ZstdError as exc:
        raise MalformedCiphertext(f"{what} is not a zstd body ({exc})") from None
    if len(out) > max_bytes:
        raise MalformedCiphertext(
            f"{what} inflates to more than {max_bytes} bytes, the most it can have at this preset"
        )
    return out


def raw_body(data: bytes | memoryview, max_raw: int, what: str) -> bytes:
    """A SEAL object's body without its header, at most ``max_raw`` bytes: inflated if it
    travels zstd-compressed (TenSEAL's binding always compresses), unpacked if it travels
    packed (the native path's ``compact`` uploads, :func:`upload_chunks`), as is if it
    travels uncompressed (the native path's others: random coefficients do not compress).
    The header must be one this build writes, for exactly the length of ``data``."""
    header = read_header(data, 0, what)
    known = (COMPR_NONE, COMPR_ZSTD, COMPR_PACKED)
    mode = header.compr_mode if header.compr_mode in known else COMPR_ZSTD
    most = {COMPR_NONE: max_raw, COMPR_PACKED: PACKED_HEAD.size + max_raw}.get(
        mode, zstd_bound(max_raw)
    )
    if len(data) > _HEADER.size + most:
        raise MalformedCiphertext(
            f"{what} has {len(data)} bytes; at this preset it has at most {_HEADER.size + most}"
        )
    check_header(header, len(data), mode, what)
    if mode == COMPR_NONE:
        return bytes(memoryview(data)[_HEADER.size :])
    if mode == COMPR_PACKED:
        return unpacked(memoryview(data)[_HEADER.size :], max_raw, what)
    return inflate(memoryview(data)[_HEADER.size :], max_raw, what)


def checked_blob(
    data: bytes | memoryview,
    max_raw: int,
    check_layout: Callable[[bytes], None],
    what: str,
) -> bytes:
    """SEAL bytes from another party -> the same object, uncompressed and checked.

    The header must be one this build writes (zstd, packed or none, the exact length of
    ``data``), the body must be (or inflate or unpack to) at most ``max_raw`` bytes
    (:func:`raw_body`), and
    ``check_layout(raw)`` must accept every size inside it. SEAL then reads a blob whose
    every length is known: it allocates nothing the preset does not need."""
    raw = raw_body(data, max_raw, what)
    check_layout(raw)
    return uncompressed_blob(raw)


def seal_header(nbytes: int, compr_mode: int = COMPR_NONE) -> bytes:
    """The header this SEAL build writes in front of ``nbytes`` in all (an object's, or the
    nested one before its data array), in ``compr_mode``."""
    ours = written_header()
    return _HEADER.pack(SEAL_MAGIC, _HEADER.size, *ours.version, compr_mode, 0, nbytes)


def upload_chunks(blob: bytes, size: int, preset: CKKSPreset) -> list[bytes]:
    """The native encryptor's uploads (uncompressed seeded ciphertexts of ``size`` bytes, back
    to back) as they travel: packed where every data prime is below 2^48 (``compact``: 12.1
    bytes a value), as written otherwise (a 60-bit prime leaves nothing to pack)."""
    if not packs(preset.coeff_bits):
        return [blob[at : at + size] for at in range(0, len(blob), size)]
    rows = np.frombuffer(blob, dtype=np.uint8).reshape(-1, size)
    at = _HEADER.size + CIPHERTEXT_DATA
    (count,) = _COUNT.unpack_from(blob, at - _COUNT.size)
    if read_header(blob).compr_mode != COMPR_NONE or size < at + 8 * count:
        raise ValueError("upload_chunks packs uncompressed ciphertexts only")
    words = np.empty((len(rows), count), dtype="<u8")
    words.view(np.uint8)[:] = rows[:, at : at + 8 * count]
    packed = pack_words(words).astype("<u8", copy=False).view(np.uint8)
    tail = size - at - 8 * count
    head = PACKED_HEAD.size + CIPHERTEXT_DATA
    length = _HEADER.size + head + PACKED_BYTES * count + tail
    out = np.empty((len(rows), length), dtype=np.uint8)
    prefix = seal_header(length, COMPR_PACKED) + PACKED_HEAD.pack(CIPHERTEXT_DATA, count)
    out[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    out[:, len(prefix) : _HEADER.size + head] = rows[:, _HEADER.size : at]
    out[:, _HEADER.size + head : length - tail] = packed
    out[:, length - tail :] = rows[:, size - tail :]
    return [row.tobytes() for row in out]


def upload_seeds(parts: Sequence[bytes | memoryview], max_raw: int) -> bytes:
    """The seeds of one's own upload (:func:`upload_chunks`' output, or TenSEAL's), in chunk
    order: a seeded ciphertext ends with its seed, so a chunk written as is or packed gives
    its last bytes, and only a zstd chunk is inflated first."""
    seeds = []
    for i, data in enumerate(parts):
        if read_header(data, 0, f"upload chunk {i}").compr_mode in (COMPR_NONE, COMPR_PACKED):
            seeds.append(bytes(memoryview(data)[-SEED_INFO_BYTES:]))
        else:
            seeds.append(raw_body(data, max_raw, f"upload chunk {i}")[-SEED_INFO_BYTES:])
    return b"".join(seeds)


def unpacked(body: bytes | memoryview, max_raw: int, what: str) -> bytes:
    """A packed body (:data:`COMPR_PACKED`) as the uncompressed body it was packed from, of at
    most ``max_raw`` bytes; MalformedCiphertext if its packing head does not fit its bytes."""
    if len(body) < PACKED_HEAD.size:
        raise MalformedCiphertext(f"{what} ends inside its packing head")
    offset, count = PACKED_HEAD.unpack_from(body)
    start = PACKED_HEAD.size + offset
    end = start + PACKED_BYTES * count
    if count % 4 or end > len(body):
        raise MalformedCiphertext(
            f"{what} packs {count} coefficients at byte {offset}, which its {len(body)} "
            "bytes do not hold (in fours)"
        )
    unpacked_bytes = len(body) - PACKED_HEAD.size + (8 - PACKED_BYTES) * count
    if unpacked_bytes > max_raw:
        raise MalformedCiphertext(
            f"{what} unpacks to {unpacked_bytes} bytes; at this preset it has at most {max_raw}"
        )
    words = np.frombuffer(bytes(body[start:end]), dtype="<u8").reshape(1, -1)
    coefficients = unpack_words(words).astype("<u8", copy=False)
    return bytes(body[PACKED_HEAD.size : start]) + coefficients.tobytes() + bytes(body[end:])


def uncompressed_blob(raw: bytes) -> bytes:
    """A SEAL header (uncompressed, exact length) in front of an object's raw bytes."""
    return seal_header(_HEADER.size + len(raw)) + raw


def raw_ciphertext(ct: seal.Ciphertext) -> bytes:
    """One of our own SEAL objects, serialised without compression (its data in order)."""
    data = to_bytes(ct)
    most = ciphertext_raw_bytes(ct.poly_modulus_degree(), ct.coeff_modulus_size(), seeded=False)
    return inflate(memoryview(data)[_HEADER.size :], most, "ciphertext")


def check_nested(raw: bytes, offset: int, nbytes: int, what: str) -> None:
    """A header SEAL writes inside an object (before a data array or a PRNG seed): SEAL
    loads through it again, so it must be uncompressed and exactly ``nbytes`` long."""
    check_header(read_header(raw, offset, what), nbytes, COMPR_NONE, what)


def ciphertext_raw_bytes(n: int, primes: int, seeded: bool) -> int:
    """Uncompressed size of a size-2 ciphertext of N=n over ``primes`` primes: metadata,
    data array, and for a seeded one the first polynomial and the seed of the second."""
    polys = 1 if seeded else 2
    data = _HEADER.size + _COUNT.size + polys * n * primes * 8
    return _CT_META.size + data + (_PRNG_INFO_BYTES if seeded else 0)


def check_ciphertext_layout(raw: bytes, n: int, primes: int, what: str) -> None:
    """Every size in an uncompressed ciphertext, against the preset's: a size-2 ciphertext
    of degree ``n`` over ``primes`` primes, seeded (an upload) or not (a sum)."""
    if len(raw) < _CT_META.size:
        raise MalformedCiphertext(f"{what} ends inside its metadata ({len(raw)} bytes)")
    _, _, size, degree, n_primes, _, _ = _CT_META.unpack_from(raw)
    if size != 2:
        raise MalformedCiphertext(f"{what} has size {size}, expected 2")
    if (degree, n_primes) != (n, primes):
        raise WrongContext(
            f"{what} is of degree {degree} over {n_primes} primes; this preset's fresh "
            f"ciphertexts are of degree {n} over {primes}"
        )
    seeded = len(raw) == ciphertext_raw_bytes(n, primes, True)
    if not (seeded or len(raw) == ciphertext_raw_bytes(n, primes, False)):
        raise MalformedCiphertext(
            f"{what} inflates to {len(raw)} bytes; a ciphertext of this preset has "
            f"{ciphertext_raw_bytes(n, primes, True)} (seeded) or "
            f"{ciphertext_raw_bytes(n, primes, False)}"
        )
    count = (1 if seeded else 2) * n * primes
    at = _CT_META.size
    check_nested(raw, at, _HEADER.size + _COUNT.size + 8 * count, f"{what}'s data")
    (claimed,) = _COUNT.unpack_from(raw, at + _HEADER.size)
    if claimed != count:
        raise MalformedCiphertext(f"{what} claims {claimed} coefficients, expected {count}")
    if seeded:
        check_nested(raw, len(raw) - _PRNG_INFO_BYTES, _PRNG_INFO_BYTES, f"{what}'s seed")


def parms_id_bytes(parms_id: Sequence[int]) -> bytes:
    """A parms_id as SEAL writes it: four little-endian uint64."""
    return struct.pack("<4Q", *parms_id)


@functools.cache
def make_context(preset: CKKSPreset) -> seal.SEALContext:
    """SEAL's context for a preset, built once per process and shared: it is immutable, and
    building one (NTT tables, prime checks) costs about 10 ms, which 100 clients and the
    server would otherwise pay twice each."""
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(preset.poly_modulus_degree)
    parms.set_coeff_modulus(
        seal.CoeffModulus.Create(preset.poly_modulus_degree, list(preset.coeff_bits))
    )
    context = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    if not context.parameters_set():
        raise ConfigError(
            f"SEAL rejects preset {preset.name}: {context.parameters_error_message()}"
        )
    return context


@functools.cache
def params_fingerprint(preset: CKKSPreset) -> str:
    """A short public identifier of the parameter set, bound into key wrapping."""
    parms = make_context(preset).key_context_data().parms()
    return hashlib.sha256(to_bytes(parms)).hexdigest()[:16]


#: what a ``key_install`` receipt reports instead of a key id when the wrapped key does not
#: open for its recipient, does not load as a key, or opens to another key than the one its
#: maker committed to: the recipient installs nothing, and the server, who cannot tell which
#: of the two is at fault, settles it (``CKKSServer.setup``)
KEY_REFUSED = "wrapped_key_refused"


def key_id(secret_key_bytes: bytes) -> str:
    """What names a CKKS secret key in key setup's receipts, in public: a domain-separated
    SHA-256 of its serialisation (the key has thousands of bits of entropy: the hash tells
    nothing about it)."""
    return hashlib.sha256(b"secagg/ckks-key-id/v1|" + secret_key_bytes).hexdigest()


def is_key_id(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


class PublicCKKS:
    """What the server holds: the parameters and an evaluator. No key of any kind."""

    def __init__(self, preset: CKKSPreset):
        self.preset = preset
        self.context = make_context(preset)
        self.evaluator = seal.Evaluator(self.context)
        self.encoder = seal.CKKSEncoder(self.context)
        self.scale = 2.0**preset.scale_bits
        # the shape every ciphertext the server sums or sends has: fresh level, size 2
        self._degree = preset.poly_modulus_degree
        self._primes = len(self.context.first_context_data().parms().coeff_modulus())
        #: largest uncompressed ciphertext of this preset (a sum: two full polynomials)
        self.max_raw_bytes = ciphertext_raw_bytes(self._degree, self._primes, seeded=False)

    @property
    def n_primes(self) -> int:
        """Primes of a fresh ciphertext (the data level)."""
        return self._primes

    def load_ciphertext(
        self, data: bytes | memoryview, what: str = "ciphertext", seeds: list | None = None
    ) -> seal.Ciphertext:
        """One ciphertext from another party's bytes: checked (:func:`checked_blob`), then
        loaded by SEAL, whose own errors become :class:`MalformedCiphertext`. With
        ``seeds``, it must be seeded (an upload), and its seed info is appended there."""
        n, primes = self._degree, self._primes
        blob = checked_blob(
            data,
            self.max_raw_bytes,
            lambda raw: check_ciphertext_layout(raw, n, primes, what),
            what,
        )
        if seeds is not None:
            if len(blob) != _HEADER.size + ciphertext_raw_bytes(n, primes, seeded=True):
                raise MalformedCiphertext(
                    f"{what} is not seeded: an upload's second polynomial travels as a seed, "
                    "which is what lets a decryptor check the sums it is asked to open"
                )
            seeds.append(blob[-SEED_INFO_BYTES:])
        return self.load_trusted(blob, what)

    def load_trusted(self, blob: bytes, what: str = "ciphertext") -> seal.Ciphertext:
        """SEAL loads bytes whose every size was checked (or that we made ourselves)."""
        try:
            return from_bytes(seal.Ciphertext(), self.context, blob)
        except SEAL_LOAD_ERRORS as exc:
            raise MalformedCiphertext(f"{what} does not load: {exc}") from None

    def load_upload(
        self, parts: Sequence[bytes | memoryview], n_values: int
    ) -> tuple[list[seal.Ciphertext], bytes]:
        """A client's upload: fresh seeded ciphertexts, and their seeds in chunk order."""
        seeds: list[bytes] = []
        cts = self.load_ciphertexts(parts, n_values, seeds=seeds)
        return cts, b"".join(seeds)

    def load_ciphertexts(
        self,
        parts: Sequence[bytes | memoryview],
        n_values: int,
        scale: float | None = None,
        aggregate: bool = False,
        seeds: list | None = None,
    ) -> list[seal.Ciphertext]:
        """Load and check ciphertexts for an n-value vector at the fresh-upload level.

        Uploads must carry the fresh scale Δ (or ``scale``). An ``aggregate`` (a weighted
        sum the server sends back) carries Δ·2^weight_bits, or less when the server
        renormalised a sum some clients dropped out of: any scale in
        [:attr:`min_aggregate_scale`, Δ·2^weight_bits].
        """
        self.check_chunks(parts, n_values)
        out: list[seal.Ciphertext] = []
        for i, data in enumerate(parts):
            ct = self.load_ciphertext(data, f"ciphertext {i}", seeds)
            if ct.parms_id() != self.context.first_parms_id():
                raise WrongContext(f"ciphertext {i} is not at this preset's fresh level")
            if ct.size() != 2 or not ct.is_ntt_form():
                raise MalformedCiphertext(f"ciphertext {i} has size {ct.size()}, expected 2")
            if aggregate:
                if not self.min_aggregate_scale <= ct.scale <= self.sum_scale or (
                    out and ct.scale != out[0].scale
                ):
                    raise WrongContext(
                        f"aggregate ciphertext {i} has scale "
                        f"2^{np.log2(ct.scale):.1f}, outside [2^"
                        f"{np.log2(self.min_aggregate_scale):.0f}, 2^"
                        f"{self.preset.scale_bits + self.preset.weight_bits}] "
                        "or unlike the other chunks"
                    )
            elif ct.scale != (self.scale if scale is None else scale):
                raise WrongContext(
                    f"ciphertext {i} has scale 2^{np.log2(ct.scale):.1f}, "
                    f"preset {self.preset.name} uses 2^{self.preset.scale_bits}"
                )
            out.append(ct)
        return out

    def aggregate_polynomials(
        self, parts: Sequence[bytes | memoryview], n_values: int
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """A server-weighted sum's two polynomials, read out of SEAL's save without SEAL (a
        server on TenSEAL's binding releases the first: ``CKKSServer.to_field``): every size
        checked as for
        :meth:`load_ciphertexts` (``raw_body``, ``check_ciphertext_layout``), both
        polynomials present (not seeded), the fresh level, NTT form, one scale in
        [:attr:`min_aggregate_scale`, :attr:`sum_scale`] for all chunks. Returns (C0, C1),
        each (chunks, primes·N) uint64, and the scale; the native open refuses a coefficient
        outside its prime."""
        self.check_chunks(parts, n_values)
        n, primes = self._degree, self._primes
        width, full = n * primes, ciphertext_raw_bytes(n, primes, seeded=False)
        first = parms_id_bytes(self.context.first_parms_id())
        polys = np.empty((2, len(parts), width), dtype=np.uint64)
        scales = set()
        for i, data in enumerate(parts):
            what = f"aggregate ciphertext {i}"
            raw = raw_body(data, self.max_raw_bytes, what)
            check_ciphertext_layout(raw, n, primes, what)
            if len(raw) != full:
                raise MalformedCiphertext(f"{what} is seeded: a sum carries both polynomials")
            parms, ntt, _, _, _, scale, correction = _CT_META.unpack_from(raw)
            if parms != first:
                raise WrongContext(f"{what} is not at this preset's fresh level")
            if ntt != 1 or correction != 1:
                raise MalformedCiphertext(f"{what} is not a CKKS ciphertext in NTT form")
            if not self.min_aggregate_scale <= scale <= self.sum_scale:
                raise WrongContext(f"{what} has scale 2^{np.log2(scale):.1f}, outside its range")
            scales.add(scale)
            at = CIPHERTEXT_DATA
            polys[:, i] = np.frombuffer(raw, dtype="<u8", count=2 * width, offset=at).reshape(
                2, width
            )
        if len(scales) > 1:
            raise WrongContext("the aggregate's chunks carry different scales")
        return polys[0], polys[1], scales.pop()

    def check_chunks(self, parts: Sequence, n_values: int) -> None:
        """MalformedCiphertext unless ``parts`` has one chunk per N values."""
        expected = chunks_for(n_values, self.preset)
        if len(parts) != expected:
            raise MalformedCiphertext(
                f"{len(parts)} ciphertexts for {n_values} values; preset {self.preset.name} "
                f"packs {self.preset.values_per_ciphertext} per ciphertext, so {expected}"
            )

    def weighted_sum(
        self, vectors: Sequence[list[seal.Ciphertext]], weights: Sequence[float]
    ) -> list[seal.Ciphertext]:
        """Σ_i w_i · vectors[i], chunk by chunk, with w_i quantised to 2^-weight_bits."""
        total = CiphertextSum(self)
        for vec, w in zip(vectors, weights):
            total.add(vec, w)
        return total.result()

    @property
    def sum_scale(self) -> float:
        return self.scale * 2.0**self.preset.weight_bits

    @property
    def min_aggregate_scale(self) -> float:
        """The smallest scale an aggregate may carry: a sum renormalised for dropouts by at
        most 2^-20 (server weights: down to Δ; client weights: the sum is at Δ, so Δ·2^-20)."""
        return self.sum_scale * 2.0 ** -max(self.preset.weight_bits, 20)


def checked_weight(weight: float, weight_bits: int) -> int:
    """The integer k a weight becomes in a CKKS sum (:func:`quantise`), refused unless
    |w| ≤ 1 (the headroom: every client's values are checked against it)."""
    w = float(weight)
    if not abs(w) <= 1.0:
        raise ConfigError(f"CKKS weighted sums need |w| <= 1 (headroom); got {w}")
    return quantise(w, weight_bits)


def check_normaliser(normaliser: float) -> None:
    """A running sum's normaliser (the share of the planned weight that arrived) lies in
    (0, 1], or ConfigError."""
    if not 0 < normaliser <= 1 + 1e-9:
        raise ConfigError(f"a running sum's normaliser must lie in (0, 1], got {normaliser}")


def quantise(weight: float, weight_bits: int) -> int:
    """The integer k a weight becomes in a CKKS sum: SEAL encodes the constant w at scale
    2^wb as round(w·2^wb), half away from zero (C's ``round``)."""
    k = int(math.floor(abs(float(weight)) * 2.0**weight_bits + 0.5))
    return -k if weight < 0 else k


class CiphertextSum:
    """A running Σ_i round(w_i · 2^weight_bits) · ct_i, chunk by chunk.

    The server folds each upload in as it arrives and can drop it at once, so a round holds
    one model's worth of ciphertexts however many clients take part. Weights need |w| ≤ 1
    (headroom: each client's values are checked against headroom / n_clients, so any such
    weights keep the sum inside the modulus); a weight that rounds to zero adds nothing.
    """

    def __init__(self, public: PublicCKKS):
        self.public = public
        self.chunks: list[seal.Ciphertext] | None = None
        self._wscale = 2.0**public.preset.weight_bits

    def add(self, vector: list[seal.Ciphertext], weight: float, consume: bool = False) -> bool:
        """Fold ``weight · vector`` in; False if the weight rounds to zero at this preset's
        precision and nothing was added. ``consume`` multiplies ``vector`` in place (no
        copy) when the caller drops it afterwards, as a streaming server does."""
        w = float(weight)
        if checked_weight(w, self.public.preset.weight_bits) == 0:
            return False
        if self.chunks is not None and len(vector) != len(self.chunks):
            raise MalformedCiphertext(
                f"{len(vector)} chunks, the running sum has {len(self.chunks)}"
            )
        factor = seal.Plaintext()  # the constant round(w·2^wb), encoded once per upload
        self.public.encoder.encode(w, vector[0].parms_id(), self._wscale, factor)
        evaluator = self.public.evaluator
        if consume:
            for ct in vector:
                evaluator.multiply_plain_inplace(ct, factor)
        else:
            scaled = []
            for ct in vector:
                out = seal.Ciphertext()
                evaluator.multiply_plain(ct, factor, out)
                scaled.append(out)
            vector = scaled
        if self.chunks is None:
            self.chunks = list(vector)
        else:
            for acc, ct in zip(self.chunks, vector):
                evaluator.add_inplace(acc, ct)
        return True

    def result(self, normaliser: float = 1.0) -> list[seal.Ciphertext]:
        """The sum, to be decoded as Σ w_i x_i / normaliser: the normaliser goes into the
        ciphertexts' scale (SEAL stores the scale with a ciphertext), so a sum that some
        clients dropped out of is renormalised without another multiplication."""
        if self.chunks is None:
            raise ConfigError("every weight rounds to zero at this preset's weight precision")
        check_normaliser(normaliser)
        if normaliser != 1.0:
            for ct in self.chunks:
                ct.scale = self.public.sum_scale * normaliser
        return self.chunks
