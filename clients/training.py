"""Local training on a client: a fixed number of SGD steps from the global model.

As in FLamby's ``_Model._local_train`` with ``DataLoaderWithMemory``: mini-batches come from
a shuffled loader whose position persists across rounds (a new permutation each epoch, the
last batch of an epoch may be short), the client optimizer is plain SGD, and the
pseudo-gradient is new parameters − old parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from secagg.clients.state import restored_generator
from secagg.clients.tasks import ClientData
from secagg.errors import ConfigError, StateError

#: samples per forward pass when a model scores a whole set (evaluation, ``loss_at``): bounds
#: the activations' memory; the outputs are concatenated, so a set of up to this many
#: samples is scored in one pass exactly as before
EVAL_BATCH = 1024


def resolve_device(name: str) -> torch.device:
    """The torch device a run's ``device`` setting names: "cpu", "cuda", "cuda:N", or "auto"
    (the first GPU if torch sees one, else the CPU).

    Raises ConfigError for a GPU this process cannot use (none, or no such index)."""
    if not isinstance(name, str):
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {name!r}")
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {name!r}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {name!r}")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {name!r}: torch sees no CUDA GPU in this process (a CPU-only torch, or no "
            "GPU visible); use --device cpu, or --device auto to take a GPU only where there is one"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
            f"numbered from 0; name one of them, or use --device auto"
        )
    return device


def flat_params(model: nn.Module) -> np.ndarray:
    """All parameters as one float64 vector (on the CPU, wherever the model is)."""
    # .cpu() is a no-op on CPU tensors: the CPU path is unchanged bit for bit
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).double().numpy()


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: np.ndarray) -> None:
    """Set the parameters from one vector, each copied onto its own device and dtype."""
    flat = np.asarray(flat)
    n = sum(p.numel() for p in model.parameters())
    if flat.shape != (n,):
        raise ValueError(f"model has {n} parameters, got a vector of shape {flat.shape}")
    pos = 0
    for p in model.parameters():
        k = p.numel()
        p.copy_(torch.from_numpy(flat[pos : pos + k].reshape(p.shape)).to(p.dtype).to(p.device))
        pos += k


@torch.no_grad()
def model_outputs(
    model: nn.Module,
    data: ClientData,
    *,
    device: torch.device | None = None,
    batch_size: int = EVAL_BATCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's outputs for all of ``data`` in order, and the targets, both on the CPU.

    Keyword-only:

    - ``device``: where the model runs (its parameters must be there already); batches go
      there and outputs come back; None: the CPU;
    - ``batch_size``: samples per forward pass (:data:`EVAL_BATCH`).

    The caller sets the model's mode (``eval()``)."""
    outputs, targets = [], []
    for x, y in data.batches(batch_size):
        out = model(x if device is None else x.to(device))
        outputs.append(out.cpu())
        targets.append(y)
    if len(outputs) == 1:  # one pass: the tensors themselves, as a whole-set call gave them
        return outputs[0], targets[0]
    return torch.cat(outputs), torch.cat(targets)


class BatchStream:
    """An endless shuffled mini-batch stream that remembers where it is between rounds."""

    def __init__(self, n: int, batch_size: int, rng: np.random.Generator):
        self.n, self.batch_size, self.rng = n, batch_size, rng
        self._order: np.ndarray = np.empty(0, dtype=np.int64)
        self._pos = 0

    @property
    def at_epoch_end(self) -> bool:
        """The next batch starts a new epoch (a new permutation)."""
        return self._pos >= len(self._order)

    def next(self) -> np.ndarray:
        if self._pos >= len(self._order):
            self._order, self._pos = self.rng.permutation(self.n), 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return idx

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: this epoch's permutation, the position in it, and the
        generator that draws the next permutation (``bit_generator.state``: a plain dict)."""
        return {
            "n": self.n,
            "batch_size": self.batch_size,
            "order": self._order.copy(),
            "pos": self._pos,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where :meth:`state_dict` was taken; checks everything before changing
        anything."""
        if (state.get("n"), state.get("batch_size")) != (self.n, self.batch_size):
            raise StateError(
                f"the batch stream state is for {state.get('n')} samples in "
                f"batches of {state.get('batch_size')}; this stream has "
                f"{self.n} in batches of {self.batch_size}"
            )
        order = np.asarray(state["order"])
        # the order travels as float64 (exact for any index below 2^53): check it is one
        if order.ndim != 1 or (
            order.size
            and not (
                np.array_equal(order, np.round(order)) and 0 <= order.min() and order.max() < self.n
            )
        ):
            raise StateError("the batch stream state's order is not a list of sample indices")
        pos = state["pos"]
        if not isinstance(pos, int) or isinstance(pos, bool) or pos < 0:
            raise StateError(f"the batch stream position {pos!r} is not a position")
        rng = restored_generator(self.rng, state["rng"], "the batch stream")
        self._order, self._pos, self.rng = order.astype(np.int64), pos, rng


