"""The ``threshold`` backend's parts: masks under one-time keys that no single client holds.

``params``: the construction, presets, encoding and upload format (public).
``ring``: R_p = Z_p[X]/(X^N+1) through SEAL's NTT, samplers and PRNG (the native extension).
``combine``: the holders' shares of a key sum, checked and interpolated (public).
The client side (shares sealed for the clients that open a sum, the client half) is in
``secagg.secret`` (``share_relay``, ``threshold_client``).
"""
