"""One way to score a plan: build its schedule, simulate it, attach the prediction.

    candidate = score(plan, cost, label="pipedream 15-1")
    candidate.iteration_s, candidate.plan.prediction.bubble_fraction
    candidate = memory_checked(candidate, cost, optimizer="adam")   # infeasible when over memory
    found = best_first(plans, cost, optimizer="adam")                # the fastest of many, fewer simulated

Every planner ranks its options with these, so a prediction means the same thing whichever planner
made it: the event simulator's iteration time (:func:`pipetrain.simulate.events.simulate`) of the
schedule :func:`~pipetrain.schedule.generators.build_schedule` makes from the plan, the schedule the
runtime then executes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.plan import Plan, Prediction
from pipetrain.planners.contract import Candidate
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.bounds import chain_lower_bound_s
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import overflows
from pipetrain.simulate.steady import steady_timeline

__all__ = ["best_first", "fitting_best", "memory_checked", "over_memory", "profile_noise", "profile_sources", "score",
           "score_steady", "tie_limit"]

_MIB = 2**20


def profile_sources(cost: CostModel) -> str:
    """Where the cost model's profiles came from: ``profile measured (cpu)``, or one per device kind."""
    if len(cost.profiles) == 1:
        (p,) = cost.profiles.values()
        return f"profile {p.source} ({p.device})"
    return "profiles " + ", ".join(f"{kind}: {p.source} ({p.device})" for kind, p in sorted(cost.profiles.items()))


def score(plan: Plan, cost: CostModel, *, label: str = "") -> Candidate:
    """The plan with its simulated :class:`~pipetrain.plan.plan.Prediction`, as a candidate.

    Args:
        plan: a valid plan whose ranks index ``cost.cluster``.
        cost: profiles and the cluster the plan runs on.
        label: what the planner calls this option; it heads the prediction's basis.
    """
    timeline = simulate(build_schedule(plan), plan, cost)
    basis = f"{label + ', ' if label else ''}simulated: {profile_sources(cost)}, cluster {cost.cluster.name}"
    prediction = Prediction(timeline.iteration_s, timeline.bubble_fraction(), timeline.peak_activation_bytes, basis)
    return Candidate(plan.with_prediction(prediction), timeline.iteration_s, cost.cluster, label)


def score_steady(plan: Plan, cost: CostModel, *, label: str = "") -> Candidate:
    """An asynchronous plan (``pipedream``, ``2bw``; docs/algorithms.md §3.5) scored by its steady state:
    ``iteration_s`` is the seconds per batch once the pipeline is full
    (:func:`~pipetrain.simulate.steady.steady_state`), comparable with a synchronous plan's iteration
    time; the bubble and activation peaks are those of the simulated run of several batches."""
    steady, timeline = steady_timeline(plan, cost)
    basis = (f"{label + ', ' if label else ''}steady state (no flush), simulated: {profile_sources(cost)}, "
             f"cluster {cost.cluster.name}")
    prediction = Prediction(steady.batch_s, timeline.bubble_fraction(), timeline.peak_activation_bytes, basis)
    return Candidate(plan.with_prediction(prediction), steady.batch_s, cost.cluster, label)


def over_memory(
    plan: Plan, cost: CostModel, optimizer: OptimizerName = "sgd", peaks: Sequence[int] | None = None
) -> str:
    """Empty when every stage fits its device, else which stage does not and by how much (``peaks``:
    per rank activation peaks already simulated, see :func:`~pipetrain.simulate.memory.stage_memory`)."""
    over = overflows(plan, cost, optimizer=optimizer, peaks=peaks)
    if not over:
        return ""
    k, need, have = over[0]
    return f"stage {k} needs {need / _MIB:.0f} MiB, its device has {have / _MIB:.0f} MiB"


def memory_checked(
    candidate: Candidate, cost: CostModel, optimizer: OptimizerName = "sgd", *, check: bool = True
) -> Candidate:
    """``candidate``, marked infeasible when some stage does not fit its device (:func:`over_memory`;
    the activation peaks of the candidate's own simulation, :func:`score`, are not replayed again);
    ``check=False`` returns it unchecked (a problem without a memory cap)."""
    if not check:
        return candidate
    prediction = candidate.plan.prediction
    peaks = prediction.peak_memory_bytes if prediction is not None else None
    if peaks is not None and len(peaks) != candidate.plan.n_ranks:
        peaks = None
    why = over_memory(candidate.plan, cost, optimizer, peaks)
    return replace(candidate, infeasible=f"over memory: {why}") if why else candidate


def profile_noise(cost: CostModel) -> float:
    """The largest relative spread of the cost model's measured profiles (:mod:`~pipetrain.planners.noise`);
    0 for estimated ones."""
    return max((p.noise.spread for p in cost.profiles.values() if p.noise is not None), default=0.0)


def tie_limit(fastest: float, noise: float) -> float:
    """The slowest time that can still tie with ``fastest`` (:func:`~pipetrain.planners.contract.rank_key`
    rounds to 3 significant digits) or fall within the profile's noise ``noise`` of it (:mod:`~.noise`)."""
    if not math.isfinite(fastest) or fastest <= 0:
        return math.inf
    unit = 10.0 ** (math.floor(math.log10(fastest)) - 2)
    return max(fastest + unit, fastest * (1 + noise)) * (1 + 1e-9)


def best_first(plans: Sequence[Plan], cost: CostModel, optimizer: OptimizerName = "sgd", *,
               check: bool = True) -> list[Candidate]:
    """The plans worth simulating, scored (:func:`score`) and memory-checked (:func:`memory_checked`,
    ``check``), in increasing order of their lower bound (:func:`~pipetrain.simulate.bounds.chain_lower_bound_s`):
    it stops at the first plan whose bound exceeds the fastest time found yet among plans that fit the
    devices' memory (whether or not ``check`` marks the others) by more than a 3-digit tie
    (:func:`~pipetrain.planners.contract.rank_key`) or the profiles' measured noise ``ε``
    (:mod:`~pipetrain.planners.noise`). So the fastest plan, the fastest that fits, those that tie
    with it or lie within the noise of it, and their ranking are those of scoring every plan; only
    slower candidates are missing. A plan the bound does not cover (bound 0) is always scored.
    Returned in the order scored; the plans' own order breaks ties of the bound."""
    noise = profile_noise(cost)
    bounds = [chain_lower_bound_s(plan, cost) for plan in plans]
    limit = math.inf
    found = []
    for i in sorted(range(len(plans)), key=bounds.__getitem__):
        if bounds[i] > limit:
            break
        candidate = score(plans[i], cost)
        checked = memory_checked(candidate, cost, optimizer)  # the limit counts fitting plans, whatever ``check``
        if checked.feasible:
            limit = min(limit, tie_limit(candidate.iteration_s, noise))
        found.append(checked if check else candidate)
    return found


def fitting_best(candidates: Sequence[Candidate], planner: str) -> Candidate:
    """The first of ``candidates`` (ranked by :func:`~pipetrain.planners.contract.rank_key`, so feasible
    ones first) when it fits (:func:`memory_checked`).

    Raises:
        UserError: none fits; names the fastest one's overflow and the ways out.
    """
    best = candidates[0]
    if best.feasible:
        return best
    raise UserError(f"no {planner} plan fits the devices' memory (the fastest: {best.infeasible}); use more "
                    "devices, a smaller batch, recompute (--recompute auto, the default, or all), a micro-batch "
                    "planner with unequal sizes (--planner tidgap), or --no-memory-cap to plan anyway")
