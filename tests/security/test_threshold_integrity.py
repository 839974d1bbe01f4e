"""Every threshold sum proves itself before it is used (``secagg.threshold.combine``).

A lying holder (garbage, one coefficient off, or an offset chosen to shift the revealed
sum by a value it picks) and a dealer that seals one holder a share off its polynomial,
each at exactly t, t + 1 and t + 2 answers: the sum is never wrongly opened (the check block
and the headroom catch a wrong key sum), a lie among more than t answers is routed around
and the off holder named, a lie among exactly t skips the round, and no lie aborts a seed.
Before the check (issue 46), a liar at exactly t shifted a one-block release by a chosen
offset, and one at t + 1 aborted the seed.
"""

from __future__ import annotations

import numpy as np
import pytest

import secagg
from secagg import wire
from secagg.errors import RoundSkipped
from secagg.threshold.params import get_preset, public_seed
from secagg.wire import Envelope
from tests.harness import BackendRound

IDS = [f"client_{i}" for i in range(5)]  # t = 3
N = 1000  # one data block


def values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, N)


def parts_of(field: wire.Field) -> list[bytes]:
    env = Envelope.from_bytes(Envelope("a", "b", 0, "x", {"f": field}).to_bytes())
    return [bytes(p) for p in env.ciphertext_parts("f")]


def a_round(answering: int):
    """Five clients, the sum of all five uploads at 0.2, and only ``answering`` holders
    online (the last ones offline)."""
    r = BackendRound(IDS, N, backend="threshold", decryption_budget=4)
    xs = {c: values(k) for k, c in enumerate(IDS)}
    handles = r.uploads(xs)
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.2] * 5)
    for c in IDS[answering:]:
        r.clients[c].on_decrypt_share = _offline  # type: ignore[method-assign]
    return r, total, sum(0.2 * x for x in xs.values())


def _offline(env):
    raise ConnectionError("offline")


def lie(r: BackendRound, liar: str, change) -> None:
    """``liar``'s answers carry ``change(share)`` instead of its share."""
    client = r.clients[liar]
    honest = client.on_decrypt_share

    def lying(env):
        out = honest(env)
        share = client.ring.from_bytes(parts_of(out["share"])[0], 1)[0]
        return {**out, "share": wire.ciphertext([client.ring.to_bytes(change(share))])}

    client.on_decrypt_share = lying  # type: ignore[method-assign]


def one_off(p: int):
    def change(share):
        share = share.copy()
        share[17] = (share[17] + 1) % p
        return share

    return change


def garbage(p: int):
    return lambda share: np.random.default_rng(5).integers(0, p, share.size, dtype=np.uint64)


def chosen_offset(r: BackendRound, liar: str, total, offset: float):
    """The lie that shifts a one-block release by ``offset`` at every value when exactly
    these t holders answer: δ = −(a_0·λ_liar)^{-1}·round(Δ·2^wb·offset), since the server
    unmasks Σ w_i b_i − a_0·(K + λ_liar·δ). ``a`` is public; only the check block and the
    headroom stand in its way."""
    ring, preset = r.server.ring, r.server.preset
    p = ring.p
    answering = IDS[:3]
    xs = [1 + IDS.index(h) for h in answering]
    lam = ring.lagrange(xs)[answering.index(liar)]
    basis = r.server.descriptor(r.ctx(), total, "reveal", "global_update").basis
    a0 = ring.public(public_seed(preset, basis), 1)[0]  # NTT form
    target = np.zeros(preset.ring_dim, dtype=np.int64)
    target[:N] = int(round(offset * preset.scale * 2**preset.weight_bits))
    t_hat = ring.ntt(np.mod(target, p).astype(np.uint64)[None, :])[0]
    inverse = np.array([pow(int(v) * lam % p, -1, p) for v in a0], dtype=object)
    delta_hat = np.array([(-int(t) * int(i)) % p for t, i in zip(t_hat, inverse)], dtype=np.uint64)
    delta = ring.intt(delta_hat[None, :])[0]
    return lambda share: ((share.astype(object) + delta.astype(object)) % p).astype(np.uint64)


