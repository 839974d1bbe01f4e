"""Flower's SecAgg+ masking, timed with flwr's own client code (``secaggplus_mod``'s stages).

For ``k`` clients on a ring of ``share_num`` (each client, itself included, shares its keys
with ``share_num`` nodes, so it has ``share_num - 1`` neighbours; ``share_num = k``: every
other client, SecAgg), the stages run as the mod runs them: ``_setup`` (key pairs),
``_share_keys`` (Shamir shares of the mask seed and key, encrypted per neighbour), then
``_collect_masked_vectors`` for the first client: decrypt its neighbours' shares, quantise
its weighted update, add its private mask and one pairwise mask per neighbour (flwr's
``pseudo_rand_gen``), reduce mod 2^32 and serialise. What is timed is that last stage: the
counterpart of a secagg client's protect (encode + encrypt + serialise). The messages
between the stages are routed here, as Flower's server workflow would route them.

Settings are ``SecAggPlusWorkflow``'s defaults (clipping range 8, quantisation range 2^22,
modulus 2^32, max weight 1000). flwr's stage functions are private (``_setup`` and so on):
this module reads them as they are in the installed flwr (the `flower` extra's pin) and
fails loudly if they move.
"""

from __future__ import annotations

import importlib
import statistics
import time

import numpy as np
from flwr.common import ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import Key

# the module (its package re-exports the mod function under the same name)
mod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")

#: SecAggPlusWorkflow's defaults
CLIPPING_RANGE = 8.0
QUANTIZATION_RANGE = 4194304
MODULUS_RANGE = 4294967296
MAX_WEIGHT = 1000.0


def neighbourhood(nid: int, k: int, share_num: int) -> list[int]:
    """``nid`` and its ``share_num - 1`` nearest nodes on a ring of ``k`` (node ids 1..k)."""
    around = [(nid - 1 + d) % k + 1 for d in range(-(share_num // 2), share_num - share_num // 2)]
    return sorted(set(around))


def mask_seconds(
    values: np.ndarray, k: int, share_num: int, repeats: int, n_samples: int = 100
) -> tuple[float, int]:
    """Median seconds of client 1's masking stage for ``values``, and its upload's bytes."""
    if not 2 <= share_num <= k:
        raise ValueError(f"share_num must lie in [2, {k}], got {share_num}")
    ids = list(range(1, k + 1))
    hoods = {nid: neighbourhood(nid, k, share_num) for nid in ids}
    threshold = max(2, share_num // 2 + 1)
    times, masked = [], {}
    for _ in range(repeats):
        states = {nid: mod.SecAggPlusState(nid=nid) for nid in ids}
        setup = {
            Key.SAMPLE_NUMBER: k,
            Key.SHARE_NUMBER: share_num,
            Key.THRESHOLD: threshold,
            Key.CLIPPING_RANGE: CLIPPING_RANGE,
            Key.TARGET_RANGE: QUANTIZATION_RANGE,
            Key.MOD_RANGE: MODULUS_RANGE,
            Key.MAX_WEIGHT: MAX_WEIGHT,
        }
        keys = {nid: mod._setup(states[nid], setup) for nid in ids}  # noqa: SLF001
        inbox: dict[int, tuple[list[int], list[bytes]]] = {nid: ([], []) for nid in ids}
        for nid in ids:
            shared = {
                str(j): (keys[j][Key.PUBLIC_KEY_1], keys[j][Key.PUBLIC_KEY_2]) for j in hoods[nid]
            }
            out = mod._share_keys(states[nid], shared)  # noqa: SLF001
            for dst, ct in zip(out[Key.DESTINATION_LIST], out[Key.CIPHERTEXT_LIST]):
                inbox[dst][0].append(nid)
                inbox[dst][1].append(ct)
        srcs, cts = inbox[1]
        parameters = ndarrays_to_parameters([values.astype(np.float32)])
        start = time.perf_counter()
        masked = mod._collect_masked_vectors(  # noqa: SLF001
            states[1], {Key.SOURCE_LIST: srcs, Key.CIPHERTEXT_LIST: cts}, n_samples, parameters
        )
        times.append(time.perf_counter() - start)
    upload = sum(len(b) for b in masked[Key.MASKED_PARAMETERS])
    return statistics.median(times), upload
