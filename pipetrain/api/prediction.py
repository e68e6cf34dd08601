"""What a plan will do: its schedule and simulated timeline, under the cost model that prices it.

    schedule, predicted = api.predict(plan, profile, cluster)      # a local plan: graph= too
    cost = api.cost_of(plan, profile, cluster, graph)              # with local learning's heads
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipetrain.api.clusters import Profiles, each_profile
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AUX_WIDTH, check_aux, default_aux
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.methods import LocalParams, Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.profile.heads import head_profiles
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import validate_for_plan
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline

__all__ = ["cost_of", "local_cost", "predict", "single_process"]


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


def single_process(plan: Plan, profile: Profiles, cluster: Cluster) -> Timeline:
    """The simulated timeline of ``plan``'s model without a pipeline: every layer in one process on the
    cluster's first device, the whole batch as one micro-batch, at the plan's precision (local learning's
    heads left out: one process trains by plain backpropagation).

        alone = single_process(plan, profile, cluster).iteration_s    # against plan.prediction.iteration_s
    """
    layers = tuple(layer.name for layer in each_profile(profile)[0].layers)  # graph order, a DAG's too
    one = Plan(model=plan.model, model_fingerprint=plan.model_fingerprint, batch_size=plan.batch_size,
               method=Method.GPIPE, stages=(StagePlan(layers, (0,), (plan.batch_size,), (plan.batch_size,)),),
               precision=plan.precision, optimizer=plan.optimizer, clip_grad_norm=plan.clip_grad_norm)
    first = replace(cluster, devices=cluster.devices[:1], name=f"{cluster.name}[:1]")
    return simulate(build_schedule(one), one,
                    CostModel(profile, first, optimizer=one.optimizer, clip_grad_norm=one.clip_grad_norm))


def cost_of(plan: Plan, profile: Profiles, cluster: Cluster, graph: LayerGraph | None = None) -> CostModel:
    """The cost model that predicts ``plan``: pricing its optimizer's step and clipping
    (:attr:`~pipetrain.plan.plan.Plan.optimizer`, :attr:`~pipetrain.plan.plan.Plan.clip_grad_norm`), with
    its auxiliary heads for method local (:func:`local_cost`).

    Raises:
        UserError: a local plan without its ``graph``; a profile at another precision than the plan's
            (:meth:`~pipetrain.profile.table.Profile.check_precision`).
    """
    for p in each_profile(profile):
        p.check_precision(plan.precision)
    params = plan.params
    if not isinstance(params, LocalParams):
        return CostModel(profile, cluster, optimizer=plan.optimizer, clip_grad_norm=plan.clip_grad_norm)
    if graph is None:
        raise UserError("a local plan's prediction counts its auxiliary heads: pass graph= "
                        "(api.graph_for_plan(plan))")
    return local_cost(graph, profile, cluster, params.aux, after=[s.layers[-1] for s in plan.stages],
                      optimizer=plan.optimizer)


def local_cost(graph: LayerGraph, profile: Profiles, cluster: Cluster, aux: str | None = None,
               after: Sequence[str] | None = None, optimizer: OptimizerName = "sgd",
               width: int = AUX_WIDTH) -> CostModel:
    """``profile`` on ``cluster`` with the auxiliary heads ``aux`` (None: the model's default), ``width``
    wide, after every layer but the last (or those in ``after``), estimated or measured as the profile was
    (:func:`~pipetrain.profile.heads.head_profiles`): method local's cost model, stepping with
    ``optimizer`` (local learning clips no global norm)."""
    kind = check_aux(graph, aux if aux is not None else default_aux(graph))
    cost = CostModel(profile, cluster, optimizer=optimizer)
    heads = {id(p): head_profiles(graph, p, kind, after=after, width=width) for p in cost.profiles.values()}
    return cost.with_heads({k: heads[id(p)] for k, p in cost.profiles.items()})
