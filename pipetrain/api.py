"""The public workflow: model → profile → plan → simulate → train, as plain functions.

    >>> from pipetrain import api
    >>> graph = api.resolve_model("gpt-tiny")
    >>> profile = api.profile_model(graph, batch_size=32)
    >>> cluster = api.local_cluster(2)
    >>> plan, _ = api.plan_pipeline(graph, profile, cluster, batch_size=32)
    >>> uedp = api.plan_microbatches(plan, profile, cluster, planner="tidgap")  # optional: UMPIPE
    >>> schedule, predicted = api.predict(plan, profile, cluster)

Each step is also a ``pipetrain`` sub-command; the CLI is a thin layer over these functions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.microbatch import (
    GA_PLANNERS,
    PLANNER_NAMES,
    GAConfig,
    PlannerName,
    fits_without_recompute,
    microbatch_caps,
    plan_uedp,
)
from pipetrain.plan.microbatch.ga import OnGeneration
from pipetrain.plan.plan import Method, Plan
from pipetrain.plan.planner import Candidate, plan_equal, rank_key
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline

__all__ = [
    "GA_PLANNERS",
    "PLANNABLE_METHODS",
    "PLANNER_NAMES",
    "GAConfig",
    "check_stage_count",
    "graph_for_plan",
    "local_cluster",
    "plan_microbatches",
    "plan_pipeline",
    "predict",
    "profile_model",
    "resolve_model",
]

log = logging.getLogger(__name__)

PLANNABLE_METHODS = (Method.GPIPE, Method.ONE_F_ONE_B)
"""The methods :func:`plan_pipeline` searches; ``uedp`` is :func:`plan_microbatches` on top of one."""


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

    Raises:
        UserError: ``method`` is ``uedp``: plan with this function, then :func:`plan_microbatches`.
    """
    if method is Method.UEDP:
        raise UserError("method uedp plans micro-batches on an equal plan's stages: call plan_pipeline without "
                        "a method, then plan_microbatches(plan, profile, cluster, planner=...)")
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


def plan_microbatches(
    base: Plan,
    profile: Profile,
    cluster: Cluster,
    *,
    planner: PlannerName = "tidgap",
    seed: int = 0,
    ga: GAConfig | None = None,
    memory_cap: bool = True,
    progress: bool = False,
) -> Plan:
    """UMPIPE's unequal micro-batches (method ``uedp``) on a base plan's stages, simulated.

    The stages (layers, ranks) and batch come from ``base``, e.g. the plan :func:`plan_pipeline`
    returns; each stage gets its own forward and backward micro-batch sizes from ``planner``.
    Compare ``result.prediction.iteration_s`` with ``base.prediction.iteration_s`` for the speedup.

    Args:
        base: a chain plan with one rank per stage.
        planner: ``"equal"``, ``"greedy"``, ``"dp"``, ``"dgap"``, ``"tidgap"``, ``"single"`` or
            ``"1f1b-ga"`` (unequal micro-batches under the 1F1B order; the plan's method is ``1f1b``)
            (:mod:`pipetrain.plan.microbatch`).
        seed: GA seed; the same arguments give the same plan.
        ga: GA hyperparameters (:class:`GAConfig`: population, generations...); GA planners only.
        memory_cap: keep every stage within its device's memory (PAPERS.md §1.12): micro-batches
            no larger than :func:`~pipetrain.plan.microbatch.microbatch_caps`, and when some stage
            cannot hold all ``B`` samples' activations, the plan's ``recompute`` flag on.
        progress: show a progress bar over the GA's generations on stderr.

    Raises:
        UserError: an unknown planner, a cluster with too few devices, a profile of another model,
            or (``memory_cap``) a stage that does not fit even with one-sample micro-batches.
    """
    if planner not in PLANNER_NAMES:
        raise UserError(f"unknown micro-batch planner {planner!r}; choose one of {', '.join(PLANNER_NAMES)}")
    if base.n_ranks > cluster.n_devices:
        raise UserError(f"the plan uses {base.n_ranks} ranks but the cluster has {cluster.n_devices}; "
                        f"pass --ranks {base.n_ranks}")
    if profile.fingerprint and base.model_fingerprint and profile.fingerprint != base.model_fingerprint:
        raise UserError(f"the profile is of another model ({profile.model}); re-profile {base.model!r}")
    cost = CostModel(profile, cluster)
    caps = None
    if memory_cap:
        caps = microbatch_caps(base, cost)
        if not base.recompute and not all(fits_without_recompute(base, cost)):
            log.info("some stage cannot hold all %d samples' activations: planning with recompute", base.batch_size)
            base = replace(base, recompute=True)
    generations = (ga or GAConfig()).generations
    with _generation_bar(planner, generations, progress and planner in GA_PLANNERS) as on_generation:
        return plan_uedp(base, cost, planner=planner, seed=seed, config=ga, caps=caps, on_generation=on_generation)


@contextmanager
def _generation_bar(planner: str, generations: int, enabled: bool) -> Iterator[OnGeneration | None]:
    """A rich bar on stderr over GA generations with the best iteration time so far; None when disabled."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("generations  best {task.fields[best]} ms"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(planner, total=generations, best="-")

        def on_generation(generation: int, best_s: float) -> None:
            bar.update(task, completed=generation, best=f"{best_s * 1e3:.4g}")

        yield on_generation


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
