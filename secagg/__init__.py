"""secagg: federated aggregation with CKKS-encrypted client updates and optional DP.

This package is the privacy layer (wire format, backends, later key exchange, flooding, DP).
The algorithms live in ``protocols``, the client runtime in ``clients``, the round engine in
``server``, and the in-process experiment driver and CLI in ``simulation``.
"""

__version__ = "0.1.0"
