"""secagg: federated aggregation with CKKS-encrypted client updates and optional DP.

One import namespace: ``secagg`` itself is the privacy layer (wire format, backends, key
wrapping, flooding, DP arithmetic); the algorithms are ``secagg.protocols``, the client runtime
``secagg.clients``, the round engine ``secagg.server``, and the in-process experiment driver
and CLI ``secagg.simulation``.
"""

__version__ = "0.1.0"
