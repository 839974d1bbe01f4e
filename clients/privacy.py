"""Sample-level DP-SGD on a client, with Opacus.

:func:`make_private` wraps a client's own :class:`LocalTrainer` the way Opacus'
``PrivacyEngine.make_private`` wraps a model, optimizer and loader: the model gets per-sample
gradients, every step clips each sample's gradient to ``max_grad_norm`` and adds Gaussian
noise, batches are Poisson-sampled (rate batch_size / n, which is what the RDP analysis of the
subsampled Gaussian assumes), and Opacus' RDP accountant counts every step. Give either a
noise multiplier or a target ε for the whole run (then the multiplier is solved for the run's
total number of local steps).

Caveat: per-sample clipping bounds one sample's influence only when the loss is a sum over
samples. The Cox partial likelihood of the TCGA tasks is not (a sample also sits in the risk
sets of others in its batch), so DP-SGD's ε there is indicative, not a proof; on the digits
tasks (cross-entropy) it is exact.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from torch.utils.data import DataLoader

from secagg.clients.training import LocalTrainer, flat_params, set_flat_params
from secagg.dp import RDP_ORDERS
from secagg.errors import ConfigError, StateError


class PrivateTrainer:
    """A LocalTrainer whose steps are DP-SGD steps; same interface, plus ``epsilon`` and
    ``steps_taken``."""

    def __init__(
        self, trainer: LocalTrainer, noise_multiplier: float, max_grad_norm: float, seed: int
    ):
        self.inner = trainer
        self.data, self.batch_size, self.loss_fn = trainer.data, trainer.batch_size, trainer.loss_fn
        self.noise_multiplier, self.max_grad_norm = noise_multiplier, max_grad_norm
        self.device = trainer.device
        # the client's samples as a Dataset: a TensorDataset over whole tensors, or the
        # task's own Dataset (Opacus' Poisson sampler reads it item by item)
        loader = DataLoader(
            trainer.data.dataset,
            batch_size=trainer.batch_size,
            generator=torch.Generator().manual_seed(seed),
        )
        optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
        with warnings.catch_warnings():  # Opacus warns about secure_mode off: simulation RNG
            warnings.simplefilter("ignore")
            self.engine = PrivacyEngine(accountant="rdp", secure_mode=False)
            self.model, self.optimizer, self.loader = self.engine.make_private(
                module=trainer.model,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=noise_multiplier,
                max_grad_norm=max_grad_norm,
                poisson_sampling=True,
                # the noise is drawn where the gradients are, so its generator lives there;
                # the samplers' generators stay on the CPU (they draw indices)
                noise_generator=torch.Generator(device=self.device).manual_seed(seed + 1),
            )
        self.sample_rate = 1 / len(loader)
        self._new_epoch()

    # ---- where the Poisson sampler is --------------------------------------------------------
    # A DataLoader iterator cannot be saved, but it is a pure function of the sampling
    # generator: the generator's state when this epoch's iterator was made and the number of
    # batches drawn since restore it exactly (by drawing them again).
    def _sampling_generators(self) -> dict[str, torch.Generator]:
        # the loader draws its base seed, the sampler its masks; Opacus passes one generator
        # to both today, but saving each keeps this right if that changes
        return {"loader": self.loader.generator, "sampler": self.loader.batch_sampler.generator}

    def _new_epoch(self) -> None:
        self._epoch_start = {
            k: g.get_state().clone() for k, g in self._sampling_generators().items()
        }
        self._batches, self._drawn = iter(self.loader), 0

    @property
    def n_params(self) -> int:
        return self.inner.n_params

    def _next_batch(self):
        try:
            batch = next(self._batches)
        except StopIteration:
            self._new_epoch()
            batch = next(self._batches)
        self._drawn += 1
        return batch

    # ---- state between messages ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Opacus' state between rounds: the accountant's history, the noise generator, and
        the sampler's position (generator state at the epoch's start + batches drawn). The
        generator states are secret in effect: whoever holds the noise generator's state can
        subtract the noise. ``inner``: the wrapped trainer's own state."""
        if getattr(self.optimizer, "_step_skip_queue", None):
            raise StateError(
                "a DP-SGD client in the middle of a virtual step cannot be "
                "exported: export between rounds"
            )
        return {
            "kind": "dp-sgd",
            "inner": self.inner.state_dict(),
            "accountant": [list(entry) for entry in self.engine.accountant.history],
            "noise_generator": _generator_bytes(self.optimizer.generator.get_state()),
            "epoch_start": {k: _generator_bytes(v) for k, v in self._epoch_start.items()},
            "drawn": self._drawn,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "dp-sgd":
            raise StateError(
                f"a {state.get('kind')!r} trainer state cannot load into a DP-SGD "
                "client: restore a state exported by a client that trains the "
                "same way"
            )
        drawn, history = state["drawn"], state["accountant"]
        if (
            not isinstance(drawn, int)
            or isinstance(drawn, bool)
            or not 0 <= drawn <= len(self.loader)
        ):
            raise StateError(f"{drawn!r} batches drawn does not fit an epoch of {len(self.loader)}")
        if not isinstance(history, list) or not all(
            isinstance(e, list) and len(e) == 3 for e in history
        ):
            raise StateError(
                "the DP-SGD accountant history is not a list of "
                "(noise multiplier, sample rate, steps)"
            )
        generators = self._sampling_generators()
        if set(state["epoch_start"]) != set(generators):
            raise StateError(
                f"the DP-SGD sampler state holds {sorted(state['epoch_start'])}, "
                f"this client samples with {sorted(generators)}"
            )
        noise = _generator_state(state["noise_generator"], self.optimizer.generator)
        epoch_start = {
            k: _generator_state(v, generators[k]) for k, v in state["epoch_start"].items()
        }
        self.inner.load_state_dict(state["inner"])
        self.optimizer.generator.set_state(noise)
        self.engine.accountant.history = [(float(z), float(q), int(n)) for z, q, n in history]
        for key, generator in generators.items():
            generator.set_state(epoch_start[key])
        self._new_epoch()
        for _ in range(drawn):  # draw the epoch's batches again: same masks, same generator
            next(self._batches)
        self._drawn = drawn

    def train(self, w: np.ndarray, lr: float, steps: int, prox_mu: float = 0.0) -> np.ndarray:
        if prox_mu:
            raise ConfigError("FedProx's proximal term is not supported with DP-SGD here")
        set_flat_params(self.model, w)
        start = flat_params(self.model)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        for _ in range(steps):
            x, y = self._next_batch()
            if len(x) == 0:  # Poisson sampling can draw an empty batch: noise-only step
                first = self.data.batch(torch.arange(1))[0]
                loss = self.model(first.to(self.device)).sum() * 0.0
            else:
                loss = self.loss_fn(self.model(x.to(self.device)), y.to(self.device))
            self.optimizer.zero_grad()
            with warnings.catch_warnings():  # Opacus' hooks on a model whose input needs
                warnings.simplefilter("ignore")  # no gradient: expected, harmless
                loss.backward()
            self.optimizer.step()
        return flat_params(self.model) - start

    def loss_at(self, w, drop_bias: bool = False, data=None) -> float:
        return self.inner.loss_at(w, drop_bias=drop_bias, data=data)

    def predict(self, w, features):
        return self.inner.predict(w, features)

    def steps_taken(self) -> int:
        """The DP-SGD steps this client's accountant counted so far: every optimizer step that
        added noise (an empty Poisson batch too: it is a noise-only step), each sampled at
        ``sample_rate`` with multiplier ``noise_multiplier``. The accountant keeps them as
        (z, q, steps) entries; this client's z and q never change, so its history is one
        entry (or none), and (``noise_multiplier``, ``sample_rate``, this count) is all of
        it. A history with another (z, q) (a state from another client) raises StateError:
        its ε would not be the ε of those three numbers."""
        history = self.engine.accountant.history
        mine = (self.noise_multiplier, self.sample_rate)
        other = sorted({(z, q) for z, q, _ in history} - {mine})
        if other:
            raise StateError(
                f"the DP-SGD accountant holds steps at (noise multiplier, sample rate) {other}, "
                f"this client steps at {mine}: its steps cannot be reported as its own"
            )
        return sum(int(n) for _, _, n in history)

    def epsilon(self, delta: float) -> float:
        """ε spent so far at ``delta`` (Opacus' RDP accountant)."""
        if not len(self.engine.accountant):
            return 0.0
        with warnings.catch_warnings():  # "optimal order at the edge": a loose, valid bound
            warnings.simplefilter("ignore")
            return float(self.engine.accountant.get_epsilon(delta, alphas=RDP_ORDERS))


def _generator_bytes(state: torch.Tensor) -> bytes:
    return state.numpy().tobytes()


def _generator_state(data: Any, like: torch.Generator) -> torch.Tensor:
    """A state for the generator ``like`` from :func:`_generator_bytes`; its size (which
    differs between a CPU and a CUDA generator) is checked on load."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError(f"a generator state must be bytes, got {type(data).__name__}")
    expected = like.get_state().numel()
    if len(data) != expected:
        raise StateError(f"a torch generator state has {expected} bytes, got {len(data)}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@functools.cache
def noise_for_epsilon(target_epsilon: float, delta: float, rate: float, steps: int) -> float:
    """The noise multiplier that spends ``target_epsilon`` at ``delta`` over ``steps`` steps
    sampled at ``rate`` (Opacus' RDP bisection, several seconds): solved once per distinct
    (ε, δ, rate, steps) in a process, so clients of equal batch counts share one solve."""
    with warnings.catch_warnings():  # the bisection tries noises far off the optimum
        warnings.simplefilter("ignore")
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=rate,
                steps=steps,
                accountant="rdp",
                alphas=RDP_ORDERS,
            )
        )


def make_private(
    trainer: LocalTrainer,
    *,
    max_grad_norm: float,
    total_steps: int,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    delta: float = 1e-5,
    seed: int = 0,
) -> PrivateTrainer:
    """DP-SGD for ``trainer``: by noise multiplier, or by target ε over ``total_steps``."""
    if (noise_multiplier is None) == (target_epsilon is None):
        raise ConfigError("DP-SGD needs exactly one of noise_multiplier and target_epsilon")
    if not max_grad_norm > 0:
        raise ConfigError(f"DP-SGD needs max_grad_norm > 0, got {max_grad_norm}")
    if noise_multiplier is None:
        if target_epsilon is None or not target_epsilon > 0:  # None: ruled out above
            raise ConfigError(f"target_epsilon must be > 0, got {target_epsilon}")
        rate = 1 / -(-len(trainer.data) // trainer.batch_size)
        noise_multiplier = noise_for_epsilon(target_epsilon, delta, rate, total_steps)
    elif not noise_multiplier > 0:
        raise ConfigError(f"DP-SGD needs noise_multiplier > 0, got {noise_multiplier}")
    return PrivateTrainer(trainer, float(noise_multiplier), float(max_grad_norm), seed)
