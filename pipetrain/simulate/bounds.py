"""A lower bound on a flush plan's simulated iteration time, without simulating it (issue 30).

    bound = chain_lower_bound_s(plan, cost)         # seconds; simulate(...).iteration_s >= bound

For a flush plan whose stages form a chain (stage ``j`` feeds ``j + 1``), each stage on one rank and
a rank running one or several of them (``gpipe``, ``1f1b``, ``zb1``, ``zb2`` as the balanced planner
makes them; ``interleaved``, ``interleaved-zb`` with ``v`` chunks per rank, ``zbv``, ``dualpipev``
in a V), with ``F_k``, ``B_k``, ``W_k`` the stage's forward, backward (its input gradient when the
method splits the backward) and weight-gradient seconds on the cheapest of its micro-batch sizes,
and sums over its ``m`` micro-batches written ``ΣF_k`` …, the event simulator's makespan ``T``
(:func:`~pipetrain.simulate.events.simulate`) satisfies, for every rank ``r`` running stages ``S_r``::

    fill_k  = Σ_{j<k} F_j                  # stage k's first F waits for one micro-batch's forwards upstream
    drain_k = Σ_{j<k} B_j                  # stage k's last B hands its gradient down through every stage above
    T >= min_{k∈S_r} fill_k + Σ_{k∈S_r} (ΣF_k + ΣB_k + ΣW_k + step_k)
    T >= fill_k + ΣF_k + ΣB_k + drain_k + step_0          (k >= 1, a rank holding stage k alone)

since a rank runs one action at a time, never faster than standalone, and its first action is a
forward (transfers, contention, the gradient all-reduces and the norm are left out: they only add).
The second line is GPipe's ``(m + K − 1)`` fill and drain (docs/algorithms.md §2.3) without the
bubble's interleaving; on a rank with several stages the first line alone (the rank's work after
the earliest fill; Narayanan et al. 2021 §2.2's bubble is what it leaves out). A planner simulates
its candidates in increasing order of this bound and stops at the first whose bound exceeds the best
time found (:func:`~pipetrain.planners.score.best_first`). Cost: O(K · sizes) lookups of the cost
model's cached stage times, against the simulator's O(actions × ranks).

Any other plan (replicated stages, a DAG, unequal partitions, local losses, no flush) gets 0,
a bound that holds trivially.
"""

from __future__ import annotations

from collections import defaultdict

from pipetrain.cost import CostModel
from pipetrain.plan.methods import Backward, StageGraph
from pipetrain.plan.placement import Placement
from pipetrain.plan.plan import Plan

__all__ = ["chain_lower_bound_s"]


def _bounded(plan: Plan) -> bool:
    spec = plan.spec
    return (spec.graph is StageGraph.CHAIN and spec.flush and spec.gradients_cross_stages
            and all(len(s.ranks) == 1 for s in plan.stages)
            and all(s.forward_sizes == s.backward_sizes for s in plan.stages))


def chain_lower_bound_s(plan: Plan, cost: CostModel) -> float:
    """Seconds the simulated iteration of ``plan`` takes at least (module docstring); 0 for a plan
    it does not bound."""
    if not _bounded(plan):
        return 0.0
    split = plan.spec.backward is Backward.SPLIT
    single = plan.spec.placement is Placement.SINGLE
    fastest = max((1.0, *cost.cluster.shared_speed))  # a node's sharing table could only speed ranks up above 1
    fill = drain = 0.0
    bound = 0.0
    step_0 = cost.step_s(plan.stages[0].layers, plan.stages[0].ranks[0])
    work: dict[int, float] = defaultdict(float)  # per rank: its stages' compute and steps
    first: dict[int, float] = {}  # per rank: the fill of its earliest stage
    for k, stage in enumerate(plan.stages):
        layers, rank, recompute = stage.layers, stage.ranks[0], plan.recomputes(k)
        sizes = stage.forward_sizes
        forward = [cost.forward_s(layers, b, rank) for b in sizes]
        if split:
            backward = [cost.backward_input_s(layers, b, rank, recompute) for b in sizes]
            weight = sum(cost.weight_grad_s(layers, b, rank) for b in sizes)
        else:
            backward, weight = [cost.backward_s(layers, b, rank, recompute) for b in sizes], 0.0
        own = sum(forward) + sum(backward)
        work[rank] += own + weight + cost.step_s(layers, rank)
        first.setdefault(rank, fill)
        if single and k:
            bound = max(bound, fill + own + drain + step_0)
        fill += min(forward)
        drain += min(backward)
    bound = max(bound, *(first[r] + work[r] for r in work))
    return bound / fastest