@pytest.mark.parametrize("kind", ["one coefficient off", "garbage"])
@pytest.mark.parametrize("answering", [4, 5])
def test_a_lying_holder_among_more_than_t_answers_is_routed_around_and_named(kind, answering):
    r, total, exact = a_round(answering)
    p = r.server.ring.p
    lie(r, IDS[1], one_off(p) if kind == "one coefficient off" else garbage(p))
    ctx = r.ctx()
    got, who = r.server.reveal(ctx, total, "global_update")
    assert np.abs(got - exact).max() < 1e-5  # the sum is right (weights at 2^-16)
    assert who.endswith(f"off the polynomial: {IDS[1]} (a wrong share, or a dealer's)")
    assert IDS[1] not in ctx.excluded  # named, not blamed: a dealer could have framed it


@pytest.mark.parametrize("kind", ["one coefficient off", "garbage", "a chosen offset"])
def test_a_lying_holder_among_exactly_t_answers_skips_the_round(kind):
    r, total, exact = a_round(3)
    p = r.server.ring.p
    change = {
        "one coefficient off": lambda: one_off(p),
        "garbage": lambda: garbage(p),
        "a chosen offset": lambda: chosen_offset(r, IDS[1], total, 0.25),
    }[kind]()
    if kind == "a chosen offset":  # the lie is the real attack: without a check it works
        from secagg.backends.consent import gather_consents

        d = r.server.descriptor(r.ctx(), total, "reveal", "global_update")
        consents = gather_consents(r.ctx(), d, r.server.signers)
        shares = {}
        for j, h in enumerate(IDS[:3]):
            request = {
                "release": wire.config({"descriptor": d.to_config(), "consents": consents}),
                "holders": wire.config({"ids": IDS}),
                "preimages": wire.ciphertext([e.seeds for e in total.entries]),
                "shares": wire.ciphertext([total.sealed[e.client][j] for e in total.entries]),
            }
            out = r.ask(h, "decrypt_share", request)
            share = r.server.ring.from_bytes(parts_of(out["share"])[0], 1)[0]
            shares[h] = change(share) if h == IDS[1] else share
        key = r.server.ring.reconstruct(np.stack(list(shares.values())), [1, 2, 3])
        centred = r.server.ring.unmask(total.total, key, public_seed(r.server.preset, d.basis))
        shifted = centred[0, :N] / (r.server.preset.scale * 2**16)
        assert np.abs(shifted - exact - 0.25).max() < 1e-5
        r, total, exact = a_round(3)  # a fresh round: those consents are spent
        change = chosen_offset(r, IDS[1], total, 0.25)
    lie(r, IDS[1], change)
    with pytest.raises(RoundSkipped, match="exactly t answered"):
        r.server.reveal(r.ctx(), total, "global_update")


def _dealer_off_for(holder_index: int):
    """A ThresholdClient.protect that seals holder ``holder_index`` a share off the dealer's
    polynomial (a valid seal of a wrong value): the dealer cheats, the holder is honest."""
    from secagg.secret import threshold_client

    original = threshold_client.share_payloads

    def off(ring_, key, t, n):
        payloads = original(ring_, key, t, n)
        if holder_index >= t - 1:  # a whole ring element: one coefficient moved
            share = ring_.from_bytes(payloads[holder_index], 1)[0].copy()
            share[3] = (share[3] + 1) % ring_.p
            payloads[holder_index] = ring_.to_bytes(share)
        return payloads

    return original, off


