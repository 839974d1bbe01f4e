"""RadialGAN federated data augmentation (GenoMed4All D6.2 §5, Eq. 5.1–5.8, and §6.5.2;
Yoon, Jordon and van der Schaar 2018).

M nodes hold data sets D_i = {(x_j^(i), y_j)} over feature spaces X^(i) and one label space Y.
Node i owns three networks, all kept at node i:

    F_i : X^(i) × Y → Z           encoder into the common latent space   (Eq. 5.3)
    G_i : Z → X^(i) × Y           decoder / generator                    (Eq. 5.4)
    D_i : X^(i) × Y → (0, 1)      discriminator

and the translation of node j's samples into node i's domain is x_j → G_i(F_j(x_j, y)).
Training solves min_{G,F} max_D Σ_i L_adv^i + λ Σ_i L_cyc^i (Eq. 5.7) with

    L_adv^i = E ln D_i(X^(i); Y) + Σ_{j≠i} α_ij E ln(1 − D_i(G_i(F_j(X^(j); Y))))       (5.5)
    L_cyc^i = E ‖(X^(i); Y) − G_i(F_i(X^(i); Y))‖₂
              + Σ_{j≠i} α_ij E ‖F_j(X^(j); Y) − F_i(G_i(F_j(X^(j); Y)))‖₂              (5.6)

and node i's classifier f_i is then trained, in a separate and purely local phase, on
D̃_i = D_i ∪_{j≠i} G_i(F_j(D_j)) (Eq. 5.8).

What crosses the network. F_j, G_i and D_i never leave their nodes; nothing is averaged.
Eq. 5.5 and 5.6 put node j's latent codes F_j(x_j, y) into node i's losses, so every training
step sends (a) node j's minibatch codes z_j to every other node i, and (b) back to node j the
gradient ∂(node i's objective)/∂z_j, without which F_j cannot learn its share of the
translation. The augmentation (Eq. 5.8) sends node j's codes of *all* its samples to node i,
which decodes them with G_i. These are per-sample vectors of one node's patients (the
report's Figure 5.1: "a common latent space is used for sharing the local information"):
none is a weighted sum of the clients' uploads, so none can be carried by the engine's
protected sums, and relaying them through the server shows them to it. Hence:

- on ``plain`` the hand-over runs through the engine's exchange (:func:`relay_latent_codes`
  with :class:`RadialGANNode` answering the phases ``radialgan_codes`` and
  ``radialgan_translate``); the audit shows the server learning ``latent_codes`` (a
  plaintext vector per source node) and the scalars ``latent_dim`` and ``n_translated``,
  exactly :data:`CAPABILITIES`' ``reveals``;
- on encrypted backends it is refused with a ConfigError that says why (a one-contributor
  relay of individual codes is neither a sum nor something the server may read);
  ``CAPABILITIES`` also sets ``needs_individual_updates``, so the run planner's check refuses
  it the same way it refuses coordinate-wise medians.

The GAN training itself (Eq. 5.7: every step exchanges codes and code gradients between
nodes, in-process) is no part of the library: it lives with its benchmark,
``benchmarks/radialgan_training.py``, with its deviations from the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, MalformedMessage, ProtocolStateError
from secagg.protocols.base import Capabilities, ClientAPI, RoundAPI, VectorStateHalf
from secagg.wire import Envelope, Field

#: what the server learns when it relays a hand-over (plain only: see the module docstring)
CAPABILITIES = Capabilities(
    reveals=("latent_codes", "latent_dim", "n_translated"),
    needs_individual_updates=True,  # per-sample codes of one node: not a sum
    server_computes_update=True,
    client_dp_compatible=False,
)
CODES_PHASE, TRANSLATE_PHASE = "radialgan_codes", "radialgan_translate"

#: (n_in, hidden, n_out) of a one-hidden-layer ReLU network
Shape = tuple[int, int, int]


# ---- the nodes' samples -----------------------------------------------------------------------
def joint(x: np.ndarray, labels: np.ndarray, n_classes: int) -> np.ndarray:
    """(X; Y): the features with the label one-hot, the space F_i reads and G_i writes."""
    y = np.asarray(labels).astype(int)
    if y.min(initial=0) < 0 or y.max(initial=0) >= n_classes:
        raise ConfigError(f"labels must lie in 0..{n_classes - 1}")
    return np.hstack([np.asarray(x, dtype=np.float64), np.eye(n_classes)[y]])


# ---- one-hidden-layer networks on flat parameters (torch's order: W1, b1, W2, b2) -------------
def n_parameters(shape: Shape) -> int:
    n_in, hidden, n_out = shape
    return hidden * n_in + hidden + n_out * hidden + n_out


def unpack(params: np.ndarray, shape: Shape) -> tuple[np.ndarray, ...]:
    n_in, hidden, n_out = shape
    if params.size != n_parameters(shape):
        raise ProtocolStateError(
            f"a network of shape {shape} has {n_parameters(shape)} parameters, got {params.size}"
        )
    sizes = (hidden * n_in, hidden, n_out * hidden, n_out)
    w1, b1, w2, b2 = np.split(params, np.cumsum(sizes)[:-1])
    return w1.reshape(hidden, n_in), b1, w2.reshape(n_out, hidden), b2


def network(params: np.ndarray, x: np.ndarray, shape: Shape) -> tuple[np.ndarray, tuple]:
    """Linear → ReLU → Linear: (outputs, what :func:`network_backward` needs)."""
    w1, b1, w2, b2 = unpack(params, shape)
    pre = x @ w1.T + b1
    hidden = np.maximum(pre, 0.0)
    return hidden @ w2.T + b2, (x, pre, hidden)


def generator_head(raw: np.ndarray, n_features: int) -> np.ndarray:
    """G_i's sample (X; Y) from its raw outputs: sigmoid pixels, softmax label."""
    pixels = 1.0 / (1.0 + np.exp(-raw[:, :n_features]))
    logits = raw[:, n_features:] - raw[:, n_features:].max(1, keepdims=True)
    label = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return np.hstack([pixels, label])


