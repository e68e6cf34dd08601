"""How a chain stage back-propagates: one fused backward, or split into B and W (zero bubble).

    fused  B  backward(y, grad of y) for the F of [lo, hi): the input's and the weights' gradients
              together; keep x.grad for SEND_B. There is no W.
    split  F  also records the output of every module holding parameters of its own
           B  the gradients of x and of each recorded output in one pass that keeps the graph; keep
              x.grad for SEND_B, and the outputs' gradients for W
           W  weight gradients of the B of exactly [lo, hi): per parameter owner, from the gradient
              of its output, accumulated into .grad; then the micro-batch's activations are released

Split backward (``zb1``, ``interleaved-zb``, ``zbv``; Qi et al. 2024 "Zero Bubble Pipeline
Parallelism" §2; :mod:`pipetrain.graph.split_backward`): a rank whose program has W actions runs each
backward in two parts. B back-propagates ``grad [hi-lo, *out]`` (the last stage: the scalar loss) to
the stage input ``x [hi-lo, *in]`` and to every recorded output, keeping the graph; W later computes
each such module's weight gradients from its output's gradient and frees the graph. The weight
gradients are the fused backward's, so training is unchanged. The meter holds the outputs' gradients
from B to W.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.split_backward import StageParts, WeightWork, input_grads, layer_outputs, weight_grads
from pipetrain.runtime.interp.context import Range, RankContext
from pipetrain.schedule.action import Action

__all__ = ["Call", "FusedBackward", "SplitBackward", "missing_backward"]

Call = Callable[[Action, torch.Tensor], torch.Tensor]
"""The stage's layers on ``x [b, *in]`` for an action, on the weights it names: ``y [b, *out]``."""


def missing_backward(a: Action, pending: Iterable[Range] = ()) -> UserError:
    """The error of a W that no B of its range left work for."""
    return UserError(f"{a}: no B of exactly [{a.lo}:{a.hi}) waits for its W (pending: {sorted(pending)}); "
                     "put each W after the B of its range")


class FusedBackward:
    """B computes the input's and the weights' gradients in one pass (module docstring)."""

    def run(self, a: Action, x: torch.Tensor, call: Call) -> torch.Tensor:
        return call(a, x)

    def input_grad(self, ctx: RankContext, a: Action, x: torch.Tensor, y: torch.Tensor,
                   grad: torch.Tensor | None) -> torch.Tensor | None:
        """Back-propagate ``y`` (with ``grad``, none on the last stage); ``x.grad`` when ``x`` takes one."""
        torch.autograd.backward(y, grad)
        ctx.meter.release((a.lo, a.hi))
        if not x.requires_grad:
            return None
        return x.grad if x.grad is not None else torch.zeros_like(x)

    def weight(self, ctx: RankContext, a: Action) -> None:
        raise missing_backward(a)

    def held(self) -> dict[str, list[Range]]:
        return {}

    def clear(self) -> None:
        """Nothing is kept between B and W."""


class SplitBackward:
    """B and a later W per micro-batch (module docstring).

    Args:
        module: the stage's layers, whose parameter owners' outputs F records.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.parts: dict[Range, StageParts] = {}
        self.pending: dict[Range, WeightWork] = {}

    def run(self, a: Action, x: torch.Tensor, call: Call) -> torch.Tensor:
        """The layers, recording each parameter owner's output while autograd records."""
        if not torch.is_grad_enabled():
            return call(a, x)
        y, self.parts[(a.lo, a.hi)] = layer_outputs(self.module, x, keep_hooks=True)
        return y

    def input_grad(self, ctx: RankContext, a: Action, x: torch.Tensor, y: torch.Tensor,
                   grad: torch.Tensor | None) -> torch.Tensor | None:
        """B: the gradients of the stage input and of every layer output; what W needs is kept."""
        key = (a.lo, a.hi)
        x_grad, self.pending[key] = input_grads(y, grad, x, self.parts.pop(key))
        ctx.meter.hold(key, [g for _, g in self.pending[key]])  # released at W
        return x_grad

    def weight(self, ctx: RankContext, a: Action) -> None:
        """W: the parameters' gradients of the B of ``[lo, hi)``, then release its graph."""
        key = (a.lo, a.hi)
        if key not in self.pending:
            raise missing_backward(a, self.pending)
        weight_grads(self.pending.pop(key))
        ctx.meter.release(key)

    def held(self) -> dict[str, list[Range]]:
        return {"weight gradients": sorted(self.pending)} if self.pending else {}

    def clear(self) -> None:
        self.parts.clear()
        self.pending.clear()
