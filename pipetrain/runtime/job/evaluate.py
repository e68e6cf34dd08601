"""Evaluation inside the pipeline: the eval set through forward-only programs of the plan.

Every rank of the plan runs, per eval batch of ``n`` samples (the plan's ``B``, the last one
possibly smaller), its program of :func:`~pipetrain.schedule.forward_only.forward_only_schedule`
through the same interpreter as training, each stage's kernel an
:class:`~pipetrain.runtime.interp.evaluation.EvaluationKernel` meanwhile: the first stage loads the
inputs, the last stage the targets and adds ``(output, target)`` of every micro-batch to an
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
from pipetrain.runtime.interp.context import RankContext
from pipetrain.runtime.interp.evaluation import EvaluationKernel
from pipetrain.runtime.interp.executor import Contexts, expected_receives, receive_prepost, run_program
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


def evaluate_rank(ctx: Contexts, plan: Plan, dataset: Dataset[Sample], prepost_budget: int) -> EvalResult | None:
    """Run this rank's part of one evaluation over ``dataset``; the last stage returns the result.

    ``ctx``: the rank's context, or its contexts by stage (a multi-stage placement);
    ``prepost_budget``: the backend's receive-buffer budget (:func:`~pipetrain.schedule.prepost.prepost_budget`).
    Every rank of the plan must call it at the same point (the ranks exchange activations).
    """
    contexts = [ctx] if isinstance(ctx, RankContext) else list(ctx.values())
    tally = EvalTally()
    training = [c.kernel for c in contexts]
    for c in contexts:
        c.module.eval()
        c.kernel = EvaluationKernel(c.kernel.ports, tally)
    transport = contexts[0].transport
    earlier = transport.n_pending  # an asynchronous run's gradients in flight: received after the evaluation
    try:
        for inputs, targets in eval_batches(dataset, plan.batch_size):
            program = _programs(plan, int(inputs.shape[0]))[contexts[0].rank]
            for c in contexts:
                c.begin_step(inputs, targets, _forward_ranges(program, c.stage) if c.is_first else None)
            prepost = receive_prepost(ctx, program, prepost_budget, plan.params.queue_bound)
            transport.expect(expected_receives(ctx, program), prepost)
            run_program(ctx, program)
            transport.wait_sends(keep=earlier)
    finally:
        for c, kernel in zip(contexts, training, strict=True):
            c.kernel = kernel
            c.module.train()
    last = next((c for c in contexts if c.is_last), None)
    if last is None:
        return None
    if last.replicas is not None:
        totals = tally.totals()
        dist.all_reduce(totals, group=last.replicas)
        tally.set_totals(totals)
    return tally.result()


def _forward_ranges(program: Sequence[Action], stage: int) -> list[tuple[int, int]]:
    """A first stage's ranges to load: those its forwards take (its own micro-batches when replicated)."""
    return [(a.lo, a.hi) for a in program if a.kind is ActionKind.F and a.stage == stage]


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
