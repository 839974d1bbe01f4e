"""Combining the holders' shares of a release's key sum K = Σ_i w_i·k_i (no secret here).

With exactly t shares, Lagrange interpolation at 0 gives K and nothing can be checked. With
more than t, the shares must lie on one polynomial of degree < t: if they do not, a holder
sent a wrong share. When leaving out one holder makes the rest consistent (and the rest are
still more than t, so that consistency means something) that holder is named; otherwise the
combination is refused as a whole. Nobody asks again with another holder set: retrying a
threshold decryption is what Lattigo's SECURITY.md and Okada et al. (eprint 2025/409) warn
against, and the holders refuse it (``threshold_client``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from secagg.errors import ReleaseRefused


class ShareMismatch(ReleaseRefused):
    """Too few shares of a key sum, or shares that do not lie on one polynomial of degree
    < t with at most one holder to blame."""


def interpolate(
    ring, shares: Mapping[str, np.ndarray], xs: Mapping[str, int], t: int
) -> tuple[np.ndarray, list[str]]:
    """(K, the holders whose share was wrong and left out) from ``shares`` (holder -> its
    share s_j, one ring element) at x-coordinates ``xs``."""
    names = list(shares)
    if len(names) < t:
        raise ShareMismatch(f"{len(names)} share(s) of the key sum; t = {t} are needed")
    points = np.stack([shares[h] for h in names])
    x = [xs[h] for h in names]
    if len(names) == t or ring.consistent(points, x, t):
        return ring.reconstruct(points[:t], x[:t]), []
    if len(names) >= t + 2:
        for left_out, holder in enumerate(names):
            rest = [i for i in range(len(names)) if i != left_out]
            if ring.consistent(points[rest], [x[i] for i in rest], t):
                return ring.reconstruct(points[rest[:t]], [x[i] for i in rest[:t]]), [holder]
    raise ShareMismatch(
        f"the {len(names)} shares of the key sum do not lie on one polynomial of degree "
        f"< {t}, and no single holder explains it"
    )
