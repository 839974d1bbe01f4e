"""Privacy accounting for a run: ε at δ for each mechanism, with Opacus' RDP accountant.

Three mechanisms, each a Gaussian mechanism or a composition of them:

- client-level DP: every release of an aggregate (the global update; LARC's Ĝ sent back to
  the clients) is one Gaussian mechanism on every client's data with the realised noise
  multiplier the engine logged (``Server.privacy_events``), sampling rate 1 (all clients);
- DP-SGD: each client's own Opacus accountant (Poisson-subsampled Gaussian per local step);
  over seeds, the steps each client's accountant counted (it reports them) composed here;
- scalar DP: each client's revealed scalars, one Gaussian mechanism with multiplier σ_s and
  sensitivity (high − low) per release, counted from the audit.

The accountant lives here, not on the server: the server only records multipliers (Opacus
imports torch, which the server package never does).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from secagg.dp import RDP_ORDERS


def gaussian_epsilon(steps: Iterable[tuple[float, float, int]], delta: float) -> float:
    """ε at δ of a composition of (noise multiplier, sampling rate, count) Gaussian steps."""
    from opacus.accountants import RDPAccountant  # 0.6 s of imports a node's process skips

    accountant = RDPAccountant()
    for z, rate, count in steps:
        if count <= 0:
            continue
        if z <= 0:
            return math.inf
        accountant.history.append((float(z), float(rate), int(count)))
    if not accountant.history:
        return 0.0
    with warnings.catch_warnings():  # "optimal order at the edge": a loose, valid bound
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta, alphas=RDP_ORDERS))


def client_level_epsilon(events: Iterable[Mapping], delta: float) -> float:
    return gaussian_epsilon(((e["noise_multiplier"], 1.0, 1) for e in events), delta)


def scalar_release_counts(records: Iterable[Mapping], run: str, names: set[str]) -> Counter:
    """How many protected scalars each client revealed in ``run`` (from the audit)."""
    counts: Counter = Counter()
    for r in records:
        if r["event"] != "message" or r["run"] != run or r["direction"] != "received":
            continue
        counts[r["peer"]] += sum(1 for f in r["fields"] if f["name"] in names)
    return counts


def scalar_epsilons(counts: Mapping[str, int], sigma: float, delta: float) -> dict[str, float]:
    return {c: gaussian_epsilon([(sigma, 1.0, n)], delta) for c, n in counts.items()}


@functools.lru_cache(maxsize=1024)
def _unit_rdp(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """The RDP curve (at ``RDP_ORDERS``) of one step: Opacus' ``compute_rdp``, which takes
    about 0.3 s at a sampling rate below 1, kept per (z, q); RDP grows linearly in steps."""
    from opacus.accountants.analysis.rdp import compute_rdp

    return tuple(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDP_ORDERS)
    )


def _rdp_epsilon(rdp, delta: float) -> float:
    from opacus.accountants.analysis.rdp import get_privacy_spent

    with warnings.catch_warnings():  # "optimal order at the edge": a loose, valid bound
        warnings.simplefilter("ignore")
        return float(get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)[0])


def composed_epsilon(steps: Iterable[tuple[float, float, int]], delta: float) -> float:
    """:func:`gaussian_epsilon` by adding the RDP curves of every (z, q, count) entry, each
    step's curve computed once per (z, q): what Opacus' accountant fed them all gives."""
    rdp: Any = 0
    for z, q, count in steps:
        if count <= 0:
            continue
        if z <= 0:
            return math.inf
        rdp = rdp + np.asarray(_unit_rdp(float(z), float(q))) * int(count)
    if isinstance(rdp, int):
        return 0.0
    return _rdp_epsilon(rdp, delta)