@dataclass
class NodeNetworks:
    """One node's F_i, G_i and D_i (flat parameters) and their shapes."""

    encoder: np.ndarray
    generator: np.ndarray
    discriminator: np.ndarray
    n_features: int
    n_classes: int
    hidden: int
    latent: int

    @property
    def joint_width(self) -> int:
        return self.n_features + self.n_classes

    @property
    def encoder_shape(self) -> Shape:
        return (self.joint_width, self.hidden, self.latent)

    @property
    def generator_shape(self) -> Shape:
        return (self.latent, self.hidden, self.joint_width)

    @property
    def discriminator_shape(self) -> Shape:
        return (self.joint_width, self.hidden, 1)


def encode(nets: NodeNetworks, xy: np.ndarray) -> np.ndarray:
    """F_i(x, y)."""
    return network(nets.encoder, xy, nets.encoder_shape)[0]


def decode(nets: NodeNetworks, codes: np.ndarray) -> np.ndarray:
    """G_i(z): a sample of node i's (X; Y)."""
    return generator_head(network(nets.generator, codes, nets.generator_shape)[0], nets.n_features)


def translate(source: NodeNetworks, target: NodeNetworks, xy: np.ndarray) -> np.ndarray:
    """G_target(F_source(x, y)): the source node's samples in the target node's domain."""
    return decode(target, encode(source, xy))


