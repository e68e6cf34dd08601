"""fp16's dynamic loss scaling, agreed over every stage of the pipeline.

float16 keeps 5 exponent bits: gradients below about 6e-8 flush to zero. As in
``torch.amp.GradScaler``, the loss is multiplied by a scale ``S`` before back-propagation, so every
gradient computed and sent between stages (in float16) is ``S`` times the true one; at STEP the float32
gradients are divided by ``S`` again. A step whose gradients hold an inf or NaN (``S`` was too large)
is skipped and ``S`` halves; after ``growth_interval`` good steps in a row ``S`` doubles
(:meth:`LossScaler.update`).

In a pipeline the overflow may show on one stage only, and every stage must skip the same steps and
keep the same ``S``. So at its first STEP of a step each rank unscales the gradients of all its
stages, and one all-reduce (MAX) of the found-inf flag over the plan's ranks makes the decision
common (:class:`RankLossScaling`); every rank then updates its copy of ``S`` from the same flag, so
the copies stay equal without being sent. The last stage scales its loss by ``S``
(:attr:`~pipetrain.runtime.interp.context.LossTally.scale`); clipping runs after unscaling, on the
true gradients. ``S`` and its counters go into each checkpoint's manifest (:meth:`LossScaler.state_dict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.errors import UserError

__all__ = ["LossScaler", "RankLossScaling", "unscale_"]


@dataclass
class LossScaler:
    """The scale and its update rule (``torch.amp.GradScaler``'s defaults).

    Attributes:
        scale: ``S``, the factor on the loss.
        growth_factor: ``S`` is multiplied by this after ``growth_interval`` good steps in a row.
        backoff_factor: ``S`` is multiplied by this after a step with an overflow.
        growth_interval: good steps in a row before ``S`` grows.
        good_steps: good steps since ``S`` last changed.
        skipped: steps skipped so far.
    """

    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0
    skipped: int = 0

    def update(self, found_inf: bool) -> None:
        """After a step: back off (and count it skipped) on an overflow, else grow after
        ``growth_interval`` good steps in a row."""
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self) -> dict[str, float | int]:
        """What a checkpoint keeps (JSON numbers)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        """Restore :meth:`state_dict`'s values.

        Raises:
            UserError: a field is missing or unknown (the checkpoint was not written by this version).
        """
        if set(state) != set(asdict(self)):
            raise UserError(f"the checkpoint's loss scaler state has fields {sorted(state)}, expected "
                            f"{sorted(asdict(self))}; resume with the version of pipetrain that wrote it")
        self.scale, self.growth_factor = float(state["scale"]), float(state["growth_factor"])
        self.backoff_factor, self.growth_interval = float(state["backoff_factor"]), int(state["growth_interval"])
        self.good_steps, self.skipped = int(state["good_steps"]), int(state["skipped"])


def unscale_(params: Sequence[nn.Parameter], scale: float) -> bool:
    """Divide the gradients of ``params`` by ``scale`` in place; whether any holds an inf or NaN."""
    grads = [p.grad for p in params if p.grad is not None]
    found = any(not bool(torch.isfinite(g).all()) for g in grads)
    inverse = 1.0 / scale
    for g in grads:
        g.mul_(inverse)
    return found


class RankLossScaling:
    """One rank's loss scaling over all its stages (module docstring; the interpreter's
    :class:`~pipetrain.runtime.interp.context.LossScaling`).

    Args:
        scaler: the scale and its rule (equal on every rank).
        params: the parameters of every stage the rank runs (their gradients are unscaled together).
        group: the plan's ranks (None: the default group), over which the found-inf flag is reduced.
        device: where the flag is reduced (the rank's device).
    """

    def __init__(self, scaler: LossScaler, params: Sequence[nn.Parameter], group: dist.ProcessGroup | None,
                 device: torch.device) -> None:
        self.scaler, self.params, self.group, self.device = scaler, list(params), group, device
        self._decided: bool | None = None
        self._poison = False
        self.skipped_last = False

    def begin_step(self) -> None:
        """A new step: the next :meth:`skips` decides afresh."""
        self._decided = None

    def poison(self) -> None:
        """Testing hook: an inf in this rank's first gradient at the next :meth:`skips`, a fake overflow."""
        self._poison = True

    def skips(self) -> bool:
        """Unscale, agree on the overflow over the plan's ranks, update the scale; True: skip the update."""
        if self._decided is None:
            if self._poison:
                self._poison_first_gradient()
            found = torch.tensor([1.0 if unscale_(self.params, self.scaler.scale) else 0.0], device=self.device)
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self.group)
            self._decided = self.skipped_last = bool(found.item() > 0)
            self.scaler.update(self._decided)
        return self._decided

    def _poison_first_gradient(self) -> None:
        self._poison = False
        first = next((p for p in self.params if p.requires_grad), None)
        if first is None:
            return
        if first.grad is None:
            first.grad = torch.zeros_like(first)
        first.grad.view(-1)[0] = float("inf")
