"""The review's ways for one client to end a run, each closed: the bytes get a typed
ClientInputError, the round excludes that client only, and memory stays flat.

- deeply nested JSON in an envelope header or a config field (was RecursionError);
- a zero-size seeded ciphertext (was IndexError inside SEAL), and its sibling, a zero-size
  ciphertext whose data array claims 2^27 coefficients (SEAL zero-filled 1 GB);
- a SEAL header claiming 2^40 bytes (was MemoryError), and a 65,730-byte upload whose zstd
  body inflates to 2 GB (SEAL grew a 4.1 GB buffer).

Also: SEAL's scratch files are 0600 while they exist and gone after any exit.
"""

from __future__ import annotations

import os
import re
import resource
import stat
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from secagg import wire
from secagg.backends import make_backends
from secagg.ckks import native, public
from secagg.ckks.presets import get_preset
from secagg.ckks.public import PublicCKKS, ciphertext_raw_bytes, raw_body, written_header
from secagg.errors import ClientInputError, MalformedCiphertext, MalformedMessage
from secagg.protocols.fedavg import sample_size_weights
from secagg.secret.ckks_keys import SecretKeyHolder
from secagg.server.audit import AuditLog
from secagg.wire import Envelope
from tests.conftest import backend_client, make_server
from tests.security.forge import (
    CT_COUNT_AT,
    CT_SIZE_AT,
    bomb_upload,
    seal_blob,
    with_u64,
    zstd_raw_frame,
)

PRESET = get_preset("compact")
HOLDER = SecretKeyHolder(PRESET)
PUBLIC = PublicCKKS(PRESET)
DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB: under the 1 MiB header limit


def envelope_bytes(header: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">4sHI", wire.MAGIC, wire.WIRE_VERSION, len(header)) + header + payload


def deep_header(sender: str = "client_bad") -> bytes:
    head = f'{{"sender":"{sender}","recipient":"server","round":0,"phase":"train","fields":[],'
    return envelope_bytes(head.encode() + b'"x":' + DEEP + b"}")


def deep_config(sender: str = "client_bad") -> bytes:
    head = (
        f'{{"sender":"{sender}","recipient":"server","round":0,"phase":"train",'
        f'"fields":[{{"name":"x","kind":"config","nbytes":{len(DEEP)}}}]}}'
    )
    return envelope_bytes(head.encode(), DEEP)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- deeply nested JSON ----------------------------------------------------------------------
@pytest.mark.parametrize("build", [deep_header, deep_config], ids=["header", "config field"])
def test_deep_json_is_a_malformed_message_not_a_recursion_error(build):
    with pytest.raises(MalformedMessage, match="levels deep; at most 32"):
        Envelope.from_bytes(build())


@pytest.mark.parametrize("build", [deep_header, deep_config], ids=["header", "config field"])
def test_a_client_sending_deep_json_is_excluded_and_the_round_goes_on(honest, build):
    gs, handlers = honest
    audit = AuditLog()
    server = make_server({**handlers, "client_bad": lambda data: build()}, audit=audit)
    report = server.run_round(0)
    assert list(report.excluded) == ["client_bad"]
    w = sample_size_weights({c: n for c, (_, n) in gs.items()})
    np.testing.assert_allclose(server.params, sum(w[c] * g for c, (g, _) in gs.items()))
    (ex,) = [r for r in audit.records if r["event"] == "excluded"]
    assert ex["error"] == "MalformedMessage" and "levels deep" in ex["reason"]


# ---- forged ciphertexts ----------------------------------------------------------------------
def upload_raw(upload: bytes | memoryview) -> bytes:
    """The uncompressed SEAL bytes of a real upload (what an attacker starts from)."""
    return raw_body(upload, 1 << 20, "upload")


def zero_size_seeded(upload) -> bytes:
    """A real seeded upload whose ciphertext size field says 0: SEAL then skips the bound on
    the data array, takes the seeded branch and indexes polynomial 1 of a size-0 ciphertext."""
    return seal_blob(zstd_raw_frame(with_u64(upload_raw(upload), CT_SIZE_AT, 0)))


