"""Plans whose predicted times differ by less than the profile's noise count as equally fast (issue 32).

    result = within_noise(result, epsilon=profile.noise.spread)
    result.plan, result.within_noise, result.noise

A measured profile's times move from one profiling run to the next (load, caches, frequency), by
about its relative spread ε (:class:`~pipetrain.profile.noise.ProfileNoise`). Choosing the fastest
candidate by a margin smaller than ε picks another plan on every run. So :func:`within_noise` takes
the feasible candidates predicted within ``1 + ε`` of the fastest and keeps the one that wins on
what noise cannot move, the plan's structure (:func:`robust_key`):

1. the fewest ranks (devices left idle are devices saved);
2. the simplest method: the fewest of split backward, several stages per rank, no flush
   (asynchronous), a DAG of stages, local losses, and stages that recompute;
3. the fewest micro-batches: fewer actions, messages and per-action overheads, the parts of a
   prediction modelled rather than measured, and larger kernels, whose times vary less;
4. the least peak activation memory (bytes are counted, not timed: GPipe and 1F1B of the same
   micro-batches differ here);
5. then the method's name, the stages' layer counts and micro-batch sizes, so that any two distinct
   plans are ordered.

Within the noise, a candidate's time never decides, so the same candidates give the same choice
whatever their times' jitter. Planners still rank by time (:func:`~.contract.rank_key`); this runs
once, after any planner, in :func:`pipetrain.api.plan`.
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.plan.methods import METHODS, Backward, StageGraph
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Candidate, PlanningResult

__all__ = ["robust_key", "within_noise"]

_RobustKey = tuple[int, int, int, int, str, tuple[int, ...], tuple[tuple[int, ...], ...]]


def _complexity(plan: Plan) -> int:
    """How many of the method's and stages' complications (module docstring, rule 2) the plan has."""
    spec = METHODS[plan.method]
    traits = (spec.backward is Backward.SPLIT, spec.multi_stage, not spec.flush, spec.graph is StageGraph.DAG,
              not spec.gradients_cross_stages)
    return sum(traits) + sum(s.recompute for s in plan.stages)


def robust_key(c: Candidate) -> _RobustKey:
    """The order among candidates within the noise (module docstring): smaller first; no time in it."""
    plan = c.plan
    peak = max(plan.prediction.peak_memory_bytes, default=0) if plan.prediction else 0
    return (plan.n_ranks, _complexity(plan), max(len(s.forward_sizes) for s in plan.stages), peak,
            plan.method.value, tuple(len(s.layers) for s in plan.stages),
            tuple(s.forward_sizes for s in plan.stages))


def within_noise(result: PlanningResult, epsilon: float | None) -> PlanningResult:
    """``result`` with the plan chosen among the candidates within ``epsilon`` of the fastest.

    Args:
        result: a planner's answer; its plan is replaced only when it is one of the candidates within the
            noise (a planner that kept a slower plan for other reasons keeps it).
        epsilon: the profile's relative spread (0.1: ±10%); None or 0: no noise known, ``result`` as is.

    Returns:
        ``result`` with ``noise=epsilon`` and, when two or more feasible candidates are predicted within
        ``(1 + epsilon)`` of the fastest, ``within_noise`` holding them fastest first and ``plan`` (and
        ``cluster``) the first of them by :func:`robust_key`.
    """
    if not epsilon:
        return result
    feasible = [c for c in result.candidates if c.feasible]
    if not feasible:
        return replace(result, noise=epsilon)
    fastest_s = min(c.iteration_s for c in feasible)
    close = tuple(sorted((c for c in feasible if c.iteration_s <= fastest_s * (1 + epsilon)),
                         key=lambda c: c.iteration_s))
    if len(close) < 2 or not any(c.plan == result.plan for c in close):
        return replace(result, noise=epsilon)
    chosen = min(close, key=robust_key)
    cluster = result.cluster if chosen.cluster is None else chosen.cluster
    return replace(result, plan=chosen.plan, cluster=cluster, within_noise=close, noise=epsilon)
