"""The F, B and STEP handlers of local learning (PPLL, Guo et al. 2024; docs/algorithms.md §6).

The interpreter (:mod:`pipetrain.runtime.interp.executor`) sends F, B and STEP here when its rank's
context has a :class:`LocalStage`; RECV_F and SEND_F are the ordinary ones. Per micro-batch
``[lo, hi)`` of ``b`` samples on stage ``k``::

    F     h = layers(x [b, *in])                   x arrived detached: no gradient flows upstream
          loss = head(h, y [b], images [b, *in₀])  stages 0 … K-2: the auxiliary head's mean loss
          loss = model_loss(h, y) / b              last stage: the model's own loss, mean
          keep (x, loss); store h.detach() [b, *out] for SEND_F
    B     loss.backward()                          gradients of the stage and its head only
    STEP  optimizer step over the stage and its head; zero the gradients

The loss is the micro-batch's *mean*, so every local update has the scale of one step of plain
training on a mini-batch of ``b`` samples whatever the micro-batch count. The reported loss is the
last stage's, weighted to the mean over the mini-batch. Evaluation never comes here: it runs the
main path (the stages' layers, no heads) end to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pipetrain.graph.aux_heads import AuxHead, build_aux_head, check_aux
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.plan.methods import LocalParams
from pipetrain.plan.plan import Plan

if TYPE_CHECKING:
    from pipetrain.runtime.interp.executor import RankContext
    from pipetrain.schedule.action import Action

__all__ = ["LocalStage", "build_local_stage", "local_backward", "local_forward", "local_step"]


@dataclass
class LocalStage:
    """A rank's local-learning state.

    Attributes:
        head: the stage's auxiliary head (None on the last stage, which uses the model's loss).
        queue_depth: messages a link to the next stage holds before a send waits.
        images: the mini-batch's model inputs ``[B, *in₀]`` when the head reconstructs them, else None.
    """

    head: AuxHead | None
    queue_depth: int
    images: torch.Tensor | None = None

    @property
    def needs_images(self) -> bool:
        return self.head is not None and self.head.decoder is not None


def build_local_stage(graph: LayerGraph, plan: Plan, stage: int, output_spec: TensorSpec,
                      device: torch.device) -> LocalStage | None:
    """``stage``'s local state under ``plan`` (its head on ``device``), or None unless the method is ``local``."""
    params = plan.params
    if not isinstance(params, LocalParams):
        return None
    kind = check_aux(graph, params.aux)
    last = stage == plan.n_stages - 1
    head = None if last else build_aux_head(kind, graph, output_spec, stage, plan.n_stages).to(device)
    return LocalStage(head, params.queue_depth)


def _state(ctx: RankContext) -> LocalStage:
    if ctx.local is None:
        raise ValueError("a local-learning handler ran on a rank without local state")
    return ctx.local


def local_forward(ctx: RankContext, a: Action) -> None:
    """F: the stage, then its local loss (see the module docstring)."""
    state, x = _state(ctx), ctx.inputs.take(a.lo, a.hi)
    if ctx.targets is None:
        raise ValueError("local learning needs the targets on every stage; call begin_step first")
    y = ctx.targets[a.lo:a.hi]
    with ctx.meter.track((a.lo, a.hi)):
        h = ctx.module(x)
        if state.head is None:
            loss = ctx.loss(h, y) / a.size
        else:
            images = state.images[a.lo:a.hi] if state.images is not None else x
            loss = state.head(h, y, images)
    ctx.saved[(a.lo, a.hi)] = (x, loss)
    if ctx.is_last:
        weighted = loss.detach() * (a.size / ctx.batch_size)
        ctx.loss_total = weighted if ctx.loss_total is None else ctx.loss_total + weighted
    else:
        ctx.outputs.put(a.lo, a.hi, h.detach())


def local_backward(ctx: RankContext, a: Action) -> None:
    """B: back-propagate the micro-batch's local loss through the stage and its head."""
    key = (a.lo, a.hi)
    if key not in ctx.saved:
        raise ValueError(f"{a}: no forward covered exactly [{a.lo}:{a.hi}) (kept: {sorted(ctx.saved)})")
    _, loss = ctx.saved.pop(key)
    torch.autograd.backward(loss)
    ctx.meter.release(key)


def local_step(ctx: RankContext, a: Action) -> None:
    """STEP: the stage's (and its head's) optimizer step; sends are bounded by the transport's window."""
    if ctx.optimizer is not None:
        ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
