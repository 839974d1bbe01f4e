"""Typed errors. Every error a caller can act on derives from :class:`SecaggError`.

The round engine catches :class:`ClientInputError` subclasses per client: the offending
client is excluded from the round and the audit records why; the run goes on.
"""

from collections.abc import Iterable


class SecaggError(Exception):
    """Base class of every error secagg raises on purpose."""


class ConfigError(SecaggError, ValueError):
    """An option or preset is invalid; the message says which and what is allowed."""


class ClientInputError(SecaggError):
    """Something a client sent cannot be used. The client is excluded from the round."""


class WireError(ClientInputError):
    """Bytes that do not decode to a valid envelope."""


class TruncatedMessage(WireError):
    """The bytes end before the envelope says they should."""


class OversizedMessage(WireError):
    """The envelope is larger than the receiver accepts."""


class UnsupportedVersion(WireError):
    """The envelope was written by an incompatible wire-format version."""


class MalformedMessage(WireError):
    """The bytes are not an envelope, or its header is inconsistent."""


class UnexpectedField(ClientInputError):
    """A field is missing, has the wrong kind, or is not finite."""


class UnknownSender(ClientInputError):
    """The envelope names a sender the server did not address."""


class DuplicateMessage(ClientInputError):
    """A second message from the same sender in the same round and phase."""


class DuplicateUpload(DuplicateMessage):
    """An upload whose seeds an upload already loaded this round had: a copy of another
    client's upload re-sent as the sender's own (a release would list one upload twice and
    every client would refuse it). The copy is refused at load and its sender excluded; the
    upload loaded first stands (``RoundContext.loaded``)."""


class StaleMessage(ClientInputError):
    """A reply for another round or phase than the one asked: replayed or stale."""


class RoundAborted(SecaggError):
    """A round cannot go on: no usable client is left (or too few) in some phase.

    The driver records it (``aborted`` in metrics.csv, an ``aborted`` audit record) and ends
    that seed's run; ``phase`` says where it happened and ``exclusions`` why each client
    was dropped."""

    def __init__(
        self,
        message: str,
        *,
        round: int | None = None,
        phase: str | None = None,
        exclusions: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.round, self.phase = round, phase
        self.exclusions = dict(exclusions or {})


class ProtocolStateError(SecaggError):
    """A request arrived that the receiver's state cannot answer (before training, without a
    key, without a model, ...): the protocol ran out of order."""


class ReleaseRefused(ProtocolStateError):
    """A client refuses to consent to, reveal or open an aggregate it cannot check: not a
    weighted sum of signed uploads, too few contributors or a dominant weight, another
    length, an upload already released once, or a budget spent (``secagg.ckks.release``)."""


class ConsentRefused(RoundAborted):
    """Contributors did not consent to releasing an aggregate their uploads are in, so it
    cannot be opened this round. ``culprits``: the clients that refused while the others
    consented to the same request (the engine takes them out of the run); empty when every
    contributor refused, i.e. the request itself broke the clients' policy. ``unanswered``:
    the culprits that gave no answer at all (a node down or late) rather than a refusal."""

    def __init__(
        self,
        message: str,
        *,
        culprits: list[str],
        unanswered: Iterable[str] = (),
        **kwargs,
    ):
        super().__init__(message, **kwargs)
        self.culprits = list(culprits)
        self.unanswered = sorted(set(unanswered) & set(culprits))


class RoundSkipped(ConsentRefused):
    """A round cannot release its sum without breaking what the clients require: its uploads
    cannot make a release their rules allow (too few left after dropouts to hide each
    honest upload among enough others, whoever colludes; weights that would single one
    out), or the holders' shares open no sum that checks (a wrong share among exactly t).
    The round is skipped and the run goes on, with the reason in the audit; nobody is
    blamed."""

    def __init__(self, message: str, **kwargs):
        super().__init__(message, culprits=[], **kwargs)


class GroupSatOut(SecaggError):
    """A client's upload stays out of the round's sums because its participation group is
    not whole this round (``--participation groups``): another member did not answer. Not
    the client's doing: it is asked again next round."""


class MalformedCiphertext(ClientInputError):
    """Ciphertext bytes that SEAL cannot load, or the wrong number or kind of ciphertexts."""


class WrongContext(ClientInputError):
    """A ciphertext made under other parameters (another preset, level or scale)."""


class ValueRangeError(SecaggError, ValueError):
    """A value is too large for the CKKS preset (CKKS would overflow silently)."""


class KeySetupError(SecaggError):
    """Key material is missing, or a wrapped key does not open (tampered or misaddressed)."""


class StateError(ConfigError):
    """A client's exported state cannot be restored here: another client's, truncated or
    garbled, written by another state version, or made for another task, backend or
    protocol. The client that refused it keeps the state it had."""


class DataNotHeld(ConfigError):
    """A site's data was asked for where it is not held: a deployment's coordinator holds its
    own test set only, and each site's data stays on its node
    (:meth:`secagg.ClientData.not_held`). Nothing was read; the message says what asked."""


class PolicyRefused(ProtocolStateError):
    """A client refuses a request its own provisioning does not allow (a phase the run does
    not use, training settings or DP other than its own, a round gone back, a budget
    spent): nothing is computed (``secagg.clients.policy``)."""


#: what a failed reply may say about why: a fixed code per kind of failure, never a value
#: from the client's data (``ClientRefused``); the first matching class wins
ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (PolicyRefused, "refused_by_policy"),
    (ReleaseRefused, "release_refused"),
    (ValueRangeError, "value_out_of_range"),
    (KeySetupError, "key_setup_failed"),
    (StateError, "state_refused"),
    (ProtocolStateError, "out_of_order"),
    (ClientInputError, "malformed_request"),
    (ConfigError, "bad_configuration"),
)


def error_code(error: BaseException) -> str:
    """The fixed code a reply carries for ``error`` (``internal_error`` if unforeseen)."""
    for kind, code in ERROR_CODES:
        if isinstance(error, kind):
            return code
    return "internal_error"


class RunNotComplete(SecaggError):
    """A run over Flower ended ``degraded`` or ``aborted`` (``secagg.runspec.status``):
    its ServerApp raises this once the run folder is written, so that Flower records the run
    as failed. ``status`` is the run's status, as in its run.json."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


class ClientRefused(SecaggError):
    """A client did not answer a request: what crosses the wire is the client, the phase and
    a fixed code (:data:`ERROR_CODES`), never the detail, which can carry values from the
    client's data (a ``ValueRangeError`` names the value). The client keeps the detail in
    its own log."""

    def __init__(self, client: str, phase: str, code: str):
        super().__init__(f"{client} refused {phase!r}: {code}")
        self.client, self.phase, self.code = client, phase, code
