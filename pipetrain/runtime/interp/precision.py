"""How a stage computes and what its messages carry at the plan's precision (:mod:`pipetrain.profile.precision`).

Under ``bf16`` and ``fp16`` (``c`` the compute dtype, bfloat16 or float16)::

    F        the stage's forward, and the last stage's loss, under ``torch.autocast(device, c)``:
             matmuls and convolutions in c, reductions and the loss in float32, as autocast's op lists say
    B        backward outside autocast, as torch recommends: each op back-propagates in the dtype its
             forward ran in; a recomputing stage re-runs its forward under autocast first
    SEND     a floating-point message [b, *spec] is cast to c before it leaves (activations and gradients)
    RECV     its buffer is allocated as c [b, *spec]; integer messages (token ids) keep their dtype
    weights  float32 throughout (the master copy); so are their gradients and the optimizer state

A received activation enters the next stage's forward in c (autocast casts it where an op needs
float32); a received gradient ``dy`` in c is back-propagated through the stage's output ``y``, and
autograd casts it to ``y``'s dtype (float32 where the stage ended in a float32 op). Two stages on one
rank hand tensors over without a message and so without a cast. Under ``fp32`` nothing changes: no
autocast, no cast, float32 messages.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from pipetrain.profile.precision import Precision, compute_dtype

__all__ = ["StagePrecision"]


@dataclass(frozen=True)
class StagePrecision:
    """A stage's precision on its device (module docstring).

    Attributes:
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device_type: ``"cpu"`` or ``"cuda"``, the autocast device.
    """

    precision: Precision = "fp32"
    device_type: str = "cpu"

    @property
    def mixed(self) -> bool:
        """Whether the stage computes in a 16-bit dtype."""
        return self.precision != "fp32"

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The context a forward runs in: ``torch.autocast`` at the compute dtype, or nothing under fp32."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=compute_dtype(self.precision))

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a message whose tensor is ``dtype`` travels in: the compute dtype for a floating-point
        one, ``dtype`` itself for the rest (and for everything under fp32)."""
        return compute_dtype(self.precision) if self.mixed and dtype.is_floating_point else dtype
