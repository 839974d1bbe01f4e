"""RadialGAN's GAN training (GenoMed4All D6.2 §5, Eq. 5.5–5.7; Yoon, Jordon and van der
Schaar 2018), for its benchmark: the networks, the hand-over and the audit are the library's
(``secagg.protocols.radialgan``); this trains every node's F_i, G_i and D_i in-process.

Every training step sends node j's minibatch codes F_j(x_j, y) to every other node i and,
back to node j, the gradient of node i's objective with respect to them (the library
module's docstring: what crosses the network). :func:`train_radialgan` routes both between
nodes in-process, counting their bytes; they are the same kind of data as the hand-over
and would go through the same relay, so they are not carried through the engine (a round
trip per GAN step).

Deviations chosen:

- The generator side minimises the non-saturating −Σ_j α_ij E ln D_i(G_i(F_j(·))) instead of
  Eq. 5.5's E ln(1 − D_i(·)) (same fixed point; the saturating form gives G no gradient while
  D wins, which with 50 samples at a node is from the first steps). D maximises Eq. 5.5.
- Every network is one hidden layer of ReLUs, written in numpy with hand-written gradients
  (the protocol package may not import torch; tests check every gradient against finite
  differences) and trained with Adam (β₁ = 0.5). G_i's output is sigmoid pixels in [0, 1]
  and a softmax over the labels; a translated sample's label is the argmax (the report's
  G_i: Z → X^(i) × Y generates the label too).
- α_ij = n_j / Σ_{k≠i} n_k (the report: "usually defined by the number of samples").
- A warm-up (``warmup`` steps, 300 in the benchmark) in which every node descends only its
  own-cycle term E‖(x; y) − G_i(F_i(x; y))‖ before the game of Eq. 5.7 starts; nothing crosses
  nodes then. Without it the latent codes collapse to a point from the first steps (the
  latent cycle term is zero for constant codes) and stay there: measured on the digits, the
  reconstruction error stays at the mean image's, 2.34, even with λ = 100. ``latent_weight``
  scales the latent cycle term against the reconstruction term (1, the report's, by default).
- Even so, the translation does not carry labels on the digits: the argmax of G_bad's label
  output agrees with the source digit's label at chance (benchmarks/radialgan.py), and in
  single-seed probes with no noise and 500 digits on both nodes at 0.21–0.24. Nothing in
  Eq. 5.5–5.7 ties the label semantics of the two latent maps together except D_i's view of
  the joint (x; y), which 50 samples do not teach.
- The report's MNIST experiment (§6.6.2.1) used real good-node samples at the bad node
  because "the radial GAN architecture is not yet completely operative"; the benchmark runs
  both that stand-in and the GAN. Its noise: "a percentage of missing pixels ... replaced by
  binary noise" is read as: in every bad-node image exactly round(share · 64) pixels, chosen
  at random per image, are replaced by fair coin flips in {0, 1} (:func:`corrupt_with_noise`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from secagg.errors import ConfigError
from secagg.protocols.radialgan import (
    NodeNetworks,
    Shape,
    decode,
    encode,
    generator_head,
    network,
    unpack,
)


# ---- the bad node's data --------------------------------------------------------------------
def corrupt_with_noise(
    x: np.ndarray, share: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(corrupted copy, mask): in every row exactly round(share · columns) entries, chosen at
    random per row, are replaced by fair coin flips in {0, 1} (the report's binary noise)."""
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"the noise share must lie in [0, 1], got {share}")
    n, d = x.shape
    k = int(round(share * d))
    order = np.argsort(rng.random((n, d)), axis=1)[:, :k]
    mask = np.zeros((n, d), dtype=bool)
    np.put_along_axis(mask, order, True, axis=1)
    noisy = np.array(x, dtype=np.float64, copy=True)
    noisy[mask] = rng.integers(0, 2, size=int(mask.sum())).astype(np.float64)
    return noisy, mask


