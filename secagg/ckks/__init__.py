"""CKKS on SEAL (TenSEAL's ``sealapi``): presets, packing, serialization, flooding, keys.

Two halves, as in ``cryptography``'s recipes vs hazmat split:

- ``public``: parameters, encoding checks, ciphertext loading and homomorphic sums — all the
  server ever uses. It cannot decrypt: it never sees a secret key.
- ``secret``: the client's key holder (encrypt, decrypt, flood). Only client code imports it;
  ``tests/test_layering.py`` checks that the server never does.
"""
