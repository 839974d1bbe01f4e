"""Aggregation backends. Issue-by-issue: ``plain`` now; ``ckks`` (TenSEAL) next."""

from secagg.backends.base import ClientBackend, ServerBackend
from secagg.backends.plain import PlainClient, PlainServer
from secagg.errors import ConfigError

BACKENDS = ("plain",)


def make_backends(name: str, n_clients: int) -> tuple[ServerBackend, list[ClientBackend]]:
    """Set up one backend: the server half and one client half per client."""
    if name == "plain":
        return PlainServer(), [PlainClient() for _ in range(n_clients)]
    raise ConfigError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "ClientBackend", "ServerBackend", "make_backends"]
