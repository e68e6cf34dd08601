"""Recompute under memory pressure: a plan over its devices' memory tries recomputing the stages that overflow.

    plan = as_chosen(plan, constraints.recompute)                      # "all": every stage recomputes
    candidates = with_recompute_options(candidates, cost, optimizer)   # plus recomputing variants that fit

Activation checkpointing (docs/algorithms.md §2.6; :attr:`~pipetrain.plan.plan.StagePlan.recompute`)
trades memory for time: a recomputing stage keeps only its inputs from F to B and pays its forward
again in backward. For a candidate over memory (:func:`~pipetrain.simulate.memory.overflows`), each
rank that overflows gets one more of its stages recomputing per round, the cheapest first (the least
forward seconds on its largest micro-batch, the time recompute adds per micro-batch), and the plan is
simulated again (:func:`~pipetrain.planners.score.score`), until every rank fits or every stage of an
overflowing rank recomputes. One stage per rank (gpipe, 1f1b, zb1, ...) is one round: exactly the
stages that overflow recompute; several chunks per rank (interleaved, zbv) recompute only as many
chunks as the rank needs. The variant is a candidate beside the original, labelled with the stages
that recompute and why, so the planner's ranking keeps the fastest plan that fits: recomputing at few
micro-batches may beat keeping activations at many. Since recompute never saves time, candidates
over memory are tried fastest first, and only while faster than the fastest plan that fits so far
(as it is, or a variant already made). Cost: one simulation per round per candidate tried.

The user's choice (:attr:`~pipetrain.planners.contract.Constraints.recompute`): ``auto``
(the default) makes these variants, ``none`` does not, ``all`` recomputes every stage of every plan
(:func:`as_chosen`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipetrain.cost import CostModel
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Candidate, RecomputeChoice
from pipetrain.planners.score import memory_checked, over_memory, score
from pipetrain.simulate.memory import overflows

__all__ = ["as_chosen", "recomputing", "with_recompute_options"]


def as_chosen(plan: Plan, choice: RecomputeChoice) -> Plan:
    """``plan`` as the user's choice builds it: every stage recomputing for ``all``, else as it is (``auto``
    recomputes only a plan over memory, :func:`with_recompute_options`)."""
    return plan.with_recompute() if choice == "all" else plan


def with_recompute_options(candidates: Sequence[Candidate], cost: CostModel,
                           optimizer: OptimizerName) -> list[Candidate]:
    """``candidates`` and, for each over memory and faster than the fastest that fits, its variant that
    recomputes the overflowing stages (module docstring); variants that still do not fit are left out.

    Args:
        candidates: scored candidates (:func:`~pipetrain.planners.score.score`), on ``cost``'s cluster or
            on their own :attr:`~pipetrain.planners.contract.Candidate.cluster`.
        cost: the cost model.
        optimizer: whose state counts against memory.
    """
    over = [over_memory(c.plan, _on(cost, c), optimizer, _peaks(c)) for c in candidates]
    bound = min((c.iteration_s for c, why in zip(candidates, over, strict=True) if not why), default=math.inf)
    variants = []
    for c in sorted((c for c, why in zip(candidates, over, strict=True) if why), key=lambda c: c.iteration_s):
        if c.iteration_s >= bound:  # its variant is slower still than a plan that fits: so are the rest
            break
        variant = recomputing(c, _on(cost, c), optimizer)
        if variant is not None:
            variants.append(variant)
            bound = min(bound, variant.iteration_s)
    return [*candidates, *variants]


def _on(cost: CostModel, candidate: Candidate) -> CostModel:
    """The cost model on the cluster the candidate's ranks index."""
    return cost if candidate.cluster is None else cost.on(candidate.cluster)


def _peaks(candidate: Candidate) -> Sequence[int] | None:
    """The candidate's simulated activation peaks per rank, when its prediction has one per rank."""
    prediction = candidate.plan.prediction
    if prediction is None or len(prediction.peak_memory_bytes) != candidate.plan.n_ranks:
        return None
    return prediction.peak_memory_bytes


def recomputing(candidate: Candidate, cost: CostModel, optimizer: OptimizerName) -> Candidate | None:
    """``candidate``'s plan recomputing, round by round, the cheapest stage not yet recomputing on each
    rank that overflows, re-simulated, until it fits (module docstring); None when it never does (the
    weights and optimizer state alone overflow, or the stashed inputs of every micro-batch do).

    Its label (and the prediction's basis) says which stages recompute and why: the overflow that made
    them.
    """
    base = candidate.plan
    plan, why = base, over_memory(base, cost, optimizer, _peaks(candidate))
    chosen = set(base.recompute_stages)
    current = candidate
    while True:
        over = overflows(plan, cost, optimizer=optimizer, peaks=_peaks(current))
        if not over:
            break
        added = {_cheapest(plan, cost, k, chosen) for k, _, _ in over} - {None}
        if not added:
            return None
        chosen |= {k for k in added if k is not None}
        plan = base.with_recompute(chosen)
        stages = ", ".join(map(str, sorted(chosen)))
        label = f"{candidate.label + ', ' if candidate.label else ''}recompute stage{'s' * (len(chosen) > 1)} " \
                f"{stages} (without: {why})"
        current = memory_checked(score(plan, cost, label=label), cost, optimizer)
    return current if current.feasible else None


def _cheapest(plan: Plan, cost: CostModel, stage: int, chosen: set[int]) -> int | None:
    """The stage, of those on the ranks of overflowing ``stage`` that do not recompute yet, whose forward
    on its largest micro-batch is cheapest; None when all of them recompute."""
    ranks = plan.stages[stage].ranks
    options = sorted({k for r in ranks for k in plan.stages_of_rank(r)} - chosen)
    if not options:
        return None

    def extra_s(k: int) -> float:
        s = plan.stages[k]
        return cost.forward_s(s.layers, max(s.backward_sizes), s.ranks[0])

    return min(options, key=lambda k: (extra_s(k), k))
