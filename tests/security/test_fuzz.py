"""Seeded fuzzing of every server-side entry point a client's bytes reach.

One malicious client may send anything; it must only get itself excluded. So every mutated
input below must either be accepted or raise a ClientInputError subclass (no other exception,
no crash), and the process's peak memory must stay flat. Inputs are mutations of real
messages, fully determined by SEED (the CKKS ones come from a seeded SEAL PRNG):

- envelopes through ``Envelope.from_bytes`` and every accessor: bit flips, truncations,
  extensions, header JSON mutations (deep nesting, huge and non-finite numbers, wrong types,
  field-length and header-length lies), config payload mutations, random bytes;
- plain vector uploads and a decryptor's reply through ``Exchange.ask`` over an
  ``InProcessTransport`` (next to an honest client), loaded by ``PlainServer.load`` or read
  as the revealed vector;
- CKKS uploads through ``CKKSServer.load`` (directly and through ``Exchange.ask``) and
  aggregates through a decryptor's ``load_ciphertexts``: the SEAL header's size field,
  compression mode and other bytes, body bit flips, truncations, extensions, zero length,
  forged zstd frames carrying lying ciphertext metadata, zstd bombs, wrong part counts.
  These run in a subprocess, so that a crash inside SEAL fails the test instead of pytest.

Run ``pytest -s`` to see the figures (inputs, accepted and refused per category, peak RSS).
"""

from __future__ import annotations

import collections
import json
import random
import re
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.plain import PlainServer
from secagg.errors import ClientInputError
from secagg.server.audit import AuditLog
from secagg.server.exchange import Exchange
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope
from tests.security import forge

SEED = 20_250_601
#: inputs per category (13,400 in all)
COUNTS = {
    "envelope -> Envelope.from_bytes": 6000,
    "plain upload -> Exchange.ask + PlainServer.load": 2000,
    "decryptor reply -> Exchange.ask + vector": 1000,
    "ckks upload -> CKKSServer.load": 3200,
    "ckks upload -> Exchange.ask + CKKSServer.load": 600,
    "aggregate -> decryptor's load_ciphertexts": 600,
}
MAX_RSS_GROWTH_MB = 300
ROUND, BAD, N_VALUES = 3, "client_bad", 8


