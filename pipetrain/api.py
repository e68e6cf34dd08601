"""The public workflow: model → profile → plan → simulate → train, as plain functions.

    >>> from pipetrain import api
    >>> graph = api.resolve_model("gpt-tiny")
    >>> profile = api.profile_model(graph, batch_size=32)
    >>> cluster = api.local_cluster(2)
    >>> plan, _ = api.plan_pipeline(graph, profile, cluster, batch_size=32)
    >>> schedule, predicted = api.predict(plan, profile, cluster)

Each step is also a ``pipetrain`` sub-command; the CLI is a thin layer over these functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Method, Plan
from pipetrain.plan.planner import Candidate, plan_equal, rank_key
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline

__all__ = [
    "PLANNABLE_METHODS",
    "check_stage_count",
    "graph_for_plan",
    "local_cluster",
    "plan_pipeline",
    "predict",
    "profile_model",
    "resolve_model",
]

PLANNABLE_METHODS = (Method.GPIPE, Method.ONE_F_ONE_B)


def resolve_model(model: str | LayerGraph, **overrides: Any) -> LayerGraph:
    """A LayerGraph from a zoo name (with size overrides) or as given."""
    if isinstance(model, LayerGraph):
        return model
    return build_model(model, **overrides)


def graph_for_plan(plan: Plan, graph: LayerGraph | None = None) -> LayerGraph:
    """The model a plan was made for, checked against the plan (layers and fingerprint)."""
    graph = graph or resolve_model(plan.model)
    plan.validate(graph.names, graph.fingerprint())
    return graph


def profile_model(
    graph: LayerGraph,
    batch_size: int,
    *,
    estimate: str | None = None,
    progress: bool = False,
    repeats: int = 5,
) -> Profile:
    """Measure the model's per-layer costs here, or estimate them for a device model.

    Args:
        graph: the model.
        batch_size: the largest micro-batch size of the grid.
        estimate: a device model name (``"v100"``, ``"h100"``...) to estimate instead of measure.
        progress: show a progress bar while measuring.
        repeats: timed repeats per (layer, size); the median is kept.
    """
    if estimate is not None:
        from pipetrain.profile.estimate import estimate_profile

        return estimate_profile(graph, estimate, batch_size)
    from pipetrain.profile.measure import measure_profile

    return measure_profile(graph, batch_size, repeats=repeats, progress=progress)


def local_cluster(n_ranks: int, path: str | Path | None = None) -> Cluster:
    """This machine with ``n_ranks`` ranks: from a `pipetrain probe` file if given, else defaults
    (loopback link, no contention, the measured CPU runtime cost per action)."""
    if path is not None:
        return Cluster.load(path).with_ranks(n_ranks)
    return Cluster.local(n_ranks, action_overhead_s=CPU_ACTION_OVERHEAD_S)


def plan_pipeline(
    graph: LayerGraph,
    profile: Profile,
    cluster: Cluster,
    *,
    batch_size: int,
    method: Method | None = None,
    n_stages: int | None = None,
    n_micro: int | None = None,
) -> tuple[Plan, list[Candidate]]:
    """The fastest plan by simulation, with every candidate considered (fastest first).

    Args:
        method: ``None`` tries every plannable method (GPipe and 1F1B) and keeps the fastest.
        n_stages: defaults to one stage per device of the cluster.
        n_micro: fix the micro-batch count instead of searching it.
    """
    stages = n_stages or cluster.n_devices
    check_stage_count(graph, stages)
    if profile.fingerprint and profile.fingerprint != graph.fingerprint():
        raise UserError(f"the profile is of another model ({profile.model}); re-profile {graph.name!r}")
    methods = [method] if method is not None else list(PLANNABLE_METHODS)
    cost = CostModel(profile, cluster)
    candidates: list[Candidate] = []
    for m in methods:
        candidates += plan_equal(
            model=graph.name, fingerprint=graph.fingerprint(), layer_names=graph.names, cost=cost,
            method=m, n_stages=stages, batch_size=batch_size, n_micro=n_micro,
        )[1]
    candidates.sort(key=rank_key)
    return candidates[0].plan, candidates


def check_stage_count(graph: LayerGraph, n_stages: int) -> None:
    """Fail fast, before any profiling, when the model cannot be cut into ``n_stages``."""
    if n_stages > len(graph):
        raise UserError(
            f"{n_stages} stages but {graph.name!r} has only {len(graph)} layers; use at most {len(graph)} ranks"
        )


def predict(plan: Plan, profile: Profile, cluster: Cluster) -> tuple[Schedule, Timeline]:
    """The plan's schedule and its simulated timeline."""
    if plan.n_ranks > cluster.n_devices:
        raise UserError(
            f"the plan uses {plan.n_ranks} ranks but the cluster has {cluster.n_devices}; "
            f"pass --ranks {plan.n_ranks}"
        )
    schedule = build_schedule(plan)
    return schedule, simulate(schedule, plan, CostModel(profile, cluster))
