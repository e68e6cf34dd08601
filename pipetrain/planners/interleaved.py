"""The ``interleaved`` planner: ``v`` model chunks per rank under interleaved 1F1B (Narayanan et al.
2021, §2.2; :mod:`pipetrain.schedule.interleaved`), with the backward fused (method ``interleaved``)
or split into B and deferred W (method ``interleaved-zb``, Qi et al. 2024 §2–3;
:mod:`pipetrain.schedule.interleaved_zb`), and ZB-V's two chunks per rank in a V (method ``zbv``,
Qi et al. 2024 §6; :mod:`pipetrain.schedule.zbv`).

    result = plan_interleaved(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan.virtual_stages, result.candidates

For each chunk count ``v`` (``constraints.virtual_stages``, default every ``v`` from 2 up to the
layers per device, at most :data:`MAX_CHUNKS`) and micro-batch count ``m`` (``constraints.n_micro``,
default :func:`~pipetrain.planners.counts.thinned_counts`), the layers are cut into ``v·R`` stages by
the exact min–max partition at that micro-batch size, stage ``s`` placed on rank ``s mod R`` (R: the
devices, or fewer when the model has under two layers per device: a sub-cluster); every
plan is run by each method (``constraints.method``, default all) and simulated
(:func:`~pipetrain.planners.score.score`, the event simulator with the cluster's contention) in
increasing order of its lower bound (each rank's work after its earliest fill,
:func:`~pipetrain.simulate.bounds.chain_lower_bound_s`), stopping where the bound exceeds the fastest
fitting time (:func:`~pipetrain.planners.score.best_first`: the same winner as simulating all; 65 of
151 plans simulated for gpt1-14 at batch 512 on 7 ranks, issue 30); the fastest is kept.
Unlike torch's interleaved schedules any ``m`` is allowed. For ``v = 2`` the layers
are also cut into ``2R`` stages balanced per rank pair
(:func:`~pipetrain.planners.partition.v_shape.v_balanced_partition`), placed in a V (stage ``s`` on
rank ``s``, or ``2R − 1 − s`` from ``s = R`` on, :mod:`pipetrain.plan.placement`) and run by ``zbv``.
A candidate over memory gets a variant recomputing as few chunks of its overflowing ranks as make them
fit, cheapest first (:mod:`pipetrain.planners.recompute`).
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Method, MethodSpec
from pipetrain.plan.placement import Placement, placed_ranks
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import ModelRef, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.counts import thinned_counts
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.partition import balanced_partition
from pipetrain.planners.partition.v_shape import v_balanced_partition
from pipetrain.planners.recompute import as_chosen, with_recompute_options
from pipetrain.planners.score import best_first, fitting_best
from pipetrain.planners.spec import planned_methods

__all__ = ["MAX_CHUNKS", "build_interleaved_plan", "interleaved_plans", "plan_interleaved", "v_placed"]

MAX_CHUNKS = 4
"""The most chunks per rank the planner tries by default (each adds ``R`` messages per micro-batch)."""


def interleaved_plans(spec: MethodSpec) -> bool:
    """The methods this planner plans: those whose ranks each run several stages (looping or V
    placement): interleaved, interleaved-zb and zbv."""
    return spec.multi_stage


def build_interleaved_plan(model: ModelRef, cost: CostModel, *, n_ranks: int, chunks: int, batch_size: int,
                           n_micro: int, method: Method = Method.INTERLEAVED) -> Plan:
    """``chunks · n_ranks`` balanced stages, stage ``s`` on rank ``s mod n_ranks`` (``zbv``: in a V, each
    rank's two stages balanced, :func:`~pipetrain.planners.partition.v_shape.v_balanced_partition`),
    ``n_micro`` equal micro-batches, run by ``method`` (``interleaved``, ``interleaved-zb`` or ``zbv``
    with 2 chunks; no simulation).

    Raises:
        UserError: fewer layers than stages; ``zbv`` with other than 2 chunks.
    """
    if METHODS[method].placement is Placement.V and chunks != 2:
        raise UserError(f"method {method.value} runs exactly 2 chunks per rank (a V), not {chunks}; drop "
                        "--virtual-stages or give --virtual-stages 2")
    n_stages = chunks * n_ranks
    if n_stages > len(model.layer_names):
        raise UserError(f"{chunks} chunks on {n_ranks} ranks need {n_stages} stages but {model.name!r} has "
                        f"{len(model.layer_names)} layers; use fewer --virtual-stages or ranks")
    sizes = equal_sizes(batch_size, n_micro)
    work = [cost.layer_work_s(name, max(sizes), 0) for name in model.layer_names]
    v_shaped = METHODS[method].placement is Placement.V
    counts = v_balanced_partition(work, n_ranks) if v_shaped else balanced_partition(work, n_stages)
    stages, first = [], 0
    for k, count in enumerate(counts):
        stages.append(StagePlan(model.layer_names[first:first + count], (k % n_ranks,), sizes, sizes))
        first += count
    return v_placed(Plan(model.name, model.fingerprint, batch_size, method, tuple(stages)))


def v_placed(plan: Plan) -> Plan:
    """``plan`` with its stages on the ranks its method's placement gives (V for ``zbv``); as it is for others."""
    placed = placed_ranks(Placement.V, plan.n_stages, plan.n_ranks) if plan.placement is Placement.V else None
    if placed is None:
        return plan
    return replace(plan, stages=tuple(replace(s, ranks=r) for s, r in zip(plan.stages, placed, strict=True)))


def runs_with(spec: MethodSpec, n_micro: int, n_stages: int) -> bool:
    """Whether a method runs ``n_micro`` micro-batches on ``n_stages`` stages (DualPipeV and 2BW need
    one per stage, :attr:`~pipetrain.plan.methods.MethodSpec.microbatches_per_stage`)."""
    return not spec.microbatches_per_stage or n_micro >= n_stages


def plan_interleaved(problem: PlanningProblem) -> PlanningResult:
    """The fastest interleaved plan over methods, chunk and micro-batch counts (module docstring).

    Raises:
        UserError: one device, a model with fewer than two layers per device, or a method that does
            not loop.
    """
    c, n_layers = problem.constraints, len(problem.model.layer_names)
    planned = planned_methods(interleaved_plans)
    if c.method is not None and not interleaved_plans(METHODS[c.method]):
        raise UserError(f"the interleaved planner plans methods {', '.join(m.value for m in planned[:-1])} "
                        f"and {planned[-1].value}, not {c.method.value}; drop the method or use the balanced planner")
    methods = planned if c.method is None else (c.method,)
    n_ranks = min(problem.cost.cluster.n_devices, n_layers // 2)  # at least 2 layers (chunks) per rank
    cluster, _ = placed_cluster(problem.cost.cluster, range(n_ranks))
    cost = problem.cost.on(cluster)
    most = n_layers // max(n_ranks, 1)
    chunk_options = [c.virtual_stages] if c.virtual_stages is not None else list(range(2, min(most, MAX_CHUNKS) + 1))
    if c.method is not None and METHODS[c.method].placement is Placement.V:
        if c.virtual_stages not in (None, 2):
            raise UserError(f"method {c.method.value} runs exactly 2 chunks per rank (a V), not "
                            f"{c.virtual_stages}; drop --virtual-stages or give --virtual-stages 2")
        chunk_options = [2] if most >= 2 else []
    if n_ranks < 2 or not chunk_options:
        raise UserError(f"interleaved 1F1B needs at least 2 ranks with 2 layers each (here {n_ranks} ranks, "
                        f"{n_layers} layers); use --method 1f1b")
    counts = [c.n_micro] if c.n_micro is not None else thinned_counts(problem.batch_size, problem.smallest_microbatch)
    plans: list[Plan] = []
    for chunks in chunk_options:
        for m in counts:
            looping = [x for x in methods if METHODS[x].placement is Placement.LOOPING]
            v_shaped = [x for x in methods if METHODS[x].placement is Placement.V and chunks == 2]
            for placed in (looping, v_shaped):
                kinds = [x for x in placed if runs_with(METHODS[x], m, chunks * n_ranks)]
                if kinds:  # one partition per placement, run by each of its methods
                    plan = build_interleaved_plan(problem.model, cost, n_ranks=n_ranks, chunks=chunks,
                                                  batch_size=problem.batch_size, n_micro=m, method=kinds[0])
                    plans += [as_chosen(plan.run_by(method), c.recompute) for method in kinds]
    candidates = best_first(plans, cost, problem.optimizer, check=c.memory_cap)
    if not candidates:  # every method asked for needs a micro-batch per stage (DualPipeV), more than given
        fewest = min(chunks for chunks in chunk_options) * n_ranks
        raise UserError(f"method {', '.join(m.value for m in methods)} needs a micro-batch per stage, at least "
                        f"{fewest} on {n_ranks} ranks, not {max(counts)}; give --micro {fewest} or more "
                        "(n_micro), or a larger batch")
    if c.memory_cap and c.recompute == "auto":
        candidates = with_recompute_options(candidates, cost, problem.optimizer)
    candidates.sort(key=rank_key)
    return PlanningResult("interleaved", fitting_best(candidates, "interleaved").plan, cluster, tuple(candidates))