def zero_size_huge_array(upload) -> bytes:
    """Size 0 and a data array claiming 2^27 coefficients: SEAL zero-filled 1 GB for it."""
    raw = with_u64(with_u64(upload_raw(upload), CT_SIZE_AT, 0), CT_COUNT_AT, 1 << 27)
    return seal_blob(zstd_raw_frame(raw))


def header_claims_2_40(upload) -> bytes:
    return with_u64(bytes(upload), 8, 1 << 40)


FORGED = {
    "zero-size seeded ciphertext": (zero_size_seeded, "has size 0, expected 2"),
    "zero size, 2^27-coefficient array": (zero_size_huge_array, "has size 0, expected 2"),
    "header claiming 2^40 bytes": (header_claims_2_40, "claims 1099511627776 bytes"),
    "65,730-byte zstd bomb": (lambda upload: bomb_upload(), "inflates to more than"),
    "zero bytes": (lambda upload: b"", "empty or truncated"),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_forged_ciphertext_is_malformed_and_allocates_nothing(case):
    forge, message = FORGED[case]
    data = forge(HOLDER.encrypt(np.ones(5), 1.0)[0])
    before = peak_rss_mb()
    with pytest.raises(MalformedCiphertext, match=re.escape(message)):
        PUBLIC.load_ciphertexts([data], 5)
    assert peak_rss_mb() - before < 50  # each of these made SEAL allocate 1 GB or more
    if case == "65,730-byte zstd bomb":
        assert len(data) == 65_730


def test_the_forged_bytes_are_well_formed_apart_from_the_lie():
    """The forgeries fail on what they lie about, not on clumsy framing: unchanged, the
    same construction (raw zstd blocks, a rebuilt header) loads."""
    upload = HOLDER.encrypt(np.arange(5) / 10, 1.0)[0]
    (ct,) = PUBLIC.load_ciphertexts([seal_blob(zstd_raw_frame(upload_raw(upload)))], 5)
    np.testing.assert_allclose(HOLDER._decode([ct], 5), np.arange(5) / 10, atol=1e-6)


def _ckks_round(bad_upload):
    """A CKKS FedAvg round with two honest clients and one whose upload is replaced."""
    ids = ["client_0", "client_1", "client_bad"]
    server_backend, backends = make_backends("ckks", ids)
    gs = {"client_0": np.array([0.1, 0.2, 0.0, -0.1, 0.3]), "client_1": np.full(5, -0.05)}
    handlers = {c: backend_client(c, backends[c], gs[c], 10 * (k + 1)) for k, c in enumerate(gs)}
    honest_bad = backend_client("client_bad", backends["client_bad"], np.full(5, 0.5), 10)

    def tampering(data):
        req, reply = Envelope.from_bytes(data), Envelope.from_bytes(honest_bad(data))
        if req.phase != "train":
            return reply.to_bytes()
        forged = bad_upload(reply.ciphertext_parts("pseudo_gradient")[0])
        fields = {**reply.fields, "pseudo_gradient": wire.ciphertext([forged])}
        return Envelope("client_bad", "server", reply.round, reply.phase, fields).to_bytes()

    handlers["client_bad"] = tampering
    audit = AuditLog()
    server = make_server(handlers, dim=5, audit=audit, backend=server_backend)
    server.setup(rounds=2)
    return server, server.run_round(0), audit, gs


@pytest.mark.parametrize("case", list(FORGED))
def test_a_client_uploading_a_forged_ciphertext_is_excluded_and_the_round_goes_on(case):
    forge, message = FORGED[case]
    server, report, audit, gs = _ckks_round(forge)
    assert list(report.excluded) == ["client_bad"]
    (ex,) = [r for r in audit.records if r["event"] == "excluded"]
    assert ex["error"] == "MalformedCiphertext" and message in ex["reason"]
    w = sample_size_weights({"client_0": 10, "client_1": 20})
    expected = w["client_0"] * gs["client_0"] + w["client_1"] * gs["client_1"]
    np.testing.assert_allclose(server.params, expected, atol=1e-6)


def test_the_secret_key_from_a_leader_is_checked_the_same_way():
    """A key-install blob comes from another client: the same lies are refused, typed."""
    from secagg.errors import KeySetupError

    key = HOLDER.export_for_wrapping()
    for forged in (b"", with_u64(key, 8, 1 << 40), bomb_upload(), key[:-1]):
        with pytest.raises(KeySetupError, match="secret key"):
            SecretKeyHolder(PRESET, forged)
    assert SecretKeyHolder(PRESET, key).export_for_wrapping() == key


# ---- what SEAL writes: the facts the checks rest on --------------------------------------------
def test_seal_header_facts_and_size_bounds_match_what_this_build_writes():
    ours = written_header()
    upload = HOLDER.encrypt(np.ones(PRESET.values_per_ciphertext), 1.0)[0]
    (fresh,) = PUBLIC.load_ciphertexts([upload], PRESET.values_per_ciphertext)
    summed = public.to_bytes(PUBLIC.weighted_sum([[fresh], [fresh]], [0.5, 0.5])[0])
    n, primes = PRESET.poly_modulus_degree, len(PRESET.coeff_bits) - 1
    print(
        f"\nSEAL header: version {ours.version}, compression mode {ours.compr_mode}; "
        f"seeded upload {len(upload)} B (raw {len(upload_raw(upload))}), "
        f"sum {len(summed)} B (raw {len(upload_raw(summed))}); bound raw "
        f"{PUBLIC.max_raw_bytes}, blob {16 + public.zstd_bound(PUBLIC.max_raw_bytes)}"
    )
    assert ours.version[0] == 4 and ours.compr_mode == public.COMPR_ZSTD
    # the native path's compact uploads travel packed (``packing``), SEAL's objects with zstd
    packed = public.COMPR_PACKED if native.module() is not None else public.COMPR_ZSTD
    for blob, mode in ((upload, packed), (summed, public.COMPR_ZSTD)):
        header = public.read_header(blob)
        assert (header.version, header.compr_mode, header.size) == (ours.version, mode, len(blob))
        assert len(blob) <= 16 + public.zstd_bound(PUBLIC.max_raw_bytes)
    assert len(upload_raw(upload)) == ciphertext_raw_bytes(n, primes, seeded=True)
    assert len(upload_raw(summed)) == PUBLIC.max_raw_bytes == 2 * n * primes * 8 + 97


# ---- scratch files ---------------------------------------------------------------------------
class _Failing:
    """A stand-in SEAL object: records its scratch file, then fails as SEAL can."""

    def __init__(self):
        self.seen: list[tuple[str, int, bytes]] = []

    def _record(self, path):
        with open(path, "rb") as f:
            self.seen.append((path, stat.S_IMODE(os.stat(path).st_mode), f.read()))
        raise RuntimeError("SEAL failed midway")

    def save(self, path):
        self._record(path)

    def load(self, context, path):
        self._record(path)


def test_scratch_files_are_0600_while_they_exist_and_gone_after_an_error():
    obj = _Failing()
    with pytest.raises(RuntimeError):
        public.to_bytes(obj)
    with pytest.raises(RuntimeError):
        public.from_bytes(obj, PUBLIC.context, b"secret bytes")
    (save_path, save_mode, _), (load_path, load_mode, content) = obj.seen
    assert save_mode == load_mode == 0o600 and content == b"secret bytes"
    assert not os.path.exists(save_path) and not os.path.exists(load_path)
    assert stat.S_IMODE(os.stat(public._SCRATCH).st_mode) == 0o700
    assert not public._LIVE


def test_a_sigterm_removes_the_scratch_files_and_still_ends_the_process():
    script = textwrap.dedent(
        """
        import os, signal, time
        from secagg.ckks import public
        path, fd = public._create_scratch()
        print(path, public._SCRATCH, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    path, folder = done.stdout.split()
    assert done.returncode == -15  # died of the signal, as without the handler
    assert not os.path.exists(path) and not os.path.exists(folder)


def test_every_ckks_load_error_is_a_client_input_error():
    assert issubclass(MalformedCiphertext, ClientInputError)