class Tally:
    """Per category: inputs, accepted, refused by error type, and anything else (failures)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.failures: list[str] = []

    def record(self, category: str, mutation: str, run: Callable[[], Any]) -> None:
        row = self.rows.setdefault(
            category, {"inputs": 0, "accepted": 0, "refused": collections.Counter()}
        )
        row["inputs"] += 1
        try:
            outcome = run()  # exchange_once: the type of the exclusion, or None
            refused = outcome if isinstance(outcome, str) else None
        except ClientInputError as exc:
            refused = type(exc).__name__
        except Exception as exc:  # the point of the test: nothing else may escape
            self.failures.append(f"{category} / {mutation}: {type(exc).__name__}: {exc}"[:300])
            return
        if refused:
            row["refused"][refused] += 1
        else:
            row["accepted"] += 1

    def as_json(self) -> dict[str, Any]:
        rows = {c: {**r, "refused": dict(r["refused"])} for c, r in self.rows.items()}
        return {"rows": rows, "failures": self.failures}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- envelope mutations ------------------------------------------------------------------------
SPECIAL_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 5000, "1" * 4000]
SPECIAL_VALUES: list[Any] = [
    -1,
    0,
    2**31,
    2**63,
    2**64,
    -(2**63),
    1.5,
    1e308,
    True,
    None,
    "",
    "x" * 300,
    "\ud800",
    [],
    {},
    [1, -2],
    {"a": 1},
]


def deep_text(depth: int, rng: random.Random) -> str:
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    return opener * depth + "0" + closer * depth


def split_envelope(data: bytes) -> tuple[dict[str, Any], bytes]:
    (head_len,) = struct.unpack_from(">I", data, 6)
    return json.loads(data[10 : 10 + head_len]), data[10 + head_len :]


def join_envelope(header_text: bytes, payload: bytes, head_len: int | None = None) -> bytes:
    n = len(header_text) if head_len is None else head_len
    return struct.pack(">4sHI", wire.MAGIC, wire.WIRE_VERSION, n) + header_text + payload


def encode_header(header: dict[str, Any], rng: random.Random, raw_tokens: dict[str, str]) -> bytes:
    """json.dumps, then placeholders replaced by text it cannot write (deep, NaN, huge)."""
    text = json.dumps(header)
    for placeholder, token in raw_tokens.items():
        text = text.replace(json.dumps(placeholder), token)
    return text.encode("utf-8", errors="surrogatepass")


def mutate_header_json(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    header, payload = split_envelope(data)
    tokens: dict[str, str] = {}

    def special() -> Any:
        roll = rng.random()
        if roll < 0.3:
            tokens[f"__raw{len(tokens)}__"] = deep_text(rng.choice([33, 64, 1000, 100_000]), rng)
            return list(tokens)[-1]
        if roll < 0.5:
            tokens[f"__raw{len(tokens)}__"] = rng.choice(SPECIAL_NUMBERS)
            return list(tokens)[-1]
        return rng.choice(SPECIAL_VALUES)

    specs = header["fields"]
    op = rng.choice(["top value", "field value", "drop key", "add key", "fields shape", "nbytes"])
    if op == "top value":
        header[rng.choice(list(header))] = special()
    elif op == "field value" and specs:
        spec = rng.choice(specs)
        spec[rng.choice([*spec, "dtype", "parts"])] = special()
    elif op == "drop key":
        target = rng.choice([header, *specs])
        target.pop(rng.choice(list(target)))
    elif op == "add key":
        rng.choice([header, *specs])[rng.choice(["x", "fields", "parts", "kind"])] = special()
    elif op == "fields shape":
        choice = rng.randrange(4)
        if choice == 0 and specs:
            specs.append(dict(rng.choice(specs)))  # repeated name
        elif choice == 1 and specs:
            specs.pop(rng.randrange(len(specs)))
        elif choice == 2:
            rng.shuffle(specs)
        else:
            spec = rng.choice(specs) if specs else {}
            spec["kind"] = rng.choice([*wire.KINDS, "bogus"])
    else:  # field-length lies
        if specs:
            spec = rng.choice(specs)
            lie = rng.choice([-1, 1, rng.randint(-16, 16), 2**40, 10**30, -spec["nbytes"]])
            spec["nbytes"] = spec["nbytes"] + lie
            if "parts" in spec and rng.random() < 0.5:
                spec["parts"] = [p + rng.randint(-2, 2) for p in spec["parts"]]
    return f"header json: {op}", join_envelope(encode_header(header, rng, tokens), payload)


def mutate_config_payload(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    header, payload = split_envelope(data)
    body = rng.choice(
        [
            deep_text(rng.choice([33, 100_000]), rng),
            '{"x": ' + rng.choice(SPECIAL_NUMBERS) + "}",
            "[1, 2]",
            '"text"',
            "{",
            '{"x": "\\ud800"}',
            '{"a": 1, "a": 2}',
            '{"x": "' + "y" * (wire.MAX_CONFIG_BYTES + 1) + '"}',
        ]
    ).encode()
    specs = [s for s in header["fields"] if s["kind"] == wire.CONFIG]
    if not specs:
        header["fields"].append({"name": "extra", "kind": wire.CONFIG, "nbytes": 0})
        specs = header["fields"][-1:]
    # rebuild the payload with the config field replaced
    blobs, pos = {}, 0
    for spec in header["fields"]:
        blobs[spec["name"]] = payload[pos : pos + spec["nbytes"]]
        pos += spec["nbytes"]
    blobs[specs[0]["name"]] = body
    specs[0]["nbytes"] = len(body)
    new_payload = b"".join(blobs[s["name"]] for s in header["fields"])
    return "config payload", join_envelope(json.dumps(header).encode(), new_payload)


def mutate_envelope(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    roll = rng.random()
    if roll < 0.2:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return "bit flips", bytes(out)
    if roll < 0.3:
        return "truncation", data[: rng.randrange(len(data))]
    if roll < 0.4:
        return "extension", data + rng.randbytes(rng.randint(1, 64))
    if roll < 0.7:
        return mutate_header_json(data, rng)
    if roll < 0.8:
        return mutate_config_payload(data, rng)
    if roll < 0.9:  # header-length lies, and the frame's other fields
        header, payload = split_envelope(data)
        text = json.dumps(header).encode()
        lie = rng.choice([len(text) + rng.randint(-20, 20), 2**32 - 1, (1 << 20) + 1, 0])
        frame = bytearray(join_envelope(text, payload, head_len=max(lie, 0)))
        if rng.random() < 0.3:
            frame[rng.randrange(6)] ^= 1 << rng.randrange(8)  # magic and version
        return "header length / frame", bytes(frame)
    start = rng.choice([b"", wire.MAGIC, wire.MAGIC + b"\x00\x01"])
    return "random bytes", start + rng.randbytes(rng.randint(0, 300))


def base_envelopes(phase: str = "train") -> list[bytes]:
    g = np.linspace(-1, 1, N_VALUES)
    upload = {"pseudo_gradient": wire.vector(g), "n_samples": wire.scalar(10)}
    bases = [
        upload,
        {"pseudo_gradient": wire.vector(g.astype(np.float32)), "n_samples": wire.scalar(3)},
        {**upload, "meta": wire.config({"a": [1, {"b": "x"}], "lr": 0.1})},
        {
            "pseudo_gradient": wire.ciphertext([b"abc" * 10, b"", b"xyz"]),
            "n_samples": wire.scalar(1),
        },
    ]
    return [Envelope(BAD, "server", ROUND, phase, f).to_bytes() for f in bases]


def read_all(env: Envelope) -> None:
    """Every accessor on every field, as a server would read them."""
    for name, f in env.fields.items():
        if f.kind == wire.VECTOR:
            env.vector(name)
        elif f.kind == wire.SCALAR:
            env.scalar(name)
        elif f.kind == wire.CONFIG:
            env.config(name)
        else:
            env.ciphertext_parts(name)


def exchange_once(
    phase: str, raw: bytes, honest: bytes, expect: dict[str, str], on_reply
) -> str | None:
    """One exchange with an honest client and the fuzzed one; its error type, or None."""
    transport = InProcessTransport({"client_0": lambda data: honest, BAD: lambda data: raw})
    ex = Exchange(ROUND, ["client_0", BAD], transport, AuditLog())
    replies = ex.ask(phase, {"client_0": {}, BAD: {}}, expect=expect, on_reply=on_reply)
    assert "client_0" in replies  # the honest client is never hurt
    if BAD in replies:
        return None
    match = re.match(rf"{phase}: (\w+): ", ex.excluded[BAD])
    assert match, ex.excluded[BAD]
    return match.group(1)


def honest_reply(fields: dict[str, wire.Field], phase: str) -> bytes:
    return Envelope("client_0", "server", ROUND, phase, fields).to_bytes()


def fuzz_envelopes(tally: Tally, counts: dict[str, int]) -> None:
    rng = random.Random(SEED)
    bases = base_envelopes()
    category = "envelope -> Envelope.from_bytes"
    for _ in range(counts[category]):
        mutation, data = mutate_envelope(rng.choice(bases), rng)
        tally.record(category, mutation, lambda: read_all(Envelope.from_bytes(data)))

    plain = PlainServer()
    category = "plain upload -> Exchange.ask + PlainServer.load"
    honest = honest_reply(
        {"pseudo_gradient": wire.vector(np.ones(N_VALUES)), "n_samples": wire.scalar(5)}, "train"
    )
    expect = {"pseudo_gradient": wire.VECTOR, "n_samples": wire.SCALAR}

    def load(client, env):
        return plain.load(env, "pseudo_gradient", N_VALUES), env.scalar("n_samples")

    for _ in range(counts[category]):
        mutation, data = mutate_envelope(rng.choice(bases[:2]), rng)
        tally.record(category, mutation, lambda: exchange_once("train", data, honest, expect, load))

    category = "decryptor reply -> Exchange.ask + vector"
    reveal = [
        Envelope(BAD, "server", ROUND, "reveal", {"global_update": wire.vector(v)}).to_bytes()
        for v in (np.linspace(0, 1, N_VALUES), np.ones(N_VALUES, dtype=np.float32))
    ]
    honest = honest_reply({"global_update": wire.vector(np.zeros(N_VALUES))}, "reveal")
    expect = {"global_update": wire.VECTOR}
    for _ in range(counts[category]):
        mutation, data = mutate_envelope(rng.choice(reveal), rng)
        tally.record(
            category,
            mutation,
            lambda: exchange_once(
                "reveal", data, honest, expect, lambda c, env: env.vector("global_update", N_VALUES)
            ),
        )


# ---- CKKS mutations (run in a subprocess: see ckks_main) -----------------------------------------
def seeded_uploads(n: int) -> tuple[list[bytes], bytes]:
    """n seeded uploads and one weighted sum of them, byte-for-byte the same on every run:
    the key and the encryptions come from a SEAL PRNG seeded with SEED."""
    import tenseal.sealapi as seal

    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import PublicCKKS, to_bytes

    preset = get_preset("compact")
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(preset.poly_modulus_degree)
    parms.set_coeff_modulus(
        seal.CoeffModulus.Create(preset.poly_modulus_degree, list(preset.coeff_bits))
    )
    parms.set_random_generator(seal.Blake2xbPRNGFactory([SEED, 1, 2, 3, 4, 5, 6, 7]))
    context = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    encryptor = seal.Encryptor(context, seal.KeyGenerator(context).secret_key())
    encoder = seal.CKKSEncoder(context)
    uploads = []
    for k in range(n):
        pt = seal.Plaintext()
        values = np.sin(np.arange(preset.poly_modulus_degree // 2) + k) * 0.5
        encoder.encode(values.tolist(), 2.0**preset.scale_bits, pt)
        uploads.append(to_bytes(encryptor.encrypt_symmetric(pt)))
    public = PublicCKKS(preset)
    cts = [public.load_ciphertexts([u], N_VALUES) for u in uploads]
    total = public.weighted_sum(cts, [1 / n] * n)
    return uploads, to_bytes(total[0])


def mutate_raw_ciphertext(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Lies inside the uncompressed ciphertext (to be wrapped in a valid zstd frame)."""
    at = rng.choice(
        [
            (forge.CT_SIZE_AT, [0, 1, 3, 16, 17, 2**32, 2**64 - 1]),
            (forge.CT_N_AT, [0, 1, 2048, 8192, 2**40]),
            (forge.CT_L_AT, [0, 1, 3, 64, 2**40]),
            (forge.CT_COUNT_AT, [0, 1, 8191, 8193, 16384, 2**27, 2**40, 2**64 - 1]),
            (forge.CT_DATA_HEADER_AT + 8, [0, 16, 24, 2**40, len(raw)]),  # data array's size
            (len(raw) - 73, [0, 17, 81, 2**40]),  # a seeded one's PRNG-info size
        ]
    )
    roll = rng.random()
    if roll < 0.5:
        offset, values = at
        return f"raw u64 at {offset}", forge.with_u64(raw, offset, rng.choice(values))
    out = bytearray(raw)
    if roll < 0.6:  # a nested header's compression mode or version
        offset = rng.choice([forge.CT_DATA_HEADER_AT, len(raw) - 81])
        out[offset + rng.choice([3, 4, 6])] = rng.choice([0, 1, 2, 3, 255])
        return "raw nested header byte", bytes(out)
    if roll < 0.8:
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(120) if rng.random() < 0.7 else rng.randrange(len(out))
            out[pos] ^= 1 << rng.randrange(8)
        return "raw bit flips", bytes(out)
    if roll < 0.9:
        return "raw truncation", raw[: rng.randrange(len(raw))]
    return "raw extension", raw + rng.randbytes(rng.randint(1, 200))


