"""What a coalition learns from all the releases of a run, and the rules that bound it.

The game. The adversary is the server together with up to ``colluders`` clients: t − 1 on
``threshold`` (t of them could open anything they hold shares of), none on ``ckks`` (the
clients share one key, so there the server alone is the adversary). It chooses the weights,
the contributor sets, which uploads are paired, how many releases it asks for and who drops
out. Each release of a set S of uploads tells it R = Σ_{i∈S} k_i·x_i; all releases of S
together tell it every combination Σ_l a_l·R_l = Σ_i c_i·x_i of them, from which it
subtracts its members' own terms. It wins if one such combination holds fewer than
``min_honest`` honest terms of non-negligible weight, |c_i| ≥ ε·max_j |c_j| (ε the client's
``min_weight_share``): that combination is, up to ε, a sum of fewer honest uploads than the
client agreed to be hidden among (one: an individual update).

The rules, each checked from the checking client's own configuration by every contributor
before it consents and by every holder before it answers:

1. **Weights** are integers with 0 < |k| ≤ ``max_weight`` (2^weight_bits, far below the
   prime or the modulus): no weight vanishes modulo p (k = p is 0 in the ring: listing every
   other contributor at p and the victim at p + 1 made the "sum" the victim's upload).
2. **One set per upload**: an upload enters releases over one set of uploads only (two
   sums over sets that differ by one upload give it by difference).
3. **One upload per client per basis** (round, phase, model, settings) enters releases: a
   client that made two uploads of the same thing (a retried request) lets one of them be
   released at most.
4. **The weightings of a set** W (one row per release) leave every combination at least
   ``min_honest`` non-negligible honest terms, whoever the ``colluders`` are
   (:func:`weakest_share` ≥ ε). For one release this is |k|_(c+m) ≥ ε·|k|_(1) over the
   sorted weights, c colluders and m = ``min_honest``: at least c + m contributors, and the
   coalition's best choice of members (the largest weights beside the victim's) leaves m
   terms within 1/ε of the largest. A later release proportional to an earlier one tells
   nothing new and is allowed; a second independent weighting is checked exactly over the
   two-dimensional row space (below); a third independent one is refused.

Why they suffice: by 2 and 3 every honest upload is in releases over one set S only, and
every release over S is consented to by all of S, so each honest contributor of S sees every
weighting of S and applies 4 to all of them together; a combination across different sets
adds only terms the coalition knows (its own uploads) or independent honest uploads, which
cannot cancel a term of S. By 1 the ring computes the weighted sum the integers say.

The two-release check is exact: a combination is c(θ) = cos θ·k + sin θ·k'. Between the
directions where some c_i vanishes or two |c_i| cross, the order of the |c_i| is fixed and
the ratio of two of them is monotone in θ (d/dθ of sin(θ − α)/sin(θ − β) has one sign), so
the worst ratio |c|_(c+m)/|c|_(1) is met at one of those O(n²) directions, which integer
arithmetic gives exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

#: candidate directions evaluated per block (bounds memory at about 8 MB per 250 clients)
_BLOCK = 4096


def weakest_share(rows: Sequence[Sequence[int]], colluders: int, min_honest: int) -> float:
    """min over the combinations c of ``rows`` (integer weights, one row per release, the
    same uploads in the same order) of |c|_(colluders + min_honest) / |c|_(1), the
    (colluders + min_honest)-th largest |c_i| over the largest: what the coalition's best
    members leave of the honest terms. 0.0 when some combination isolates exactly, when
    there are too few uploads, or when the rows span more than two dimensions."""
    need = colluders + min_honest
    basis = independent_rows(rows)
    if not basis or len(basis[0]) < need or need < 1:
        return 0.0
    if len(basis) > 2:
        return 0.0
    if len(basis) == 1:
        return _order_ratio(np.abs(np.asarray(basis[0], dtype=np.int64))[None, :], need)
    k1, k2 = (np.asarray(r, dtype=np.int64) for r in basis)
    n = k1.size
    i, j = np.triu_indices(n, 1)
    # directions (a, b) ⟂ w_i, ⟂ w_i − w_j and ⟂ w_i + w_j, w_i = (k1_i, k2_i)
    normals = np.concatenate(
        [
            np.stack([k1, k2], 1),
            np.stack([k1[i] - k1[j], k2[i] - k2[j]], 1),
            np.stack([k1[i] + k1[j], k2[i] + k2[j]], 1),
        ]
    )
    directions = np.stack([normals[:, 1], -normals[:, 0]], 1)
    directions = directions[np.any(directions != 0, axis=1)]
    worst = 1.0
    for start in range(0, len(directions), _BLOCK):
        a, b = directions[start : start + _BLOCK].T
        combos = np.abs(a[:, None] * k1[None, :] + b[:, None] * k2[None, :])
        worst = min(worst, _order_ratio(combos, need))
        if worst == 0.0:
            break
    return worst


def _order_ratio(magnitudes: np.ndarray, need: int) -> float:
    """min over rows of (need-th largest) / largest, rows that are all zero left out."""
    ordered = -np.sort(-magnitudes, axis=1)
    top = ordered[:, 0]
    live = top > 0
    if not np.any(live):
        return 1.0
    return float(np.min(ordered[live, need - 1].astype(np.float64) / top[live]))


def independent_rows(rows: Sequence[Sequence[int]]) -> list[list[int]]:
    """A basis of the rows' span, in order: a row proportional to a kept one (exact integer
    cross-multiplication) is dropped; a third independent row makes the list three long
    (found in floating point: near-dependent rows count as independent, the safe side)."""
    kept: list[list[int]] = []
    for row in rows:
        r = [int(k) for k in row]
        if not any(r):
            continue
        if not kept:
            kept.append(r)
        elif len(kept) == 1:
            if not _proportional(kept[0], r):
                kept.append(r)
        else:
            m = np.asarray(kept, dtype=np.float64).T
            x = np.asarray(r, dtype=np.float64)
            fit, *_ = np.linalg.lstsq(m, x, rcond=None)
            if np.linalg.norm(m @ fit - x) > 1e-9 * np.linalg.norm(x):
                kept.append(r)
                break
    return kept


def _proportional(u: Sequence[int], v: Sequence[int]) -> bool:
    """u and v (non-zero integer rows) are multiples of each other: u_i·v_p = v_i·u_p for
    a position p where u is non-zero."""
    p = next(i for i, a in enumerate(u) if a)
    return len(u) == len(v) and all(a * v[p] == b * u[p] for a, b in zip(u, v))


# ---- the run: every release a client ever entered -------------------------------------------
#: how a run's releases may choose their contributors (a client's own setting, never the
#: server's): ``fixed`` (one contributor set for the run; a missing client pauses releases),
#: ``groups`` (whole groups of a public partition; a group with a member missing sits the
#: round out) or ``per-round`` (any set that passes the per-release rules; only with
#: client-level DP, whose accountant then composes every release of the run)
PARTICIPATION = ("fixed", "groups", "per-round")
_GROUPS_CONTEXT = b"secagg participation groups v1\x00"


def participation_groups(roster: Sequence[str], groups: int) -> dict[str, int]:
    """Each client's group (0 … groups − 1) for ``participation="groups"``: the roster's
    clients in the order of SHA-256 over their names (public: every party deals alike, and
    neither the server nor a client chooses), dealt round-robin, so the groups differ in
    size by one at most. ValueError for fewer than two groups or more than clients."""
    clients = sorted(roster)
    if not isinstance(groups, int) or isinstance(groups, bool) or not 2 <= groups <= len(clients):
        raise ValueError(
            f"participation groups needs 2 to {len(clients)} groups (--participation-groups), "
            f"got {groups!r}"
        )
    ranked = sorted(clients, key=lambda c: hashlib.sha256(_GROUPS_CONTEXT + c.encode()).digest())
    return {c: k % groups for k, c in enumerate(ranked)}


class RunLedger:
    """What one client counts over the whole run: for each of its upload streams (the phase
    its upload answered and its length: one unknown vector per client and stream, the worst
    case of a server that holds the model still so that uploads repeat), the contributor set of the
    first release it entered and a basis of the weight rows of every release since.

    The run rule (``participation="fixed"``): every later release of a stream covers the
    same contributor set, and all its weight rows over the run together pass rule 4 exactly
    as one upload's weightings do (``weakest_share`` ≥ ε with the colluders: at most two
    independent rows, a row proportional to an earlier one tells nothing new). So every
    combination of every release of the run is a combination of at most two rows that
    already passed; sets of different streams are different unknowns. A protocol whose
    weights vary with the data every round (``weights_vary``: LARC's α) keeps the fixed set,
    and its rows are held to the rule per model instead of per run: uploads made from one
    model are one stream (a server that holds the model still gets no third weighting of
    them), uploads from different models are counted as different vectors. That is the
    per-round guarantee; a model moved by a hair of the server's choosing makes near-equal
    uploads that it does not bound, so over the run only client DP covers such a protocol.
    With ``groups`` (the roster dealt by ``participation_groups``) the same holds over the
    columns of the client's own group, which every release it enters must hold whole: any
    combination restricted to a group is a multiple of at most two rows that passed, so it
    keeps at least a group's sum. With ``per-round`` participation the per-release rules
    only.

    Its state travels with the client half's (``to_config``/``load``), so a restarted node
    counts on; it is checked before the expensive per-release checks (its own cost: one
    exact two-row check over the contributors, as rule 4's)."""

    def __init__(
        self,
        participation: str = "fixed",
        weights_vary: bool = False,
        group: Sequence[str] = (),
    ):
        if participation not in PARTICIPATION:
            raise ValueError(f"participation is one of {PARTICIPATION}, got {participation!r}")
        if (participation == "groups") != bool(group):
            raise ValueError("participation groups, and only it, names the client's own group")
        self.participation = participation
        self.weights_vary = weights_vary
        #: with ``groups``: this client's group (itself included), which every release it
        #: enters must hold whole, and over whose columns its rows are kept
        self.group = sorted(group)
        #: stream ("phase:length") -> {"set": sorted clients, "releases": how many it entered,
        #: "rows": {"" (or, where the weights vary, a model): a basis of the weight rows
        #: over the set, at most two}}
        self.streams: dict[str, dict] = {}
        #: digest of each of this client's uploads -> [its stream, its rows' key]
        self.uploads: dict[str, list[str]] = {}

    def uploaded(self, digest: str, n_values: int, phase: str = "", model: str = "") -> None:
        """Remember which stream an upload of this client belongs to: the phase it answered
        and its own length (the client knows both; the server chooses neither), and where
        the weights vary, the model it was made from too (``model``)."""
        self.uploads[digest] = [f"{phase}:{int(n_values)}", model if self.weights_vary else ""]

    def check(self, client_id: str, d, digest: str, policy) -> None:
        """ReleaseRefused unless release ``d`` (a ``Descriptor`` listing this client's
        upload ``digest``) keeps the run rule with every release recorded before, under
        ``policy`` (a ``ReleasePolicy``: its colluders, ``min_contributors`` and
        ``min_share``)."""
        from secagg.errors import ReleaseRefused

        if self.participation == "per-round" or policy.min_contributors < 2:
            return  # a client that accepts one-upload releases accepts being singled out
        stream, key = self.uploads.get(digest, ["", ""])
        weights = d.weights
        if self.group:
            missing = [c for c in self.group if c not in weights]
            if missing:
                raise ReleaseRefused(
                    f"{client_id}: release {d.name!r} (round {d.round}) holds its group only "
                    f"in part (missing {missing[:8]}); participation is by whole groups, so a "
                    "group with a member missing sits the round out"
                )
        ref = self.streams.get(stream)
        if ref is None:
            return
        if not self.group and sorted(weights) != ref["set"]:
            gone = sorted(set(ref["set"]) - set(weights))
            new = sorted(set(weights) - set(ref["set"]))
            raise ReleaseRefused(
                f"{client_id}: release {d.name!r} (round {d.round}) is over another set of "
                f"clients than this run's releases (participation is fixed; missing "
                f"{gone[:8]}, added {new[:8]}): sums over sets chosen round by round give "
                "every update by difference once the uploads repeat"
            )
        rows = [*ref["rows"].get(key, []), [weights[c] for c in ref["set"]]]
        share = weakest_share(rows, policy.colluders, policy.min_contributors)
        if share <= 0.0 or share < policy.min_share:
            raise ReleaseRefused(
                f"{client_id}: release {d.name!r} (round {d.round}) weighs this run's "
                f"contributors so that with the run's earlier releases a combination keeps "
                f"fewer than {policy.min_contributors} honest uploads of weight "
                f"{policy.min_share:g} of the largest (weakest share over the run "
                f"{share:.3g}); this client refuses a release that singles an upload out "
                "over the run (weightings of repeated uploads stay within two directions)"
            )

    def record(self, d, digest: str) -> None:
        stream, key = self.uploads.get(digest, ["", ""])
        clients = self.group or sorted(d.weights)  # the columns the run rule keeps
        ref = self.streams.setdefault(stream, {"set": clients, "rows": {}, "releases": 0})
        if all(c in d.weights for c in ref["set"]):
            row = [d.weights[c] for c in ref["set"]]
            basis = independent_rows([*ref["rows"].get(key, []), row])
            if len(basis) <= 2:
                ref["rows"][key] = basis
        ref["releases"] += 1

    def to_config(self) -> dict:
        return {
            "participation": self.participation,
            "weights_vary": self.weights_vary,
            "group": list(self.group),
            "streams": {
                s: {**v, "rows": {k: [list(r) for r in rs] for k, rs in v["rows"].items()}}
                for s, v in self.streams.items()
            },
            "uploads": {d: list(u) for d, u in self.uploads.items()},
        }

    def load(self, cfg: object) -> None:
        """Take an exported ledger (``to_config``), checked whole first; ValueError if it is
        garbled or was kept under other rules."""
        if not isinstance(cfg, dict) or set(cfg) != {
            "participation",
            "weights_vary",
            "group",
            "streams",
            "uploads",
        }:
            raise ValueError(
                "a run ledger holds participation, weights_vary, group, streams, uploads"
            )
        if (
            cfg["participation"] != self.participation
            or cfg["weights_vary"] != self.weights_vary
            or cfg["group"] != self.group
        ):
            raise ValueError(
                f"the run ledger was kept under participation {cfg['participation']!r} "
                f"(weights vary: {cfg['weights_vary']!r}, group {cfg['group']!r}), this "
                f"client runs {self.participation!r} (weights vary: {self.weights_vary}, "
                f"group {self.group})"
            )
        streams, uploads = cfg["streams"], cfg["uploads"]
        if not (
            isinstance(streams, dict)
            and isinstance(uploads, dict)
            and all(
                isinstance(k, str)
                and isinstance(v, list)
                and len(v) == 2
                and all(isinstance(x, str) for x in v)
                for k, v in uploads.items()
            )
            and all(_stream_entry(v) for v in streams.values())
        ):
            raise ValueError("the run ledger is garbled")
        self.streams = {
            s: {**v, "rows": {k: [list(r) for r in rs] for k, rs in v["rows"].items()}}
            for s, v in streams.items()
        }
        self.uploads = {d: list(u) for d, u in uploads.items()}


def _stream_entry(v: object) -> bool:
    return (
        isinstance(v, dict)
        and set(v) == {"set", "rows", "releases"}
        and isinstance(v["set"], list)
        and all(isinstance(c, str) for c in v["set"])
        and isinstance(v["rows"], dict)
        and all(
            isinstance(key, str)
            and isinstance(rows, list)
            and len(rows) <= 2
            and all(
                isinstance(r, list)
                and len(r) == len(v["set"])
                and all(isinstance(k, int) and not isinstance(k, bool) for k in r)
                for r in rows
            )
            for key, rows in v["rows"].items()
        )
        and isinstance(v["releases"], int)
        and not isinstance(v["releases"], bool)
    )


def run_weakest_share(
    releases: Sequence[Mapping[str, int]], colluders: int, min_honest: int
) -> float:
    """The weakest share over the whole run: every release (client -> integer weight) of one
    stream as a row over the clients (each client's uploads one vector), min over the
    combinations of their rows of the (colluders + min_honest)-th largest term over the
    largest (``weakest_share``). Exact for rows that span at most two dimensions; 0.0 (the
    safe side: not excluded) beyond."""
    clients = sorted({c for r in releases for c in r})
    rows = [[int(r.get(c, 0)) for c in clients] for r in releases]
    return weakest_share(rows, colluders, min_honest) if rows else 1.0
