"""Federated gradient-boosted trees (GenoMed4All D6.2 §10.2): XGBoost's split search and leaf
weights from sums over the clients.

With the logistic loss, g_i = p̂_i − y_i and h_i = p̂_i (1 − p̂_i). A split of node I into
I_L, I_R gains (Eq. in §10.2, the ½ and γ dropped as the report does)

    L_split = G_L² / (H_L + λ) + G_R² / (H_R + λ) − G² / (H + λ),     G = Σ g, H = Σ h

and a leaf's weight is w* = −G / (H + λ), times the learning rate η (the report writes the
residual sum, Σ (y − p̂) = −G). Both need only sums, so per tree (a round):

- level by level, every client builds, for each node of the level, the histograms of g and h
  over every feature's shared bins, from the ensemble so far and the partial tree; the
  server reveals their protected sum (one reveal per level), and for every node picks the
  split with the largest gain whose children both hold H ≥ ``min_child_weight``, or none
  when no gain is positive (its samples then all go left, and its subtree splits no more);
- the clients send each leaf's Σg and Σh; the server reveals the sum and sets the weights.

This is xgboost's ``hist`` method with depthwise growth on the same bins: on plain (float64)
the trees are xgboost's, margins equal to 1e-6 on training and unseen data, and so on ckks
and threshold with their ``wide`` presets. On ckks ``compact`` (noise ~5e-5 in the summed
histograms) near-tied splits in small nodes go either way, so a few nodes differ from plain's
and the accuracy may differ in the fourth decimal (measured: it did in 2 of 3 runs).

Sums are uploaded divided by N (sent by the server), so every value lies within ±1, inside
every preset's headroom; the server multiplies back.

``top_s > 0`` is the report's own proposal instead of the histograms: each client sends, per
node, its S best splits by its own gain, with the gains and its node's sample count N_p, in
plaintext (declared: ``top_s_splits``), and the server takes argmax_s Σ_p N_p L_{s,p} (a
client that did not propose a split adds nothing for it). It reveals each client's own best
splits, gains and node sizes, and the histograms no more; the leaves still come from sums.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np

from secagg import wire
from secagg.errors import ConfigError, MalformedMessage, UnexpectedField
from secagg.options import Flag
from secagg.protocols.base import (
    Capabilities,
    ClientAPI,
    ClientHalf,
    Protocol,
    RoundAPI,
    Upload,
)
from secagg.protocols.pieces import ExtraReleases
from secagg.protocols.registry import Example, register_protocol
from secagg.wire import Envelope, Field

# ---- the math -------------------------------------------------------------------------------
#: Exact arithmetic meets exact boundaries here: at the first tree every h is 1/4, so a child
#: of 4 samples has H = min_child_weight = 1 exactly, a balanced leaf has G = 0 exactly, and
#: small nodes have several splits of one partition with equal gains. A backend's noise
#: (~5e-5 absolute in the sums on ckks compact, ~1e-12 relative on the wide presets) must
#: not decide them, so: gains within TIE (relative) count as tied, the first in (feature,
#: bin) order winning as in xgboost; H within HESS_TOL of min_child_weight meets it; |G|
#: below G_TOL is a balanced leaf (weight 0). Genuine values that close are rare; a leaf
#: zeroed changes a margin by at most ~η G_TOL. HESS_TOL is far above the precise presets'
#: noise and far below a genuine shortfall: it was 1e-3, which let a child of H = 0.99904
#: through where xgboost's H ≥ min_child_weight refuses it (from tree 28 of 50 every backend
#: then built other trees, margins 0.59 apart); at 1e-6 plain float64, ckks wide and
#: threshold wide build xgboost's 50 trees (margins within 2.4e-6). On compact the noise
#: (~5e-5) exceeds it, so a child of H = 1 exactly may be refused there: compact's trees
#: already differ in near-ties (use wide).
TIE, HESS_TOL, G_TOL = 1e-6, 1e-6, 1e-3


def slot_width(depth: int) -> int:
    """Values per tree: split feature and threshold per internal node, then the leaves."""
    return 2 * (2**depth - 1) + 2**depth


def ensemble_margin(trees: np.ndarray, x: np.ndarray, depth: int = 3) -> np.ndarray:
    """Σ_t tree_t(x) for the encoded ensemble ``trees`` (numpy; the clients use this too)."""
    width, internal = slot_width(depth), 2**depth - 1
    slots = np.asarray(trees, dtype=np.float64).reshape(-1, width)
    margin = np.zeros(len(x))
    for slot in slots:
        features, thresholds = slot[:internal], slot[internal : 2 * internal]
        leaves = slot[2 * internal :]
        node = np.zeros(len(x), dtype=np.int64)
        for _ in range(depth):
            f = features[node].astype(np.int64)
            value = x[np.arange(len(x)), np.maximum(f - 1, 0)]
            right = (f > 0) & (value > thresholds[node])
            node = 2 * node + 1 + right
        margin += leaves[node - internal]
    return margin


def gradients(margin: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = 1.0 / (1.0 + np.exp(-margin))
    return p - y, p * (1.0 - p)


def route(tree: np.ndarray, x: np.ndarray, depth: int, level: int) -> np.ndarray:
    """The node index (in heap order) each sample reaches at ``level`` of a partial tree."""
    internal = 2**depth - 1
    features, thresholds = tree[:internal], tree[internal : 2 * internal]
    node = np.zeros(len(x), dtype=np.int64)
    for _ in range(level):
        f = features[node].astype(np.int64)
        right = (f > 0) & (x[np.arange(len(x)), np.maximum(f - 1, 0)] > thresholds[node])
        node = 2 * node + 1 + right
    return node


def histograms(
    x: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    nodes: np.ndarray,
    first: int,
    n_nodes: int,
    bins: int,
) -> np.ndarray:
    """(n_nodes × features × bins × 2) sums of g and h, nodes first … first + n_nodes − 1."""
    n, p = x.shape
    out = np.zeros((n_nodes, p, bins, 2))
    local = nodes - first
    for j in range(p):
        np.add.at(out[:, j, :, 0], (local, x[:, j].astype(np.int64)), g)
        np.add.at(out[:, j, :, 1], (local, x[:, j].astype(np.int64)), h)
    return out


def split_gains(hist: np.ndarray, lam: float, min_child_weight: float) -> np.ndarray:
    """L_split of every (feature, threshold bin k: bins ≤ k go left) from one node's
    (features × bins × 2) histogram; −inf where a child holds too little H."""
    g_left = np.cumsum(hist[:, :, 0], axis=1)[:, :-1]
    h_left = np.cumsum(hist[:, :, 1], axis=1)[:, :-1]
    g_total, h_total = hist[0, :, 0].sum(), hist[0, :, 1].sum()
    g_right, h_right = g_total - g_left, h_total - h_left
    gain = g_left**2 / (h_left + lam) + g_right**2 / (h_right + lam) - g_total**2 / (h_total + lam)
    small = min_child_weight - HESS_TOL
    gain[(h_left < small) | (h_right < small)] = -np.inf
    return gain


def best_split(hist: np.ndarray, lam: float, min_child_weight: float) -> tuple[int, int, float]:
    """(feature, threshold bin, gain) of one node's best split from its (features × bins × 2)
    histogram; feature −1 when no split gains."""
    gain = split_gains(hist, lam, min_child_weight)
    if gain.size == 0 or not np.isfinite(gain.max()) or gain.max() <= 0:
        return -1, 0, 0.0
    # gains within TIE of the best count as equal (small nodes often have several splits of
    # one partition, equal but for rounding): the first in (feature, bin) order wins, as in
    # xgboost, whatever a backend's noise does to the last digits
    j, k = np.unravel_index(np.argmax(gain >= gain.max() * (1.0 - TIE)), gain.shape)
    return int(j), int(k), float(gain[j, k])


def snapped(threshold: int, present: np.ndarray) -> int:
    """The threshold moved up to just below the next bin any training sample falls in: the
    same partition of the training data, and xgboost's cut (it places cuts only at values
    present in the data), so unseen bins of new data go the same way as in xgboost."""
    later = np.flatnonzero(present[threshold + 1 :])
    return int(threshold + later[0]) if later.size else threshold


def leaf_weights(sums: np.ndarray, lam: float, eta: float) -> np.ndarray:
    """w* = −η G / (H + λ) per leaf (0 for a leaf no sample reaches)."""
    g, h = sums[:, 0], sums[:, 1]
    g = np.where(np.abs(g) < G_TOL, 0.0, g)
    return np.where(h > HESS_TOL, -eta * g / (h + lam), 0.0)


def checked_proposal(client: str, proposal: dict[str, Any], n_nodes: int) -> dict[str, Any]:
    """A client's top-S proposal, if it has the layout ``top_splits`` gives (n and splits per
    node, each split [feature, threshold, finite gain]); UnexpectedField otherwise."""
    n, splits = proposal.get("n"), proposal.get("splits")

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    ok = (
        isinstance(n, list)
        and isinstance(splits, list)
        and len(n) == len(splits) == n_nodes
        and all(number(v) and v >= 0 for v in n)
        and all(
            isinstance(node, list)
            and all(
                isinstance(s, list)
                and len(s) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in s[:2])
                and number(s[2])
                for s in node
            )
            for node in splits
        )
    )
    if not ok:
        raise UnexpectedField(f"{client}'s top-S split proposal is malformed")
    return proposal


def top_splits(hist: np.ndarray, lam: float, min_child_weight: float, s: int) -> list[list]:
    """A client's S best (feature, bin, gain) for one node by its own histogram."""
    gain = split_gains(hist, lam, min_child_weight)
    order = np.argsort(gain, axis=None)[::-1][:s]
    return [
        [int(j), int(k), float(gain[j, k])]
        for j, k in zip(*np.unravel_index(order, gain.shape))
        if np.isfinite(gain[j, k]) and gain[j, k] > 0
    ]


