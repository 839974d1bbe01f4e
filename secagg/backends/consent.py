"""The server's side of a verified release: every contributor's signed consent, gathered
before an aggregate goes to anyone who opens it (``secagg.ckks.release`` says why)."""

from __future__ import annotations

from collections.abc import Mapping

from secagg import wire
from secagg.ckks.release import Descriptor, signature_bytes, verify_consent
from secagg.errors import ClientInputError, ConsentRefused


def gather_consents(ctx, d: Descriptor, signers: Mapping[str, bytes] | None) -> dict[str, str]:
    """Every contributor's signature over ``d``; ConsentRefused if any is missing."""
    contributors = [client for client, _, _ in d.entries]
    replies = ctx.ask(
        "consent",
        {c: {"release": wire.config(d.to_config())} for c in contributors},
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
            round=ctx.round,
            phase="consent",
            exclusions=ctx.excluded,
        )
    return consents
