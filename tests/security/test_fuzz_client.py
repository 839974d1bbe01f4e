"""Seeded fuzzing of what a deviating server sends a client: key setup and releases.

A client must refuse anything it cannot check with one of the project's typed errors
(``SecaggError``: KeySetupError, ReleaseRefused, MalformedCiphertext, ...), never another
exception and never a crash, with its memory flat. Inputs are mutations of real requests,
determined by SEED (the keys are fresh each run, so the counts of each refusal vary a little):

- key setup (``key_hello``, ``key_generate``, ``key_install``) through the client's handlers:
  envelope mutations (``test_fuzz.mutate_envelope``), setup and peer configs of the wrong
  shape or type, wrapped keys with bit flips, truncations and random bytes;
- consent requests: descriptors with fields missing, of the wrong types, lying counts,
  other clients' digests, duplicate entries;
- reveal and open requests: the aggregate's ciphertexts mutated
  (``test_fuzz.mutate_ciphertext``), seeds flipped, truncated or swapped, consents missing
  or garbled, descriptors edited after the consents were signed.

This runs in a subprocess (SEAL loads the mutated key and ciphertext bytes); ``pytest -s``
prints the figures.
"""

from __future__ import annotations

import base64
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from secagg import wire
from secagg.errors import SecaggError
from secagg.wire import Envelope
from tests.security.test_fuzz import (
    SPECIAL_VALUES,
    Tally,
    mutate_ciphertext,
    mutate_envelope,
    peak_rss_mb,
    report,
    run_fuzzer,
)

SEED = 20_261_122
COUNTS = {
    "key setup request -> client": 1500,
    "consent request -> client": 1500,
    "reveal or open request -> client": 1000,
}
MAX_RSS_GROWTH_MB = 300
IDS = ["client_0", "client_1", "client_2"]
N_VALUES = 8


class ClientTally(Tally):
    """A refusal is any of the project's own errors (a client raises these to refuse)."""

    def record(self, category: str, mutation: str, run: Callable[[], Any]) -> None:
        def typed():
            try:
                run()
            except SecaggError as exc:
                return type(exc).__name__
            return None

        super().record(category, mutation, typed)


def garble(value: Any, rng: random.Random) -> Any:
    """A JSON value replaced by another type, or a dict with a key dropped, changed or added."""
    if isinstance(value, dict) and value and rng.random() < 0.6:
        out = dict(value)
        key = rng.choice(list(out))
        roll = rng.random()
        if roll < 0.3:
            del out[key]
        elif roll < 0.8:
            out[key] = garble(out[key], rng)
        else:
            out[rng.choice(["extra", key + "x"])] = rng.choice(SPECIAL_VALUES)
        return out
    if isinstance(value, list) and value and rng.random() < 0.6:
        out = list(value)
        i = rng.randrange(len(out))
        roll = rng.random()
        if roll < 0.3:
            del out[i]
        elif roll < 0.6:
            out.append(out[i])  # a duplicate entry
        else:
            out[i] = garble(out[i], rng)
        return out
    return rng.choice(SPECIAL_VALUES)


def request(to: str, phase: str, fields: dict[str, wire.Field]) -> bytes:
    return Envelope("server", to, 0, phase, fields).to_bytes()


def answer(client, data: bytes) -> None:
    """What a client does with bytes from the server: decode, then its handler."""
    env = Envelope.from_bytes(data)
    handler = client.handlers().get(env.phase)
    if handler is None:
        raise SecaggError(f"no phase {env.phase!r}")  # the runtime's own refusal
    handler(env)


def parts_of(fields: dict[str, wire.Field], name: str) -> list[bytes]:
    env = Envelope.from_bytes(Envelope("server", "c", 0, "p", {name: fields[name]}).to_bytes())
    return [bytes(p) for p in env.ciphertext_parts(name)]


def mutated_config(fields: dict[str, wire.Field], name: str, rng: random.Random):
    cfg = json.loads(bytes(fields[name].data))
    return {**fields, name: wire.config(garble(cfg, rng))}


def fuzz_key_setup(tally: ClientTally, count: int, rng: random.Random) -> None:
    from secagg.backends import make_backends
    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import params_fingerprint

    preset = get_preset("compact")
    setup = wire.config({"preset": preset.name, "params": params_fingerprint(preset)})
    _, clients = make_backends("ckks", IDS)
    leader = clients["client_0"]
    wrapped = leader.handlers()["key_generate"](
        Envelope(
            "server",
            "client_0",
            0,
            "key_generate",
            {"setup": setup, "peers": wire.config({"ids": IDS[1:]})},
        )
    )["wrapped_key.client_1"]
    bases = {
        "key_hello": {"setup": setup},
        "key_generate": {"setup": setup, "peers": wire.config({"ids": IDS[1:]})},
        "key_install": {
            "setup": setup,
            "leader": wire.config({"id": "client_0"}),
            "wrapped_key": wrapped,
        },
    }
    category = "key setup request -> client"
    for i in range(count):
        if i % 50 == 0:  # fresh clients now and then: setup happens once per client
            _, clients = make_backends("ckks", IDS)
        phase = rng.choice(list(bases))
        fields = dict(bases[phase])
        roll = rng.random()
        if roll < 0.4:
            name = rng.choice([n for n in fields if fields[n].kind == wire.CONFIG])
            fields, mutation = mutated_config(fields, name, rng), f"{phase} {name} config"
            data = request("client_1", phase, fields)
        elif roll < 0.7 and phase == "key_install":
            blob = bytearray(bytes(wrapped.data))
            op = rng.choice(["flip", "truncate", "random", "extend"])
            if op == "flip":
                blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
            elif op == "truncate":
                blob = blob[: rng.randrange(len(blob))]
            elif op == "random":
                blob = bytearray(rng.randbytes(rng.randint(0, 200)))
            else:
                blob += rng.randbytes(rng.randint(1, 64))
            fields["wrapped_key"] = wire.ciphertext(bytes(blob))
            mutation, data = f"wrapped key {op}", request("client_1", phase, fields)
        else:
            extra, data = mutate_envelope(request("client_1", phase, fields), rng)
            mutation = f"{phase} envelope {extra}"
        tally.record(category, mutation, lambda: answer(clients["client_1"], data))


