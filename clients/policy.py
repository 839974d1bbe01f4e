"""What a client answers, from its own provisioning: the client is the trust anchor.

A server may deviate (DESIGN §2): it may ask for a phase the run never needs, train one
client with the run's settings and every other with ``lr = 0`` (their uploads are then
encryptions of zero, and the ordinary sum reveals the one), drop the client's DP from the
request, send different models to different clients (Pasquini et al., CCS 2022), or query a
client's data through a phase that answers any model it is sent. So everything a client's
privacy rests on comes from its own :class:`ClientPolicy`, fixed when it is provisioned
(in simulation the driver hands each client its own copy; over Flower it is the node's own
experiment file), and a request is checked against it *before* anything is computed:

============================  ============================================================
setting                       checked by
============================  ============================================================
phases it answers             :meth:`ClientPolicy.check_phase`: the engine's phases this run
                              uses (``plaintext_update`` only where the client's own
                              provisioning allows plaintext updates); its backend's and
                              protocol's own phases
rounds                        :class:`PolicyGuard`: never backwards, no training past the
                              last round, ``train`` once a round
training settings             :meth:`ClientPolicy.training`: lr (its schedule), local steps
                              or epochs, FedProx μ equal the provisioning's; a protocol that
                              varies one per round (Auto-FedRL) within the provisioned range
client DP, scalar DP,         :meth:`ClientPolicy.training`: a request must ask for exactly
reports                       the provisioned ones; the client applies its own
validation                    :class:`PolicyGuard`: at most once a round (twice in round 0:
                              the initial model and the first update)
reported scalars              :class:`PolicyGuard`: at most ``scalar_budget`` in all
server optimizer              :meth:`ClientPolicy.server_optimizer_config`: its own (any
                              positive lr); LARC's α: the weight Ĝ's descriptor lists
what it consents to           the backend's release policy (contributors, weight floor and
                              cap), the *basis* below, and no upload of its own listed
                              under another sender
a round in parts              :class:`PolicyGuard`: each part of a round's update once,
                              after that round's training, its bounds from ``part_values``
                              (``secagg.parts``), never from the request
============================  ============================================================

**Basis.** Every protected upload is tagged with the digest of what it was made from
(:func:`upload_basis`): the round, the phase, the model the client held and every field of
the request except the model and its own planned weight. A client consents only to a
release whose every contributor lists the same basis as its own upload, so a sum of uploads
made from different models, different settings or different protocol fields (ADMM's local
steps) is never opened.

A refusal raises :class:`~secagg.errors.PolicyRefused` before any work.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg.ckks.release import PRECHECK
from secagg.errors import PolicyRefused, StateError
from secagg.parts import part_bounds
from secagg.protocols.base import Allowed
from secagg.protocols.plan import TrainingPlan
from secagg.wire import Field

#: the engine's own phases; which of them a client answers is its policy's business
ENGINE_PHASES = (
    "enroll",
    "train",
    "validate",
    "apply",
    "plaintext_update",
    "observe",
    "model_part",
    "upload_part",
)
#: request fields that legitimately differ between the clients of one sum: the model (the
#: basis holds the digest of the model the client actually trained from, sent or held) and
#: the client's own planned weight (its consent binds the weight it applied), and a planned
#: decryptor's precheck (which uploads to expand a check for while it trains: a hint it
#: verifies against the signed release, that changes nothing its upload is made from)
PER_CLIENT_FIELDS = frozenset({"model", "upload_weight", PRECHECK, f"{PRECHECK}.seeds"})


@dataclass(frozen=True, kw_only=True)
class ClientPolicy:
    """A client's own provisioning of what it answers (module docstring).

    Parameters:
        phases: the engine phases this client answers (see :data:`ENGINE_PHASES`).
        rounds: the rounds it trains at most.
        plan: its training plan: learning-rate schedule, local steps or epochs, FedProx's
            μ, client-level and scalar DP, the data-independent numbers it reports (the
            server's engine sends the same plan's settings).
        varies: training settings its protocol chooses per round, with what it allows
            (Auto-FedRL's searched lr and local steps).
        scalar_budget: how many scalars computed from its data it reports in all.
        max_validations: how many validation losses it reports in all.
        server_optimizer: the run's server optimizer (its config without the learning rate,
            which a server-lr schedule moves), for what a client steps or evaluates itself:
            server-blind updates and LARC's probe; None: the client takes none.
        part_values: the model, its update and the releases move in parts of this many
            values (``secagg.parts``: the parts' bounds come from here, never from a
            request); 0: whole.
    """

    phases: frozenset[str] = frozenset({"enroll", "train"})
    rounds: int = 1
    plan: TrainingPlan = field(default_factory=TrainingPlan)
    varies: Mapping[str, Allowed] = field(default_factory=dict)
    scalar_budget: int = 0
    max_validations: int = 0
    server_optimizer: Mapping[str, Any] | None = None
    part_values: int = 0

    def parts(self, n_values: int) -> list[tuple[int, int]]:
        """This client's parts of a model of ``n_values`` values (one, whole, without parts)."""
        return part_bounds(n_values, self.part_values)

    def check_phase(self, phase: str) -> None:
        if phase in ENGINE_PHASES and phase not in self.phases:
            raise PolicyRefused(f"this client's provisioning does not answer {phase!r}")

    def server_optimizer_config(self, requested: Any) -> dict[str, Any]:
        """A server optimizer's config from a request, if it is this client's own (any
        positive learning rate: the server's schedule moves it)."""
        own = self.server_optimizer
        if not isinstance(requested, dict) or own is None:
            raise PolicyRefused("this client takes no server optimizer from a request")
        lr = requested.get("lr", _ABSENT)
        fixed = {k: v for k, v in requested.items() if k != "lr"}
        if fixed != {k: v for k, v in own.items() if k != "lr"} or not (
            lr is _ABSENT
            or (isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < math.inf)
        ):
            raise PolicyRefused("the request's server optimizer is not this client's own")
        return dict(requested)

    @property
    def client_dp(self) -> dict[str, float] | None:
        """Its client-level DP as the client applies it (``{"clip", "sigma"}``), or None."""
        return None if self.plan.client_dp is None else self.plan.client_dp.config()

    @property
    def scalar_dp(self) -> dict[str, float] | None:
        """Its scalar DP (``{"low", "high", "sigma"}``), or None."""
        return None if self.plan.scalar_dp is None else self.plan.scalar_dp.config()

    def training(self, requested: Any, round_number: int) -> dict[str, Any]:
        """The settings to train with: the request's, if they are exactly what this client's
        provisioning gives for the round (or, for a setting its protocol varies, within the
        provisioned range); else PolicyRefused, before any work."""
        if not isinstance(requested, dict):
            raise PolicyRefused("a training request's settings are not a mapping")
        expected = self.plan.settings(round_number)
        if "steps" in self.varies and "steps" in requested:
            expected.pop("epochs", None)  # a protocol that searches the steps replaces epochs
            expected.setdefault("steps", self.plan.local_steps)
        for key in set(expected) | set(requested):
            if key in self.varies:
                value = requested.get(key, _ABSENT)
                if value is _ABSENT or not (
                    value == expected.get(key, _ABSENT) or self.varies[key].admits(value)
                ):
                    raise PolicyRefused(
                        f"training setting {key!r} lies outside what this client allows"
                    )
            elif requested.get(key, _ABSENT) != expected.get(key, _ABSENT):
                raise PolicyRefused(
                    f"training setting {key!r} differs from this client's provisioning"
                )
        return dict(requested)