def mutate_ciphertext(blob: bytes, raw: bytes, rng: random.Random) -> tuple[str, list[bytes]]:
    roll = rng.random()
    out = bytearray(blob)
    if roll < 0.12:
        value = rng.choice(
            [0, 1, 15, 16, len(blob) - 1, len(blob) + 1, len(blob) + rng.randint(2, 1000)]
            + [2**40, 2**63, 2**64 - 1, rng.getrandbits(64)]
        )
        return "header size field", [forge.with_u64(blob, 8, value)]
    if roll < 0.2:
        out[6] = rng.choice([0, 1, 3, 4, 255, rng.randrange(256)])
        return "header compr_mode", [bytes(out)]
    if roll < 0.27:
        out[rng.choice([0, 1, 2, 3, 4, 5, 7])] ^= 1 << rng.randrange(8)
        return "header magic/size/version/reserved", [bytes(out)]
    if roll < 0.45:
        for _ in range(rng.randint(1, 16)):
            out[rng.randrange(16, len(out))] ^= 1 << rng.randrange(8)
        return "body bit flips", [bytes(out)]
    if roll < 0.53:
        cut = rng.choice([0, rng.randrange(17), rng.randrange(len(blob))])
        cut_blob = blob[:cut]
        if cut >= 16 and rng.random() < 0.5:
            cut_blob = forge.with_u64(cut_blob, 8, cut)  # a consistent header
        return "truncation", [cut_blob]
    if roll < 0.58:
        longer = blob + rng.randbytes(rng.randint(1, 4096))
        if rng.random() < 0.5:
            longer = forge.with_u64(longer, 8, len(longer))
        return "extension", [longer]
    if roll < 0.6:
        return "zero length", [b""]
    if roll < 0.82:
        mutation, forged = mutate_raw_ciphertext(raw, rng)
        return f"forged frame: {mutation}", [forge.seal_blob(forge.zstd_raw_frame(forged))]
    if roll < 0.88:
        nbytes = rng.choice([100, 4096, 65_730, rng.randint(20, 131_000)])
        body = forge.zstd_rle_bomb(nbytes, rng.choice([forge.BLOCK_MAX, rng.randint(1, 1 << 17)]))
        return "zstd bomb", [forge.seal_blob(body)]
    if roll < 0.92:
        mode = rng.choice([0, 1, 2])
        body = raw if mode == 0 else forge.zstd_raw_frame(raw)
        return "other framing", [forge.seal_blob(body, compr_mode=mode)]
    if roll < 0.96:
        return "random body", [forge.seal_blob(rng.randbytes(rng.randint(0, 70_000)))]
    return "part count", [blob] * rng.choice([0, 2, 3])


