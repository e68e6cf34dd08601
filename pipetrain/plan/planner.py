"""Planning equal-micro-batch pipelines (GPipe, 1F1B): partition, count, predict.

For each candidate micro-batch count ``m`` the planner cuts the layers into stages by an exact
min–max partition of per-layer forward + backward time *at that micro-batch size* (a stage's
cost curve depends on the size, PAPERS.md §1.3), builds the schedule, simulates it, and keeps the
fastest. Candidates: every ``m`` up to 64 plus powers of two up to the batch. Ties go to fewer
micro-batches (less runtime overhead, larger messages).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.partition import balanced_partition
from pipetrain.plan.plan import Method, Plan, Prediction, StagePlan, equal_sizes
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

__all__ = ["Candidate", "candidate_counts", "equal_plan", "plan_equal", "rank_key"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One simulated option: the plan and its predicted iteration time."""

    plan: Plan
    iteration_s: float


def rank_key(c: Candidate) -> tuple[float, int, int]:
    """Fastest first; among equally fast plans (to 3 significant digits), less activation memory,
    then fewer micro-batches: GPipe and 1F1B often tie in time, and 1F1B holds fewer activations."""
    peak = max(c.plan.prediction.peak_memory_bytes, default=0) if c.plan.prediction else 0
    digits = 3 - (math.floor(math.log10(c.iteration_s)) + 1 if c.iteration_s > 0 else 0)
    return (round(c.iteration_s, digits), peak, len(c.plan.stages[0].forward_sizes))


def candidate_counts(batch_size: int, limit: int = 64) -> list[int]:
    """Micro-batch counts worth simulating: 1..limit and the powers of two up to the batch."""
    counts = set(range(1, min(batch_size, limit) + 1))
    p = 1
    while p <= batch_size:
        counts.add(p)
        p *= 2
    counts.add(batch_size)
    return sorted(counts)


def equal_plan(
    *,
    model: str,
    fingerprint: str,
    layer_names: Sequence[str],
    cost: CostModel,
    method: Method,
    n_stages: int,
    batch_size: int,
    n_micro: int,
) -> Plan:
    """The balanced plan with ``n_micro`` equal micro-batches (no simulation)."""
    if n_stages > cost.cluster.n_devices:
        raise UserError(
            f"{n_stages} stages need {n_stages} ranks but the cluster has {cost.cluster.n_devices}; "
            "use fewer stages or more ranks"
        )
    sizes = equal_sizes(batch_size, n_micro)
    b = max(sizes)
    # The per-action overhead is paid once per stage, not per layer: leave it out of the balance.
    per_layer = [
        cost.forward_s((name,), b, 0) + cost.backward_s((name,), b, 0) - 2 * cost.action_overhead_s
        for name in layer_names
    ]
    counts = balanced_partition(per_layer, n_stages)
    stages, first = [], 0
    for k, count in enumerate(counts):
        stages.append(StagePlan(tuple(layer_names[first:first + count]), (k,), sizes, sizes))
        first += count
    return Plan(model, fingerprint, batch_size, method, tuple(stages))


def plan_equal(
    *,
    model: str,
    fingerprint: str,
    layer_names: Sequence[str],
    cost: CostModel,
    method: Method,
    n_stages: int,
    batch_size: int,
    n_micro: int | None = None,
    counts: Iterable[int] | None = None,
) -> tuple[Plan, list[Candidate]]:
    """The fastest equal-micro-batch plan, with every simulated candidate (fastest first).

    ``n_micro`` fixes the count; otherwise the planner simulates ``counts`` (default
    :func:`candidate_counts`) and keeps the fastest.
    """
    options = [n_micro] if n_micro is not None else (list(counts) if counts else candidate_counts(batch_size))
    candidates = []
    for m in options:
        plan = equal_plan(model=model, fingerprint=fingerprint, layer_names=layer_names, cost=cost,
                          method=method, n_stages=n_stages, batch_size=batch_size, n_micro=m)
        timeline = simulate(build_schedule(plan), plan, cost)
        prediction = Prediction(
            timeline.iteration_s, timeline.bubble_fraction(), timeline.peak_activation_bytes,
            f"simulated: profile {cost.profile.source} ({cost.profile.device}), cluster {cost.cluster.name}",
        )
        candidates.append(Candidate(plan.with_prediction(prediction), timeline.iteration_s))
        log.debug("m=%d predicted %.6f s", m, timeline.iteration_s)
    candidates.sort(key=rank_key)
    return candidates[0].plan, candidates
