"""The stage kernel of local learning (PPLL, Guo et al. 2024; docs/algorithms.md §6).

A stage whose gradients never cross to another stage (``MethodSpec.gradients_cross_stages`` False)
trains on a local loss through its auxiliary head; its messages are a chain's forward ones (RECV_F and
SEND_F, :class:`~pipetrain.runtime.interp.ports.ChainPorts`). Per micro-batch ``[lo, hi)`` of ``b``
samples on stage ``k``::

    F     h = layers(x [b, *in])                   x arrived detached: no gradient flows upstream
          loss = head(h, y [b, *target], images [b, *in₀], ℓ)
                                                   stages 0 … K-2: the auxiliary head's prediction of the
                                                   model's output [b, *out], scored by the task's loss ℓ
                                                   (the job's), mean
          loss = ℓ(h, y) / b                       last stage: the task's loss of the model's output, mean
          keep (x, loss); store h.detach() [b, *out] for SEND_F
    B     loss.backward()                          gradients of the stage and its head only
    STEP  optimizer step over the stage and its head; zero the gradients; sends are bounded by the
          transport's window (the plan's queue depth), not waited for here

The loss is the micro-batch's *mean*, so every local update has the scale of one step of plain
training on a mini-batch of ``b`` samples whatever the micro-batch count. The reported loss is the
last stage's, weighted to the mean over the mini-batch. Evaluation runs the main path (the stages'
layers, no heads) end to end (:mod:`pipetrain.runtime.interp.evaluation`).
"""

from __future__ import annotations

import torch

from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AuxHead, build_aux_head, check_aux
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import LocalParams
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.backward import missing_backward
from pipetrain.runtime.interp.context import Range, RankContext
from pipetrain.runtime.interp.ports import ChainPorts
from pipetrain.schedule.action import Action

__all__ = ["LocalKernel", "local_kernel"]


class LocalKernel:
    """A local-learning stage's F, B and STEP (module docstring).

    Args:
        ports: its messages (forward ones only).
        head: the stage's auxiliary head (None on the last stage, which uses the model's loss).

    Attributes:
        images: the mini-batch's model inputs ``[B, *in₀]`` when the head reconstructs them, else None.
        saved: per forward range, ``(x, loss)``.
    """

    targets_everywhere = True

    def __init__(self, ports: ChainPorts, head: AuxHead | None) -> None:
        self.ports = ports
        self.head = head
        self.images: torch.Tensor | None = None
        self.saved: dict[Range, tuple[torch.Tensor, torch.Tensor]] = {}

    def begin_step(self, ctx: RankContext, inputs: torch.Tensor | None) -> None:
        self.ports.clear()
        self.saved.clear()
        needs_images = self.head is not None and self.head.decoder is not None
        self.images = inputs.to(ctx.transport.device) if needs_images and inputs is not None else None

    def forward(self, ctx: RankContext, a: Action) -> None:
        """F: the stage, then its local loss (see the module docstring)."""
        x, y = self.ports.inputs.take(a.lo, a.hi), ctx.tally.targets_of(a)
        with ctx.meter.track((a.lo, a.hi)):
            h = ctx.module(x)
            if self.head is None:
                loss = ctx.tally.loss(h, y) / a.size
            else:
                images = self.images[a.lo:a.hi] if self.images is not None else x
                loss = self.head(h, y, images, ctx.tally.loss)
        self.saved[(a.lo, a.hi)] = (x, loss)
        if ctx.is_last:
            ctx.tally.add(loss * (a.size / ctx.tally.batch_size))
        else:
            self.ports.outputs.put(a.lo, a.hi, h.detach())

    def backward(self, ctx: RankContext, a: Action) -> None:
        """B: back-propagate the micro-batch's local loss through the stage and its head."""
        key = (a.lo, a.hi)
        if key not in self.saved:
            raise ValueError(f"{a}: no forward covered exactly [{a.lo}:{a.hi}) (kept: {sorted(self.saved)})")
        _, loss = self.saved.pop(key)
        torch.autograd.backward(loss)
        ctx.meter.release(key)

    def weight(self, ctx: RankContext, a: Action) -> None:
        raise missing_backward(a)

    def step(self, ctx: RankContext, a: Action) -> None:
        """STEP: the stage's (and its head's) optimizer step."""
        if ctx.optimizer is not None:
            ctx.optimizer.step()
            ctx.optimizer.zero_grad(set_to_none=True)

    def held(self) -> dict[str, list[Range]]:
        return {"forwards": sorted(self.saved)} if self.saved else {}


def local_kernel(graph: LayerGraph, plan: Plan, stage: int, ports: ChainPorts, device: torch.device) -> LocalKernel:
    """``stage``'s local-learning kernel under ``plan``, its head (of the plan's kind) on ``device``.

    Raises:
        UserError: the plan's parameters are not local learning's (no head kind), or no head predicts
            the model's output from the stage's (:func:`~pipetrain.graph.aux_heads.check_aux`).
    """
    params = plan.params
    if not isinstance(params, LocalParams):
        raise UserError(f"method {plan.method.value} trains on local losses but its plan has no auxiliary heads; "
                        "re-plan it")
    kind = check_aux(graph, params.aux, [ports.output_spec])
    last = stage == plan.n_stages - 1
    head = None if last else build_aux_head(kind, graph, ports.output_spec, stage, plan.n_stages).to(device)
    return LocalKernel(ports, head)