# ---- training the one-hidden-layer networks -----------------------------------------------
def init_network(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    """Uniform ±1/√fan_in weights and biases (torch's default for Linear)."""
    n_in, hidden, n_out = shape
    parts = [
        rng.uniform(-1, 1, hidden * n_in) / np.sqrt(n_in),
        rng.uniform(-1, 1, hidden) / np.sqrt(n_in),
        rng.uniform(-1, 1, n_out * hidden) / np.sqrt(hidden),
        rng.uniform(-1, 1, n_out) / np.sqrt(hidden),
    ]
    return np.concatenate(parts)


def network_backward(
    params: np.ndarray, cache: tuple, d_out: np.ndarray, shape: Shape
) -> tuple[np.ndarray, np.ndarray]:
    """(∂/∂params, ∂/∂inputs) of Σ d_out · outputs."""
    x, pre, hidden = cache
    w1, _, w2, _ = unpack(params, shape)
    d_hidden = (d_out @ w2) * (pre > 0)
    grads = [(d_hidden.T @ x).ravel(), d_hidden.sum(0), (d_out.T @ hidden).ravel(), d_out.sum(0)]
    return np.concatenate(grads), d_hidden @ w1


def generator_head_backward(out: np.ndarray, d_out: np.ndarray, n_features: int) -> np.ndarray:
    """∂/∂raw of Σ d_out · generator_head(raw), from the head's output."""
    s, p = out[:, :n_features], out[:, n_features:]
    d_label = d_out[:, n_features:]
    d_logits = p * (d_label - (d_label * p).sum(1, keepdims=True))
    return np.hstack([d_out[:, :n_features] * s * (1.0 - s), d_logits])


# ---- the losses (Eq. 5.5, 5.6) and their gradients ------------------------------------------
def _log_sigmoid(t: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -t)


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return np.exp(_log_sigmoid(t))


def adversarial_loss(
    real_logits: np.ndarray, fake_logits: Sequence[np.ndarray], alpha: Sequence[float]
) -> float:
    """L_adv^i (Eq. 5.5) from D_i's logits: E ln D(real) + Σ_j α_ij E ln(1 − D(fake_j))."""
    value = float(_log_sigmoid(real_logits).mean())
    return value + sum(a * float(_log_sigmoid(-f).mean()) for f, a in zip(fake_logits, alpha))


def row_norms_mean(diff: np.ndarray) -> float:
    """E ‖·‖₂ over rows."""
    return float(np.sqrt((diff**2).sum(1)).mean())


def _row_norms_mean_grad(diff: np.ndarray) -> np.ndarray:
    norms = np.sqrt((diff**2).sum(1, keepdims=True))
    return np.divide(diff, norms, out=np.zeros_like(diff), where=norms > 0) / len(diff)


def cycle_loss(
    xy: np.ndarray,
    reconstructed: np.ndarray,
    codes: Sequence[np.ndarray],
    codes_back: Sequence[np.ndarray],
    alpha: Sequence[float],
) -> float:
    """L_cyc^i (Eq. 5.6): E‖(x; y) − G_i(F_i(x; y))‖ + Σ_j α_ij E‖z_j − F_i(G_i(z_j))‖,
    given G_i(F_i(x; y)) and each F_i(G_i(z_j))."""
    value = row_norms_mean(xy - reconstructed)
    return value + sum(a * row_norms_mean(z - b) for z, b, a in zip(codes, codes_back, alpha))


def discriminator_objective(
    nets: NodeNetworks, xy: np.ndarray, fakes: Sequence[np.ndarray], alpha: Sequence[float]
) -> tuple[float, np.ndarray]:
    """(L_adv^i, ∂L_adv^i/∂D_i): D_i ascends it. ``fakes``: G_i(z_j) per source node."""
    shape = nets.discriminator_shape
    real, cache = network(nets.discriminator, xy, shape)
    grad, _ = network_backward(nets.discriminator, cache, _sigmoid(-real) / len(real), shape)
    fake_logits = []
    for fake, a in zip(fakes, alpha):
        logits, cache = network(nets.discriminator, fake, shape)
        fake_logits.append(logits)
        d = -a * _sigmoid(logits) / len(logits)  # ∂ ln(1 − σ(t))/∂t = −σ(t)
        grad = grad + network_backward(nets.discriminator, cache, d, shape)[0]
    return adversarial_loss(real, fake_logits, alpha), grad


def translator_objective(
    nets: NodeNetworks,
    xy: np.ndarray,
    received: Sequence[np.ndarray],
    alpha: Sequence[float],
    lam: float,
    latent_weight: float = 1.0,
) -> tuple[float, np.ndarray, np.ndarray, list[np.ndarray]]:
    """Node i's generator-side objective and its gradients:

        −Σ_j α_ij E ln D_i(G_i(z_j)) + λ L_cyc^i,     z_j = F_j(x_j; y) received from node j,

    returned as (value, ∂/∂F_i, ∂/∂G_i, [∂/∂z_j]): the last go back to node j (its share of
    the gradient of F_j); F_i's share from the other nodes arrives the same way."""
    enc_s, gen_s, disc_s, p = (
        nets.encoder_shape,
        nets.generator_shape,
        nets.discriminator_shape,
        nets.n_features,
    )
    d_enc, d_gen = np.zeros_like(nets.encoder), np.zeros_like(nets.generator)
    # own cycle: (x; y) → F_i → G_i → back
    z, enc_cache = network(nets.encoder, xy, enc_s)
    raw, gen_cache = network(nets.generator, z, gen_s)
    rec = generator_head(raw, p)
    value = lam * row_norms_mean(xy - rec)
    g = generator_head_backward(rec, -lam * _row_norms_mean_grad(xy - rec), p)
    dg, dz = network_backward(nets.generator, gen_cache, g, gen_s)
    d_gen += dg
    d_enc += network_backward(nets.encoder, enc_cache, dz, enc_s)[0]
    d_received = []
    for code, a in zip(received, alpha):
        raw, gen_cache = network(nets.generator, code, gen_s)
        fake = generator_head(raw, p)
        logits, disc_cache = network(nets.discriminator, fake, disc_s)
        value -= a * float(_log_sigmoid(logits).mean())
        d_logits = -a * _sigmoid(-logits) / len(logits)
        d_fake = network_backward(nets.discriminator, disc_cache, d_logits, disc_s)[1]
        back, enc_cache = network(nets.encoder, fake, enc_s)
        weight = lam * latent_weight * a
        value += weight * row_norms_mean(code - back)
        g_code = weight * _row_norms_mean_grad(code - back)
        de, d_from_encoder = network_backward(nets.encoder, enc_cache, -g_code, enc_s)
        d_enc += de
        g_raw = generator_head_backward(fake, d_fake + d_from_encoder, p)
        dg, d_through_generator = network_backward(nets.generator, gen_cache, g_raw, gen_s)
        d_gen += dg
        d_received.append(g_code + d_through_generator)
    return value, d_enc, d_gen, d_received


def encoder_backward(nets: NodeNetworks, xy: np.ndarray, d_codes: np.ndarray) -> np.ndarray:
    """∂/∂F_i of Σ d_codes · F_i(x; y): F_i's share of the other nodes' objectives."""
    _, cache = network(nets.encoder, xy, nets.encoder_shape)
    return network_backward(nets.encoder, cache, d_codes, nets.encoder_shape)[0]


# ---- the local driver: Eq. 5.7 by alternating Adam steps -----------------------------------------
@dataclass
class _Adam:
    lr: float
    beta1: float = 0.5
    beta2: float = 0.999
    first: dict[str, np.ndarray] = field(default_factory=dict)
    second: dict[str, np.ndarray] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)

    def step(self, key: str, params: np.ndarray, grad: np.ndarray, ascend: bool = False):
        """One Adam step of ``params`` in place (descent, or ascent with ``ascend``)."""
        g = -grad if ascend else grad
        m = self.first.get(key, np.zeros_like(g))
        v = self.second.get(key, np.zeros_like(g))
        t = self.steps.get(key, 0) + 1
        m = self.beta1 * m + (1 - self.beta1) * g
        v = self.beta2 * v + (1 - self.beta2) * g**2
        self.first[key], self.second[key], self.steps[key] = m, v, t
        m_hat, v_hat = m / (1 - self.beta1**t), v / (1 - self.beta2**t)
        params -= self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


