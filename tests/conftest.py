"""Scripted clients for testing the server without torch or data."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from secagg import wire
from secagg.backends.plain import PlainServer
from secagg.protocols import make_protocol
from secagg.protocols.optimizers import SGD
from secagg.server.audit import AuditLog
from secagg.server.engine import Server
from secagg.server.plan import TrainingPlan
from secagg.server.transport import InProcessTransport
from secagg.wire import Envelope

_SECAGG_LOGGER = logging.getLogger("secagg")
#: the ``secagg`` logger as importing secagg leaves it (a NullHandler, propagating)
_AS_IMPORTED = (list(_SECAGG_LOGGER.handlers), _SECAGG_LOGGER.level, _SECAGG_LOGGER.propagate)


@pytest.fixture(autouse=True)
def _secagg_logger_as_imported() -> Iterator[None]:
    """A test (or a module's fixture) that runs an entry point in this process
    (``secagg.simulation.cli.main``, ``secagg.run(progress=True)``) sets the ``secagg`` logger
    up for stderr and stops its propagation (``secagg.logs.to_stderr``): after each test the
    logger is as importing secagg left it, propagating to the root logger, where pytest's
    caplog listens."""
    yield
    handlers, level, propagate = _AS_IMPORTED
    _SECAGG_LOGGER.handlers[:] = handlers
    _SECAGG_LOGGER.setLevel(level)
    _SECAGG_LOGGER.propagate = propagate


def honest_client(cid: str, g: np.ndarray, n: float) -> Callable[[bytes], bytes]:
    """Uploads a fixed pseudo-gradient; answers a LARC probe with ΔL = sum(g)."""

    def handle(data: bytes) -> bytes:
        req = Envelope.from_bytes(data)
        if req.phase == "train":
            fields = {"pseudo_gradient": wire.vector(g), "n_samples": wire.scalar(n)}
        elif req.phase == "enroll":
            fields = {"n_samples": wire.scalar(n)}
        else:
            fields = {"delta_loss": wire.scalar(float(np.sum(g)))}
        return Envelope(cid, "server", req.round, req.phase, fields).to_bytes()

    return handle


def backend_client(
    cid: str,
    backend,
    g: np.ndarray,
    n: float,
    train_n: float | None = None,
    phases: dict[str, Callable[[Envelope], dict]] | None = None,
) -> Callable[[bytes], bytes]:
    """A client with a real backend half (key setup, reveals) and a fixed pseudo-gradient,
    weighted by itself where the request names its weight (a client-weighted preset);
    ``train_n`` makes it report another sample count with its upload than at enrolment;
    ``phases`` answers those phases instead (a protocol's own, or a failing training)."""
    handlers = {**backend.handlers(), **(phases or {})}

    def handle(data: bytes) -> bytes:
        req = Envelope.from_bytes(data)
        if req.phase in handlers:
            fields = handlers[req.phase](req)
        elif req.phase == "enroll":
            fields = {"n_samples": wire.scalar(n)}
        else:
            weight = req.scalar("upload_weight") if "upload_weight" in req.fields else None
            fields = {
                "pseudo_gradient": backend.protect(g, weight),
                "n_samples": wire.scalar(n if train_n is None else train_n),
            }
        return Envelope(cid, "server", req.round, req.phase, fields).to_bytes()

    return handle


def make_server(
    handlers: dict,
    dim: int = 3,
    protocol: str = "fedavg",
    audit: AuditLog | None = None,
    backend=None,
    deadline: float | None = None,
) -> Server:
    """A server of ``protocol`` over scripted ``handlers``, one local step, SGD lr 1 (plain
    unless a server ``backend`` is given); ``deadline``: seconds per request (None: none)."""
    return Server(
        make_protocol(protocol),
        backend if backend is not None else PlainServer(),
        SGD(dim, lr=1.0),
        InProcessTransport(handlers, deadline=deadline),
        np.zeros(dim),
        plan=TrainingPlan(local_steps=1),
        audit=audit or AuditLog(),
    )


@pytest.fixture
def honest():
    gs = {
        "client_0": (np.array([1.0, 0.0, 2.0]), 10.0),
        "client_1": (np.array([3.0, 1.0, 0.0]), 30.0),
    }
    return gs, {c: honest_client(c, g, n) for c, (g, n) in gs.items()}
