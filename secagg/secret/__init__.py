"""Client secrets: every module that holds a client's (or the experimenter's) private key
material or computes with it. Nothing on the server's side imports this package.

The separation is pyca/cryptography's ``hazmat``: what can hurt a client if it ends up in
the wrong process is in one place, behind one name, so that "the server never holds a key"
is one rule checked by one prefix rather than a list of files kept by hand.

The rule (``tests/test_layering.py`` checks each part):

1. **Nothing on the server side imports ``secagg.secret``**, at any level of a module (an
   import inside a function counts as much as one at the top): not the round engine
   (``secagg.server``), not the protocols (``secagg.protocols``), not the server halves and
   public modules of the privacy layer (every module of ``secagg/`` outside this package).
   The one exception is the backend registry (``secagg.backends``), whose client factories
   import a client half inside the function that builds a client, which only a client's
   process calls; at its top level it imports nothing of this package either. A fresh
   interpreter that imports the server, the server halves or the Flower ServerApp loads no
   module whose name starts with ``secagg.secret``.
2. **The top-level API never hands a key out**: ``secagg.__all__`` names nothing from this
   package, and what ``secagg.run`` returns (``RunResult``) holds no key object.
3. **What lives here**: a module goes here when it holds a private key, generates one, or
   is handed one to use. Today:

   - ``ckks_keys``: the CKKS secret key holder (encrypt, decrypt, flooded decryption);
   - ``ckks_masks``: an upload's masks made beside training (encryptions of zero under the
     key: key material) and a decryptor's precomputed check with its flooding normals;
   - ``keywrap``: a client's X25519 identity (pairwise key wrapping);
   - ``sealing``: sealing for the experimenter, and the experimenter's own key pair;
   - ``share_relay``: a threshold holder's share sealed for the clients that open a sum;
   - ``consenting``: a client's Ed25519 signing identity, release policy and signed
     consents, and the state every key-holding client half exports (its private keys);
   - ``holder``: :class:`~secagg.secret.holder.KeyHoldingClient`, the base of both
     key-holding client halves (identity, signing key, policy, budgets, consent records);
   - ``ckks_client``, ``threshold_client``: the client halves of the two encrypted backends;
   - ``identities``: fresh client identities (the provisioning authority's key generation).

   What stays outside, and why: modules that hold no private key and compute nothing with
   one: the public CKKS half (``secagg.ckks.public``, ``first_polys``, ``release``,
   ``flooding``, ``presets``), the threshold construction (``secagg.threshold``), the wire
   format; ``secagg.backends``' ``Provision`` and ``Identity``, the frozen records that
   carry a client's key bytes from its provisioning to its client half (no code of theirs
   touches a key: the registry's factory hands the ``Provision`` whole to the client half,
   and the server only ever gets ``public_signers``); and the drivers' key files
   (``secagg.flower.keystore``: bytes on a node's disk, mode 0600), which the ServerApp
   needs for the public signers' roster.

The native extension's full module (``secagg.ckks._seal_native``) is the one secret-key
module outside this package. The build (``setup.py``, ``scripts/build_native.sh``) puts it
there: the encryptor, decryptor and masks that ``ckks_keys`` hands a key, with the public
arithmetic beside them. The same source builds its public half (``secagg.ckks._seal_public``:
the parameters, the seed expansion and sums mod q, the threshold ring; no class that takes a
key), which is all a server process loads (the server-weighted sums, the threshold ring). The
full module holds no key of its own: a key exists only in objects this package makes. It is
loaded only by name, lazily, through ``secagg.ckks.native.module``; no module of the
server's side has an import statement for it, and neither importing nor running the server
loads it (``tests/test_layering.py``).
"""