def fuzz_ckks(tally: Tally, counts: dict[str, int]) -> None:
    from secagg.backends.ckks_server import CKKSServer
    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import raw_body

    rng = random.Random(SEED + 1)
    uploads, summed = seeded_uploads(3)
    raws = {b: raw_body(b, 1 << 20, "base") for b in [*uploads, summed]}
    server = CKKSServer(get_preset("compact"))

    def as_envelope(parts: list[bytes]) -> Envelope:
        return Envelope(BAD, "server", ROUND, "train", {"pseudo_gradient": wire.ciphertext(parts)})

    category = "ckks upload -> CKKSServer.load"
    for _ in range(counts[category]):
        blob = rng.choice([*uploads, summed])
        mutation, parts = mutate_ciphertext(blob, raws[blob], rng)
        env = as_envelope(parts)
        tally.record(category, mutation, lambda: server.load(env, "pseudo_gradient", N_VALUES))

    category = "ckks upload -> Exchange.ask + CKKSServer.load"
    fields = {"pseudo_gradient": wire.ciphertext([uploads[0]]), "n_samples": wire.scalar(5)}
    honest = honest_reply(fields, "train")
    expect = {"pseudo_gradient": wire.CIPHERTEXT, "n_samples": wire.SCALAR}

    def load(client, env):
        return server.load(env, "pseudo_gradient", N_VALUES)

    for _ in range(counts[category]):
        blob = rng.choice(uploads)
        mutation, parts = mutate_ciphertext(blob, raws[blob], rng)
        data = Envelope(
            BAD, "server", ROUND, "train", {**fields, "pseudo_gradient": wire.ciphertext(parts)}
        ).to_bytes()
        if rng.random() < 0.2:
            extra, data = mutate_envelope(data, rng)
            mutation += f" + envelope {extra}"
        tally.record(category, mutation, lambda: exchange_once("train", data, honest, expect, load))

    category = "aggregate -> decryptor's load_ciphertexts"
    for _ in range(counts[category]):
        mutation, parts = mutate_ciphertext(summed, raws[summed], rng)
        tally.record(
            category,
            mutation,
            lambda: server.public.load_ciphertexts(parts, N_VALUES, aggregate=True),
        )


