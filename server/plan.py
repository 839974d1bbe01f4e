"""What a run asks of its clients and what it allows, checked once.

- :class:`~secagg.protocols.plan.TrainingPlan` (re-exported here): the settings every
  training request carries, which each client's own policy holds too;
- :class:`RunPolicy`: how the server runs (server-blind, plaintext updates allowed,
  streaming, minimum clients, message size limit);
- :func:`check_run`: the one place that says which protocol, backend and policy go together.
  The experiment driver calls it before any work, the engine again for direct use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from secagg import wire
from secagg.errors import ConfigError
from secagg.parts import check_part_values
from secagg.protocols.base import Capabilities, Protocol
from secagg.protocols.pieces import ValidationFeedback, piece, pre_stage_of
from secagg.protocols.plan import TrainingPlan

__all__ = ["RunPolicy", "TrainingPlan", "check_run"]


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    """How the server runs.

    Parameters:
        server_blind: the server never learns the global update; clients decrypt it and
            apply their copy of the server optimizer (encrypted backends only).
        allow_plaintext_updates: aggregators that are not sums (medians) may receive each
            client's update in plaintext on an encrypted backend; the audit says so.
        streaming: fold uploads into a running sum as they arrive, where the protocol's
            weights are known beforehand.
        min_clients: a round with fewer usable uploads is aborted before anything is
            combined, and a set-up that leaves fewer clients aborts the run before its first
            round (nothing released either way); ``"all"``: every client of the run (a
            pilot that must not lose a site).
        max_message_bytes: the largest reply the server decodes.
        max_weight_share: the clients' cap on one upload's share of a sum's weight (their
            release policy's; 1: no cap, as on plain): the server caps every sum to it so
            they consent.
        part_values: move the model, the uploads and the releases in parts of this many
            values (``secagg.parts``; the clients' provisioning fixes the same); 0: whole.
    """

    server_blind: bool = False
    allow_plaintext_updates: bool = False
    streaming: bool = True
    min_clients: int | str = 1
    max_message_bytes: int = wire.DEFAULT_MAX_BYTES
    max_weight_share: float = 0.5
    part_values: int = 0

    def __post_init__(self):
        check_min_clients(self.min_clients)
        check_part_values(self.part_values)

    def required_clients(self, n_clients: int) -> int:
        """The fewest clients a round may go on with, in a run of ``n_clients``."""
        return n_clients if self.min_clients == "all" else int(self.min_clients)


def check_min_clients(value: Any) -> None:
    """ConfigError unless ``value`` is a positive integer or ``"all"``."""
    if value != "all" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"min_clients must be a positive integer or 'all', got {value!r}")


def check_run(
    protocol: str,
    capabilities: Capabilities,
    *,
    backend: str,
    backend_can_read: bool,
    policy: RunPolicy,
    client_dp: bool,
    validation: bool | None = None,
    pre_stage: str | None = None,
    validation_feedback: bool = False,
) -> None:
    """Refuse combinations that cannot work, with what to do instead.

    ``validation``: whether the clients hold validation samples (None: unknown here);
    ``pre_stage`` and ``validation_feedback``: the protocol's pieces of those names
    (:func:`check_protocol_run` reads them from the protocol)."""
    if policy.server_blind and backend_can_read:
        raise ConfigError(
            "server-blind runs need an encrypted backend (--backend ckks): on "
            f"{backend} the server reads every upload anyway"
        )
    if policy.server_blind and capabilities.server_computes_update:
        raise ConfigError(
            f"{protocol} forms the global update in plaintext on the server "
            "(from revealed sums), so it cannot run server-blind"
        )
    if policy.server_blind and pre_stage:
        raise ConfigError(
            f"{protocol} pre-trains a model ({pre_stage}) that the "
            "server hands to the clients, which a server-blind run would keep "
            "from it; run it without --server-blind"
        )
    if (
        capabilities.needs_individual_updates
        and not backend_can_read
        and not policy.allow_plaintext_updates
    ):
        raise ConfigError(
            f"{protocol} needs every client's update in plaintext (it is not a sum), so it "
            f"cannot run on {backend} as is; pass --allow-plaintext-updates to accept that "
            "(the audit will then report individual_updates_revealed: true)"
        )
    if client_dp and not capabilities.client_dp_compatible:
        raise ConfigError(
            f"{protocol}'s update is not one weighted sum of the clients' "
            "noised uploads, so client-level DP cannot be accounted for it; use "
            "a weighted-sum protocol (fedavg, fedadam, larc, costwagg, ...)"
        )
    if policy.part_values:
        why = (
            "it does not stream (its weights come after the uploads)"
            if not (capabilities.streams and policy.streaming)
            else "its round is more than one streamed sum, revealed and stepped"
            if not capabilities.moves_in_parts
            else "a server-blind run sends the whole update to every client"
            if policy.server_blind
            else "client-level DP is accounted over one release a round"
            if client_dp
            else None
        )
        if why is not None:
            raise ConfigError(
                f"{protocol} cannot move the model in parts (part_values "
                f"{policy.part_values}): {why}; parts are for streaming runs of the FedAvg "
                "family (fedavg, fedadam, ...) without server-blind or client DP, or set "
                "part_values 0"
            )
    if validation_feedback and validation is False:
        raise ConfigError(
            f"{protocol} rewards its agent with the clients' validation loss: "
            "give the clients validation samples with --validation-split "
            "(e.g. 0.2)"
        )


def check_protocol_run(protocol: Protocol, **run: Any) -> None:
    """:func:`check_run` for a built protocol: its capabilities and its pieces (and, for a
    round in parts, that it finishes its streamed sum as the base does)."""
    policy = run.get("policy")
    if (
        policy is not None
        and policy.part_values
        and type(protocol).finish_sum is not Protocol.finish_sum
    ):
        raise ConfigError(
            f"{protocol.name} cannot move the model in parts (part_values "
            f"{policy.part_values}): it finishes its streamed sum its own way "
            "(finish_sum), so its round is more than one streamed sum; set part_values 0"
        )
    check_run(
        protocol.name,
        protocol.capabilities,
        pre_stage=pre_stage_of(protocol),
        validation_feedback=piece(protocol, ValidationFeedback) is not None,
        **run,
    )