class DecayOnIncrease:
    """A local learning rate that decays when the training loss rises (GenoMed4All D6.2
    §8.3.1, DeepCox): after epoch i, if Loss^(i+1) > Loss^(i), lr ← max(lr / √(i+1), floor).

    The epoch's loss is the mean of its mini-batch objectives. The rate starts at the first
    round's configured rate and is this client's own from then on (it carries across rounds,
    as the report's training loop does across epochs)."""

    def __init__(self, floor: float = 0.001):
        self.floor = floor
        self.lr: float | None = None
        self.epoch = 0  # epochs completed
        self.previous: float | None = None  # the last completed epoch's loss
        self.total, self.count = 0.0, 0  # the running epoch's losses

    def rate(self, configured: float) -> float:
        if self.lr is None:
            self.lr = float(configured)
        return self.lr

    def observe(self, loss: float) -> None:
        self.total += loss
        self.count += 1

    def end_epoch(self) -> None:
        if not self.count:
            return
        loss = self.total / self.count
        self.epoch += 1
        if self.previous is not None and loss > self.previous and self.lr is not None:
            self.lr = max(self.lr / np.sqrt(self.epoch), self.floor)
        self.previous, self.total, self.count = loss, 0.0, 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "lr": self.lr,
            "epoch": self.epoch,
            "previous": self.previous,
            "total": self.total,
            "count": self.count,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {"lr", "epoch", "previous", "total", "count"}:
            raise StateError(f"a decaying learning rate's state, got {sorted(state)}")
        self.lr, self.epoch, self.previous = state["lr"], state["epoch"], state["previous"]
        self.total, self.count = float(state["total"]), int(state["count"])


