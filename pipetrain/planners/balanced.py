"""The ``balanced`` planner: equal-micro-batch pipelines (GPipe, 1F1B, ZB-H1, ZB-H2), one stage per device.

    result = plan_balanced(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan, result.candidates       # the fastest, and every (method, count) simulated

For each method it plans (:func:`balanced_plans`) and candidate micro-batch count ``m`` the planner
cuts the layers into stages by an exact min–max partition of per-layer forward + backward time *at
that micro-batch size* (a stage's cost curve depends on the size, docs/algorithms.md §2.2), builds the
schedule, simulates it (:func:`~pipetrain.planners.score.score`) and keeps the fastest; counts whose
lower bound (:func:`~pipetrain.simulate.bounds.chain_lower_bound_s`) already exceeds the fastest
fitting time are not simulated (:func:`~pipetrain.planners.score.best_first`; issue 30).
Candidates: every ``m`` up to 64
plus powers of two up to the batch (:func:`~pipetrain.planners.counts.candidate_counts`). Ties go
to less activation memory, then fewer micro-batches (:func:`~pipetrain.planners.contract.rank_key`).
A candidate over memory gets a variant that recomputes its overflowing stages
(:mod:`pipetrain.planners.recompute`), so a plan that fits only by recomputing competes with those that
fit as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Method, MethodSpec, SizeRule, StageGraph
from pipetrain.plan.placement import Placement
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Candidate, ModelRef, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.counts import candidate_counts
from pipetrain.planners.partition import balanced_partition
from pipetrain.planners.recompute import as_chosen, with_recompute_options
from pipetrain.planners.score import best_first, fitting_best, memory_checked, over_memory
from pipetrain.planners.spec import planned_methods

__all__ = ["balanced_candidates", "balanced_plans", "build_balanced_plan", "fastest_fitting", "plan_balanced"]

log = logging.getLogger(__name__)


def balanced_plans(spec: MethodSpec) -> bool:
    """The methods the balanced planner plans: one stage per rank along a chain, a flush per batch,
    gradients across stages and one partition per stage (forward = backward), the backward fused or
    split: gpipe, 1f1b, zb1 and zb2."""
    return (spec.placement is Placement.SINGLE and spec.graph is StageGraph.CHAIN and spec.flush
            and spec.gradients_cross_stages and spec.sizes is not SizeRule.PER_PASS)


def build_balanced_plan(model: ModelRef, cost: CostModel, *, method: Method, n_stages: int, batch_size: int,
                        n_micro: int) -> Plan:
    """The balanced plan with ``n_micro`` equal micro-batches, stage ``k`` on rank ``k`` (no simulation)."""
    if n_stages > cost.cluster.n_devices:
        raise UserError(
            f"{n_stages} stages need {n_stages} ranks but the cluster has {cost.cluster.n_devices}; "
            "use fewer stages or more ranks"
        )
    sizes = equal_sizes(batch_size, n_micro)
    b = max(sizes)
    counts = balanced_partition([cost.layer_work_s(name, b, 0) for name in model.layer_names], n_stages)
    stages, first = [], 0
    for k, count in enumerate(counts):
        stages.append(StagePlan(model.layer_names[first:first + count], (k,), sizes, sizes))
        first += count
    return Plan(model.name, model.fingerprint, batch_size, method, tuple(stages))


def balanced_candidates(problem: PlanningProblem, methods: Sequence[Method]) -> list[Candidate]:
    """The simulated balanced plans of ``methods`` (one per method and micro-batch count), fastest
    first: those :func:`~pipetrain.planners.score.best_first` scores, in increasing order of their
    lower bound, up to the first that cannot beat (or tie) the fastest that fits, so the fastest plan
    and the fastest that fits are those of simulating every one. When none of them runs a micro-batch
    per stage, also the fastest plans that do (best first among those): a method that needs as many
    micro-batches as stages (``2bw``, run on a ``1f1b`` plan's stages,
    :attr:`~pipetrain.plan.methods.MethodSpec.microbatches_per_stage`) takes the fastest of them."""
    c = problem.constraints
    n_stages = c.n_stages or min(problem.cost.cluster.n_devices, len(problem.layer_names))
    smallest = problem.smallest_microbatch
    options = [c.n_micro] if c.n_micro is not None else candidate_counts(problem.batch_size, smallest=smallest)
    plans = [as_chosen(build_balanced_plan(problem.model, problem.cost, method=method, n_stages=n_stages,
                                           batch_size=problem.batch_size, n_micro=m), c.recompute)
             for method in methods for m in options]
    candidates = best_first(plans, problem.cost, problem.optimizer, check=c.memory_cap)
    if not any(len(cand.plan.stages[0].forward_sizes) >= n_stages for cand in candidates):
        filled = [p for p in plans if len(p.stages[0].forward_sizes) >= n_stages]
        candidates += best_first(filled, problem.cost, problem.optimizer, check=c.memory_cap)
    log.debug("balanced: simulated %d of %d plans", len(candidates), len(plans))
    if c.memory_cap and c.recompute == "auto":
        candidates = with_recompute_options(candidates, problem.cost, problem.optimizer)
    return sorted(candidates, key=rank_key)


def plan_balanced(problem: PlanningProblem) -> PlanningResult:
    """The fastest balanced plan over the methods (``constraints.method``, default every one of
    :func:`balanced_plans`) and micro-batch counts (``constraints.n_micro``, default: search), with the
    candidates simulated (:func:`balanced_candidates`)."""
    method = problem.constraints.method
    if method is not None and not balanced_plans(METHODS[method]):
        raise UserError(f"the balanced planner plans {', '.join(m.value for m in planned_methods(balanced_plans))}, "
                        f"not method={method.value}; use a micro-batch planner (e.g. 'tidgap') for uedp")
    candidates = balanced_candidates(problem, [method] if method is not None else planned_methods(balanced_plans))
    best = fitting_best(candidates, "balanced")
    return PlanningResult("balanced", best.plan, problem.cost.cluster, tuple(candidates))


def fastest_fitting(result: PlanningResult, problem: PlanningProblem) -> PlanningResult:
    """``result`` (planned without the memory cap) with its fastest plan that fits the devices' memory
    under the problem's optimizer: ``auto``'s answer from the balanced planner, whose ranking whatever
    the memory is the micro-batch planners' base (:class:`~pipetrain.planners.spec.AutoRun`).

    Raises:
        UserError: no candidate fits; names the fastest one's overflow.
    """
    options = result.candidates
    if problem.constraints.recompute == "auto":
        options = tuple(sorted(with_recompute_options(options, problem.cost, problem.optimizer), key=rank_key))
    fitting = [c for c in options if memory_checked(c, problem.cost, problem.optimizer).feasible]
    if not fitting:
        why = over_memory(result.plan, problem.cost, problem.optimizer)
        raise UserError(f"no equal plan on {result.plan.n_stages} stages fits: {why}")
    return replace(result, plan=fitting[0].plan)