# ---- the protocol ---------------------------------------------------------------------------
class XGBoostClient(ClientHalf):
    phases = {"xgb_histograms": "level", "xgb_leaves": "leaves"}

    def local_update(self, client: ClientAPI, request: Envelope) -> np.ndarray:
        return np.zeros(client.n_params)  # the trees are built from sums, in later phases

    @staticmethod
    def _state(client: ClientAPI, env: Envelope):
        cfg = env.config("xgb")
        depth, bins = int(cfg["depth"]), int(cfg["bins"])
        x, y = client.features(), client.labels()
        if x.size and (x.min() < 0 or x.max() >= bins or np.any(x != np.round(x))):
            raise ConfigError(
                f"xgboost needs features as bin indices 0 … {bins - 1} ({client.id}'s are not): "
                "use an xgb-* task"
            )
        g, h = gradients(ensemble_margin(client.model, x, depth), y)
        tree = env.vector("tree")
        if tree.size != 2 * (2**depth - 1) + 2**depth:
            raise MalformedMessage(f"a depth-{depth} tree has another size than {tree.size}")
        return cfg, depth, bins, x, g, h, tree

    @classmethod
    def level(cls, client: ClientAPI, env: Envelope) -> dict[str, Field]:
        cfg, depth, bins, x, g, h, tree = cls._state(client, env)
        level = int(env.scalar("level"))
        first, n_nodes = 2**level - 1, 2**level
        nodes = route(tree, x, depth, level)
        hist = histograms(x, g, h, nodes, first, n_nodes, bins)
        if int(cfg["top_s"]) == 0:
            return {
                "histograms": client.protect(hist.ravel() * float(cfg["scale"])),
                "n_features": wire.scalar(x.shape[1]),  # the schema, so the server can load
            }
        counts = np.bincount(nodes - first, minlength=n_nodes)
        proposals = [
            top_splits(
                hist[k], float(cfg["lam"]), float(cfg["min_child_weight"]), int(cfg["top_s"])
            )
            for k in range(n_nodes)
        ]
        return {"top_s_splits": wire.config({"splits": proposals, "n": counts.tolist()})}

    @classmethod
    def leaves(cls, client: ClientAPI, env: Envelope) -> dict[str, Field]:
        _, depth, _, x, g, h, tree = cls._state(client, env)
        leaf = route(tree, x, depth, depth) - (2**depth - 1)
        sums = np.zeros((2**depth, 2))
        np.add.at(sums[:, 0], leaf, g)
        np.add.at(sums[:, 1], leaf, h)
        return {"leaf_sums": client.protect(sums.ravel() * float(env.config("xgb")["scale"]))}