_ABSENT = object()


class PolicyGuard:
    """What a client counts between messages against its policy: the latest round, the
    rounds it trained, its validations and reported scalars (exported with its state)."""

    def __init__(self, policy: ClientPolicy):
        self.policy = policy
        self.round = 0
        self.trained: set[int] = set()
        self.validations: dict[int, int] = {}
        self.scalars = 0
        #: the parts of the latest round's update already uploaded (part 0 with ``train``)
        self.uploaded: tuple[int, set[int]] = (-1, set())

    def check_round(self, round_number: int) -> None:
        if round_number < self.round:
            raise PolicyRefused(
                f"a request for round {round_number} after round {self.round} (rounds never "
                "go back)"
            )

    def answered(self, round_number: int) -> None:
        """A request of this round was answered: no later one may name an earlier round
        (a refused request moves nothing, so a garbled round number cannot lock it out)."""
        self.round = max(self.round, round_number)

    def train(self, round_number: int) -> None:
        if round_number >= self.policy.rounds:
            raise PolicyRefused(
                f"this client trains {self.policy.rounds} rounds; asked for round {round_number}"
            )
        if round_number in self.trained:
            raise PolicyRefused(f"this client already trained in round {round_number}")
        self.trained.add(round_number)

    def upload_part(self, round_number: int, index: int, parts: int) -> None:
        """Part ``index`` of this round's update may leave once, only after this round's
        training, and only within the ``parts`` this client's provisioning makes."""
        if round_number not in self.trained:
            raise PolicyRefused(f"a part of round {round_number}'s update before its training")
        if not 0 <= index < parts:
            raise PolicyRefused(f"part {index} of an update this client sends in {parts} parts")
        uploaded = self.uploaded[1] if self.uploaded[0] == round_number else set()
        if index in uploaded:
            raise PolicyRefused(f"part {index} of round {round_number}'s update already left")
        self.uploaded = (round_number, uploaded | {index})

    def validate(self, round_number: int) -> None:
        per_round = 2 if round_number == 0 else 1  # round 0: the initial model, then the update
        total = sum(self.validations.values())
        if (
            self.validations.get(round_number, 0) >= per_round
            or total >= self.policy.max_validations
        ):
            raise PolicyRefused(
                f"this client already reported its validation loss for round {round_number}"
            )
        self.validations[round_number] = self.validations.get(round_number, 0) + 1

    def scalar(self) -> None:
        if self.scalars >= self.policy.scalar_budget:
            raise PolicyRefused(
                f"this client reports at most {self.policy.scalar_budget} scalars from its data"
            )
        self.scalars += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "trained": sorted(self.trained),
            "validations": {str(r): n for r, n in self.validations.items()},
            "scalars": self.scalars,
            "uploaded": [self.uploaded[0], sorted(self.uploaded[1])],
        }

    def load_state_dict(self, state: Any) -> None:
        if not isinstance(state, dict) or set(state) != {
            "round",
            "trained",
            "validations",
            "scalars",
            "uploaded",
        }:
            raise StateError(
                "a policy guard's state holds round, trained, validations, scalars, uploaded"
            )
        uploaded = state["uploaded"]
        if not (
            isinstance(uploaded, list)
            and len(uploaded) == 2
            and isinstance(uploaded[0], int)
            and isinstance(uploaded[1], list)
            and all(isinstance(p, int) and not isinstance(p, bool) for p in uploaded[1])
        ):
            raise StateError("a policy guard's uploaded parts are [round, [indices]]")
        counts = [state["round"], state["scalars"], *state["trained"]]
        validations = state["validations"]
        if (
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
            or not isinstance(validations, dict)
            or not all(isinstance(n, int) and n >= 0 for n in validations.values())
        ):
            raise StateError("a policy guard's counts must be non-negative integers")
        self.round, self.scalars = state["round"], state["scalars"]
        self.uploaded = (uploaded[0], set(uploaded[1]))
        self.trained = set(state["trained"])
        self.validations = {int(r): n for r, n in validations.items()}


