"""Planning: one entry point for every planner and method (:data:`~pipetrain.planners.registry.PLANNERS`).

    result = api.plan(graph, profile, cluster, batch_size=32)                       # balanced
    result = api.plan(graph, profile, cluster, batch_size=32, planner="auto")       # every planner
    result = api.plan(graph, profile, cluster, batch_size=32, planner="auto",
                      constraints=Constraints(time_budget_s=60))                    # `pipetrain plan`'s default
    result = api.plan(graph, profile, cluster, batch_size=32,
                      constraints=Constraints(method=Method.ZBV))                   # its planner: interleaved
    unequal = api.plan(graph, profile, cluster, planner="tidgap",
                       constraints=Constraints(base=result.plan, seed=0))           # UMPIPE on a plan's stages
    local = api.plan(graph, profile, cluster, batch_size=32, planner="local",
                     constraints=Constraints(params=LocalParams("dgl", queue_depth=2)))  # PPLL, heads costed
    result.plan, result.cluster, result.candidates, result.report
    result.within_noise, result.noise       # candidates as fast as the plan within the profile's noise

A plan run by another method with the same stages and micro-batches is no planning:
``plan.run_by(Method.PIPEDREAM)``, or with :func:`local_params` for local learning's heads.
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.api.clusters import Profiles, check_profile_of, each_profile
from pipetrain.api.models import check_stage_count
from pipetrain.api.prediction import local_cost
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import check_aux, default_aux
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OptimizerName, check_optimizer
from pipetrain.plan.methods import DEFAULT_QUEUE_DEPTH, LocalParams
from pipetrain.planners import (
    MICROBATCH_PLANNERS,
    PLANNERS,
    Constraints,
    ModelRef,
    PlannerSpec,
    PlanningProblem,
    PlanningResult,
    constraints_for,
    default_planner,
    get_planner,
    planner_for,
)
from pipetrain.planners.noise import within_noise
from pipetrain.profile.precision import Precision, parse_precision

__all__ = ["local_params", "plan"]


def plan(
    model: LayerGraph | ModelRef,
    profile: Profiles,
    cluster: Cluster,
    *,
    batch_size: int | None = None,
    planner: str | None = None,
    optimizer: OptimizerName = "sgd",
    constraints: Constraints | None = None,
    progress: bool = False,
    precision: Precision = "fp32",
    clip_grad_norm: bool = False,
) -> PlanningResult:
    """Plan with any registered planner (:data:`~pipetrain.planners.registry.PLANNERS`).

    Args:
        model: the model: its LayerGraph, or a :class:`~pipetrain.planners.contract.ModelRef` (layer
            names only: ``ModelRef.of_plan(base)`` for a micro-batch planner on a base plan).
        profile: one profile, or one per device kind (:func:`~pipetrain.api.clusters.cluster_profiles`).
        cluster: the devices and links.
        batch_size: samples per mini-batch; default the base plan's (``constraints.base``).
        planner: a registry name: a stage planner (``balanced``, ``pipedream``, ``bapipe``, ``graphpipe``,
            ``interleaved``, ``auto``, ``2bw``, ``local``) or a micro-batch planner (``equal``, ``greedy``,
            ``dp``, ``dgap``, ``tidgap``, ``single``, ``1f1b-ga``, ``zb1-ga``, ``interleaved-ga``); None:
            the planner of ``constraints.method``
            (:func:`~pipetrain.planners.registry.planner_for`), the default micro-batch planner
            (``tidgap``) on a given base plan, else ``balanced`` (milliseconds; ``pipetrain plan``'s
            default is ``auto`` with ``Constraints(time_budget_s=60)``, :mod:`pipetrain.cli.planning`).
        optimizer: the optimizer training will run (``sgd``, ``sgd-momentum``, ``adam``, ``adamw``): its
            state counts against device memory and its step is priced (:mod:`pipetrain.profile.optimizer_step`);
            the plan records it (:attr:`~pipetrain.plan.plan.Plan.optimizer`).
        constraints: what to fix (method, stages, micro-batches, base plan, seed, GA budget, the method's
            params: local learning's heads and queue depth); a planner refuses the ones it does not use.
        progress: show progress on stderr.
        precision: ``fp32``, ``bf16`` or ``fp16``, the plan's :attr:`~pipetrain.plan.plan.Plan.precision`:
            the runtime trains it so (:mod:`pipetrain.runtime.interp.precision`).
        clip_grad_norm: whether training will clip the gradient norm (``--clip-grad-norm``): each STEP
            is priced with the norm and its all-reduce over the ranks, and the plan records it.

    Returns:
        ``result.plan``, ``result.cluster`` (the cluster the plan's ranks index, a sub-cluster when
        it leaves devices idle), ``result.candidates`` (what was scored, fastest first) and
        ``result.report`` (the planner's own account). When the profile measured its noise (its
        relative spread ε, :class:`~pipetrain.profile.noise.ProfileNoise`) and several feasible
        candidates are predicted within ε of the fastest, ``result.within_noise`` lists them and
        ``result.plan`` is the most robust of them, by their structure, not their times
        (:func:`~pipetrain.planners.noise.within_noise`), so repeated profiles agree on it.

    Raises:
        UserError: an unknown planner, constraints it does not take, a model with fewer layers than
            stages, a profile of another model, local learning on a model it cannot train or with
            clipping, or what the planner itself refuses.
    """
    constraints = constraints or Constraints()
    spec = _planner(planner, constraints)
    constraints = _with_heads(spec, constraints_for(spec, constraints), model)
    spec.check(constraints)
    ref = model if isinstance(model, ModelRef) else ModelRef.of(model)
    check_stage_count(model, constraints.n_stages or min(cluster.n_devices, len(ref.layer_names)))
    for p in each_profile(profile):
        check_profile_of(model, p, "the profile")
    params = constraints.params
    optimizer = check_optimizer(optimizer)
    if clip_grad_norm and isinstance(params, LocalParams):
        raise UserError("--clip-grad-norm clips the whole model's gradient, which local learning never forms; "
                        "drop it to plan method local")
    if isinstance(params, LocalParams) and isinstance(model, LayerGraph):
        cost = local_cost(model, profile, cluster, params.aux, optimizer=optimizer)
    else:
        cost = CostModel(profile, cluster, optimizer=optimizer, clip_grad_norm=clip_grad_norm)
    problem = PlanningProblem(ref, cost, _batch_size(batch_size, constraints), optimizer, constraints, progress)
    result = within_noise(spec.run(problem), _noise(profile))
    return replace(result, plan=replace(result.plan, precision=parse_precision(precision), optimizer=optimizer,
                                        clip_grad_norm=clip_grad_norm))


def _noise(profile: Profiles) -> float | None:
    """The largest relative spread of the profiles' timings (None: none was measured)."""
    spreads = [p.noise.spread for p in each_profile(profile) if p.noise is not None]
    return max(spreads, default=None)


def _planner(name: str | None, constraints: Constraints) -> PlannerSpec:
    """The planner named, else the one of the constraints' method or base plan (:func:`plan`)."""
    if name is not None:
        if name not in PLANNERS and constraints.base is not None:
            raise UserError(f"unknown micro-batch planner {name!r} for the base plan; choose one of "
                            f"{', '.join(MICROBATCH_PLANNERS)}")
        return get_planner(name)
    if constraints.base is not None and constraints.method is None:
        return default_planner("microbatch")
    return planner_for(constraints.method)


def _batch_size(batch_size: int | None, constraints: Constraints) -> int:
    if batch_size is not None:
        return batch_size
    if constraints.base is None:
        raise UserError("plan needs batch_size (samples per mini-batch), or a base plan whose batch to keep")
    return constraints.base.batch_size


def _with_heads(spec: PlannerSpec, constraints: Constraints, model: LayerGraph | ModelRef) -> Constraints:
    """For a planner of local learning (its methods take :class:`LocalParams`): ``constraints`` with
    heads the model can train, ``constraints.params``' or the model's default ones (:func:`local_params`).

    Raises:
        UserError: a model known only by its layer names (the heads are costed on the model), or one
            that cannot train with local heads.
    """
    if spec.method_params() is not LocalParams:
        return constraints
    params = constraints.params
    if params is not None and not isinstance(params, LocalParams):
        return constraints  # the planner names what it takes
    if not isinstance(model, LayerGraph):
        raise UserError("local learning costs its auxiliary heads on the model: pass its LayerGraph, not a ModelRef")
    heads = local_params(model, None if params is None else params.aux,
                         DEFAULT_QUEUE_DEPTH if params is None else params.queue_depth)
    return replace(constraints, params=heads)


def local_params(graph: LayerGraph, aux: str | None = None, queue_depth: int = DEFAULT_QUEUE_DEPTH) -> LocalParams:
    """Local learning's parameters for ``graph`` (PPLL, docs/algorithms.md §6): auxiliary heads ``aux``
    (None: the model's default, :func:`~pipetrain.graph.aux_heads.default_aux`) and queues of
    ``queue_depth`` messages; for ``plan(..., constraints=Constraints(params=...))`` and
    ``plan.run_by(Method.LOCAL, params=...)``.

    Raises:
        UserError: a model output no head predicts, an unknown head, a depth below 1.
    """
    params = LocalParams(check_aux(graph, aux if aux is not None else default_aux(graph)), queue_depth)
    params.check("local")
    return params
