"""secagg's native path over SEAL: the extension ``scripts/build_native.sh`` builds from
``native/seal_native.cpp`` at set-up (SEAL 4.1.2's sources from Pyfhel's sdist on PyPI).

It does in one call, in memory and on every core what the TenSEAL binding does one chunk at a
time through scratch files: encode and seeded-encrypt a whole vector (uncompressed SEAL
format, 8 bytes a value), and sum the second polynomials the seeds of a release's uploads
expand to. Its bytes are SEAL's: TenSEAL loads them, and the server checks them exactly as it
checks TenSEAL's (``public.raw_body``). The tests hold the two paths to the same results:
``tests/test_native.py``.

The extension is two modules built from that one file: ``_seal_native``, with the classes that
take a key (the encryptor, decryptor and masks ``secagg.secret`` hands one), and its public
half ``_seal_public`` (the parameters, the seed expansion and sums mod q, the threshold ring),
which is all a server process loads (:func:`public_module`, :func:`seed_expander`).

``SECAGG_NATIVE`` chooses the path: ``auto`` (the default: native when built), ``off`` (the
TenSEAL binding only: the before-and-after benchmarks set it) or ``on`` (refuse to run
without the extension). ``SECAGG_NATIVE_THREADS`` caps the threads of one call (default: the
cores the process may use).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from secagg.errors import ConfigError

ENV = "SECAGG_NATIVE"
THREADS_ENV = "SECAGG_NATIVE_THREADS"
MODES = ("auto", "on", "off")
# where the extension comes from: an installed secagg has it when its wheel was built by the
# build backend (setup.py), a checkout once scripts/build_native.sh ran
INSTALL_HINT = (
    "install secagg from its sdist or a wheel built from it (the build backend builds the "
    "extension; a C++17 compiler is needed), or in a checkout run `bash scripts/build_native.sh`"
)
_BUILD_HINT = f"{INSTALL_HINT} (or set SECAGG_NATIVE=off)"


def mode() -> str:
    return _checked_mode(os.environ.get(ENV, "auto").strip().lower() or "auto")


def _checked_mode(value: str) -> str:
    if value not in MODES:
        raise ConfigError(f"{ENV}={value!r}: choose one of {', '.join(MODES)}")
    return value


#: the extension's two modules: everything, and the public half (no class that takes a key)
FULL, PUBLIC = "secagg.ckks._seal_native", "secagg.ckks._seal_public"


def module() -> ModuleType | None:
    """The extension (with the classes that take a key: client side), or None when the
    TenSEAL path is to be used (``SECAGG_NATIVE``)."""
    return _loaded(FULL)


def public_module() -> ModuleType | None:
    """The extension's public half (no class that takes a key: what a server loads), or None
    when the TenSEAL path is to be used (``SECAGG_NATIVE``)."""
    return _loaded(PUBLIC)


def _loaded(name: str) -> ModuleType | None:
    chosen = mode()
    if chosen == "off":
        return None
    try:
        extension = importlib.import_module(name)
    except ImportError as exc:
        if chosen == "on":
            raise ConfigError(
                f"{ENV}=on but the native extension is missing ({exc}): {_BUILD_HINT}"
            ) from None
        return None
    _check_version(extension.SEAL_VERSION)
    return extension


def _check_version(version: str) -> None:
    """The extension's SEAL must write what TenSEAL's reads: the same major.minor, which
    every SEAL header carries and ``public.check_header`` compares."""
    from secagg.ckks.public import written_header

    ours = written_header().version
    major, minor = (int(p) for p in version.split(".")[:2])
    if (major, minor) != ours:
        raise ConfigError(
            f"the native extension is built on SEAL {version}, TenSEAL's is "
            f"{ours[0]}.{ours[1]}: {_BUILD_HINT}"
        )


@functools.cache
def parameters(n: int, coeff_bits: tuple[int, ...], name: str = FULL):
    """The extension's SEAL context for these parameters (of module ``name``: each module's
    classes take its own), built once per process and shared (building one costs
    milliseconds, which every client's key holder and every release of a small model would
    otherwise pay); only called once :func:`module` or :func:`public_module` returned it."""
    extension = importlib.import_module(name)
    return extension.Parameters(n=n, coeff_bits=list(coeff_bits))


@functools.cache
def seed_expander(n: int, coeff_bits: tuple[int, ...]):
    """The public half's ``SeedExpander`` for these parameters, made once per process (the
    server's sums and a decryptor's check alike: it takes no key)."""
    extension = importlib.import_module(PUBLIC)
    return extension.SeedExpander(parameters=parameters(n, coeff_bits, PUBLIC))


def threads() -> int:
    """Threads for one native call: ``SECAGG_NATIVE_THREADS``, or the cores this process may
    run on (a benchmark sets 1 to show the cost per core)."""
    given = os.environ.get(THREADS_ENV, "").strip()
    if not given:
        return max(1, len(os.sched_getaffinity(0)))
    if not given.isdigit() or int(given) < 1:
        raise ConfigError(f"{THREADS_ENV}={given!r}: a positive number of threads")
    return int(given)


@contextmanager
def chosen(value: str, threads: int | None = None) -> Iterator[None]:
    """``SECAGG_NATIVE=value`` (and ``SECAGG_NATIVE_THREADS=threads``) inside the block, as
    they were after: the benchmarks run one configuration on both paths in one process."""
    settings = {ENV: _checked_mode(value), THREADS_ENV: None if threads is None else str(threads)}
    previous = {name: os.environ.get(name) for name in settings}
    try:
        for name, setting in settings.items():
            if setting is not None:
                os.environ[name] = setting
        yield
    finally:
        for name, old in previous.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