@pytest.mark.parametrize("answering", [3, 4, 5])
def test_a_dealer_sealing_one_holder_an_off_share_never_opens_a_wrong_sum(answering, monkeypatch):
    """client_0 deals holder 4 (x = 5) a share off its polynomial. With 4 holders the
    wronged one is offline and nothing is wrong; with all 5 the sum is right and holder 4 is
    named as off the polynomial but not excluded (the dealer could not be told from it);
    with exactly t = 3 (holders 0, 1, 2) nothing is wrong either. Then holder 4 among exactly
    t answers: the round is skipped, never a wrong sum."""
    from secagg.secret import threshold_client

    _, off = _dealer_off_for(4)
    r = BackendRound(IDS, N, backend="threshold", decryption_budget=4)
    xs = {c: values(k) for k, c in enumerate(IDS)}
    monkeypatch.setattr(threshold_client, "share_payloads", off)
    dealt = {IDS[0]: r.upload(IDS[0], xs[IDS[0]])}
    monkeypatch.undo()
    handles = {**dealt, **r.uploads({c: xs[c] for c in IDS[1:]})}
    exact = sum(0.2 * x for x in xs.values())
    total = r.server.weighted_sum([handles[c] for c in IDS], [0.2] * 5)
    for c in IDS[answering:]:
        r.clients[c].on_decrypt_share = _offline  # type: ignore[method-assign]
    ctx = r.ctx()
    got, who = r.server.reveal(ctx, total, "global_update")
    assert np.abs(got - exact).max() < 1e-5
    assert ("off the polynomial: client_4" in who) == (answering == 5)
    assert not ctx.excluded.keys() - set(IDS[answering:])  # no holder blamed

    r2 = BackendRound(IDS, N, backend="threshold", decryption_budget=4)
    monkeypatch.setattr(threshold_client, "share_payloads", off)
    dealt = {IDS[0]: r2.upload(IDS[0], xs[IDS[0]])}
    monkeypatch.undo()
    handles = {**dealt, **r2.uploads({c: xs[c] for c in IDS[1:]})}
    total = r2.server.weighted_sum([handles[c] for c in IDS], [0.2] * 5)
    for c in IDS[1:3]:  # holders 0, 3, 4 answer: the wronged one among exactly t
        r2.clients[c].on_decrypt_share = _offline  # type: ignore[method-assign]
    with pytest.raises(RoundSkipped, match="a share is wrong"):
        r2.server.reveal(r2.ctx(), total, "global_update")


def test_a_lying_holder_in_a_run_costs_nothing_and_aborts_no_seed():
    """End to end on six clients (t = 4): one holder lies in every answer; every round's
    sum is still right (the model equals the honest run's to the backend's precision), the
    audit names it, the seed completes."""
    from secagg.secret.threshold_client import ThresholdClient

    original = ThresholdClient.on_decrypt_share
    p = get_preset("lean").prime

    def lying(self, env):
        out = original(self, env)
        if self.id != "client_2" or not parts_of(out["share"]):
            return out
        share = self.ring.from_bytes(parts_of(out["share"])[0], 1)[0]
        return {**out, "share": wire.ciphertext([self.ring.to_bytes(garbage(p)(share))])}

    settings = dict(protocol="fedavg", backend="threshold", rounds=2, seeds=[3], local_steps=2)
    honest = secagg.run(**settings)
    ThresholdClient.on_decrypt_share = lying  # type: ignore[method-assign]
    try:
        lied = secagg.run(**settings)
    finally:
        ThresholdClient.on_decrypt_share = original  # type: ignore[method-assign]
    assert not lied.aborted
    assert np.abs(lied.final_params[3] - honest.final_params[3]).max() < 1e-5
    reveals = [r for r in lied.audit.records if r["event"] == "reveal"]
    assert reveals and all("off the polynomial: client_2" in r["by"] for r in reveals)


# ---- the combination search over every t-subset (``combine.open_checked``) ---------------------
def _shares_on(r, points: dict[int, np.ndarray], xs: list[int]) -> dict[int, np.ndarray]:
    """The values at ``xs`` of the polynomial of degree < len(points) through ``points``."""
    known_x = list(points)
    known = [points[x] for x in known_x]
    return {x: r.combine(known, r.lagrange(known_x, at=x)) for x in xs}


def _open(r, shares: dict[str, np.ndarray], xs: dict[str, int], t: int, key_sum):
    from secagg.threshold.combine import open_checked

    def check(centred):  # a sum checks only under the right key sum (as check_sum does)
        return None if np.array_equal(centred, key_sum) else "the check block is not noise"

    return open_checked(r, shares, xs, t, lambda k: k, check)


