"""The stage kernel of an evaluation: forward only, the last stage tallying.

While the eval set runs through the plan's forward-only programs
(:func:`~pipetrain.schedule.forward_only.forward_only_schedule`, :mod:`pipetrain.runtime.job.evaluate`),
each stage's kernel is an :class:`EvaluationKernel` over the training kernel's own ports, so its
messages are the training ones (a DAG stage's ports, ZB-V's hand-off on one rank)::

    F  ys = layers(xs) under no_grad, nothing kept; the last stage adds (y, targets[lo:hi]) to the
       tally; the others store ys for SEND_F

Local learning's heads are not run: evaluation is the main path, end to end. Modules are in
``eval()`` mode meanwhile (the job's part), as in the single-process reference.
"""

from __future__ import annotations

import torch
from torch import nn

from pipetrain.data import EvalTally
from pipetrain.runtime.interp.context import Ports, Range, RankContext, stage_outputs
from pipetrain.schedule.action import Action

__all__ = ["EvaluationKernel"]


class EvaluationKernel:
    """Forward only, over ``ports``; the last stage adds its outputs to ``results`` (module docstring)."""

    head: nn.Module | None = None
    targets_everywhere = False

    def __init__(self, ports: Ports, results: EvalTally) -> None:
        self.ports = ports
        self.results = results

    def begin_step(self, ctx: RankContext, inputs: torch.Tensor | None) -> None:
        self.ports.clear()

    def forward(self, ctx: RankContext, a: Action) -> None:
        with torch.no_grad():
            ys = stage_outputs(ctx.module(*self.ports.gather(a)))
        if ctx.is_last:
            self.results.add(ctx.tally.loss, ys[0], ctx.tally.targets_of(a))
        else:
            self.ports.scatter(a, ys)

    def backward(self, ctx: RankContext, a: Action) -> None:
        raise self._forward_only(a)

    def weight(self, ctx: RankContext, a: Action) -> None:
        raise self._forward_only(a)

    def step(self, ctx: RankContext, a: Action) -> None:
        raise self._forward_only(a)

    def held(self) -> dict[str, list[Range]]:
        return {}

    @staticmethod
    def _forward_only(a: Action) -> RuntimeError:
        return RuntimeError(f"{a}: an evaluation runs forward only; its programs are forward_only_schedule's")
