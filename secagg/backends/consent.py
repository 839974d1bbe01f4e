"""The server's side of a verified release: every contributor's signed consent, gathered
before an aggregate goes to anyone who opens it (``secagg.ckks.release`` says why)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from secagg import wire
from secagg.backends.coalition import independent_rows, participation_groups, weakest_share
from secagg.ckks.release import Descriptor, ReleasePolicy, signature_bytes, verify_consent
from secagg.errors import (
    ClientInputError,
    ConfigError,
    ConsentRefused,
    ProtocolStateError,
    ReleaseRefused,
    RoundSkipped,
)


class ReleaseRecord:
    """The server's copy of the rules its clients hold every release to
    (``secagg.backends.coalition``), with the releases made so far: a release they would
    all refuse is not asked for. The round is skipped instead (``RoundSkipped``), so that a
    client whose scalars shape the weights (LARC's ΔL) cannot end the run by making every
    other client refuse. The clients check for themselves regardless."""

    def __init__(self, policy: ReleasePolicy):
        self.policy = policy
        #: upload digest -> the releases it entered
        self.seen: dict[str, list[Descriptor]] = {}
        #: with fixed participation, the contributor set of the run's releases, by length
        #: (the clients' ``RunLedger``: a release over another set pauses, it is not asked)
        self.run_sets: dict[int, list[str]] = {}
        #: and a basis of the weight rows over it (or over each group), by the field the
        #: uploads came as, their length and the model's epoch: the clients key rows by
        #: model only where the protocol's weights vary, so this copy foresees their
        #: refusals there and is looser elsewhere (an honest protocol's fixed weights repeat)
        self.run_rows: dict[tuple, list[list[int]]] = {}
        #: with ``participation="groups"``: each roster client's group (``deal``), and each
        #: group's members
        self.groups: dict[str, int] = {}
        self._members: dict[int, list[str]] = {}

    def deal(self, roster: Sequence[str]) -> None:
        """Deal the roster into the policy's participation groups (public, from the names:
        ``coalition.participation_groups``); nothing unless the participation is by groups."""
        if self.policy.participation == "groups" and roster:
            try:
                self.groups = participation_groups(list(roster), self.policy.groups)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            self._members = {}
            for client, group in sorted(self.groups.items()):
                self._members.setdefault(group, []).append(client)

    def members(self, group: int) -> list[str]:
        return list(self._members.get(group, ()))

    def sitting_out(self, clients: Collection[str]) -> dict[str, str]:
        """Of ``clients``, those whose group has a member missing (``ServerBackend``)."""
        if not self.groups:
            return {}
        present = set(clients)
        out = {}
        for c in present:
            missing = [m for m in self.members(self.groups.get(c, -1)) if m not in present]
            if missing:
                out[c] = (
                    f"its participation group sits the round out: {', '.join(missing)} did "
                    "not answer (a release holds whole groups only)"
                )
        return out

    def admit(self, ctx, d: Descriptor) -> None:
        heaviest = max((abs(k) for _, k, _ in d.entries), default=0)
        if self.policy.max_weight is not None and heaviest > self.policy.max_weight:
            raise ProtocolStateError(
                f"{d.name}: a weight of {heaviest / self.policy.max_weight:.6g} (> 1); the "
                "clients release sums with weights |w| <= 1 only"
            )
        if self.groups and self.policy.min_contributors > 1:
            partial = self.sitting_out(d.weights)
            if partial:
                raise RoundSkipped(
                    f"{d.name}: participation is by groups and "
                    f"{', '.join(sorted(partial))} would enter without their whole group; "
                    "the clients release only sums of whole groups (the round is skipped)",
                    round=ctx.round,
                    phase="consent",
                    exclusions=ctx.excluded,
                )
        fixed = self.run_sets.get(d.n_values)
        first_short = fixed is None and set(ctx.unanswered) - set(d.weights)
        if (
            self.policy.participation == "fixed"
            and self.policy.min_contributors > 1
            and (first_short or (fixed is not None and fixed != sorted(d.weights)))
        ):
            missing = sorted(
                set(ctx.unanswered) - set(d.weights)
                if fixed is None
                else set(fixed) ^ set(d.weights)
            )
            raise RoundSkipped(
                f"{d.name}: participation is fixed and {', '.join(missing) or 'the set'} "
                f"{'is' if len(missing) == 1 else 'are'} not in this round's sum; the clients "
                "release only sums over the run's one contributor set, so releases pause "
                "until every contributor answers again (the round is skipped)",
                round=ctx.round,
                phase="consent",
                exclusions=ctx.excluded,
            )
        earlier = []
        for _, _, digest in d.entries:
            for before in self.seen.get(digest, []):
                if before not in earlier and before.hash() != d.hash():
                    earlier.append(before)
        try:
            self.policy.check(d)
            self.policy.check_weightings(d, earlier)
            rows = self._check_run_rows(ctx, d)  # after the release's own rules: theirs say more
            # the set and the rows are fixed once asked for: the clients that consent record
            # them, whether or not the release then happens
            self.run_sets.setdefault(d.n_values, sorted(d.weights))
            for key, kept in rows.items():
                self.run_rows[key] = independent_rows(kept)
        except ReleaseRefused as exc:
            raise RoundSkipped(
                f"{d.name}: the clients' release rules refuse it ({exc}); the round is skipped",
                round=ctx.round,
                phase="consent",
                exclusions=ctx.excluded,
            ) from None

    def _check_run_rows(self, ctx, d: Descriptor) -> dict[tuple, list[list[int]]]:
        """The run's rows with ``d``'s, by key in ``run_rows``, over the run's set or over
        each whole group ``d`` holds; RoundSkipped if, with the rows of the run's earlier
        releases made from the same model, they leave the clients' run rule unmet
        (``RunLedger``)."""
        fixed = self.run_sets.get(d.n_values)
        if self.policy.participation == "per-round" or self.policy.min_contributors < 2:
            return {}
        if not self.groups and fixed is not None and fixed != sorted(d.weights):
            return {}  # the set check decides
        with_d = {}
        for key, order in self._row_columns(ctx, d):
            rows = [*self.run_rows.get(key, []), [d.weights[c] for c in order]]
            share = weakest_share(rows, self.policy.colluders, self.policy.min_contributors)
            if share > 0.0 and share >= self.policy.min_share:
                with_d[key] = rows
                continue
            raise RoundSkipped(
                f"{d.name}: its weights, with the run's earlier releases of uploads made from "
                f"the same model, would let a combination single an upload out (weakest share "
                f"over the run {share:.3g}); the clients refuse it, so the round is skipped",
                round=ctx.round,
                phase="consent",
                exclusions=ctx.excluded,
            )
        return with_d

    def _row_columns(self, ctx, d: Descriptor) -> list[tuple[tuple, list[str]]]:
        """The columns the clients keep rows over for ``d`` (its whole set, or each whole
        group it holds), each with its key in ``run_rows``."""
        stream = _row_key(ctx, d)
        if not self.groups:
            return [((*stream, -1), sorted(d.weights))]
        held = sorted({self.groups[c] for c in d.weights if c in self.groups})
        return [((*stream, g), self.members(g)) for g in held]

    def record(self, d: Descriptor) -> None:
        for _, _, digest in d.entries:
            if d not in self.seen.setdefault(digest, []):
                self.seen[digest].append(d)


def _row_key(ctx, d: Descriptor) -> tuple[int, str, int]:
    """The stream and model a release's uploads were made from, as the server knows them:
    their length, the field they came as (the clients key by the phase they answered) and
    the epoch of the model (``RoundContext.epoch``: the rounds that moved it so far)."""
    named = getattr(ctx, "upload_name", None)
    name = named(d.entries[0][2]) if named is not None and d.entries else ""
    return d.n_values, name, int(getattr(ctx, "epoch", 0))


def gather_consents(
    ctx,
    d: Descriptor,
    signers: Mapping[str, bytes] | None,
    record: ReleaseRecord | None = None,
) -> dict[str, str]:
    """Every contributor's signature over ``d``; ConsentRefused if any is missing. With
    ``record``, a release the clients' rules refuse skips the round (``RoundSkipped``) before
    anyone is asked, and a consented one is recorded."""
    if record is not None:
        record.admit(ctx, d)
    contributors = [client for client, _, _ in d.entries]
    request = {"release": wire.config(d.to_config())}  # encoded once: n entries, n clients
    replies = ctx.ask(
        "consent",
        dict.fromkeys(contributors, request),
        expect={"consent": wire.CONFIG},
        reach_excluded=True,
        # read inside ``ask``: a consent that is not a JSON object excludes its sender
        on_reply=lambda _, env: env.config("consent"),
    )
    consents = {}
    for c, consent in replies.items():
        signature = consent.get("signature")
        if signers is not None and not (
            isinstance(signature, str)
            and verify_consent(signers.get(c, b""), c, d, signature_bytes(signature))
        ):
            ctx.exclude(c, "consent", ClientInputError(f"{c}'s consent does not verify"))
            continue
        consents[c] = signature
    missing = [c for c in contributors if c not in consents]
    if missing:
        culprits = missing if len(missing) < len(contributors) else []
        raise ConsentRefused(
            f"{d.kind} of {d.name!r}: no consent from {missing}"
            + ("" if culprits else " (every contributor refused the request)")
            + "; "
            + "; ".join(f"{c}: {ctx.excluded.get(c, 'no answer')}" for c in missing),
            culprits=culprits,
            unanswered=[c for c in culprits if c in ctx.unanswered],
            round=ctx.round,
            phase="consent",
            exclusions=ctx.excluded,
        )
    if record is not None:
        record.record(d)
        note = getattr(ctx, "record_release", None)  # the audit's run view
        if note is not None:
            note(d, record.policy, {c: record.groups[c] for c in d.weights if c in record.groups})
    return consents
