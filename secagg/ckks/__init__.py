"""CKKS on SEAL (TenSEAL's ``sealapi``): presets, packing, serialization, flooding, checks.

Everything here is public, as in ``cryptography``'s recipes vs hazmat split:

- ``public``: parameters, encoding checks, ciphertext loading and homomorphic sums — all the
  server ever uses. It cannot decrypt: it never sees a secret key.
- the client's key holder (encrypt, decrypt, flood) and its masks made ahead are in
  ``secagg.secret`` (``ckks_keys``, ``ckks_masks``), which the server never imports;
  ``tests/test_layering.py`` checks it. The native extension (``_seal_native``, loaded by
  ``native``) stays here, where the build puts it: ``secagg.secret``'s docstring says why.
"""
