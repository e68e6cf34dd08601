"""A stage's optimizer step after back-propagation across stages (STEP of the chain and DAG kernels).

    STEP  on a replicated stage, all-reduce (sum) the gradients and the loss over the stage's ranks,
          and hand replica 0's buffers to the others; sum the copies of tied parameters over their
          owners (:mod:`~pipetrain.runtime.interp.ties`); under fp16, unscale the gradients and skip
          the update on every stage if any stage found an inf or NaN (:class:`~.context.LossScaling`);
          clip the gradient norm (if set: the global norm over every stage; per update under
          ``pipedream``); optimizer step; zero the gradients; after a flush (synchronous methods),
          every message and kept tensor of the batch was consumed

Summing the replicas' gradients gives the whole batch's gradient, since each holds the sum over its
own micro-batches (:mod:`pipetrain.runtime.interp.context`, gradient weighting). Buffers are not
gradients: each replica's BatchNorm updated its running statistics on its own micro-batches, so
replica 0's (the group's first rank) are kept and broadcast, as DistributedDataParallel's
``broadcast_buffers`` does; the replicas then evaluate, save and resume alike. Clipping needs the
norm over every stage (:func:`~pipetrain.runtime.job.optim.clip_grad_norm_global`, set by the job).

A STEP runs in two halves (:func:`start_step`, :meth:`OptimizerStep.finish`) so that ``2bw``, whose
stages step for one batch at different moments, can start the norm's all-reduce at STEP and finish
the step later (:class:`~pipetrain.runtime.interp.weights.VersionedWeights`); every other STEP
finishes at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.runtime.interp.context import ClipNorm, Range, RankContext
from pipetrain.schedule.action import Action

__all__ = ["OptimizerStep", "check_consumed", "optimizer_step", "start_step"]


def optimizer_step(ctx: RankContext) -> None:
    """All-reduce over the replicas, sum the tied copies, clip, step and zero the gradients (module docstring)."""
    start_step(ctx).finish()


def start_step(ctx: RankContext) -> OptimizerStep:
    """The first half of :func:`optimizer_step`: all-reduce over the replicas, sum the tied copies and
    start clipping; the returned step's :meth:`~OptimizerStep.finish` does the rest."""
    if ctx.replicas is not None:
        _allreduce_gradients(ctx, ctx.replicas)
        _broadcast_buffers(ctx.module, ctx.replicas)
    if ctx.ties is not None:
        ctx.ties.sum_gradients()
    skip = ctx.scaler is not None and ctx.scaler.skips()
    clip = None
    if ctx.clip is not None and not skip:
        clip = ctx.clip([p for p in ctx.module.parameters() if p.requires_grad])
    return OptimizerStep(ctx, clip, skip)


class OptimizerStep:
    """A STEP whose gradients are reduced and whose clipping has started (:func:`start_step`).

    Under ``2bw`` with clipping the norm is still being summed over the ranks, so the stage finishes
    the step when something needs it (:class:`~pipetrain.runtime.interp.weights.VersionedWeights`);
    it then steps with the learning rates of its STEP, whatever the job set since.
    """

    def __init__(self, ctx: RankContext, clip: ClipNorm | None, skip: bool = False) -> None:
        self.ctx, self.clip, self.skip = ctx, clip, skip
        self.lrs = _lrs(ctx.optimizer) if ctx.optimizer is not None else []

    @property
    def waits(self) -> bool:
        """Whether :meth:`finish` would wait for the ranks (the clipping norm is in flight)."""
        return self.clip is not None and self.clip.in_flight

    def finish(self) -> None:
        """Clip, step with the STEP's learning rates and zero the gradients (an fp16 overflow: only zero them)."""
        if self.clip is not None:
            self.clip.finish()
        self.ctx.meter.note_gradients()
        optimizer = self.ctx.optimizer
        if optimizer is None:
            return
        if self.skip:
            optimizer.zero_grad(set_to_none=True)
            return
        now = _lrs(optimizer)
        _set_lrs(optimizer, self.lrs)
        optimizer.step()
        _set_lrs(optimizer, now)
        optimizer.zero_grad(set_to_none=True)


def _lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [group["lr"] for group in optimizer.param_groups]


def _set_lrs(optimizer: torch.optim.Optimizer, lrs: list[float]) -> None:
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr


def _allreduce_gradients(ctx: RankContext, replicas: dist.ProcessGroup) -> None:
    """Sum the stage's gradients (and, on the last stage, the loss and micro-batches each replica added
    since its last STEP, :meth:`~.context.LossTally.sum_over`) over its replicas, in one message; tied
    parameters are summed over all their owners instead."""
    ties = ctx.ties
    params = [p for p in ctx.module.parameters() if p.requires_grad and not (ties is not None and ties.holds(p))]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    if ctx.is_last:  # the loss and micro-batches added since the last STEP, as two more "gradients"
        grads.append(ctx.tally.pending(ctx.transport.device, grads[0].dtype if grads else torch.float32))
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=replicas)
    offset = 0
    for p, g in zip(params, grads, strict=False):
        p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()
    if ctx.is_last:
        ctx.tally.sum_over(flat[-2:].clone())


def _broadcast_buffers(module: torch.nn.Module, replicas: dist.ProcessGroup) -> None:
    """Replica 0's buffers to every rank of ``replicas``, one message per dtype (module docstring).

    Only the buffers of the state_dict: non-persistent ones (a causal mask) are constants. A parameter
    is told by identity, since a tied one is in the state_dict under a second name too."""
    parameters = {id(p) for p in module.parameters()}
    by_dtype: dict[torch.dtype, dict[int, torch.Tensor]] = {}
    for buffer in module.state_dict(keep_vars=True).values():
        if id(buffer) not in parameters:
            by_dtype.setdefault(buffer.dtype, {})[id(buffer)] = buffer  # a tied buffer once
    source = dist.get_global_rank(replicas, 0)
    for unique in by_dtype.values():
        buffers = list(unique.values())
        flat = torch.cat([b.reshape(-1) for b in buffers])
        dist.broadcast(flat, src=source, group=replicas)
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()


def check_consumed(a: Action, buffers: Sequence[ChunkBuffer], held: Mapping[str, list[Range]]) -> None:
    """A flush at STEP ``a``: nothing is left in ``buffers`` or kept (``held``, by kind).

    Raises:
        RuntimeError: naming what is left, by range (the schedule does not run the plan's batch).
    """
    left = [f"{b.name} {b.ranges()}" for b in buffers if len(b)] + [f"{kind} {r}" for kind, r in held.items()]
    if left:
        raise RuntimeError(f"{a}: the step left unconsumed data: {', '.join(left)}")