def fuzz_releases(tally: ClientTally, counts: dict[str, int], rng: random.Random) -> None:
    from secagg.ckks.public import raw_body
    from tests.harness import BackendRound

    run = BackendRound(IDS, N_VALUES, decryption_budget=10**6, open_budget=10**6)
    for client in run.clients.values():
        client.releases_per_upload = {"reveal": 10**6, "open": 10**6}  # keep answering

    def fresh_release(kind: str):
        ctx = run.ctx()
        handles = run.uploads({c: np.full(N_VALUES, 0.1) for c in IDS})
        total = ctx.weighted_sum(handles, dict.fromkeys(IDS, 1 / 3))
        field = "aggregate" if kind == "reveal" else "g_hat"
        return run.server._release_fields(ctx, total, "global_update", kind, field), field

    category = "consent request -> client"
    releases = [fresh_release("reveal")[0] for _ in range(3)]
    for _ in range(counts[category]):
        info = json.loads(bytes(rng.choice(releases)["aggregate.release"].data))
        descriptor = garble(info["descriptor"], rng)
        fields = {"release": wire.config(descriptor)}
        data = request("client_1", "consent", fields)
        mutation = "descriptor"
        if rng.random() < 0.2:
            extra, data = mutate_envelope(data, rng)
            mutation += f" + envelope {extra}"
        tally.record(category, mutation, lambda: answer(run.clients["client_1"], data))

    category = "reveal or open request -> client"
    made = [fresh_release(kind) for kind in ("reveal", "open", "reveal")]
    for _ in range(counts[category]):
        fields, field = rng.choice(made)
        phase = "reveal" if field == "aggregate" else "larc_probe"
        fields = dict(fields)
        roll = rng.random()
        if roll < 0.35:
            parts = parts_of(fields, field)
            raw = raw_body(parts[0], 1 << 20, "base")
            mutation, new = mutate_ciphertext(parts[0], raw, rng)
            fields[field] = wire.ciphertext(new)
            mutation = f"aggregate {mutation}"
        elif roll < 0.55:
            seeds = [bytearray(p) for p in parts_of(fields, f"{field}.seeds")]
            i = rng.randrange(len(seeds))
            op = rng.choice(["flip", "truncate", "swap", "drop"])
            if op == "flip" and seeds[i]:
                seeds[i][rng.randrange(len(seeds[i]))] ^= 1 << rng.randrange(8)
            elif op == "truncate":
                seeds[i] = seeds[i][: rng.randrange(len(seeds[i]) + 1)]
            elif op == "swap":
                seeds.reverse()
            else:
                del seeds[i]
            fields[f"{field}.seeds"] = wire.ciphertext([bytes(s) for s in seeds])
            mutation = f"seeds {op}"
        elif roll < 0.85:
            info = json.loads(bytes(fields[f"{field}.release"].data))
            if rng.random() < 0.5:
                info = garble(info, rng)
            else:
                sig = rng.choice([b"", rng.randbytes(64), rng.randbytes(7)])
                info["consents"][rng.choice(IDS)] = base64.b64encode(sig).decode()
            fields[f"{field}.release"] = wire.config(info)
            mutation = "release config"
        else:
            extra, data = mutate_envelope(request("client_1", phase, fields), rng)
            tally.record(
                category, f"envelope {extra}", lambda: answer(run.clients["client_1"], data)
            )
            continue
        data = request("client_1", phase, fields)
        client = run.clients["client_1"]
        if phase == "reveal":
            tally.record(category, mutation, lambda: answer(client, data))
        else:
            tally.record(
                category,
                mutation,
                lambda: client.open(Envelope.from_bytes(data), field, N_VALUES),
            )


def client_main() -> None:
    tally, before, start = ClientTally(), peak_rss_mb(), time.perf_counter()
    rng = random.Random(SEED)
    fuzz_key_setup(tally, COUNTS["key setup request -> client"], rng)
    fuzz_releases(tally, COUNTS, rng)
    result = tally.as_json()
    result.update(rss_before=before, rss_after=peak_rss_mb(), seconds=time.perf_counter() - start)
    print(json.dumps(result))


def test_fuzzed_key_setup_and_release_requests_are_refused_with_typed_errors():
    result = run_fuzzer("tests.security.test_fuzz_client", "client", timeout=600)
    report("client side (subprocess)", result)
    assert not result["failures"], "\n".join(result["failures"][:20])
    assert {c: result["rows"][c]["inputs"] for c in COUNTS} == COUNTS
    assert result["rss_after"] - result["rss_before"] < MAX_RSS_GROWTH_MB
    # the mutations reach the checks: most inputs are refused, some (harmless edits) pass
    for category in COUNTS:
        assert sum(result["rows"][category]["refused"].values()) > COUNTS[category] // 2


if __name__ == "__main__" and sys.argv[1:] == ["client"]:
    client_main()
