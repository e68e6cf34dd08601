"""Planners: from a planning problem (model, cost model, batch, optimizer, constraints) to a Plan.

One contract (:mod:`pipetrain.planners.contract`), one scorer (:func:`~pipetrain.planners.score.score`)
and a registry by name (:mod:`pipetrain.planners.registry`) of one record per planner
(:class:`~pipetrain.planners.spec.PlannerSpec`: the methods it plans, how ``auto`` runs it, how its
result is shown). Partitioners (``partition/``) and micro-batch planners (``microbatch/``) are the
algorithms the registered planners use.
"""

from pipetrain.planners.contract import Candidate, Constraints, ModelRef, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.registry import (
    BASE_PLANNER,
    DEFAULT_PLANNER,
    DEFAULT_TIME_BUDGET_S,
    MICROBATCH_PLANNERS,
    PLANNERS,
    STAGE_PLANNERS,
    PlannerSpec,
    constraints_for,
    default_planner,
    get_planner,
    planner_for,
    run_planner,
)

__all__ = [
    "BASE_PLANNER",
    "DEFAULT_PLANNER",
    "DEFAULT_TIME_BUDGET_S",
    "MICROBATCH_PLANNERS",
    "PLANNERS",
    "STAGE_PLANNERS",
    "Candidate",
    "Constraints",
    "ModelRef",
    "PlannerSpec",
    "PlanningProblem",
    "PlanningResult",
    "constraints_for",
    "default_planner",
    "get_planner",
    "planner_for",
    "rank_key",
    "run_planner",
]
