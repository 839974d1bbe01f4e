"""Pieces a protocol adds to the core (:class:`~secagg.protocols.base.Protocol`): each is one
behaviour that only some protocols have, with the hooks it needs and nothing else.

A protocol that has a piece subclasses it; the engine and the driver ask for it with
:func:`piece` and compose what it returns, so a protocol without the piece pays nothing and
the core stays small. A composition of protocols (``TwoPhase``) says which pieces it can
compose and refuses a part that brings any other piece, when it is built: a combination
either works or is refused with the reason, never half-forwarded.

=========================  ==================================================  ==============
piece                      what it adds                                         who has it
=========================  ==================================================  ==============
FixedServerStep            a server step in place of the run's optimizer       ADMM
Convergence                a reason to stop before the last round              ADMM, CoxPH
ExtraReleases              released vectors of other lengths than the model's  CoxPH, DEC,
                                                                                Ensemble,
                                                                                XGBoost
PreStage                   a federated pre-stage before round 0                FedDisco, DEC
FederatedInitialisation    the initial model from federated phases             DEC
ValidationFeedback         the clients' validation losses, every round         Auto-FedRL
ClientEvaluation           scores of the evaluation set made by the clients   Ensemble
=========================  ==================================================  ==============
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from secagg.protocols.base import Protocol, RoundAPI


class FixedServerStep(ABC):
    @abstractmethod
    def server_step(self, n_clients: int | None) -> dict[str, Any]:
        """The server step this protocol fixes in place of the run's server optimizer, as an
        optimizer config (ADMM's z-update for ``n_clients`` blocks; ``None`` clients: not
        known yet, for the run's record)."""


class Convergence(ABC):
    @abstractmethod
    def finished(self) -> str | None:
        """Why the run can stop before its last round (ADMM's residuals under tolerance);
        None: go on."""


class ExtraReleases(ABC):
    @abstractmethod
    def release_lengths(self, data: Any) -> tuple[int, ...]:
        """The lengths of the vectors it releases besides the model's (Ensemble: the
        evaluation set's size), from the task's data; clients refuse any other length."""


class PreStage(ABC):
    """A federated pre-stage before round 0: FedAvg on the same clients and backend, on a
    task of the protocol's own (FedDisco's β-VAE, DEC's autoencoder), whose final model the
    protocol receives. Everything the run needs to know about the stage is here, so that a
    protocol with a pre-stage needs no edit of the run's definition (``secagg.runspec``).

    The stage's task is built on the client side (it has a model, so it usually needs
    torch, which protocols do not import): :attr:`pre_stage_task` is the builder itself or
    a ``"module:function"`` path to it, imported when a client or the driver needs it
    (FedDisco's and DEC's live next to their models, in ``secagg.clients.tasks``)."""

    #: the stage's name: its records and requests are those of ``"<seed>-<pretrain>"``
    pretrain: ClassVar[str]
    #: the stage's task from the run's configuration and a seed's data, ``(config, data)
    #: -> Task``: the function, or ``"module:function"`` naming it
    pre_stage_task: ClassVar[Any]
    #: what refuses, before anything trains, data the stage cannot carry: ``(config, data)
    #: -> None`` raising ConfigError, or ``"module:function"`` naming it; None: any data
    pre_stage_check: ClassVar[Any] = None

    @abstractmethod
    def use_pretrained(self, params: np.ndarray, layout: Mapping[str, Any]) -> None:
        """The pre-stage's final model and its layout (:meth:`pre_stage_layout`)."""

    @abstractmethod
    def pre_stage_schedule(self, config: Any) -> tuple[int, float]:
        """The pre-stage's rounds and client learning rate: the protocol's own settings
        (DEC's ``pretrain_rounds``, ``pretrain_lr``) or the run's ``config`` (FedDisco's
        β-VAE: ``--vae-rounds``, ``--vae-lr``)."""

    def pre_stage_layout(self, data: Any) -> dict[str, Any]:
        """The layout of the stage's model for the task's ``data``, given to
        :meth:`use_pretrained` with its parameters (FedDisco: the β-VAE's sizes)."""
        return {}


class FederatedInitialisation(ABC):
    @abstractmethod
    def initial_reveals(self) -> int:
        """Aggregates ``initialise`` decrypts for the server before round 0 (DEC's k-means
        sums): added to the decryption budget the clients consent to."""

    @abstractmethod
    def initialise(self, ctx: RoundAPI, params: np.ndarray) -> np.ndarray:
        """The initial global model, from federated phases before round 0 (DEC's k-means
        centroids from the pre-trained embedding)."""


class ValidationFeedback(ABC):
    """Clients report their validation loss of the global model before round 0 and after
    every update (Auto-FedRL's reward); they need validation samples."""

    @abstractmethod
    def observe_validation(self, ctx: RoundAPI, losses: Mapping[str, float]) -> None:
        """The clients' validation losses of the current global model."""


class ClientEvaluation(ABC):
    """The run's evaluation set goes to the clients and the protocol scores it; there is no
    global model to score (Ensemble: the centres' averaged risk scores)."""

    @abstractmethod
    def use_evaluation_set(self, features: np.ndarray) -> None:
        """The evaluation set's features, before round 0."""

    @abstractmethod
    def predictions(self) -> np.ndarray | None:
        """Its outputs for the evaluation set after the last round (None before)."""


PIECES: tuple[type, ...] = (
    FixedServerStep,
    Convergence,
    ExtraReleases,
    PreStage,
    FederatedInitialisation,
    ValidationFeedback,
    ClientEvaluation,
)


def piece[P](protocol: Protocol, kind: type[P]) -> P | None:
    """``protocol``'s piece ``kind`` (an object with its hooks), or None if it has none."""
    return protocol.piece(kind)


def may_have(protocol_class: type[Protocol], kind: type) -> bool:
    """Whether a protocol of ``protocol_class`` may have piece ``kind``, answered from the
    class: it has it if it subclasses it, unless the class answers for parts it is built
    with (it overrides ``piece``, as ``TwoPhase``), when only a built one can tell."""
    from secagg.protocols.base import Protocol

    return issubclass(protocol_class, kind) or protocol_class.piece is not Protocol.piece


def pieces_of(protocol: Protocol) -> tuple[type, ...]:
    """The pieces ``protocol`` has, in :data:`PIECES` order."""
    return tuple(kind for kind in PIECES if protocol.piece(kind) is not None)


def pre_stage_of(protocol: Protocol) -> str | None:
    """The pre-stage ``protocol`` runs before round 0 (``PreStage.pretrain``), or None."""
    stage = protocol.piece(PreStage)
    return stage.pretrain if stage is not None else None
