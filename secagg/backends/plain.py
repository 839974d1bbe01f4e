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
        return envelope.vector(name, length)

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
        return np.asarray(handle, dtype=np.float64)


class PlainRunningSum(RunningSum):
    def __init__(self, length: int):
        self.total = np.zeros(length, dtype=np.float64)

    def add(self, handle: np.ndarray, weight: float) -> None:
        self.total += float(weight) * handle

    def _result(self, normaliser: float) -> np.ndarray:
        return self.total if normaliser == 1.0 else self.total / normaliser
