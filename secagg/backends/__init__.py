"""Aggregation backends: ``plain`` (the baseline) and ``ckks`` (SEAL through TenSEAL).

Server code imports ``secagg.backends.base`` and the server halves only; the client halves
(which hold keys) are imported by ``make_backends`` when the experiment driver asks for them.
"""

from __future__ import annotations

from secagg.backends.base import ClientBackend, ServerBackend
from secagg.errors import ConfigError

BACKENDS = ("plain", "ckks")


def make_backends(name: str, client_ids: list[str], ckks_preset: str = "compact"
                  ) -> tuple[ServerBackend, dict[str, ClientBackend]]:
    """Set up one backend: the server half and one client half per client."""
    if name == "plain":
        from secagg.backends.plain import PlainClient, PlainServer

        return PlainServer(), {c: PlainClient() for c in client_ids}
    if name == "ckks":
        from secagg.backends.ckks_client import CKKSClient
        from secagg.backends.ckks_server import CKKSServer
        from secagg.ckks.presets import get_preset

        preset = get_preset(ckks_preset)
        return CKKSServer(preset), {c: CKKSClient(c, preset) for c in client_ids}
    raise ConfigError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "ClientBackend", "ServerBackend", "make_backends"]
