"""The memory values: a stage's predicted bytes and the optimizer-state convention.

    parameter_copies("adam")        # 4: weights, gradients, two moments
    StageMemory(w, w, 2 * w, a).total_bytes

:func:`pipetrain.simulate.memory.stage_memory` fills :class:`StageMemory` by replaying a schedule;
the runtime measures the same fields (:mod:`pipetrain.runtime.interp.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipetrain.errors import UserError
from pipetrain.profile.optimizer_step import OPTIMIZER_NAMES, OptimizerName

__all__ = ["OPTIMIZER_NAMES", "OPTIMIZER_STATE_COPIES", "OptimizerName", "StageMemory", "check_optimizer",
           "parameter_copies"]

OPTIMIZER_STATE_COPIES: Final[dict[OptimizerName, int]] = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
"""Optimizer state per parameter byte: SGD none, SGD with momentum its buffer, Adam and AdamW two moments."""


def check_optimizer(optimizer: str) -> OptimizerName:
    """``optimizer`` as an :data:`OptimizerName`; a UserError naming the choices otherwise."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise UserError(f"optimizer {optimizer!r} is unknown; use one of {', '.join(OPTIMIZER_NAMES)}")
    return optimizer  # type: ignore[return-value]


def parameter_copies(optimizer: OptimizerName = "sgd") -> int:
    """Parameter-sized buffers a stage holds per parameter byte: the weights, their gradients and the
    optimizer's state (:data:`OPTIMIZER_STATE_COPIES`): SGD 2, SGD with momentum 3, Adam and AdamW 4."""
    return 2 + OPTIMIZER_STATE_COPIES[check_optimizer(optimizer)]


@dataclass(frozen=True)
class StageMemory:
    """One stage's predicted peak memory, in bytes (the largest of its ranks for a replicated stage).

    Attributes:
        weight_bytes: the stage's parameters (every weight version it holds, for asynchronous methods).
        gradient_bytes: their gradients (one copy, held at the optimizer step).
        optimizer_state_bytes: the optimizer's state (``c`` copies of the parameters).
        activation_bytes: the peak of held activations (saved tensors, or stashed inputs).
    """

    weight_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.gradient_bytes + self.optimizer_state_bytes + self.activation_bytes
