"""Planners: from a planning problem (model, cost model, batch, optimizer, constraints) to a Plan.

One contract (:mod:`pipetrain.planners.contract`), one scorer (:func:`~pipetrain.planners.score.score`)
and a registry by name (:mod:`pipetrain.planners.registry`). Partitioners (``partition/``) and
micro-batch planners (``microbatch/``) are the algorithms the registered planners use.
"""

from pipetrain.planners.contract import Candidate, Constraints, ModelRef, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.registry import (
    MICROBATCH_PLANNERS,
    PLANNERS,
    STAGE_PLANNERS,
    PlannerSpec,
    get_planner,
    run_planner,
)

__all__ = [
    "MICROBATCH_PLANNERS",
    "PLANNERS",
    "STAGE_PLANNERS",
    "Candidate",
    "Constraints",
    "ModelRef",
    "PlannerSpec",
    "PlanningProblem",
    "PlanningResult",
    "get_planner",
    "rank_key",
    "run_planner",
]
