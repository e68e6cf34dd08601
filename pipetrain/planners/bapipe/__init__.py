"""BaPipe (docs/algorithms.md §4): explore method × stage count × micro-batches × device order × balanced
partition on (heterogeneous) clusters. :func:`explore` is the search; :func:`plan_bapipe` the
registry's planner."""

from pipetrain.planners.bapipe.candidates import BapipeCandidate, BapipeResult
from pipetrain.planners.bapipe.explore import CommModel, bapipe_layout, bapipe_plans, explore, plan_bapipe
from pipetrain.planners.device_orders import Placement

__all__ = ["BapipeCandidate", "BapipeResult", "CommModel", "Placement", "bapipe_layout", "bapipe_plans", "explore",
           "plan_bapipe"]
