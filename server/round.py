"""One round as a protocol sees it (:class:`~secagg.protocols.base.RoundAPI`).

:class:`RoundContext` puts together the round's messaging (:class:`~secagg.server.exchange.
Exchange`: ask, exclusions) and its aggregation: weighted sums on the backend, running sums
that uploads are folded into as they arrive (:class:`StreamedSum`), and releases — every sum
that leaves the server's protected state (revealed, or sent to clients) is recorded with its
weights, which client-level DP accounts.

Weights are bounded, |w| ≤ 1 (``MAX_WEIGHT``), on every backend: encrypted backends need it
for their headroom, and a protocol whose weights exceed it is wrong on plain too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from secagg import wire
from secagg.backends.base import MAX_WEIGHT, ServerBackend
from secagg.errors import (
    ClientInputError,
    ConfigError,
    DuplicateMessage,
    DuplicateUpload,
    ProtocolStateError,
    RoundAborted,
    UnknownSender,
)
from secagg.protocols.base import Plaintext, Upload
from secagg.protocols.optimizers import ServerOptimizer
from secagg.server.exchange import Exchange
from secagg.wire import Envelope, Field


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    out = {c: float(w) for c, w in weights.items()}
    bad = {c: w for c, w in out.items() if not abs(w) <= MAX_WEIGHT}
    if bad:
        raise ProtocolStateError(
            f"weights must satisfy |w| <= {MAX_WEIGHT} on every backend "
            f"(encrypted sums need the headroom); got {bad}"
        )
    return out


def capped_weights(weights: Mapping[str, float], max_share: float) -> dict[str, float]:
    """The weights with no |w_i| above ``max_share`` of Σ|w| (the clients' release policy,
    ``max_weight_share``), by water-filling: the largest are lowered to the cap, the rest
    keep their ratios, and Σ|w| is kept. Unchanged when already within the cap, for fewer
    than three weights (the clients cap sums of three or more), or where no weighting of this
    many can meet it (the clients then refuse)."""
    out = dict(weights)
    size = {c: abs(w) for c, w in out.items()}
    total = sum(size.values())
    n = len(out)
    if n < 3 or max_share >= 1 or total == 0 or max(size.values()) <= max_share * total:
        return out
    if max_share * n < 1:
        return out
    order = sorted(size, key=lambda c: -size[c])
    for h in range(1, n):
        rest = sum(size[c] for c in order[h:])
        level = max_share * rest / (1 - max_share * h)  # each capped weight, before rescaling
        if size[order[h]] <= level:
            scale = total / (rest + h * level)
            for c in order[:h]:
                out[c] = math.copysign(level * scale, out[c])
            for c in order[h:]:
                out[c] = out[c] * scale
            return out
    return out


def cap_changes(
    wanted: Mapping[str, float], used: Mapping[str, float]
) -> dict[str, tuple[float, float]]:
    """Each client whose share of Σ|w| the cap changed: (its share asked, its share used)."""
    total_wanted = sum(abs(w) for w in wanted.values()) or 1.0
    total_used = sum(abs(w) for w in used.values()) or 1.0
    out = {}
    for client, w in wanted.items():
        asked, got = abs(w) / total_wanted, abs(used[client]) / total_used
        if not math.isclose(asked, got, rel_tol=1e-12, abs_tol=1e-15):
            out[client] = (asked, got)
    return out


class RoundContext:
    """A round for a protocol: the exchange, the backend, and what was released.

    ``max_weight_share``: the clients' cap on one upload's share of a sum's weight (their
    default: 1/2); every sum of two or more is capped to it (:func:`capped_weights`) so the
    clients consent."""

    def __init__(
        self,
        exchange: Exchange,
        n_params: int,
        backend: ServerBackend,
        optimizer: ServerOptimizer | None,
        allow_plaintext_updates: bool = False,
        model: np.ndarray | None = None,
        max_weight_share: float = 0.5,
        epoch: int = 0,
    ):
        self.exchange = exchange
        #: how many rounds before this one moved the model (a skipped round does not): the
        #: uploads of two rounds of one epoch are made from the same model
        self.epoch = epoch
        self.max_weight_share = max_weight_share
        self.model = model  # the global model the round starts from (None: server-blind)
        self.round = exchange.round
        self.n_params = n_params
        self.backend = backend
        self._optimizer = optimizer
        self.allow_plaintext_updates = allow_plaintext_updates
        #: weights of every weighted sum formed this round, and the sums that left the
        #: server's protected state (revealed, or sent to clients): client-level DP accounts
        #: each release with its realised weights
        self._sums: list[tuple[Any, dict[str, float]]] = []
        self._used: dict[int, dict[str, float]] = {}  # id(sum) -> its weights, this round
        self.releases: list[tuple[str, dict[str, float]]] = []
        #: clients whose share of a sum the cap changed this round: (asked, used) shares
        self.capped_shares: dict[str, tuple[float, float]] = {}
        #: digest of each upload loaded this round -> who sent it, under which name
        self._uploads: dict[str, tuple[str, str]] = {}

    # ---- the exchange's view ---------------------------------------------------------------
    @property
    def active(self) -> list[str]:
        return self.exchange.active

    @property
    def excluded(self) -> dict[str, str]:
        return self.exchange.excluded

    @property
    def unanswered(self) -> set[str]:
        """Excluded clients that did not answer, as opposed to refused (dropouts)."""
        return self.exchange.unanswered

    @property
    def seconds(self) -> dict[str, float]:
        return self.exchange.seconds

    def exclude(self, client: str, phase: str, error: Exception) -> None:
        self.exchange.exclude(client, phase, error)

    def ask(
        self,
        phase: str,
        messages: Mapping[str, Mapping[str, Field]],
        expect: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        return self.exchange.ask(phase, messages, expect, **kwargs)

    @property
    def upload_kind(self) -> str:
        return self.backend.upload_kind

    @property
    def server_optimizer(self) -> ServerOptimizer | None:
        return self._optimizer

    # ---- aggregation ------------------------------------------------------------------------
    def weighted_sum(self, handles: Mapping[str, Any], weights: Mapping[str, float]) -> Any:
        clients = [c for c in handles if c in weights and c in self.active]
        if not clients:
            raise RoundAborted(
                f"round {self.round}: no client left to aggregate; exclusions: {self.excluded}",
                round=self.round,
                phase="aggregate",
                exclusions=self.excluded,
            )
        used = self.capped({c: weights[c] for c in clients})
        start = time.perf_counter()
        total = self.backend.weighted_sum([handles[c] for c in clients], [used[c] for c in clients])
        self.seconds["aggregate"] += time.perf_counter() - start
        self.formed(total, used)
        return total

    def forget(self, total: Any) -> None:
        """Drop a sum this round formed and already released (a round in parts: each part's
        sum goes once it is stepped, so the round does not keep every part's)."""
        self._sums = [(t, w) for t, w in self._sums if t is not total]
        self._used.pop(id(total), None)

    def formed(self, total: Any, weights: dict[str, float]) -> None:
        """Record a sum formed this round with these weights (after the cap): what it
        releases is accounted by them, and ``weights_of`` answers for it."""
        self._sums.append((total, weights))
        self._used[id(total)] = weights

    def capped(self, weights: Mapping[str, float]) -> dict[str, float]:
        """``weights`` under the run's cap (:func:`capped_weights`); where the cap changed
        a client's share of the sum, the round records it (``capped_shares``) and the audit
        says so: the algorithm did not get the weights it asked for."""
        wanted = check_weights(weights)
        used = capped_weights(wanted, self.max_weight_share)
        for client, (asked, got) in cap_changes(wanted, used).items():
            self.capped_shares[client] = (asked, got)
            self.exchange.audit.capped(self.round, client, asked, got, self.max_weight_share)
        return used

    def weights_of(self, handle: Any) -> dict[str, float]:
        """The weights a sum of this round was formed with (after the clients' cap)."""
        if id(handle) not in self._used:
            raise ProtocolStateError("weights_of: not a sum formed this round")
        return dict(self._used[id(handle)])

    def running_sum(self, weights: Mapping[str, float], length: int | None = None) -> StreamedSum:
        """A running sum of uploads of ``length`` values (the model's by default; a part's in
        a round in parts)."""
        return StreamedSum(self, weights, length)

    def _released(self, handle: Any, name: str) -> None:
        # every release is recorded, a second one of the same sum too (``larc-lagged``
        # opens its sum for the probe and then reveals it): the DP ledger counts both
        for total, weights in self._sums:
            if total is handle:
                self.releases.append((name, weights))
                return

    def as_fields(self, handle: Any, name: str) -> dict[str, Field]:
        self._released(handle, name)
        fields = self.backend.release(self, handle, name)
        self.exchange.audit.opened(self.round, name)
        return fields

    def loaded(self, client: str, name: str, handle: Any) -> Any:
        """``handle``, the upload ``client`` sent as ``name``, if it is no copy of an upload
        already loaded this round (the same seeds: ``ServerBackend.upload_digests``);
        :class:`~secagg.errors.DuplicateUpload` otherwise. Every upload of a round passes
        here (the training phase's and every later phase's, ``load``), so a client that
        re-sends another's upload as its own is the one excluded, and the upload loaded
        first stands: no release lists one upload twice (which every client refuses)."""
        digests = self.backend.upload_digests(handle)
        for digest in digests:
            if digest in self._uploads:
                first, first_name = self._uploads[digest]
                raise DuplicateUpload(
                    f"{client}'s {name} repeats the upload {first} sent as {first_name} "
                    f"this round (seed digest {digest[:16]}): a copy is refused"
                )
        for digest in digests:
            self._uploads[digest] = (client, name)
        return handle

    def record_release(self, d: Any, policy: Any, groups: Mapping[str, int]) -> None:
        """A release every contributor consented to, for the audit's run view: its weights,
        its stream (the field its uploads came as, and its length), this round's epoch and
        the clients' rules (``policy``, a ``ReleasePolicy``; ``groups``: each contributor's
        participation group, where participation is by groups)."""
        first = d.entries[0][2] if d.entries else ""
        self.exchange.audit.released(
            self.round,
            d,
            f"{self.upload_name(first)}:{d.n_values}",
            self.epoch,
            {
                "colluders": policy.colluders,
                "min_honest": policy.min_contributors,
                "min_share": policy.min_share,
                "participation": policy.participation,
                "groups": dict(groups),
            },
        )

    def upload_name(self, digest: str) -> str:
        """The field an upload loaded this round came as ("" if none did): which of a
        client's upload streams it is, as the server's copy of the run ledger keys it."""
        return self._uploads.get(digest, ("", ""))[1]

    def load(
        self, replies: Mapping[str, Envelope], name: str, *, length: int | None = None
    ) -> dict[str, Any]:
        handles = {}
        for client, env in replies.items():
            if client not in self.active:  # excluded since it replied (a copy under another name)
                continue
            try:
                handle = self.backend.load(env, name, length or self.n_params)
                handles[client] = self.loaded(client, name, handle)
            except ClientInputError as exc:
                self.exclude(client, env.phase, exc)
        self.exchange.abort_if_empty(f"load {name}")
        return handles

    @staticmethod
    def plaintext(values: np.ndarray) -> Plaintext:
        return Plaintext(np.asarray(values, dtype=np.float64))

    def individual_updates(self, uploads: Mapping[str, Upload]) -> dict[str, np.ndarray]:
        if self.backend.can_read:
            return {c: self.backend.read(u.handle) for c, u in uploads.items() if c in self.active}
        if not self.allow_plaintext_updates:
            raise ConfigError(
                "this aggregator needs every client's update in plaintext (a median or a "
                "trimmed mean is not a sum); on an encrypted backend allow it explicitly "
                "(--allow-plaintext-updates) and the audit will record the revealed updates"
            )
        replies = self.ask(
            "plaintext_update", {c: {} for c in uploads}, expect={"pseudo_gradient": wire.VECTOR}
        )
        return {c: env.vector("pseudo_gradient", self.n_params) for c, env in replies.items()}

    def reveal(self, handle: Any, name: str) -> np.ndarray:
        """The backend reveals: plain reads it, ckks asks a decryptor client (audited as a
        received plaintext vector named ``name``). A :class:`Plaintext` result is already
        the server's: it was computed from revealed aggregates."""
        if isinstance(handle, Plaintext):
            return handle.values
        self._released(handle, name)
        start = time.perf_counter()
        value, by = self.backend.reveal(self, handle, name)
        # a decryptor client's reveal arrives in its reply (timed and audited by ``ask``);
        # otherwise the server formed the plaintext itself: plain, or threshold's sum
        # unmasked with t holders' shares ("holders ...")
        if by not in self.exchange.clients:
            self.seconds["reveal"] += time.perf_counter() - start
            self.exchange.audit.reveal(self.round, "reveal", name, int(value.size), by=by)
        return value


class StreamedSum:
    """A weighted sum whose weights were fixed before the uploads arrived, folded in as each
    upload arrives. A client that never arrives is renormalised away: the result is
    Σ_arrived w_i x_i / Σ_arrived w_i, as a buffered sum over the arrived clients would be."""

    def __init__(self, ctx: RoundContext, weights: Mapping[str, float], length: int | None = None):
        self._ctx = ctx
        self.weights = ctx.capped(weights)
        self.folded: dict[str, float] = {}
        self.length = ctx.n_params if length is None else length
        self._sum = ctx.backend.running_sum(self.length)

    def add(self, client: str, handle: Any) -> None:
        if client not in self.weights:
            raise UnknownSender(f"{client} has no planned weight this round (did it enrol?)")
        if client in self.folded:
            raise DuplicateMessage(f"{client}'s upload was already added this round")
        start = time.perf_counter()
        self._sum.add(handle, self.weights[client])
        self.folded[client] = self.weights[client]
        self._ctx.seconds["aggregate"] += time.perf_counter() - start

    def result(self, renormalise: bool = True) -> Any:
        """The sum; ``renormalise``: divided by the planned weight of the uploads that
        arrived (the default, as a buffered sum over them would be), else as planned: a
        client that never arrived is only missing from it."""
        clients = list(self.folded)  # a folded upload cannot be taken out again
        if not clients:
            raise RoundAborted(
                f"round {self._ctx.round}: no upload was folded; exclusions: {self._ctx.excluded}",
                round=self._ctx.round,
                phase="train",
                exclusions=self._ctx.excluded,
            )
        normaliser = sum(self.folded[c] for c in clients) if renormalise else 1.0
        start = time.perf_counter()
        total = self._sum.result(normaliser)
        self._ctx.seconds["aggregate"] += time.perf_counter() - start
        self._ctx.formed(total, {c: self.folded[c] / normaliser for c in clients})
        return total