class XGBoost(Protocol, ExtraReleases):
    name = "xgboost"
    #: with the default options; an instance's depend on its depth and top_s
    capabilities = Capabilities(
        reveals=("gradient_histograms", "n_features", "leaf_sums"),
        reveals_per_round=4,
        server_computes_update=True,
        client_dp_compatible=False,
    )
    client = XGBoostClient

    def __init__(
        self,
        depth: Annotated[int, Flag("xgb-depth", "tree depth (the task's model fixes it)")] = 3,
        bins: Annotated[
            int, Flag("xgb-bins", "histogram bins (the task's binning fixes them)")
        ] = 16,
        eta: Annotated[float, Flag("xgb-eta", "learning rate (xgboost's default)")] = 0.3,
        lam: Annotated[float, Flag("xgb-lambda", "L2 weight on the leaves, lambda")] = 1.0,
        min_child_weight: Annotated[
            float, Flag("xgb-min-child-weight", "least H in a child")
        ] = 1.0,
        top_s: Annotated[
            int, Flag("xgb-top-s", "the report's top-S split proposal (0: histograms)")
        ] = 0,
    ):
        if not (depth >= 1 and bins >= 2 and eta > 0 and lam >= 0 and min_child_weight >= 0):
            raise ConfigError("xgboost needs depth >= 1, bins >= 2, eta > 0, lam >= 0")
        if top_s < 0:
            raise ConfigError("top_s must be >= 0 (0: histograms)")
        self.depth, self.bins, self.eta, self.lam = depth, bins, eta, lam
        self.min_child_weight, self.top_s = min_child_weight, top_s
        reveals = (
            ("leaf_sums", "top_s_splits")
            if top_s
            else ("gradient_histograms", "n_features", "leaf_sums")
        )
        self.capabilities = Capabilities(
            reveals=reveals,
            reveals_per_round=1 if top_s else depth + 1,
            server_computes_update=True,  # the tree is chosen from revealed sums
            client_dp_compatible=False,
        )
        self.internal = 2**depth - 1
        self.width = 2 * self.internal + 2**depth
        self._present: np.ndarray = np.ones((0, bins), dtype=bool)
        self._n_total = 1.0

    def _settings(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "bins": self.bins,
            "eta": self.eta,
            "lam": self.lam,
            "min_child_weight": self.min_child_weight,
            "top_s": self.top_s,
        }

    def release_lengths(self, data: Any) -> tuple[int, ...]:
        # the features of a part held here (a site's node holds only its own)
        p = next(part for part in data.train if part.held).x.shape[1]
        levels = () if self.top_s else tuple(2**k * p * self.bins * 2 for k in range(self.depth))
        return (*levels, 2**self.depth * 2)

    def _ask(self, ctx: RoundAPI, clients, phase: str, fields: dict, expect: dict, **kwargs):
        # sums are sent divided by N (every value then lies within ±1: the headroom)
        settings = {**self._settings(), "scale": 1.0 / self._n_total}
        common = {"xgb": wire.config(settings), **fields}
        return ctx.ask(phase, dict.fromkeys(clients, common), expect=expect, **kwargs)

    def _split_level(self, ctx: RoundAPI, clients, tree: np.ndarray, level: int, leaf: np.ndarray):
        first, n_nodes = 2**level - 1, 2**level
        fields = {"tree": wire.vector(tree), "level": wire.scalar(level)}
        if self.top_s:
            replies = self._ask(
                ctx,
                clients,
                "xgb_histograms",
                fields,
                {"top_s_splits": wire.CONFIG},
                # read inside ``ask``: a malformed proposal excludes its sender, not the run
                on_reply=lambda c, env: checked_proposal(c, env.config("top_s_splits"), n_nodes),
            )
            choices = [self._top_s_choice(replies, k) for k in range(n_nodes)]
        else:
            expect = {"histograms": ctx.upload_kind, "n_features": wire.SCALAR}
            replies = self._ask(ctx, clients, "xgb_histograms", fields, expect)
            widths = {int(env.scalar("n_features")) for env in replies.values()}
            if len(widths) != 1:
                raise MalformedMessage(f"the clients report different feature counts {widths}")
            length = widths.pop() * n_nodes * self.bins * 2
            loaded = ctx.load(replies, "histograms", length=length)
            total = self._n_total * ctx.reveal(
                ctx.weighted_sum(loaded, dict.fromkeys(loaded, 1.0)), "gradient_histograms"
            )
            hist = total.reshape(n_nodes, -1, self.bins, 2)
            if level == 0 and not self._present.size:
                # the bins the training data fill, from the first tree's root, where every
                # sample has h = 1/4 (later, h of a confident sample nears a backend's noise)
                self._present = hist[0, :, :, 1] > 0.125
            choices = [best_split(hist[k], self.lam, self.min_child_weight) for k in range(n_nodes)]
            choices = [
                (f, snapped(t, self._present[f]) if f >= 0 else t, gain) for f, t, gain in choices
            ]
        for k, (feature, threshold, _) in enumerate(choices):
            node = first + k
            if leaf[node] or feature < 0:
                leaf[node] = True
                if 2 * node + 2 < self.internal:  # its children split no more either
                    leaf[2 * node + 1] = leaf[2 * node + 2] = True
                continue
            tree[node], tree[self.internal + node] = feature + 1, threshold

    def _top_s_choice(
        self, replies: Mapping[str, dict[str, Any]], k: int
    ) -> tuple[int, int, float]:
        score: dict[tuple[int, int], float] = {}
        for proposal in replies.values():
            n = float(proposal["n"][k])
            for feature, threshold, gain in proposal["splits"][k]:
                key = (int(feature), int(threshold))
                score[key] = score.get(key, 0.0) + n * float(gain)
        if not score:
            return -1, 0, 0.0
        (feature, threshold), value = max(score.items(), key=lambda item: item[1])
        return feature, threshold, value

    def aggregate(self, ctx: RoundAPI, uploads: Mapping[str, Upload]) -> Any:
        slot = ctx.round
        if ctx.n_params % self.width:
            raise ConfigError(
                f"a model of {ctx.n_params} values is no stack of depth-{self.depth} trees "
                f"({self.width} values each): use an xgb-* task, with --xgb-depth at its "
                "tree depth"
            )
        if (slot + 1) * self.width > ctx.n_params:
            raise ConfigError(
                f"the model holds {ctx.n_params // self.width} trees of depth {self.depth}; "
                f"round {slot} would be tree {slot + 1}"
            )
        tree = np.zeros(self.width)
        leaf = np.zeros(self.internal, dtype=bool)
        clients = list(uploads)
        self._n_total = sum(u.n_samples for u in uploads.values())
        for level in range(self.depth):
            self._split_level(ctx, clients, tree, level, leaf)
        replies = self._ask(
            ctx, clients, "xgb_leaves", {"tree": wire.vector(tree)}, {"leaf_sums": ctx.upload_kind}
        )
        loaded = ctx.load(replies, "leaf_sums", length=2**self.depth * 2)
        weights = dict.fromkeys(loaded, 1.0)
        sums = self._n_total * ctx.reveal(ctx.weighted_sum(loaded, weights), "leaf_sums")
        tree[2 * self.internal :] = leaf_weights(sums.reshape(-1, 2), self.lam, self.eta)
        update = np.zeros(ctx.n_params)
        update[slot * self.width : (slot + 1) * self.width] = tree
        return ctx.plaintext(update)


register_protocol(
    "xgboost",
    XGBoost,
    summary="federated gradient-boosted trees from summed gradient histograms (or the "
    "report's top-S proposal), one tree per round (GenoMed4All D6.2 10.2)",
    # boosted trees over binned features
    example=Example(settings={"task": "xgb-breast-cancer-label"}, precise=True),
    tasks=("xgb-*",),
    _builtin=True,
)
