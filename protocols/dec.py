"""Federated DEC, deep embedded clustering (GenoMed4All D6.2 §7.3–7.4; Xie et al., 2016).

With z_i = f_θ(x_i) the encoder's embedding and μ_j the k centroids:

- Eq. 7.5, the Student-t soft assignment (α = 1, as the report and DEC fix it):
  q_ij = (1 + ‖z_i − μ_j‖²/α)^(−(α+1)/2) / Σ_j' (1 + ‖z_i − μ_j'‖²/α)^(−(α+1)/2);
- Eq. 7.7, the target: p_ij = (q_ij² / f_j) / Σ_j' (q_ij'² / f_j'), f_j = Σ_i q_ij;
- Eq. 7.6, the loss: L = KL(P ‖ Q) = Σ_i Σ_j p_ij log(p_ij / q_ij), P held fixed;
- Eq. 7.8–7.9, its gradients:
  ∂L/∂z_i = (α+1)/α · Σ_j (1 + ‖z_i − μ_j‖²/α)^(−1) (p_ij − q_ij)(z_i − μ_j),
  ∂L/∂μ_j = −(α+1)/α · Σ_i (1 + ‖z_i − μ_j‖²/α)^(−1) (p_ij − q_ij)(z_i − μ_j).

Deviations, chosen:

- Eq. 7.5 as printed has ‖z_i + μ_j‖ and a positive exponent, and Eq. 7.7 writes
  f_j = Σ_j q_ij: typesetting slips. These functions follow DEC's paper (a distance, a
  negative exponent, f_j summed over the points), which the gradients 7.8–7.9 also assume.
- Centroid initialisation: the report has each client run k-means and send its centroids to
  the server, which picks k of them farthest-first. Those centroids are per-client statistics
  in plaintext. Here the initialisation is federated Lloyd's k-means instead: each client
  assigns its embedded points to the current centroids and uploads, per cluster, the sum of
  its points and their count (:func:`kmeans_sums`); the server adds them (a protected sum on
  an encrypted backend) and the new centroids are the ratios (:func:`kmeans_centroids`): the
  same step as k-means on the pooled embedding, and only the sums are revealed. Lloyd needs
  starting centroids and the server sees no point: clients first send Σz, Σz² and their
  count (one protected sum, ``embedding_moments``), and the server draws ``restarts`` sets of
  k starting centroids from N(mean, diag var) with the run's seed; all restarts step in one
  protected vector per iteration ([sums | counts | inertia] each, ``kmeans_sums``), and the
  restart of least inertia Σ‖z − μ‖² wins (the report's 25 seeds, DEC's 20 restarts).
- The target P (Eq. 7.7) is recomputed once per round, from the round's starting model (the
  report: every 100 epochs; one round's local steps are the interval here). Its f_j are the
  soft frequencies over *every* client's points, a protected sum per round
  (``cluster_frequencies``, k numbers), as in centralised DEC; each client's own f_j would
  normalise by its local cluster sizes, which differ under label skew.
- Step 1 (Eq. 7.1–7.4): the stacked denoising autoencoder is trained end to end with dropout
  on the input and the hidden layers (the pre-stage ``autoencoder``: FedAvg, as the report),
  not greedily layer by layer; the decoder is then dropped.
- Refinement runs on the clients in numpy: the encoder's forward pass, Eq. 7.8–7.9 for
  ∂L/∂z_i and ∂L/∂μ_j, back-propagation through the ReLU layers, and SGD with momentum
  (``lr``, ``momentum``, ``steps`` mini-batches of ``batch``) per round; the server averages
  the change of [encoder | centroids] by sample counts (FedAvg, as the report). The stopping
  rule on changed assignments is not used: the run has a fixed number of rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from secagg import wire
from secagg.errors import ConfigError, ProtocolStateError
from secagg.options import Flag
from secagg.protocols.base import Capabilities, ClientAPI, ClientHalf, Protocol, RoundAPI, Upload
from secagg.protocols.fedavg import sample_size_weights
from secagg.protocols.pieces import ExtraReleases, FederatedInitialisation, PreStage
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

ALPHA = 1.0
#: the encoder's hidden layers and embedding size (DEC's d-500-500-2000-10, scaled to 8×8
#: digits and 30-feature tables as the report scales it to MDS: {26, 26, 100, k})
HIDDEN = (64, 32)
EMBEDDING = 10


def soft_assignment(z: np.ndarray, mu: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Eq. 7.5: Q, shape (points, clusters), each row a distribution."""
    kernel = _kernel(z, mu, alpha) ** ((alpha + 1.0) / 2.0)
    return kernel / kernel.sum(axis=1, keepdims=True)


