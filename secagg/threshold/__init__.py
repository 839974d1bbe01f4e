"""Threshold CKKS on OpenFHE: a key no single client holds (the ``threshold`` backend).

``params``: the parameter set and the public operations (server side: load, sum, serialise).
``shares``: a client's key share (secret; kept out of the server's imports).
"""
