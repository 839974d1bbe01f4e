"""FedDisco-style discrepancy weights from a β-VAE (poster, Algorithm 1 and Equation 1).

Each client encodes its samples with the federated β-VAE's encoder and reports

    d_k = (1 / L) Σ_l W1(encodings of latent dimension l, N(0, 1)),

the mean 1-D Wasserstein distance of its latent codes to the prior. The server weights the
classifier's updates with

    p_k = ReLU(n_k − α d_k + b) / Σ_m ReLU(n_m − α d_m + b),

n_k the relative dataset size. d_k is computed once (client data do not change) and is a
declared plaintext scalar; the weighted sum itself runs on any backend.

The β-VAE is a federated pre-stage (a ``PreStage`` piece, ``pretrain = "beta-vae"``): the experiment
trains it with FedAvg on the same clients and backend before round 0, and the server, which
holds its final parameters, sends them with the discrepancy request (a declared plaintext
vector, ``vae_model``). The client half runs the encoder in numpy on its own samples
(:func:`vae_encoder_means`, the layout of ``secagg.clients.tasks.vae.BetaVAE``), so this
module needs no torch. Server-blind runs are refused: the VAE stage would leave its model
with the clients only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.special import ndtri

from secagg import wire
from secagg.errors import ConfigError, ProtocolStateError
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    ClientHalf,
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.pieces import PreStage
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

#: the β-VAE's hidden and latent sizes (``secagg.clients.tasks.vae.BetaVAE``'s defaults)
VAE_HIDDEN, VAE_LATENT = 32, 4


def wasserstein_to_standard_normal(samples: np.ndarray) -> float:
    """W1 between the empirical distribution of ``samples`` and N(0, 1).

    W1 = ∫ |F⁻¹(u) − Φ⁻¹(u)| du; on the empirical quantile steps [(i−1)/m, i/m] we use the
    normal quantile at the midpoint, which converges to the integral as m grows.
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    m = x.size
    return float(np.mean(np.abs(x - ndtri((np.arange(1, m + 1) - 0.5) / m))))


def discrepancy(encodings: np.ndarray) -> float:
    """d_k: the mean over latent dimensions of W1(encodings[:, l], N(0, 1))."""
    return float(np.mean([wasserstein_to_standard_normal(col) for col in encodings.T]))


def vae_encoder_means(
    params: np.ndarray, x: np.ndarray, n_in: int, hidden: int, latent: int
) -> np.ndarray:
    """μ(x) of the β-VAE whose flat parameters are ``params`` (torch's parameter order):
    Linear(n_in, hidden) → ReLU → Linear(hidden, 2·latent), first ``latent`` outputs."""
    sizes = (hidden * n_in, hidden, 2 * latent * hidden, 2 * latent)
    if params.size < sum(sizes):
        raise ProtocolStateError(
            f"a β-VAE with layout ({n_in}, {hidden}, {latent}) has more "
            f"than {params.size} parameters"
        )
    w1, b1, w2, b2 = np.split(params[: sum(sizes)], np.cumsum(sizes)[:-1])
    h = np.maximum(x @ w1.reshape(hidden, n_in).T + b1, 0.0)
    return (h @ w2.reshape(2 * latent, hidden).T + b2)[:, :latent]


def disco_weights(n_rel: np.ndarray, d: np.ndarray, alpha: float, b: float) -> np.ndarray:
    w = np.maximum(np.asarray(n_rel) - alpha * np.asarray(d) + b, 0.0)
    if not w.sum() > 0:
        raise ConfigError(
            f"every FedDisco weight is zero (alpha={alpha}, b={b}, d={d}); lower alpha or raise b"
        )
    return w / w.sum()


class DiscoClient(ClientHalf):
    """d_k of this client's samples under the federated β-VAE's encoder."""

    phases = {"discrepancy": "discrepancy"}

    @staticmethod
    def discrepancy(client: ClientAPI, env: Envelope) -> dict[str, Field]:
        layout = env.config("vae_layout")
        encodings = vae_encoder_means(
            env.vector("vae_model"),
            client.features(),
            int(layout["n_in"]),
            int(layout["hidden"]),
            int(layout["latent"]),
        )
        return {"discrepancy": client.report(discrepancy(encodings))}


class FedDisco(Protocol, PreStage):
    name = "feddisco"
    # its β-VAE pretraining is not accounted, so no client-level DP
    capabilities = Capabilities(
        reveals=("discrepancy", "global_update"),
        client_scalars=("discrepancy",),
        client_dp_compatible=False,
    )
    client = DiscoClient
    pretrain = "beta-vae"
    pre_stage_task = "secagg.clients.tasks.vae:beta_vae_stage"
    pre_stage_check = "secagg.clients.tasks.vae:check_unit_features"

    def __init__(self, alpha: float = 0.5, b: float = 0.1):
        if alpha < 0:
            raise ConfigError(f"FedDisco needs alpha >= 0, got {alpha}")
        self.alpha, self.b = alpha, b
        self.d: dict[str, float] = {}
        self.vae: tuple[np.ndarray, dict[str, Any]] | None = None

    def use_pretrained(self, params: np.ndarray, layout: Mapping[str, Any]) -> None:
        self.vae = (np.asarray(params, dtype=np.float64), dict(layout))

    def pre_stage_schedule(self, config: Any) -> tuple[int, float]:
        """The run's β-VAE settings (``--vae-rounds``, ``--vae-lr``)."""
        return config.vae_rounds, config.vae_lr

    def pre_stage_layout(self, data: Any) -> dict[str, Any]:
        """The β-VAE's sizes (``secagg.clients.tasks.vae.BetaVAE``'s defaults)."""
        return {"n_in": int(data.train[0].x.shape[1]), "hidden": VAE_HIDDEN, "latent": VAE_LATENT}

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        missing = [c for c in uploads if c not in self.d]
        if missing:  # first round (or a newcomer): ask for the discrepancy once
            if self.vae is None:
                raise ProtocolStateError(
                    "FedDisco has no pre-trained β-VAE (run it through "
                    "the experiment driver, which pre-trains it)"
                )
            request = {
                "vae_model": wire.vector(self.vae[0]),
                "vae_layout": wire.config(self.vae[1]),
            }
            replies = ctx.ask(
                "discrepancy", {c: request for c in missing}, expect={"discrepancy": wire.SCALAR}
            )
            self.d.update({c: env.scalar("discrepancy") for c, env in replies.items()})
        clients = [c for c in uploads if c in self.d]
        n = np.array([uploads[c].n_samples for c in clients])
        p = disco_weights(n / n.sum(), np.array([self.d[c] for c in clients]), self.alpha, self.b)
        return ctx.weighted_sum({c: uploads[c].handle for c in clients}, dict(zip(clients, p)))


register_protocol(
    "feddisco",
    FedDisco,
    summary="beta-VAE discrepancy weights (pre-trains the VAE first)",
    example=Example(
        # a β-VAE over images: the digits task
        settings={
            "task": "digits-niid2",
            "local_epochs": 1,
            "batch_size": 64,
            "client_lr": "0.5",
            "vae_rounds": 2,
            "protocol_options": {"alpha": 0.0},
        }
    ),
    _builtin=True,
)
