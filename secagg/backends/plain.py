"""The plaintext baseline: uploads are float vectors and the server sees everything."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from secagg import wire
from secagg.backends.base import ClientBackend, RunningSum, ServerBackend, no_client_weight
from secagg.wire import Envelope, Field


class PlainClient(ClientBackend):
    name = "plain"

    def __init__(self, dtype: str = "float32"):
        # float32 is what the torch model holds: 4 bytes per parameter on the wire
        self.dtype = np.dtype(dtype)

    def protect(
        self, values: np.ndarray, weight: float | None = None, *, basis: str = "", request: str = ""
    ) -> Field:
        no_client_weight(self.name, weight)
        return wire.vector(np.asarray(values, dtype=self.dtype))

    def open(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        return envelope.vector(name, length)


class PlainServer(ServerBackend):
    name = "plain"
    upload_kind = wire.VECTOR
    can_read = True
    key_model = "none"
    who_can_decrypt = "nothing is encrypted: the server reads every upload"

    def load(self, envelope: Envelope, name: str, length: int) -> np.ndarray:
        # a read-only view in the upload's dtype: a handle is only read, and a float32
        # upload is not held twice (as float32 bytes and a float64 copy)
        return envelope.vector_view(name, length)

    def weighted_sum(self, handles: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        if len(handles) != len(weights) or not handles:
            raise ValueError(f"{len(handles)} vectors but {len(weights)} weights")
        total = PlainRunningSum(handles[0].size)
        for h, w in zip(handles, weights):
            total.add(h, w)
        return total.result()

    def running_sum(self, length: int) -> PlainRunningSum:
        return PlainRunningSum(length)

    def to_field(self, handle: np.ndarray) -> Field:
        return wire.vector(handle)

    def read(self, handle: np.ndarray) -> np.ndarray:
        # a sum is the server's own array; an upload is a read-only view of its message
        if handle.dtype == np.float64 and handle.flags.writeable:
            return handle
        return np.array(handle, dtype=np.float64)


#: values weighted at a time when an upload is folded in (1 MB of float64 scratch)
FOLD_BLOCK = 1 << 17


class PlainRunningSum(RunningSum):
    """Σ w_i x_i in float64, each upload weighted a block at a time: the sum holds one
    model's worth, without a model-sized temporary (bit for bit ``total += w * x``)."""

    def __init__(self, length: int):
        self.total = np.zeros(length, dtype=np.float64)
        self._scratch = np.empty(min(FOLD_BLOCK, length), dtype=np.float64)

    def add(self, handle: np.ndarray, weight: float) -> None:
        w = float(weight)
        for start in range(0, self.total.size, FOLD_BLOCK):
            block = handle[start : start + FOLD_BLOCK]
            weighted = self._scratch[: block.size]
            np.multiply(block, w, out=weighted, dtype=np.float64)
            self.total[start : start + FOLD_BLOCK] += weighted

    def _result(self, normaliser: float) -> np.ndarray:
        return self.total if normaliser == 1.0 else self.total / normaliser
