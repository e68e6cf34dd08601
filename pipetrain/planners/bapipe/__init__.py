"""BaPipe (docs/algorithms.md §4): explore method × stage count × micro-batches × device order × balanced
partition on (heterogeneous) clusters. :func:`explore` is the search; :func:`plan_bapipe` the
registry's planner."""

from pipetrain.planners.bapipe.candidates import BapipeCandidate, BapipeResult
from pipetrain.planners.bapipe.explore import BAPIPE_METHODS, CommModel, explore, plan_bapipe
from pipetrain.planners.device_orders import Placement

__all__ = ["BAPIPE_METHODS", "BapipeCandidate", "BapipeResult", "CommModel", "Placement", "explore", "plan_bapipe"]
