"""The stage kernel of a chain of stages, its variants composed from three strategies.

Per action ``a`` of ``[lo, hi)`` (``B`` the mini-batch size)::

    F     x = inputs [lo, hi) (re-chunked); y = layers(x) on a's weights; the last stage:
          y = loss(y, targets[lo:hi]) / B and add it to the step's loss; keep what B needs; store
          y for SEND_F
    B     (x, y) of [lo, hi) as F kept them; back-propagate y with the gradient of y (received, none
          on the last stage); store x.grad for SEND_B
    W     the weight gradients of the B of [lo, hi) (split backward only)
    STEP  the optimizer step (:mod:`pipetrain.runtime.interp.step`: replicas' all-reduce, clipping);
          a flush finds every message and kept tensor consumed

What varies is chosen once, when the stage is built, from the method's traits and the plan
(:func:`~pipetrain.runtime.interp.rank_setup.stage_kernel`), as three strategies:

* what F keeps for B: the activations, or only the inputs to recompute from
  (:mod:`pipetrain.runtime.interp.keeping`; ``Plan.recomputes(stage)``);
* how B runs: fused, or split into B and W (:mod:`pipetrain.runtime.interp.backward`; a program
  with W actions);
* which weights run: the module's own, or the version an action names
  (:mod:`pipetrain.runtime.interp.weights`; a method without a flush).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from pipetrain.runtime.interp.backward import Call
from pipetrain.runtime.interp.context import Range, RankContext
from pipetrain.runtime.interp.keeping import Run
from pipetrain.runtime.interp.ports import ChainPorts
from pipetrain.runtime.interp.step import OptimizerStep, check_consumed, start_step
from pipetrain.runtime.interp.transport import Transport
from pipetrain.schedule.action import Action

__all__ = ["BackwardPass", "ChainKernel", "Keeping", "WeightUse"]


class Keeping(Protocol):
    """What F keeps for B (:mod:`pipetrain.runtime.interp.keeping`)."""

    def forward(self, ctx: RankContext, a: Action, x: torch.Tensor, run: Run) -> torch.Tensor: ...

    def restore(self, ctx: RankContext, a: Action, run: Run) -> tuple[torch.Tensor, torch.Tensor]: ...

    def held(self) -> dict[str, list[Range]]: ...

    def clear(self) -> None: ...


class BackwardPass(Protocol):
    """How B runs, and W (:mod:`pipetrain.runtime.interp.backward`)."""

    def run(self, a: Action, x: torch.Tensor, call: Call) -> torch.Tensor: ...

    def input_grad(self, ctx: RankContext, a: Action, x: torch.Tensor, y: torch.Tensor,
                   grad: torch.Tensor | None) -> torch.Tensor | None: ...

    def weight(self, ctx: RankContext, a: Action) -> None: ...

    def held(self) -> dict[str, list[Range]]: ...

    def clear(self) -> None: ...


class WeightUse(Protocol):
    """Which weights run, and the step boundary (:mod:`pipetrain.runtime.interp.weights`)."""

    def call(self, a: Action, x: torch.Tensor) -> torch.Tensor: ...

    def used(self, a: Action) -> None: ...

    def backward_done(self, a: Action) -> None: ...

    def new_batch(self, forget: Callable[[], None]) -> None: ...

    def before_step(self, transport: Transport) -> None: ...

    def after_step(self, a: Action, step: OptimizerStep, check: Callable[[Action], None]) -> None: ...


class ChainKernel:
    """A chain stage's F, B, W and STEP (module docstring).

    Args:
        ports: its messages.
        keeping: what F keeps for B.
        backward: how B (and W) run.
        weights: which weights F and B run on.
    """

    head: nn.Module | None = None
    targets_everywhere = False

    def __init__(self, ports: ChainPorts, keeping: Keeping, backward: BackwardPass, weights: WeightUse) -> None:
        self.ports = ports
        self.keeping = keeping
        self.backward_pass = backward
        self.weights = weights

    def begin_step(self, ctx: RankContext, inputs: torch.Tensor | None) -> None:
        self.ports.clear()
        self.weights.new_batch(self._forget)

    def _forget(self) -> None:
        self.keeping.clear()
        self.backward_pass.clear()

    def _run(self, ctx: RankContext, a: Action, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: the stage on the action's samples, ``x`` a leaf taking a gradient when it came
        from another stage and autograd records; on the last stage ``y`` is the weighted loss."""
        if not ctx.is_first and x.is_floating_point() and torch.is_grad_enabled():
            x = x.detach().requires_grad_(True)
        y = self.backward_pass.run(a, x, self.weights.call)
        return x, ctx.tally.weighted(y, a) if ctx.is_last else y

    def forward(self, ctx: RankContext, a: Action) -> None:
        x = self.ports.inputs.take(a.lo, a.hi)
        y = self.keeping.forward(ctx, a, x, self._run)
        self.weights.used(a)
        if ctx.is_last:
            ctx.tally.add(y)
        else:
            self.ports.outputs.put(a.lo, a.hi, y.detach())

    def backward(self, ctx: RankContext, a: Action) -> None:
        x, y = self.keeping.restore(ctx, a, self._run)
        grad = None if ctx.is_last else self.ports.output_grads.take(a.lo, a.hi)
        x_grad = self.backward_pass.input_grad(ctx, a, x, y, grad)
        self.weights.backward_done(a)
        if x_grad is not None:
            self.ports.input_grads.put(a.lo, a.hi, x_grad)

    def weight(self, ctx: RankContext, a: Action) -> None:
        self.backward_pass.weight(ctx, a)

    def step(self, ctx: RankContext, a: Action) -> None:
        self.weights.before_step(ctx.transport)
        self.weights.after_step(a, start_step(ctx), self._check_consumed)

    def held(self) -> dict[str, list[Range]]:
        return {**self.keeping.held(), **self.backward_pass.held()}

    def _check_consumed(self, a: Action) -> None:
        check_consumed(a, self.ports.buffers, self.held())
