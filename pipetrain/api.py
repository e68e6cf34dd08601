"""The public workflow: model → profile → plan → simulate → train, as plain functions.

    >>> from pipetrain import api
    >>> graph = api.resolve_model("gpt-tiny")
    >>> profile = api.profile_model(graph, batch_size=32)
    >>> cluster = api.local_cluster(2)
    >>> plan, _ = api.plan_pipeline(graph, profile, cluster, batch_size=32)
    >>> uedp = api.plan_microbatches(plan, profile, cluster, planner="tidgap")  # optional: UMPIPE
    >>> result = api.plan(graph, profile, cluster, batch_size=32, planner="auto")  # any planner by name
    >>> schedule, predicted = api.predict(plan, profile, cluster)

Each step is also a ``pipetrain`` sub-command; the CLI is a thin layer over these functions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from torch import nn

from pipetrain.callables import is_callable_ref
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster, Link, device_model
from pipetrain.cluster_spec import ClusterSpec, load_cluster_spec
from pipetrain.cost import CostModel
from pipetrain.data import data_specs, resolve_loss
from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import check_aux, default_aux
from pipetrain.graph.capture import capture
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.load import default_loss_kind, leaf_classes, load_model
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.methods import DEFAULT_QUEUE_DEPTH, LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.plan.stage_graph import validate_for_graph
from pipetrain.planners import (
    MICROBATCH_PLANNERS,
    PLANNERS,
    STAGE_PLANNERS,
    Candidate,
    Constraints,
    ModelRef,
    PlanningProblem,
    PlanningResult,
    get_planner,
    run_planner,
)
from pipetrain.planners.balanced import BALANCED_METHODS
from pipetrain.planners.local import plan_local as plan_local_stages
from pipetrain.planners.microbatch import GA_PLANNERS, PLANNER_NAMES, GAConfig, PlannerName
from pipetrain.profile.heads import head_profiles
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import validate_for_plan
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline

__all__ = [
    "GA_PLANNERS",
    "MICROBATCH_PLANNERS",
    "PLANNABLE_METHODS",
    "PLANNERS",
    "PLANNER_NAMES",
    "STAGE_PLANNERS",
    "ClusterSpec",
    "Constraints",
    "GAConfig",
    "PlanningResult",
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
    "local_plan",
    "plan",
    "plan_local",
    "plan_microbatches",
    "plan_pipeline",
    "predict",
    "profile_model",
    "resolve_model",
]

log = logging.getLogger(__name__)

PLANNABLE_METHODS = BALANCED_METHODS
"""The methods :func:`plan_pipeline` searches; ``uedp`` is :func:`plan_microbatches` on top of one."""


def resolve_model(
    model: str | LayerGraph | nn.Module,
    *,
    data: str | None = None,
    loss: str | None = None,
    name: str | None = None,
    leaf_modules: Sequence[type[nn.Module] | str] = (),
) -> LayerGraph:
    """The LayerGraph of ``model``: as given, from the zoo, or the user's module captured with torch.fx.

    Args:
        model: a LayerGraph; a zoo name (the other arguments are then ignored); ``module.path:callable``
            returning an ``nn.Module``; or an ``nn.Module``. The last two are captured
            (:func:`~pipetrain.graph.capture.capture`) with the per-sample input and target specs
            of ``data``.
        data: what a user's module trains on: ``"digits"`` or ``"module.path:callable"``.
        loss: the training loss (:func:`~pipetrain.data.resolve_loss`): the graph's ``loss`` is its
            kind, or for a user's callable loss, which the runtime takes separately, the targets' default.
        name: the graph's name for an ``nn.Module`` (default: its class name); a reference is its
            graph's name, so that plans can rebuild it.
        leaf_modules: module classes (or ``module.path:Class``) to keep whole in one layer.

    Raises:
        UserError: an unknown name, no ``data`` (or ``synthetic``/``text``) for a user's module, a
            loss that does not fit the data, a module that cannot be captured.
    """
    if isinstance(model, LayerGraph):
        return model
    if isinstance(model, str) and not is_callable_ref(model):
        return load_model(model, input=None, target=None, loss=None)
    label = model if isinstance(model, str) else name or type(model).__name__
    if data is None:
        raise UserError(f"model {label!r} is your own module, whose input and target shapes come from the data; "
                        "pass data (--data) digits or module.path:callable")
    input, target = data_specs(data, label)
    kind = resolve_loss(loss, target).kind or default_loss_kind(target)
    if isinstance(model, str):
        return load_model(model, input=input, target=target, loss=kind, leaf_modules=leaf_modules)
    return capture(model, input=input, target=target, loss=kind, name=label, leaf_modules=leaf_classes(leaf_modules))


def graph_for_plan(
    plan: Plan,
    graph: LayerGraph | None = None,
    *,
    data: str | None = None,
    leaf_modules: Sequence[type[nn.Module] | str] = (),
) -> LayerGraph:
    """The model a plan was made for, checked against the plan (layers and fingerprint): ``graph``,
    else rebuilt from ``plan.model``, a zoo name or ``module.path:callable`` (captured with the
    specs of ``data`` and ``leaf_modules``, as :func:`resolve_model`)."""
    graph = graph or resolve_model(plan.model, data=data, leaf_modules=leaf_modules)
    validate_for_graph(plan, graph)
    return graph


def profile_model(
    graph: LayerGraph,
    batch_size: int,
    *,
    estimate: str | None = None,
    progress: bool = False,
    repeats: int = 5,
    loss: str | None = None,
) -> Profile:
    """Measure the model's per-layer costs here, or estimate them for a device model.

    Args:
        graph: the model.
        batch_size: the largest micro-batch size of the grid.
        estimate: a device model name (``"v100"``, ``"h100"``...) to estimate instead of measure.
        progress: show a progress bar while measuring.
        repeats: timed repeats per (layer, size); the median is kept.
        loss: the training loss timed on the last layer: ``"cross-entropy"``, ``"mse"``,
            ``"module.path:callable"``, or None for the model's own.
    """
    if estimate is not None:
        from pipetrain.profile.estimate import estimate_profile

        return estimate_profile(graph, estimate, batch_size)
    from pipetrain.data import resolve_loss
    from pipetrain.profile.measure import measure_profile

    loss_fn = None if loss is None else resolve_loss(loss, graph.target)
    return measure_profile(graph, batch_size, repeats=repeats, progress=progress, loss=loss_fn)


def local_cluster(n_ranks: int, path: str | Path | None = None) -> Cluster:
    """This machine with ``n_ranks`` ranks: from a `pipetrain probe` file if given, else defaults
    (loopback link, no contention, the measured CPU runtime cost per action)."""
    if path is not None:
        cluster = Cluster.load(path)
        return cluster if cluster.n_devices == n_ranks else cluster.with_ranks(n_ranks)
    return Cluster.local(n_ranks, action_overhead_s=CPU_ACTION_OVERHEAD_S)


# Links assumed for a cluster of estimated devices when none is given (--estimate without --cluster):
# (servers hold up to 8; intra-server link, inter-server link) per device model.
_ASSUMED_LINKS: dict[str, tuple[Link, Link, str]] = {
    "v100": (Link(10e-6, 45e9), Link(20e-6, 25e9 / 8), "NVLink 2 (45 GB/s) in a server, 25 Gb/s Ethernet across"),
    "a100": (Link(8e-6, 150e9), Link(10e-6, 200e9 / 8), "NVLink 3 (150 GB/s) in a server, 200 Gb/s across"),
    "h100": (Link(8e-6, 225e9), Link(10e-6, 400e9 / 8), "NVLink 4 (225 GB/s) in a server, 400 Gb/s across"),
    "fpga": (Link(10e-6, 12e9), Link(20e-6, 100e9 / 8), "PCIe 3 x16 (12 GB/s) in a server, 100 Gb/s across"),
}


def estimated_cluster(device: str, n_ranks: int) -> tuple[Cluster, str]:
    """``n_ranks`` devices of model ``device`` (8 per server) with assumed links, and a line saying
    what was assumed; ``"cpu"`` is this machine (:func:`local_cluster`).

    Raises:
        UserError: an unknown device model.
    """
    model = device_model(device).name
    if model == "cpu":
        return local_cluster(n_ranks), f"{n_ranks} local CPU ranks (loopback link)"
    intra, inter, described = _ASSUMED_LINKS[model]
    per_node = min(n_ranks, 8)
    n_nodes = -(-n_ranks // per_node)
    full = Cluster.homogeneous(model, n_nodes, per_node, intra, inter)
    cluster = dataclasses.replace(full, devices=full.devices[:n_ranks], name=f"{n_ranks}x{model}-assumed")
    return cluster, f"{n_ranks} × {model}, {per_node} per server, assumed links: {described}; pass --cluster for yours"


def load_cluster(path: str | Path, n_ranks: int | None = None) -> Cluster:
    """A cluster from a spec file (``.yaml``/``.yml``, :mod:`pipetrain.cluster_spec`) or a probe JSON.

    Args:
        n_ranks: for a probe JSON, that many copies of its device (as :func:`local_cluster`); for
            a spec, its first ``n_ranks`` ranks; None: every device the file lists.

    The spec's per-group profile files are not part of a Cluster: to use them, pass
    :func:`load_cluster_spec`'s result to :func:`cluster_profiles`.
    """
    return load_cluster_spec(path, n_ranks).cluster


def cluster_profiles(
    graph: LayerGraph, cluster: Cluster | ClusterSpec, batch_size: int, *, profile: Profile | None = None
) -> dict[str, Profile]:
    """One Profile per device kind of ``cluster``, for ``CostModel(profiles, cluster)`` (docs/algorithms.md §4.3).

    For each kind, the first of these that exists:

    1. the kind's measured profile file (a spec group's ``profile``);
    2. ``profile``, e.g. one measured on this machine; the kinds that take it must share one device
       model, since one profile cannot describe two;
    3. an estimate for the kind's device model (:func:`~pipetrain.profile.estimate.estimate_profile`
       up to ``batch_size``), made once per device model.

    Args:
        cluster: a :class:`ClusterSpec` (from :func:`load_cluster_spec`), or a Cluster, whose
            kinds are estimated for their device models (the kind up to ``#``).

    Raises:
        UserError: a profile (file or ``profile``) of another model than ``graph``; ``profile``
            for kinds of several device models; a kind whose device model is unknown.
    """
    spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.of(cluster)
    unmeasured = {kind: source.device_model for kind, source in spec.profiles.items() if source.path is None}
    if profile is not None:
        _check_profile_of(graph, profile, "the given profile")
        if len(set(unmeasured.values())) > 1:
            raise UserError(f"one profile cannot describe device kinds {sorted(unmeasured)} of different device "
                            "models; give each spec group a measured `profile:` file, or pass no profile to "
                            "estimate each model")
    by_model = {model: profile or profile_model(graph, batch_size, estimate=model)
                for model in set(unmeasured.values())}
    profiles: dict[str, Profile] = {}
    for kind, source in spec.profiles.items():
        if source.path is None:
            profiles[kind] = by_model[source.device_model]
        else:
            profiles[kind] = _check_profile_of(graph, Profile.load(source.path), str(source.path))
    return profiles


def _check_profile_of(graph: LayerGraph, profile: Profile, what: str) -> Profile:
    """``profile``, refused when its fingerprint says it was made for another model than ``graph``."""
    if profile.fingerprint and profile.fingerprint != graph.fingerprint():
        raise UserError(f"{what} is a profile of {profile.model!r} (fingerprint {profile.fingerprint}), not of this "
                        f"{graph.name!r} ({graph.fingerprint()}): another model or other sizes; profile this one "
                        f"with `pipetrain profile --model {graph.name}`")
    return profile


Profiles = Profile | Mapping[str, Profile]
"""One profile for every device, or one per device kind (:func:`cluster_profiles`)."""


def _each(profile: Profiles) -> list[Profile]:
    return [profile] if isinstance(profile, Profile) else list(profile.values())


def plan(
    graph: LayerGraph,
    profile: Profiles,
    cluster: Cluster,
    *,
    batch_size: int,
    planner: str = "balanced",
    optimizer: OptimizerName = "sgd",
    constraints: Constraints | None = None,
    progress: bool = False,
) -> PlanningResult:
    """Plan with any registered planner (:data:`~pipetrain.planners.registry.PLANNERS`).

    Args:
        graph: the model.
        profile: one profile, or one per device kind (:func:`cluster_profiles`).
        cluster: the devices and links.
        batch_size: samples per mini-batch.
        planner: ``balanced`` (default), ``pipedream``, ``bapipe``, ``auto``, ``2bw``, or a micro-batch planner
            (``equal``, ``greedy``, ``dp``, ``dgap``, ``tidgap``, ``single``, ``1f1b-ga``, ``zb1-ga``,
            ``interleaved-ga``).
        optimizer: whose state counts against device memory (``sgd``, ``sgd-momentum``, ``adam``, ``adamw``).
        constraints: what to fix (method, stages, micro-batches, base plan, seed, GA budget); a
            planner refuses the ones it does not use.
        progress: show progress on stderr.

    Returns:
        ``result.plan``, ``result.cluster`` (the cluster the plan's ranks index, a sub-cluster when
        it leaves devices idle), ``result.candidates`` (what was scored, fastest first) and
        ``result.report`` (the planner's own account).
    """
    spec = get_planner(planner)
    constraints = constraints or Constraints()
    spec.check(constraints)
    check_stage_count(graph, constraints.n_stages or min(cluster.n_devices, len(graph)))
    for p in _each(profile):
        _check_profile_of(graph, p, "the profile")
    problem = PlanningProblem(ModelRef.of(graph), CostModel(profile, cluster), batch_size, optimizer, constraints,
                              progress)
    return spec.run(problem)


def plan_pipeline(
    graph: LayerGraph,
    profile: Profiles,
    cluster: Cluster,
    *,
    batch_size: int,
    method: Method | None = None,
    n_stages: int | None = None,
    n_micro: int | None = None,
) -> tuple[Plan, list[Candidate]]:
    """The ``balanced`` planner's fastest plan by simulation, with every candidate (fastest first).

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
    result = plan(graph, profile, cluster, batch_size=batch_size,
                  constraints=Constraints(method=method, n_stages=stages, n_micro=n_micro))
    return result.plan, list(result.candidates)


def plan_microbatches(
    base: Plan,
    profile: Profiles,
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
        base: a chain plan with one rank per stage (method ``interleaved`` for ``interleaved-ga``).
        planner: ``"equal"``, ``"greedy"``, ``"dp"``, ``"dgap"``, ``"tidgap"``, ``"single"``, ``"1f1b-ga"``
            (unequal micro-batches under the 1F1B order; method ``1f1b``), ``"zb1-ga"`` (under the ZB-H1
            order, Qi et al. 2024; method ``zb1``) or ``"interleaved-ga"`` (per virtual stage of an
            interleaved base) (:mod:`pipetrain.planners.microbatch`).
        seed: GA seed; the same arguments give the same plan.
        ga: GA hyperparameters (:class:`GAConfig`: population, generations...); GA planners only.
        memory_cap: keep every stage within its device's memory (docs/algorithms.md §2.6): micro-batches
            no larger than :func:`~pipetrain.planners.microbatch.microbatch_caps`, and when some stage
            cannot hold all ``B`` samples' activations, the plan's ``recompute`` flag on.
        progress: show a progress bar over the GA's generations on stderr.

    Raises:
        UserError: an unknown planner, a cluster with too few devices, a profile of another model,
            or (``memory_cap``) a stage that does not fit even with one-sample micro-batches.
    """
    if planner not in PLANNER_NAMES:
        raise UserError(f"unknown micro-batch planner {planner!r}; choose one of {', '.join(PLANNER_NAMES)}")
    is_ga = planner in GA_PLANNERS  # the others take no seed or budget: ignored, as documented
    constraints = Constraints(base=base, memory_cap=memory_cap, seed=seed if is_ga else 0, ga=ga if is_ga else None)
    problem = PlanningProblem(ModelRef.of_plan(base), CostModel(profile, cluster), base.batch_size,
                              constraints=constraints, progress=progress)
    return run_planner(planner, problem).plan


def check_stage_count(graph: LayerGraph, n_stages: int) -> None:
    """Fail fast, before any profiling, when the model cannot be cut into ``n_stages``."""
    if n_stages > len(graph):
        raise UserError(
            f"{n_stages} stages but {graph.name!r} has only {len(graph)} layers; use at most {len(graph)} ranks"
        )


def predict(
    plan: Plan, profile: Profiles, cluster: Cluster, *, schedule: Schedule | None = None,
    graph: LayerGraph | None = None,
) -> tuple[Schedule, Timeline]:
    """The schedule (``schedule``, validated against the plan, or the plan's own) and its simulated
    timeline: pass the same schedule to ``train(..., schedule=)`` to run exactly what was predicted.
    A local plan needs its ``graph``, to cost its auxiliary heads (:func:`local_cost`)."""
    if plan.n_ranks > cluster.n_devices:
        raise UserError(f"the plan uses {plan.n_ranks} ranks but the cluster has {cluster.n_devices} devices; "
                        f"use a cluster with {plan.n_ranks} (local_cluster({plan.n_ranks}))")
    if schedule is None:
        schedule = build_schedule(plan)
    else:
        validate_for_plan(schedule, plan)
    return schedule, simulate(schedule, plan, cost_of(plan, profile, cluster, graph))


def cost_of(plan: Plan, profile: Profiles, cluster: Cluster, graph: LayerGraph | None = None) -> CostModel:
    """The cost model that predicts ``plan``: with its auxiliary heads for method local (:func:`local_cost`).

    Raises:
        UserError: a local plan without its ``graph``.
    """
    params = plan.params
    if not isinstance(params, LocalParams):
        return CostModel(profile, cluster)
    if graph is None:
        raise UserError("a local plan's prediction counts its auxiliary heads: pass graph= "
                        "(api.graph_for_plan(plan))")
    return local_cost(graph, profile, cluster, params.aux, after=[s.layers[-1] for s in plan.stages])


def local_cost(graph: LayerGraph, profile: Profiles, cluster: Cluster, aux: str | None = None,
               after: Sequence[str] | None = None) -> CostModel:
    """``profile`` on ``cluster`` with the auxiliary heads ``aux`` (None: the model's default) after
    every layer but the last (or those in ``after``), estimated or measured as the profile was
    (:func:`~pipetrain.profile.heads.head_profiles`): method local's cost model."""
    kind = check_aux(graph, aux if aux is not None else default_aux(graph))
    cost = CostModel(profile, cluster)
    heads = {id(p): head_profiles(graph, p, kind, after=after) for p in cost.profiles.values()}
    return cost.with_heads({k: heads[id(p)] for k, p in cost.profiles.items()})


def plan_local(graph: LayerGraph, profile: Profiles, cluster: Cluster, *, batch_size: int, aux: str | None = None,
               queue_depth: int = DEFAULT_QUEUE_DEPTH, n_stages: int | None = None,
               n_micro: int | None = None) -> PlanningResult:
    """The fastest local-learning plan (method ``local``, PPLL), its stages balanced with their
    auxiliary heads' time (:func:`~pipetrain.planners.local.plan_local`), with every candidate.

    Raises:
        UserError: as :func:`local_plan`, or more stages than devices or layers.
    """
    check_stage_count(graph, n_stages or min(cluster.n_devices, len(graph)))
    for p in _each(profile):
        _check_profile_of(graph, p, "the profile")
    cost = local_cost(graph, profile, cluster, aux)
    kind = check_aux(graph, aux if aux is not None else default_aux(graph))
    problem = PlanningProblem(ModelRef.of(graph), cost, batch_size, constraints=Constraints(n_stages=n_stages,
                                                                                           n_micro=n_micro))
    return plan_local_stages(problem, kind, queue_depth)


def local_plan(plan: Plan, graph: LayerGraph, *, aux: str | None = None,
               queue_depth: int = DEFAULT_QUEUE_DEPTH) -> Plan:
    """``plan``'s stages and micro-batches trained by local learning (method ``local``, PPLL,
    docs/algorithms.md §6): every stage but the last through an auxiliary head ``aux`` (None: the
    model's default, :func:`~pipetrain.graph.aux_heads.default_aux`), queues of ``queue_depth``.

    Raises:
        UserError: a model without one class per sample, an unknown head, a depth below 1, or stages
            with different forward and backward micro-batches.
    """
    kind = check_aux(graph, aux if aux is not None else default_aux(graph))
    local = replace(plan, method=Method.LOCAL, weights=WeightPolicy.LOCAL, params=LocalParams(kind, queue_depth),
                    prediction=None)
    local.validate()
    build_schedule(local)
    return local