def pair_weights(sizes: Sequence[int], i: int) -> list[float]:
    """α_ij for j ≠ i in node order: n_j / Σ_{k≠i} n_k."""
    others = [n for j, n in enumerate(sizes) if j != i]
    return [n / sum(others) for n in others]


@dataclass
class Exchanged:
    """What crossed between nodes during training (codes out, gradients back)."""

    codes_bytes: int = 0
    gradient_bytes: int = 0
    steps: int = 0


def train_radialgan(
    data: Sequence[np.ndarray],
    *,
    n_features: int,
    n_classes: int,
    hidden: int = 64,
    latent: int = 16,
    steps: int = 500,
    batch: int = 50,
    lam: float = 1.0,
    lr: float = 1e-3,
    latent_weight: float = 1.0,
    warmup: int = 0,
    seed: int = 0,
) -> tuple[list[NodeNetworks], Exchanged]:
    """Train every node's F_i, G_i, D_i (Eq. 5.7) on ``data`` (each node's (X; Y) rows).

    Each step every node encodes a minibatch and sends its codes to the others; every node
    ascends L_adv^i in D_i, then descends its translator objective in F_i and G_i and sends
    each source node the gradient of that objective with respect to its codes; each node
    adds what it received to F_i's gradient. Only codes and code gradients cross nodes
    (counted in the returned :class:`Exchanged`)."""
    if len(data) < 2:
        raise ConfigError("RadialGAN translates between nodes: give it at least two")
    if not (hidden >= 1 and latent >= 1 and steps >= 0 and batch >= 1 and lr > 0 and lam >= 0):
        raise ConfigError(
            "RadialGAN needs hidden, latent, batch >= 1, steps >= 0, lr > 0, lam >= 0"
        )
    rng = np.random.default_rng([seed, 0x4AD1A1])
    width = n_features + n_classes
    if any(d.ndim != 2 or d.shape[1] != width for d in data):
        raise ConfigError(f"every node's rows must be (X; Y) of width {width}")
    nodes = []
    for _ in data:
        enc = init_network((width, hidden, latent), rng)
        gen = init_network((latent, hidden, width), rng)
        disc = init_network((width, hidden, 1), rng)
        nodes.append(NodeNetworks(enc, gen, disc, n_features, n_classes, hidden, latent))
    sizes = [len(d) for d in data]
    adam = _Adam(lr)
    log = Exchanged()
    for step in range(warmup + steps):
        full = step >= warmup
        batches = [d[rng.choice(len(d), size=min(batch, len(d)), replace=False)] for d in data]
        codes = [encode(n, b) for n, b in zip(nodes, batches)]  # node j → every other node
        log.codes_bytes += sum(c.nbytes for c in codes) * (len(nodes) - 1) if full else 0
        incoming = [np.zeros_like(c) for c in codes]  # code gradients back to their sources
        enc_grads = []
        for i, (nets, xy) in enumerate(zip(nodes, batches)):
            others = [j for j in range(len(nodes)) if j != i]
            alpha = pair_weights(sizes, i)
            received = [codes[j] for j in others] if full else []
            if full:
                fakes = [decode(nets, z) for z in received]
                _, d_disc = discriminator_objective(nets, xy, fakes, alpha)
                adam.step(f"D{i}", nets.discriminator, d_disc, ascend=True)
            _, d_enc, d_gen, d_received = translator_objective(
                nets, xy, received, alpha, lam, latent_weight
            )
            adam.step(f"G{i}", nets.generator, d_gen)
            enc_grads.append(d_enc)
            for j, d in zip(others, d_received):  # empty during the warm-up
                incoming[j] += d
                log.gradient_bytes += d.nbytes
        for j, nets in enumerate(nodes):  # F_j's gradient: its own terms + what came back
            grad = enc_grads[j] + encoder_backward(nets, batches[j], incoming[j])
            adam.step(f"F{j}", nets.encoder, grad)
        log.steps += int(full)
    return nodes, log