def fields_digest(fields: Mapping[str, Field], skip: frozenset[str] = frozenset()) -> str:
    """SHA-256 over a request's fields (names, kinds, layouts and bytes), but ``skip``."""
    h = hashlib.sha256(b"secagg request fields v1\x00")
    for name in sorted(set(fields) - skip):
        f = fields[name]
        head = json.dumps([name, f.kind, f.dtype, list(f.parts or ())]).encode()
        h.update(len(head).to_bytes(4, "big") + head)
        h.update(len(f.data).to_bytes(8, "big"))
        h.update(f.data)
    return h.hexdigest()


def model_identity(model: np.ndarray) -> str:
    """The identity of a model a client was sent: SHA-256 of its float64 values."""
    data = np.ascontiguousarray(model, dtype="<f8").tobytes()
    return hashlib.sha256(b"secagg model v1\x00" + data).hexdigest()


def stepped_identity(previous: str, apply_fields: Mapping[str, Field]) -> str:
    """The identity of the model a client stepped itself (server-blind) from ``previous``
    with the aggregate of an ``apply`` request: its decryption is flooded by each client
    independently, so the values differ in the last bits while this identity does not."""
    step = fields_digest(apply_fields)
    return hashlib.sha256(f"secagg stepped model v1\x00{previous}\x00{step}".encode()).hexdigest()


def upload_basis(
    round_number: int, phase: str, fields: Mapping[str, Field], model: str | None
) -> str:
    """What an upload was made from: SHA-256 over the round, the phase, the identity of the
    model the client held and every request field but the per-client ones
    (:data:`PER_CLIENT_FIELDS`)."""
    parts = [str(int(round_number)), phase, model or "", fields_digest(fields, PER_CLIENT_FIELDS)]
    return hashlib.sha256(("secagg upload basis v1\x00" + "\x00".join(parts)).encode()).hexdigest()
