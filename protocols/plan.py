"""The training plan: what every client is asked to do in a training phase.

The server's engine sends it (``server.plan``), and each client's own policy holds its copy
from its provisioning (``clients.policy``), so both read one definition of a round's
``train`` settings and the client can check a request against its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from secagg.dp import ClientDP, ScalarDP
from secagg.protocols.optimizers import StepSchedule


@dataclass(frozen=True, kw_only=True)
class TrainingPlan:
    """What every client is asked to do in a training phase.

    Parameters:
        client_lr: the client learning rate per round.
        local_steps: SGD steps per round (ignored when ``local_epochs`` is set).
        local_epochs: local epochs per round instead of steps.
        prox_mu: FedProx's proximal weight μ (0: plain local SGD).
        client_dp: clip and noise every update before protecting it (client-level DP).
        scalar_dp: clip and noise every scalar clients report (the protocol's
            ``client_scalars``).
        reports: data-independent numbers clients attach to their training reply, by name,
            with their settings (``{"dp_sgd_epsilon": {"delta": 1e-5}}``). DP-SGD's four
            (``dp_sgd_epsilon``, ``dp_sgd_noise_multiplier``, ``dp_sgd_sample_rate``,
            ``dp_sgd_steps``) are functions of public settings and the client's sample count
            n_i: the engine declares every report as a plaintext item.
    """

    client_lr: StepSchedule = field(default_factory=StepSchedule)
    local_steps: int = 100
    local_epochs: int | None = None
    prox_mu: float = 0.0
    client_dp: ClientDP | None = None
    scalar_dp: ScalarDP | None = None
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)

    def settings(self, round_number: int) -> dict[str, Any]:
        """The ``train`` config of a round, before the protocol adjusts it."""
        work = {"epochs": self.local_epochs} if self.local_epochs else {"steps": self.local_steps}
        out: dict[str, Any] = {"lr": self.client_lr.at(round_number), **work}
        if self.prox_mu:
            out["prox_mu"] = self.prox_mu
        if self.client_dp is not None:
            out["client_dp"] = self.client_dp.config()
        if self.scalar_dp is not None:
            out["scalar_dp"] = self.scalar_dp.config()
        if self.reports:
            out["reports"] = dict(self.reports)
        return out