def target_distribution(q: np.ndarray) -> np.ndarray:
    """Eq. 7.7: P, sharper than Q and normalised by the soft cluster frequencies f_j."""
    weighted = q**2 / q.sum(axis=0)
    return weighted / weighted.sum(axis=1, keepdims=True)


def kl_loss(p: np.ndarray, q: np.ndarray) -> float:
    """Eq. 7.6: KL(P ‖ Q), summed over points and clusters (0 · log 0 = 0)."""
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def kl_gradients(
    z: np.ndarray, mu: np.ndarray, p: np.ndarray, alpha: float = ALPHA
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 7.8–7.9: (∂L/∂z, ∂L/∂μ) at fixed P."""
    q = soft_assignment(z, mu, alpha)
    coeff = (alpha + 1.0) / alpha * _kernel(z, mu, alpha) * (p - q)  # (points, clusters)
    diff = z[:, None, :] - mu[None, :, :]  # (points, clusters, dims)
    grad_z = np.einsum("ij,ijd->id", coeff, diff)
    grad_mu = -np.einsum("ij,ijd->jd", coeff, diff)
    return grad_z, grad_mu


def kmeans_sums(z: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One client's share of a Lloyd step: per cluster, the sum of its points nearest that
    centroid (k, dims) and their count (k,)."""
    nearest = np.argmin(((z[:, None, :] - mu[None, :, :]) ** 2).sum(axis=2), axis=1)
    k = mu.shape[0]
    sums = np.zeros_like(mu, dtype=np.float64)
    np.add.at(sums, nearest, z)
    return sums, np.bincount(nearest, minlength=k).astype(np.float64)


def kmeans_centroids(sums: np.ndarray, counts: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The Lloyd update from the summed shares; a cluster no point chose keeps its centroid."""
    out = previous.astype(np.float64).copy()
    filled = counts > 0.5  # counts arrive as (possibly noisy) sums: at least one point
    out[filled] = sums[filled] / counts[filled, None]
    return out


def clustering_accuracy(labels: np.ndarray, clusters: np.ndarray) -> float:
    """DEC's unsupervised accuracy: the share of points whose cluster, under the one-to-one
    map of clusters to labels that agrees most (the Hungarian algorithm), is their label."""
    labels, clusters = np.asarray(labels), np.asarray(clusters)
    label_ids, label_of = np.unique(labels, return_inverse=True)
    cluster_ids, cluster_of = np.unique(clusters, return_inverse=True)
    counts = np.zeros((len(cluster_ids), len(label_ids)))
    np.add.at(counts, (cluster_of, label_of), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / len(labels))


def _kernel(z: np.ndarray, mu: np.ndarray, alpha: float) -> np.ndarray:
    """(1 + ‖z_i − μ_j‖²/α)^(−1), shape (points, clusters)."""
    squared = ((z[:, None, :] - mu[None, :, :]) ** 2).sum(axis=2)
    return 1.0 / (1.0 + squared / alpha)


# ---- the encoder (numpy, torch's parameter order) ----------------------------------------------
def layout(n_in: int, k: int) -> dict[str, Any]:
    """The DEC model of a task with ``n_in`` features and ``k`` clusters: the layer sizes of
    the encoder and the number of parameters before the centroids."""
    if n_in < 1 or k < 2:
        raise ConfigError(f"DEC needs at least one feature and two clusters, got {n_in}, {k}")
    sizes = (n_in, *HIDDEN, EMBEDDING)
    n_encoder = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    return {"sizes": list(sizes), "k": k, "n_encoder": n_encoder}


def split_model(params: np.ndarray, shape: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """[encoder | centroids] → (encoder parameters, centroids (k, embedding))."""
    n, k, dims = int(shape["n_encoder"]), int(shape["k"]), int(shape["sizes"][-1])
    if params.size != n + k * dims:
        raise ProtocolStateError(
            f"a DEC model for layers {shape['sizes']} and {k} clusters has {n + k * dims} "
            f"values, got {params.size} (a dec-* task and its own layout)"
        )
    return params[:n], params[n:].reshape(k, dims)


def encoder_layers(params: np.ndarray, sizes: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) per layer from flat parameters (nn.Linear's W is (out, in), then b)."""
    layers, at = [], 0
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = params[at : at + n_in * n_out].reshape(n_out, n_in)
        b = params[at + n_in * n_out : at + n_in * n_out + n_out]
        layers.append((w, b))
        at += n_in * n_out + n_out
    return layers


def encode(
    layers: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray]]:
    """z = f_θ(x): ReLU on the hidden layers, a linear embedding; and each layer's input."""
    inputs, h = [], x
    for i, (w, b) in enumerate(layers):
        inputs.append(h)
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h, inputs


def encoder_gradient(
    layers: Sequence[tuple[np.ndarray, np.ndarray]],
    inputs: Sequence[np.ndarray],
    grad_z: np.ndarray,
) -> np.ndarray:
    """∂L/∂θ by back-propagating ∂L/∂z through the layers (flat, in the parameters' order)."""
    grads: list[np.ndarray] = []
    upstream = grad_z
    for i in range(len(layers) - 1, -1, -1):
        w, _ = layers[i]
        grads[:0] = [(upstream.T @ inputs[i]).ravel(), upstream.sum(axis=0)]
        if i > 0:
            upstream = (upstream @ w) * (inputs[i] > 0)  # ReLU's derivative at its output
    return np.concatenate(grads)


def kl_objective_gradient(
    params: np.ndarray, shape: Mapping[str, Any], x: np.ndarray, p: np.ndarray
) -> tuple[float, np.ndarray]:
    """The mean KL(P ‖ Q) over the points of ``x`` and its gradient in [encoder | centroids]
    (Eq. 7.6, 7.8–7.9, back-propagated), with P fixed."""
    encoder, mu = split_model(params, shape)
    layers = encoder_layers(encoder, shape["sizes"])
    z, inputs = encode(layers, x)
    q = soft_assignment(z, mu)
    grad_z, grad_mu = kl_gradients(z, mu, p)
    n = len(x)
    grad = np.concatenate([encoder_gradient(layers, inputs, grad_z), grad_mu.ravel()])
    return kl_loss(p, q) / n, grad / n


def refine(
    params: np.ndarray,
    shape: Mapping[str, Any],
    x: np.ndarray,
    p: np.ndarray,
    *,
    lr: float,
    momentum: float,
    steps: int,
    batch: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``steps`` mini-batch SGD steps with momentum on KL(P ‖ Q) (DEC's optimizer)."""
    theta = params.astype(np.float64).copy()
    velocity: np.ndarray = np.zeros(params.size)
    for _ in range(steps):
        rows = rng.choice(len(x), size=min(batch, len(x)), replace=False)
        _, grad = kl_objective_gradient(theta, shape, x[rows], p[rows])
        velocity = momentum * velocity - lr * grad
        theta += velocity
    return theta


# ---- federated k-means on the embedding ------------------------------------------------------
def moment_sums(z: np.ndarray) -> np.ndarray:
    """[Σ z, Σ z², n]: a client's share of the embedding's mean and variance."""
    return np.concatenate([z.sum(axis=0), (z**2).sum(axis=0), [float(len(z))]])


def starting_centroids(
    moments: np.ndarray, k: int, restarts: int, rng: np.random.Generator
) -> np.ndarray:
    """``restarts`` sets of k centroids drawn from N(mean, diag var) of the summed moments."""
    dims = (moments.size - 1) // 2
    n = moments[-1]
    if not n >= 1:
        raise ProtocolStateError(f"the embedding's moments count {n:g} points")
    mean = moments[:dims] / n
    var = np.maximum(moments[dims : 2 * dims] / n - mean**2, 1e-12)
    return mean + np.sqrt(var) * rng.standard_normal((restarts, k, dims))


def lloyd_shares(z: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Per restart: [sums (k·dims) | counts (k) | inertia Σ‖z − nearest μ‖²], one vector."""
    out = []
    for mu in centroids:
        sums, counts = kmeans_sums(z, mu)
        inertia = ((z[:, None, :] - mu[None, :, :]) ** 2).sum(axis=2).min(axis=1).sum()
        out.append(np.concatenate([sums.ravel(), counts, [inertia]]))
    return np.concatenate(out)


def lloyd_step(summed: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The restarts' next centroids and the inertia of the current ones, from summed shares."""
    restarts, k, dims = centroids.shape
    parts = summed.reshape(restarts, k * dims + k + 1)
    new = np.stack(
        [
            kmeans_centroids(part[: k * dims].reshape(k, dims), part[k * dims : -1], mu)
            for part, mu in zip(parts, centroids)
        ]
    )
    return new, parts[:, -1]


# ---- the protocol ---------------------------------------------------------------------------
class DECClient(ClientHalf):
    """A client's embedding statistics, its soft frequencies and its KL refinement."""

    phases = {
        "embedding_moments": "embedding_moments",
        "kmeans_sums": "kmeans",
        "cluster_frequencies": "cluster_frequencies",
    }

    @staticmethod
    def _embed(client: ClientAPI, env: Envelope, name: str) -> tuple[np.ndarray, np.ndarray]:
        shape = env.config("dec_layout")
        encoder, mu = split_model(env.vector(name), shape)
        z, _ = encode(encoder_layers(encoder, shape["sizes"]), client.features())
        return z, mu

    @staticmethod
    def embedding_moments(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        z, _ = DECClient._embed(client, env, "dec_model")
        return {"moments": client.protect(moment_sums(z) / env.scalar("scale"))}

    @staticmethod
    def kmeans(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        z, _ = DECClient._embed(client, env, "dec_model")
        shape = env.config("dec_layout")
        centroids = env.vector("centroids").reshape(-1, int(shape["k"]), int(shape["sizes"][-1]))
        return {"shares": client.protect(lloyd_shares(z, centroids) / env.scalar("scale"))}

    @staticmethod
    def cluster_frequencies(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        z, mu = DECClient._embed(client, env, "dec_model")
        frequencies = soft_assignment(z, mu).sum(axis=0)
        return {"frequencies": client.protect(frequencies / env.scalar("scale"))}

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        settings = request.config("dec")
        shape = request.config("dec_layout")
        start = client.model
        frequencies = request.vector("cluster_frequencies")
        x = client.features()
        encoder, mu = split_model(start, shape)
        z, _ = encode(encoder_layers(encoder, shape["sizes"]), x)
        q = soft_assignment(z, mu)
        weighted = q**2 / np.maximum(frequencies, 1e-12)  # Eq. 7.7 with the federation's f_j
        p = weighted / weighted.sum(axis=1, keepdims=True)
        rng = np.random.default_rng([int(settings["round"]), *client.id.encode()])
        new = refine(
            start,
            shape,
            x,
            p,
            lr=float(settings["lr"]),
            momentum=float(settings["momentum"]),
            steps=int(settings["steps"]),
            batch=int(settings["batch"]),
            rng=rng,
        )
        return new - start


class DEC(Protocol, PreStage, FederatedInitialisation, ExtraReleases):
    name = "dec"
    # k-means' sums and the soft frequencies are unplanned sums of weight 1, so the uploads
    # are buffered (no streaming); its pre-stage is not DP-accounted
    capabilities = Capabilities(
        reveals=("embedding_moments", "kmeans_sums", "cluster_frequencies", "global_update"),
        reveals_per_round=2,
        client_dp_compatible=False,
    )
    client = DECClient
    pretrain = "autoencoder"
    pre_stage_task = "secagg.clients.tasks.dec:autoencoder_stage"
    pre_stage_check = "secagg.clients.tasks.dec:check_dec_task"

    def __init__(
        self,
        *,
        lr: Annotated[float, Flag("dec-lr", "SGD rate of the KL refinement (DEC: 0.01)")] = 0.01,
        momentum: Annotated[float, Flag("dec-momentum", "SGD momentum (DEC: 0.9)")] = 0.9,
        steps: Annotated[int, Flag("dec-steps", "mini-batch steps per round on each client")] = 20,
        batch: Annotated[int, Flag("dec-batch", "mini-batch size (DEC: 256)")] = 64,
        restarts: Annotated[int, Flag("dec-restarts", "k-means restarts, stepped together")] = 5,
        kmeans_iters: Annotated[
            int, Flag("dec-kmeans-iters", "Lloyd iterations (one reveal each)")
        ] = 20,
        pretrain_rounds: Annotated[
            int, Flag("dec-pretrain-rounds", "autoencoder FedAvg rounds")
        ] = 30,
        pretrain_lr: Annotated[
            float, Flag("dec-pretrain-lr", "autoencoder client Adam rate")
        ] = 0.003,
        scale: Annotated[
            float,
            Flag(
                "dec-scale",
                "sums of points, counts and frequencies are uploaded / scale (CKKS headroom); the "
                "server multiplies back",
            ),
        ] = 1000.0,
    ):
        """
        Parameters:
            lr, momentum: SGD of the KL(P ‖ Q) refinement on each client.
            steps, batch: mini-batch steps per round and their size.
            restarts: sets of starting centroids stepped together by federated Lloyd.
            kmeans_iters: Lloyd iterations before round 0 (one reveal each, plus one for the
                embedding's moments).
            pretrain_rounds, pretrain_lr: the autoencoder pre-stage (FedAvg, client Adam).
            scale: the k-means and frequency uploads are divided by it and their sums
                multiplied back (a client's counts reach its number of points, beyond
                CKKS's per-client bound).
        """
        if not (lr > 0 and 0 <= momentum < 1 and pretrain_lr > 0 and scale > 0):
            raise ConfigError("dec needs lr > 0, 0 <= momentum < 1, pretrain_lr > 0 and scale > 0")
        counts = (steps, batch, restarts, kmeans_iters, pretrain_rounds)
        if not all(isinstance(c, int) and c >= 1 for c in counts):
            raise ConfigError(
                "dec needs steps, batch, restarts, kmeans_iters and pretrain_rounds >= 1"
            )
        self.lr, self.momentum, self.steps, self.batch = lr, momentum, steps, batch
        self.restarts, self.kmeans_iters = restarts, kmeans_iters
        self.pretrain_rounds, self.pretrain_lr, self.scale = pretrain_rounds, pretrain_lr, scale
        self.encoder: np.ndarray | None = None
        self.shape: dict[str, Any] | None = None
        self.frequencies: np.ndarray | None = None
        self.inertia: float = float("nan")
        self.rng = np.random.default_rng(0)

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def use_pretrained(self, params: np.ndarray, layout: Mapping[str, Any]) -> None:
        self.shape = dict(layout)
        self.encoder = np.asarray(params, dtype=np.float64)[: int(layout["n_encoder"])].copy()

    def pre_stage_schedule(self, config: Any) -> tuple[int, float]:
        return self.pretrain_rounds, self.pretrain_lr

    def pre_stage_layout(self, data: Any) -> dict[str, Any]:
        return data_layout(data)

    def release_lengths(self, data: Any) -> tuple[int, ...]:
        shape = data_layout(data)
        dims, k = shape["sizes"][-1], shape["k"]
        return (2 * dims + 1, self.restarts * (k * dims + k + 1), k)

    def initial_reveals(self) -> int:
        return 1 + self.kmeans_iters

    def _fields(self, model: np.ndarray) -> dict[str, Field]:
        assert self.shape is not None
        return {
            "dec_model": wire.vector(model),
            "dec_layout": wire.config(self.shape),
            "scale": wire.scalar(self.scale),
        }

    def _summed(
        self, ctx: RoundAPI, phase: str, fields: dict[str, Field], name: str, n: int
    ) -> np.ndarray:
        """Every active client's ``name`` (divided by scale), summed, revealed as ``phase``
        and multiplied back."""
        replies = ctx.ask(phase, dict.fromkeys(ctx.active, fields), expect={name: ctx.upload_kind})
        if not replies:
            raise ProtocolStateError(f"dec: no client answered {phase}")
        loaded = ctx.load(replies, name, length=n)
        reveal = ctx.reveal(ctx.weighted_sum(loaded, dict.fromkeys(loaded, 1.0)), phase)
        return self.scale * np.asarray(reveal, dtype=np.float64)

    def initialise(self, ctx: RoundAPI, params: np.ndarray) -> np.ndarray:
        """Step 2's start: the pre-trained encoder and federated k-means centroids."""
        if self.encoder is None or self.shape is None:
            raise ProtocolStateError(
                "dec has no pre-trained encoder (run it through the experiment driver, which "
                "pre-trains the autoencoder first)"
            )
        k, dims = int(self.shape["k"]), int(self.shape["sizes"][-1])
        model = np.concatenate([self.encoder, np.zeros(k * dims)])
        split_model(model, self.shape)  # the task's model and the layout agree
        if model.size != params.size:
            raise ProtocolStateError(
                f"the task's model has {params.size} values, DEC's layout {model.size}"
            )
        fields = self._fields(model)
        moments = self._summed(ctx, "embedding_moments", fields, "moments", 2 * dims + 1)
        centroids = starting_centroids(moments, k, self.restarts, self.rng)
        for _ in range(self.kmeans_iters):
            request = {**fields, "centroids": wire.vector(centroids.ravel())}
            n = self.restarts * (k * dims + k + 1)
            summed = self._summed(ctx, "kmeans_sums", request, "shares", n)
            centroids, inertia = lloyd_step(summed, centroids)
        best = int(np.argmin(inertia))  # the inertia of the centroids the last step used
        self.inertia = float(inertia[best])
        return np.concatenate([self.encoder, centroids[best].ravel()])

    def begin_round(self, ctx: RoundAPI) -> None:
        if ctx.model is None or self.shape is None:
            raise ProtocolStateError("dec needs the server to hold the model and its layout")
        k = int(self.shape["k"])
        fields = self._fields(ctx.model)
        self.frequencies = self._summed(ctx, "cluster_frequencies", fields, "frequencies", k)
        return None

    def train_fields(self, ctx: RoundAPI, client: str) -> dict[str, Field]:
        assert self.shape is not None and self.frequencies is not None
        settings = {
            "lr": self.lr,
            "momentum": self.momentum,
            "steps": self.steps,
            "batch": self.batch,
            "round": ctx.round,
        }
        return {
            "dec": wire.config(settings),
            "dec_layout": wire.config(self.shape),
            "cluster_frequencies": wire.vector(self.frequencies),
        }

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        weights = sample_size_weights({c: u.n_samples for c, u in uploads.items()})
        return ctx.weighted_sum({c: u.handle for c, u in uploads.items()}, weights)

    def round_log(self) -> dict[str, float]:
        return {"kmeans_inertia": self.inertia}


def data_layout(data: Any) -> dict[str, Any]:
    """The DEC layout of a task's data: its features and as many clusters as label values
    in the task (its training parts and its test set: one client alone may lack a class)."""
    parts = [*data.train, *([data.pooled_test] if data.pooled_test is not None else [])]
    labels = np.concatenate([np.asarray(part.y).ravel() for part in parts])
    return layout(int(data.train[0].x.shape[1]), int(np.unique(labels).size))


register_protocol(
    "dec",
    DEC,
    summary="deep embedded clustering: federated autoencoder, k-means by protected sums, "
    "KL(P||Q) refinement averaged (GenoMed4All D6.2 7.3-7.4)",
    example=Example(
        # clusters a table after its autoencoder pre-stage
        settings={
            "task": "dec-breast-cancer-iid",
            "batch_size": 32,
            "protocol_options": {"pretrain_rounds": 2, "kmeans_iters": 2, "restarts": 2},
        }
    ),
    tasks=("dec-*",),
    _builtin=True,
)
