"""What a plan does to a model's BatchNorms (:mod:`pipetrain.graph.batch_norm`).

    check_batch_norm_sizes(plan, graph)   # UserError: a micro-batch of 1 through a BatchNorm on [b, C]
    warn_batch_norm(plan, graph)          # one log line when BatchNorm statistics are per micro-batch

A BatchNorm in training normalises over the samples of one micro-batch, so a plan that cuts the
batch into several (or gives replicas of a stage their own) computes other statistics, and other
gradients, than single-process training on the whole batch: GPipe (Huang et al. 2019) documents it,
and docs/architecture.md §5.2 names it as the one exception to equal gradients. The planning and
training entry points say so once, in one line; nothing is said when every BatchNorm sees the
whole batch in one micro-batch.
"""

from __future__ import annotations

import logging

from pipetrain.errors import UserError
from pipetrain.graph.batch_norm import BatchNorms, batch_norms, listed
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.plan import Plan

__all__ = ["batch_norm_warning", "check_batch_norm_sizes", "warn_batch_norm"]

log = logging.getLogger(__name__)


def check_batch_norm_sizes(plan: Plan, graph: LayerGraph, norms: BatchNorms | None = None) -> None:
    """Every stage holding a BatchNorm that cannot train on one sample gets micro-batches of 2 or more
    (forward and backward sizes: a recomputing stage re-runs its forward in training mode).

    Raises:
        UserError: naming the stage, its BatchNorm layers and the fix.
    """
    norms = norms or batch_norms(graph)
    smallest = norms.smallest_microbatch
    for k, stage in enumerate(plan.stages):
        held = tuple(name for name in stage.layers if name in norms.single_value)
        if held and min(*stage.forward_sizes, *stage.backward_sizes) < smallest:
            raise UserError(f"stage {k} gives micro-batches of 1 sample to BatchNorm in {listed(held)}, which cannot "
                            f"train on fewer than {smallest} (one value per channel); give every micro-batch at "
                            f"least {smallest} samples (fewer micro-batches, or a plan from `pipetrain plan`)")


def batch_norm_warning(plan: Plan, graph: LayerGraph, norms: BatchNorms | None = None) -> str:
    """The one line to say when some BatchNorm sees the batch in several micro-batches, else ''."""
    norms = norms or batch_norms(graph)
    counts = [len(s.forward_sizes) for s in plan.stages if any(name in norms.layers for name in s.layers)]
    if not counts or max(counts) == 1:
        return ""
    verb, whose = ("normalises", "its") if len(norms.modules) == 1 else ("normalise", "their")
    return (f"BatchNorm {norms.named()} {verb} each micro-batch on its own ({max(counts)} per batch of "
            f"{plan.batch_size}): {whose} statistics, and the training, differ from single-process training on the "
            "whole batch")


def warn_batch_norm(plan: Plan, graph: LayerGraph) -> None:
    """Log :func:`batch_norm_warning` as a warning when there is one."""
    line = batch_norm_warning(plan, graph)
    if line:
        log.warning(line)