def test_two_coordinated_liars_among_t_plus_two_answers_cannot_skip_the_round():
    """t = 4, six answers, two of them lying together: four honest shares are there, so
    some t-subset opens the sum (the search no longer stops at the leave-one-out subsets,
    which each hold a liar), and the two liars are named."""
    from secagg.threshold.ring import ring

    preset = get_preset("wide")
    r = ring(preset.ring_dim, preset.prime)
    t, names = 4, [f"h{i}" for i in range(1, 7)]
    xs = {h: i + 1 for i, h in enumerate(names)}
    key_sum = r.key()
    coefficients = {0: key_sum, **{x: r.key() for x in (1, 2, 3)}}
    honest = _shares_on(r, coefficients, list(xs.values()))
    shares = {h: honest[xs[h]] for h in names}
    liars = ("h1", "h2")  # the first two: every leave-one-out subset of the first t holds one
    for h in liars:
        shares[h] = r.combine([shares[h], r.key()], [1, 1])
    opened, off = _open(r, shares, xs, t, key_sum)
    np.testing.assert_array_equal(opened, key_sum)
    assert sorted(off) == list(liars)


def test_liars_whose_lies_vanish_at_zero_get_no_honest_holder_named():
    """Two liars add e(x), a polynomial of degree < t with e(0) = 0 and e at two honest
    holders 0: the liars and those two lie on a second polynomial whose sum also checks (the
    same key sum). From the shares alone the two quartets cannot be told apart, so nobody is
    named: before, the first polynomial found named the other two honest holders."""
    from secagg.threshold.ring import ring

    preset = get_preset("wide")
    r = ring(preset.ring_dim, preset.prime)
    t, names = 4, [f"h{i}" for i in range(1, 7)]
    xs = {h: i + 1 for i, h in enumerate(names)}
    key_sum = r.key()
    honest = _shares_on(r, {0: key_sum, **{x: r.key() for x in (1, 2, 3)}}, list(xs.values()))
    zero = np.zeros_like(key_sum)
    # e: 0 at x = 0 and at h3, h4, a chosen value at h1 (degree < 4: four points fix it);
    # the liars h1 and h2 add it to their shares
    e = _shares_on(r, {0: zero, xs["h3"]: zero, xs["h4"]: zero, xs["h1"]: r.key()}, [1, 2])
    shares = {h: honest[xs[h]] for h in names}
    for h in ("h1", "h2"):
        shares[h] = r.combine([honest[xs[h]], e[xs[h]]], [1, 1])
    opened, off = _open(r, shares, xs, t, key_sum)
    np.testing.assert_array_equal(opened, key_sum)
    assert off == []


def test_a_holder_named_in_two_reveals_is_asked_no_more():
    """A holder that lies in every answer is named off the polynomial in two reveals, then
    set aside: the third release asks the others only (its answer budget stays where it
    was), the audit says so where it happens, and every sum stays right."""
    from secagg.backends.threshold_server import SET_ASIDE_AFTER

    r = BackendRound(IDS, N, backend="threshold", decryption_budget=8)
    liar = r.clients[IDS[1]]
    original = liar.on_decrypt_share
    p = get_preset(r.server.preset.name).prime

    def lying(env):
        out = original(env)
        share = liar.ring.from_bytes(parts_of(out["share"])[0], 1)[0]
        return {**out, "share": wire.ciphertext([liar.ring.to_bytes(garbage(p)(share))])}

    liar.on_decrypt_share = lying  # type: ignore[method-assign]
    said = []
    for k in range(SET_ASIDE_AFTER + 1):
        r.round = k
        handles = r.uploads({c: values(10 * k + i) for i, c in enumerate(IDS)})
        total = r.server.weighted_sum([handles[c] for c in IDS], [0.2] * 5)
        before = liar.decryptions
        got, by = r.server.reveal(r.ctx(), total, "global_update")
        expected = 0.2 * sum(values(10 * k + i) for i in range(5))
        np.testing.assert_allclose(got, expected, atol=1e-5)  # weights in 2^-16
        said.append(by)
        assert (liar.decryptions > before) == (k < SET_ASIDE_AFTER)
    assert all(f"off the polynomial: {IDS[1]}" in by for by in said[:SET_ASIDE_AFTER])
    assert f"set aside from now on: {IDS[1]}" in said[SET_ASIDE_AFTER - 1]
    assert IDS[1] not in said[-1]
