"""A real encrypted backend's server half and client halves joined by an in-process transport.

The server's own phases (key setup, consent, reveal) reach the clients' handlers as
serialised envelopes, so a test forms releases exactly as a run does, and a deviating server
is a test that calls the same pieces with other arguments (or edits what they produce).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends import make_backends
from secagg.ckks.release import Descriptor, consent_message
from secagg.server.audit import AuditLog
from secagg.server.exchange import Exchange
from secagg.server.round import RoundContext
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope, Field

#: a planned weighting of three clients, and each client's values under it (its sum is known)
PLAN = {"client_0": 0.5, "client_1": 0.25, "client_2": 0.25}


def planned_values(n: int = 5000) -> dict[str, np.ndarray]:
    return {c: np.linspace(-0.3, 0.3, n) * (i + 1) for i, c in enumerate(PLAN)}


def planned_sum(values: dict[str, np.ndarray]) -> np.ndarray:
    return sum(PLAN[c] * values[c] for c in PLAN)


class BackendRound:
    def __init__(self, ids: list[str], n_values: int, backend: str = "ckks", **options: Any):
        self.server, self.clients = make_backends(backend, ids, **options)
        self.n_values = n_values
        self.round = 0
        self.audit = AuditLog()
        self.transport = InProcessTransport({c: self._handler(c) for c in ids})
        self.server.setup(self.ctx(), 0)

    def _handler(self, client: str):
        def handle(data: bytes) -> bytes:
            env = Envelope.from_bytes(data)
            reply = self.clients[client].handlers()[env.phase](env)
            return Envelope(client, "server", env.round, env.phase, reply).to_bytes()

        return handle

    def ctx(self) -> RoundContext:
        exchange = Exchange(self.round, list(self.clients), self.transport, self.audit)
        return RoundContext(exchange, self.n_values, self.server, None)

    def upload(self, client: str, values: np.ndarray, weight: float | None = None) -> Any:
        """``client`` protects ``values`` (times ``weight``, on a client-weighted preset);
        the server loads the upload (a handle)."""
        field = self.protect(client, values, weight)
        env = Envelope(client, "server", self.round, "train", {"pseudo_gradient": field})
        return self.server.load(Envelope.from_bytes(env.to_bytes()), "pseudo_gradient", values.size)

    def protect(self, client: str, values: np.ndarray, weight: float | None = None) -> Field:
        return self.clients[client].protect(np.asarray(values, dtype=np.float64), weight)

    def uploads(
        self, values: dict[str, np.ndarray], weights: dict[str, float] | None = None
    ) -> dict[str, Any]:
        return {c: self.upload(c, v, (weights or {}).get(c)) for c, v in values.items()}

    def reveal_running_sum(self, handles: dict[str, Any], plan: dict[str, float]) -> np.ndarray:
        """The server adds the uploads as they arrive (a running sum of planned weights, as a
        streaming round does) and has the sum revealed."""
        ctx = self.ctx()
        total = ctx.running_sum(plan)
        for c in plan:
            total.add(c, handles[c])
        return ctx.reveal(total.result(), "global_update")

    def request(self, to: str, phase: str, fields: dict[str, Field]) -> Envelope:
        """A request from the server to ``to``, as the client receives it."""
        return Envelope.from_bytes(Envelope("server", to, self.round, phase, fields).to_bytes())

    def ask(self, to: str, phase: str, fields: dict[str, Field]) -> dict[str, Field]:
        """The client's answer to a request (its handler's exceptions propagate)."""
        return self.clients[to].handlers()[phase](self.request(to, phase, fields))


def collude(r: BackendRound, client: str) -> None:
    """``client``'s modified software consents to any release that lists it."""
    me = r.clients[client]

    def sign_anything(env: Envelope) -> dict[str, Field]:
        d = Descriptor.from_config(env.config("release"))
        signature = me._signer.sign(consent_message(client, d))
        return {"consent": wire.config({"signature": base64.b64encode(signature).decode()})}

    me.on_consent = sign_anything


class RecordingTransport(InProcessTransport):
    """The clients' real handlers (from an experiment's client factory), with every request
    and its reply kept as envelopes: ``log`` is [(client, request, reply)]."""

    def __init__(self, factory, ids: list[str]):
        super().__init__({c: client.handle for c, client in factory(ids).items()})
        self.log: list[tuple[str, Envelope, Envelope]] = []

    def request(self, peer: str, data: bytes) -> bytes:
        reply = super().request(peer, data)
        self.log.append((peer, Envelope.from_bytes(data), Envelope.from_bytes(reply)))
        return reply


def guesses_won(
    r: BackendRound, victim: str, holders: list[str], size: float, trials: int, seed: int
) -> dict[int, int]:
    """The server and colluding ``holders`` against one threshold upload: in each trial
    the victim uploads one of two known updates (±``size`` in every value, at random) and the
    coalition interpolates its guess of the one-time key from the shares that the first
    t − 1, then the first t, of ``holders`` hold (``len(holders)`` = t), unmasks and
    guesses which. How often each guess was right, by the number of shares it had."""
    from secagg.threshold.params import decode, public_seed

    preset, ring, n = r.server.preset, r.server.ring, r.n_values
    candidates = [np.full(n, size), np.full(n, -size)]
    rng = np.random.default_rng(seed)
    wins = {len(holders) - 1: 0, len(holders): 0}
    for _ in range(trials):
        bit = int(rng.integers(2))
        upload = r.upload(victim, candidates[bit])
        for count in wins:
            xs, shares = [], []
            for h in holders[:count]:
                j = r.server.holders.index(h)
                sealed = upload.sealed[victim][j]
                shares.append(
                    r.clients[h]._unsealed_share("x", victim, upload.entries[0].seeds, sealed, j)
                )
                xs.append(j + 1)
            guess = ring.reconstruct(np.stack(shares), xs)
            decoded = decode(preset, ring.unmask(upload.total, guess, public_seed(preset, "")), n)
            wins[count] += int((decoded.mean() < 0) == bool(bit))
    return wins