def as_samples(xy: np.ndarray, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of generated (X; Y) rows: the label is the softmax's argmax."""
    return xy[:, :n_features], xy[:, n_features:].argmax(1)


# ---- through the engine: the hand-over of Eq. 5.8 (plain only) -------------------------------
def refuse_encrypted(upload_kind: str) -> None:
    """RadialGAN's hand-over is plaintext by nature: refuse it where uploads are protected."""
    if upload_kind != wire.VECTOR:
        raise ConfigError(
            "RadialGAN hands one node's per-sample latent codes F_j(x_j, y) to another node "
            "(Eq. 5.5, 5.6, 5.8): individual patients' vectors, not a weighted sum of the "
            "clients' uploads, so an encrypted backend cannot carry them as a protected sum and "
            "the server may not read them; run the hand-over on --backend plain, where the "
            "audit declares latent_codes"
        )


class RadialGANNode(VectorStateHalf):
    """A node's half: its F_i and G_i (flat), their layout, and the samples translated into
    its domain (rows of (X; Y), flattened) once a hand-over reached it.

    ``layout`` is [n_features, n_classes, hidden, latent]."""

    vectors = ("encoder", "generator", "layout", "translated")
    phases = {CODES_PHASE: "codes", TRANSLATE_PHASE: "translate"}
    encoder: np.ndarray | None
    generator: np.ndarray | None
    layout: np.ndarray | None
    translated: np.ndarray | None

    @classmethod
    def holding(cls, nets: NodeNetworks) -> RadialGANNode:
        half = cls()
        half.encoder, half.generator = nets.encoder.copy(), nets.generator.copy()
        half.layout = np.array(
            [nets.n_features, nets.n_classes, nets.hidden, nets.latent], dtype=np.float64
        )
        return half

    def networks(self) -> NodeNetworks:
        if self.encoder is None or self.generator is None or self.layout is None:
            raise ProtocolStateError("this RadialGAN node holds no trained F_i and G_i")
        p, k, h, z = (int(v) for v in self.layout)
        return NodeNetworks(self.encoder, self.generator, np.zeros(0), p, k, h, z)

    def codes(self, client: ClientAPI, env: Envelope) -> dict[str, Field]:
        """F_j of every own sample (the codes node j shares)."""
        nets = self.networks()
        z = encode(nets, joint(client.features(), client.labels(), nets.n_classes))
        return {"latent_codes": wire.vector(z.ravel()), "latent_dim": wire.scalar(nets.latent)}

    def translate(self, client: ClientAPI, env: Envelope) -> dict[str, Field]:
        """G_i of the received codes: the virtual samples of Eq. 5.8, kept at node i."""
        nets = self.networks()
        values, dim = env.vector("latent_codes"), env.scalar("latent_dim")
        if dim != nets.latent or values.size % nets.latent:
            raise MalformedMessage(
                f"{values.size} code values of dimension {dim} do not fit a latent space of "
                f"dimension {nets.latent}"
            )
        xy = decode(nets, values.astype(np.float64).reshape(-1, nets.latent))
        self.translated = xy.ravel()
        return {"n_translated": wire.scalar(len(xy))}

    def translated_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, labels) of the samples translated into this node's domain."""
        nets = self.networks()
        if self.translated is None:
            raise ProtocolStateError("no hand-over has reached this RadialGAN node")
        return as_samples(self.translated.reshape(-1, nets.joint_width), nets.n_features)


def relay_latent_codes(ctx: RoundAPI, source: str, target: str) -> int:
    """The server's part of Eq. 5.8 for one pair: ask ``source`` for F_source of its samples
    and hand them to ``target``, which decodes them with G_target. Returns how many samples
    ``target`` received. Plain only (:func:`refuse_encrypted`)."""
    refuse_encrypted(ctx.upload_kind)
    if source == target:
        raise ConfigError("a node does not augment itself with its own codes")
    replies = ctx.ask(
        CODES_PHASE, {source: {}}, expect={"latent_codes": wire.VECTOR, "latent_dim": wire.SCALAR}
    )
    if source not in replies:
        raise ProtocolStateError(f"{source} sent no latent codes: {ctx.excluded.get(source)}")
    codes = replies[source]
    request: Mapping[str, Field] = {
        "latent_codes": wire.vector(codes.vector("latent_codes")),
        "latent_dim": wire.scalar(codes.scalar("latent_dim")),
    }
    answer = ctx.ask(TRANSLATE_PHASE, {target: request}, expect={"n_translated": wire.SCALAR})
    if target not in answer:
        raise ProtocolStateError(f"{target} did not take the codes: {ctx.excluded.get(target)}")
    return int(answer[target].scalar("n_translated"))
