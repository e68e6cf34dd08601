"""Evaluation inside the pipeline: the eval set through forward-only programs of the plan.

Every rank of the plan runs, per eval batch of ``n`` samples (the plan's ``B``, the last one
possibly smaller), its program of :func:`~pipetrain.schedule.forward_only.forward_only_schedule`
through the same interpreter as training, with ``ctx.evaluation`` set: stage 0 loads the inputs, the
last stage the targets and adds ``(output, target)`` of every micro-batch to an
:class:`~pipetrain.data.EvalTally`. The replicas of a replicated last stage then sum their tallies.
Modules are in ``eval()`` mode meanwhile (dropout off, BatchNorm running statistics), as in the
single-process reference, and nothing is kept for backward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from pipetrain.data import EvalResult, EvalTally, Loss, Sample, eval_batches, load_datasets
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.plan import Plan
from pipetrain.runtime.executor import RankContext, expected_receives, run_program
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.forward_only import forward_only_schedule

__all__ = ["eval_dataset", "evaluate_module", "evaluate_rank", "has_eval_set"]


def has_eval_set(source: str) -> bool:
    """Whether the data source has an eval split (every source but ``synthetic``)."""
    return source != "synthetic"


@functools.lru_cache(maxsize=4)
def eval_dataset(source: str, graph: LayerGraph) -> Dataset[Sample]:
    """The eval split of ``source`` (loaded once per process)."""
    return load_datasets(source, graph).eval


@functools.lru_cache(maxsize=16)
def _programs(plan: Plan, n: int) -> tuple[tuple[Action, ...], ...]:
    return forward_only_schedule(plan, n).ranks


def evaluate_rank(ctx: RankContext, plan: Plan, dataset: Dataset[Sample]) -> EvalResult | None:
    """Run this rank's part of one evaluation over ``dataset``; the last stage returns the result.

    Every rank of the plan must call it at the same point (the ranks exchange activations).
    """
    tally = EvalTally()
    ctx.module.eval()
    ctx.evaluation = tally
    earlier = ctx.transport.n_pending  # an asynchronous run's gradients in flight: received after the evaluation
    try:
        for inputs, targets in eval_batches(dataset, plan.batch_size):
            program = _programs(plan, int(inputs.shape[0]))[ctx.rank]
            ctx.begin_step(inputs, targets, _forward_ranges(program) if ctx.is_first else None)
            ctx.transport.expect(expected_receives(ctx, program))
            run_program(ctx, program)
            ctx.transport.wait_sends(keep=earlier)
    finally:
        ctx.evaluation = None
        ctx.module.train()
    if not ctx.is_last:
        return None
    if ctx.replicas is not None:
        totals = tally.totals()
        dist.all_reduce(totals, group=ctx.replicas)
        tally.set_totals(totals)
    return tally.result()


def _forward_ranges(program: Sequence[Action]) -> list[tuple[int, int]]:
    """Stage 0's ranges to load: those its forwards take (its own micro-batches when replicated)."""
    return [(a.lo, a.hi) for a in program if a.kind is ActionKind.F]


def evaluate_module(model: torch.nn.Module, loss: Loss, dataset: Dataset[Sample], batch_size: int) -> EvalResult:
    """Single-process evaluation of ``model`` over ``dataset`` (the reference the pipeline equals)."""
    tally = EvalTally()
    model.eval()
    try:
        with torch.no_grad():
            for inputs, targets in eval_batches(dataset, batch_size):
                tally.add(loss, model(inputs), targets)
    finally:
        model.train()
    return tally.result()
