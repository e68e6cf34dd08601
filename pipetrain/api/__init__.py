"""The public workflow: model → profile → plan → simulate → train, as plain functions.

    >>> from pipetrain import api
    >>> graph = api.resolve_model("gpt-tiny")
    >>> profile = api.profile_model(graph, batch_size=32)
    >>> cluster = api.local_cluster(2)
    >>> plan = api.plan(graph, profile, cluster, batch_size=32).plan                # balanced
    >>> uedp = api.plan(graph, profile, cluster, planner="tidgap",
    ...                 constraints=api.Constraints(base=plan)).plan               # optional: UMPIPE
    >>> result = api.plan(graph, profile, cluster, batch_size=32, planner="auto")  # any planner by name
    >>> schedule, predicted = api.predict(plan, profile, cluster)

One module per concept: :mod:`~pipetrain.api.models` (the model and its profile),
:mod:`~pipetrain.api.clusters` (devices, links, per-kind profiles), :mod:`~pipetrain.api.planning`
(:func:`plan`, every planner behind one call) and :mod:`~pipetrain.api.prediction` (schedule,
timeline, cost model). Each step is also a ``pipetrain`` sub-command; the CLI is a thin layer over
these functions.
"""

from pipetrain.api.clusters import (
    Profiles,
    check_profile_of,
    cluster_profiles,
    estimated_cluster,
    load_cluster,
    local_cluster,
)
from pipetrain.api.models import check_stage_count, graph_for_plan, profile_model, resolve_model
from pipetrain.api.planning import local_params, plan
from pipetrain.api.prediction import cost_of, local_cost, predict, single_process
from pipetrain.cluster_spec import ClusterSpec, load_cluster_spec
from pipetrain.plan.methods import LocalParams, Method
from pipetrain.planners import (
    MICROBATCH_PLANNERS,
    PLANNERS,
    STAGE_PLANNERS,
    Constraints,
    ModelRef,
    PlanningResult,
    get_planner,
)
from pipetrain.planners.microbatch import GA_PLANNERS, PLANNER_NAMES, GAConfig

__all__ = [
    "GA_PLANNERS",
    "MICROBATCH_PLANNERS",
    "PLANNERS",
    "PLANNER_NAMES",
    "STAGE_PLANNERS",
    "ClusterSpec",
    "Constraints",
    "GAConfig",
    "LocalParams",
    "Method",
    "ModelRef",
    "PlanningResult",
    "Profiles",
    "check_profile_of",
    "check_stage_count",
    "cluster_profiles",
    "cost_of",
    "estimated_cluster",
    "get_planner",
    "graph_for_plan",
    "load_cluster",
    "load_cluster_spec",
    "local_cluster",
    "local_cost",
    "local_params",
    "plan",
    "predict",
    "profile_model",
    "resolve_model",
    "single_process",
]