class LocalTrainer:
    """Local SGD. Parameters beyond the data and loss:

    - ``penalty``: a term added to every mini-batch loss from the model itself (DeepCox's
      L1/L2 on the first layer);
    - ``schedule``: a local learning-rate rule in place of the round's fixed rate
      (:class:`DecayOnIncrease`);
    - ``optimizer``: the local optimizer class (``torch.optim.SGD``, FLamby's, by default;
      DeepCox uses Adam), made afresh every round;
    - ``device``: where the model trains ("cpu" by default; a name as :func:`resolve_device`
      takes, or a ``torch.device``)."""

    def __init__(
        self,
        model: nn.Module,
        data: ClientData,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        batch_size: int,
        seed: int,
        *,
        penalty: Callable[[nn.Module], torch.Tensor] | None = None,
        schedule: DecayOnIncrease | None = None,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        device: torch.device | str = "cpu",
    ):
        # where the model trains: batches move there, parameters come back as CPU numpy
        self.device = resolve_device(device) if isinstance(device, str) else torch.device(device)
        self.model, self.data, self.loss_fn = model.to(self.device), data, loss_fn
        self.penalty, self.schedule = penalty, schedule
        self.optimizer = optimizer if optimizer is not None else torch.optim.SGD
        self.batch_size = batch_size
        self.stream = BatchStream(len(data), batch_size, np.random.default_rng(seed))
        # randomness inside the model (the β-VAE's sampling) comes from this client's own
        # stream, not the process's global one: the same in-process, in workers, or in a
        # fresh process per message
        self.seed, self.calls = seed, 0

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def state_dict(self) -> dict[str, Any]:
        """What the trainer carries from one round to the next: the batch position and the
        call count that seeds torch per call. The model's parameters are not state: every
        use sets them from a global model first."""
        state = {"kind": "sgd", "calls": self.calls, "stream": self.stream.state_dict()}
        if self.schedule is not None:
            state["schedule"] = self.schedule.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "sgd":
            raise StateError(
                f"a {state.get('kind')!r} trainer state cannot load into plain "
                "local SGD: restore a state exported by a client that trains "
                "the same way"
            )
        calls = state["calls"]
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0:
            raise StateError(f"the trainer's call count {calls!r} is not a count")
        if (self.schedule is None) != ("schedule" not in state):
            raise StateError("the trainer state and this trainer differ in their lr schedule")
        self.stream.load_state_dict(state["stream"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])
        self.calls = calls

    def train(self, w: np.ndarray, lr: float, steps: int, prox_mu: float = 0.0) -> np.ndarray:
        """Run ``steps`` SGD steps from ``w``; return the pseudo-gradient (new − old).

        ``prox_mu`` > 0 is FedProx (Li et al. 2020): the local objective gains
        μ/2 · ||θ − w||², which keeps the local model near the global one.
        """
        self.calls += 1
        # on a GPU its generator is saved and restored too (manual_seed seeds every device)
        devices = []
        if self.device.type == "cuda":
            index = self.device.index
            devices = [torch.cuda.current_device() if index is None else index]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed * 100_003 + self.calls)
            return self._train(w, lr, steps, prox_mu)

    def _train(self, w: np.ndarray, lr: float, steps: int, prox_mu: float) -> np.ndarray:
        set_flat_params(self.model, w)
        start = flat_params(self.model)
        anchor = [p.detach().clone() for p in self.model.parameters()]
        schedule = self.schedule
        opt = self.optimizer(
            self.model.parameters(), lr=lr if schedule is None else schedule.rate(lr)
        )
        self.model.train()
        for _ in range(steps):
            if schedule is not None and self.stream.at_epoch_end:
                schedule.end_epoch()
                for group in opt.param_groups:
                    group["lr"] = schedule.rate(lr)
            x, y = self.data.batch(torch.from_numpy(self.stream.next()))
            loss = self.loss_fn(self.model(x.to(self.device)), y.to(self.device))
            if self.penalty is not None:
                loss = loss + self.penalty(self.model)
            if schedule is not None:
                schedule.observe(float(loss.detach()))
            if prox_mu:
                loss = loss + prox_mu / 2 * sum(
                    ((p - a) ** 2).sum() for p, a in zip(self.model.parameters(), anchor)
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
        return flat_params(self.model) - start

    @torch.no_grad()
    def loss_at(
        self, w: np.ndarray, drop_bias: bool = False, data: ClientData | None = None
    ) -> float:
        """The loss on all local training samples (or on ``data``) with parameters ``w``.

        ``drop_bias`` zeroes every bias parameter first (the LARC team's code variant).
        """
        data = self.data if data is None else data
        set_flat_params(self.model, w)
        if drop_bias:
            for name, p in self.model.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
        self.model.eval()
        # scored in batches, the loss on all outputs at once (Cox's is not a sum over samples)
        outputs, targets = model_outputs(self.model, data, device=self.device)
        return float(self.loss_fn(outputs, targets))

    @torch.no_grad()
    def predict(self, w: np.ndarray, features: np.ndarray) -> np.ndarray:
        """The model's outputs with parameters ``w`` for ``features``, flattened (float64)."""
        set_flat_params(self.model, w)
        self.model.eval()
        x = torch.as_tensor(np.asarray(features), dtype=torch.float32)
        outs = [self.model(part.to(self.device)).cpu() for part in torch.split(x, EVAL_BATCH)]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.numpy().astype(np.float64).reshape(len(features), -1).squeeze(-1)