def ckks_main() -> None:
    """The SEAL part, in its own process: prints the tally and peak RSS as JSON."""
    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import PublicCKKS

    uploads, _ = seeded_uploads(1)
    PublicCKKS(get_preset("compact")).load_ciphertexts(uploads, N_VALUES)  # warm up SEAL
    tally, before, start = Tally(), peak_rss_mb(), time.perf_counter()
    fuzz_ckks(tally, COUNTS)
    result = tally.as_json()
    result.update(rss_before=before, rss_after=peak_rss_mb(), seconds=time.perf_counter() - start)
    print(json.dumps(result))


def report(title: str, result: dict[str, Any]) -> None:
    print(f"\n{title}: peak RSS {result['rss_before']:.0f} -> {result['rss_after']:.0f} MB")
    for category, row in result["rows"].items():
        refused = ", ".join(f"{k} {v}" for k, v in sorted(row["refused"].items()))
        print(
            f"  {category}: {row['inputs']} inputs, {row['accepted']} accepted, "
            f"{sum(row['refused'].values())} refused ({refused})"
        )
    print(f"  {len(result['failures'])} other exceptions, in {result['seconds']:.1f} s")


def check(result: dict[str, Any], categories: list[str]) -> None:
    assert not result["failures"], "\n".join(result["failures"][:20])
    assert {c: result["rows"][c]["inputs"] for c in categories} == {
        c: COUNTS[c] for c in categories
    }
    assert result["rss_after"] - result["rss_before"] < MAX_RSS_GROWTH_MB


def test_fuzzed_envelopes_plain_uploads_and_decryptor_replies_are_accepted_or_typed():
    tally, before, start = Tally(), peak_rss_mb(), time.perf_counter()
    fuzz_envelopes(tally, COUNTS)
    result = tally.as_json()
    result.update(rss_before=before, rss_after=peak_rss_mb(), seconds=time.perf_counter() - start)
    report("envelopes (in process)", result)
    check(result, list(COUNTS)[:3])


def run_fuzzer(module: str, arg: str, timeout: int = 300) -> dict[str, Any]:
    """``python -m module arg`` from the repository root: a crash inside SEAL fails the
    test instead of pytest. Returns the tally it printed last."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", module, arg],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"the fuzzer crashed ({done.returncode}): {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fuzzed_ckks_uploads_and_aggregates_are_accepted_or_typed_without_a_crash():
    result = run_fuzzer("tests.security.test_fuzz", "ckks")
    report("ckks (subprocess)", result)
    check(result, list(COUNTS)[3:])


if __name__ == "__main__" and sys.argv[1:] == ["ckks"]:
    ckks_main()
