"""Combining the holders' shares of a release's key sum K = Σ_i w_i·k_i (no secret here).

Every sum proves itself: its check block (``params.check_sum``) unmasks to noise and its
values to the headroom only under the right K. So the shares are combined t at a time and
the result is checked before anything is used:

- exactly t answers: the one combination is checked; a wrong share makes it fail, and the
  sum is refused (the round is skipped: nobody can be blamed from t shares alone);
- more than t: the first t shares, then, leaving out one holder at a time, t of the others;
  the first combination whose sum checks is used, and every holder whose share is off the
  polynomial through it is named. One lying holder among t + 1 answers is so found, and
  the sum is right; more liars than that make the sum refused, never wrongly opened.

A holder whose share is off the polynomial may have lied, or one of the dealers may have
sealed it a share off its own polynomial: from the combined shares alone the two cannot be
told apart, so the holder is *named*, not blamed (the caller decides what to do with it).
Nobody asks again with another holder set: retrying a threshold decryption is what Lattigo's
SECURITY.md and Okada et al. (eprint 2025/409) warn against, and the holders refuse it
(``threshold_client``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from secagg.errors import ReleaseRefused


class ShareMismatch(ReleaseRefused):
    """Too few shares of a key sum, or no t of them open a sum that checks."""


def open_checked(
    ring,
    shares: Mapping[str, np.ndarray],
    xs: Mapping[str, int],
    t: int,
    unmask: Callable[[np.ndarray], np.ndarray],
    check: Callable[[np.ndarray], str | None],
) -> tuple[np.ndarray, list[str]]:
    """(the unmasked sum, the holders whose share is off the polynomial of the shares that
    opened it) from ``shares`` (holder -> s_j) at x-coordinates ``xs``: ``unmask(K)`` gives
    the centred sum under a key sum K, ``check`` why it is not the sum (None: it is)."""
    names = list(shares)
    if len(names) < t:
        raise ShareMismatch(f"{len(names)} share(s) of the key sum; t = {t} are needed")
    points = {h: shares[h] for h in names}
    candidates = [names[:t]]
    if len(names) > t:
        candidates += [[h for h in names if h != out][:t] for out in names]
    reasons = []
    for subset in candidates:
        key_sum = ring.reconstruct(np.stack([points[h] for h in subset]), [xs[h] for h in subset])
        centred = unmask(key_sum)
        reason = check(centred)
        if reason is None:
            off = [
                h
                for h in names
                if h not in subset
                and not ring.consistent(
                    np.stack([points[g] for g in (*subset, h)]),
                    [xs[g] for g in (*subset, h)],
                    t,
                )
            ]
            return centred, off
        reasons.append(reason)
    raise ShareMismatch(
        f"no {t} of the {len(names)} shares of the key sum open a sum that checks "
        f"({reasons[0]}): a share is wrong"
        + (" and exactly t answered, so it cannot be found" if len(names) == t else "")
    )
