"""Combining the holders' shares of a release's key sum K = Σ_i w_i·k_i (no secret here).

Every sum proves itself: its check block (``params.check_sum``) unmasks to noise and its
values to the headroom only under the right K. So the shares are combined t at a time and
the result is checked before anything is used:

- exactly t answers: the one combination is checked; a wrong share makes it fail, and the
  sum is refused (the round is skipped: nobody can be blamed from t shares alone);
- more than t: every t-subset of the answers (at most :data:`MAX_SUBSETS`), those that more
  of the other shares agree with first (a cheap check on the shares alone: how many lie on
  the subset's polynomial); the first whose sum checks gives the sum. So any t honest
  answers open it, however many liars answered beside them (two coordinated liars among
  t + 2 answers no longer skip the round). The subsets that agree with the most shares are
  then all checked, and a holder is *named* only if its share is off every polynomial
  whose sum checks: liars who make a second polynomial that also checks (the same sum,
  lies that vanish at 0) cannot get an honest holder named; they are named by nobody.

A holder whose share is off the polynomial may have lied, or one of the dealers may have
sealed it a share off its own polynomial: from the combined shares alone the two cannot be
told apart, so the holder is *named*, not blamed (the caller decides what to do with it).
Nobody asks again with another holder set: retrying a threshold decryption is what Lattigo's
SECURITY.md and Okada et al. (eprint 2025/409) warn against, and the holders refuse it
(``threshold_client``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping

import numpy as np

from secagg.errors import ReleaseRefused

#: every t-subset of the answers is tried while C(answers, t) is at most this (3,432 at
#: 7 of 14; beyond, the first t and each leave-one-out); sorting them costs a few
#: operations on one ring element each, and only the best supported are unmasked
MAX_SUBSETS = 4096
#: the most subsets whose sum is unmasked and checked (each a pass over the sum's values)
MAX_UNMASKS = 64


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

    def on(subset: tuple[str, ...]) -> set[str]:
        """The holders whose share lies on the polynomial through ``subset``'s."""
        rows = np.stack([points[h] for h in subset])
        return set(subset) | {
            h
            for h in names
            if h not in subset
            and ring.consistent(
                np.concatenate([rows, points[h][None]]), [*(xs[g] for g in subset), xs[h]], t
            )
        }

    if len(names) == t:
        subsets = [tuple(names)]
    elif math.comb(len(names), t) <= MAX_SUBSETS:
        subsets = list(itertools.combinations(names, t))
    else:  # too many to try: the first t, then leaving out one holder at a time
        subsets = [tuple(names[:t])]
        subsets += [tuple([h for h in names if h != out][:t]) for out in names]
    support = {subset: on(subset) for subset in subsets} if len(names) > t else {}
    subsets.sort(key=lambda subset: -len(support.get(subset, ())))  # stable: given order
    reasons: list[str] = []
    opened: tuple[np.ndarray, set[str]] | None = None
    polynomials: list[set[str]] = []  # the supports of every polynomial whose sum checks
    unmasked = 0
    for subset in subsets:
        here = support.get(subset, set(subset))
        if opened is not None and (
            len(here) < len(opened[1]) or any(here <= p for p in polynomials)
        ):
            continue  # the best-supported polynomials only, each once
        if unmasked >= MAX_UNMASKS:
            break
        unmasked += 1
        key_sum = ring.reconstruct(np.stack([points[h] for h in subset]), [xs[h] for h in subset])
        centred = unmask(key_sum)
        reason = check(centred)
        if reason is None:
            polynomials.append(here)
            if opened is None:
                opened = (centred, here)
        elif opened is None:
            reasons.append(reason)
    if opened is not None:
        off = [h for h in names if all(h not in p for p in polynomials)]
        return opened[0], off
    raise ShareMismatch(
        f"no {t} of the {len(names)} shares of the key sum open a sum that checks "
        f"({reasons[0]}): a share is wrong"
        + (" and exactly t answered, so it cannot be found" if len(names) == t else "")
    )
