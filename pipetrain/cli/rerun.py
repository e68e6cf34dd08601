"""``simulate|train --method M``: a saved plan's stages and micro-batches run by another method.

    plan = rerun(rechunked(plan, args, graph), args, graph)

Which methods a plan can be re-run by is read from their traits (:func:`rerun_methods`): a
synchronous chain method (another order of the same stages: ``1f1b``, ``zb1``, ``interleaved``...),
an asynchronous one (``pipedream``, ``2bw``: no flush, weight versions) or local learning (its
parameters: the auxiliary heads and the queue depth). A multi-stage method may first re-cut the
plan's layers into chunks (:func:`rechunked`).
"""

from __future__ import annotations

import argparse
import dataclasses

from pipetrain import api
from pipetrain.cli.common import cluster_and_profiles
from pipetrain.cli.routing import check_local_flags, check_vertical_sync, listed
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import DEFAULT_QUEUE_DEPTH, METHODS, LocalParams, Method, MethodSpec
from pipetrain.plan.placement import Placement
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan, v_placed

__all__ = ["check_rerun_flags", "rechunked", "rerun", "rerun_methods"]


def _reruns(spec: MethodSpec) -> bool:
    return spec.synchronous_chain or not spec.flush or spec.params is LocalParams


def rerun_methods() -> tuple[Method, ...]:
    """The methods a saved plan's stages can be run by: synchronous chain methods, asynchronous ones
    and local learning."""
    return tuple(m for m, spec in METHODS.items() if _reruns(spec))


def rerun(plan: Plan, args: argparse.Namespace, graph: LayerGraph) -> Plan:
    """``plan`` run by ``--method`` when given (with ``--vertical-sync``; local learning with ``--aux``
    and ``--queue-depth``, default the plan's own or the model's); a local plan with new heads or depth
    when those are given; else as it is."""
    method = None if args.method is None else Method(args.method)
    target = method or plan.method
    local = METHODS[target].params is LocalParams
    check_rerun_flags(args, plan.method)
    if local and (method is not None or args.aux is not None or args.queue_depth is not None):
        own = plan.params if isinstance(plan.params, LocalParams) else None
        heads = api.local_params(graph, args.aux or (own.aux if own else None),
                                 args.queue_depth or (own.queue_depth if own else DEFAULT_QUEUE_DEPTH))
        return plan.run_by(target, params=heads)
    if method is None or (method is plan.method and not args.vertical_sync):
        return plan  # as planned (e.g. --planner pipedream|2bw for its method): keep the prediction
    return plan.run_by(method, args.vertical_sync)


def check_rerun_flags(args: argparse.Namespace, planned: Method | None) -> None:
    """``--aux``, ``--queue-depth``, ``--vertical-sync`` and ``--virtual-stages`` against the method the
    run uses: ``--method``, else the plan's (``planned``; None: a plan `train` makes, by the default
    planner: synchronous, no heads). Needs no profile, so commands call it first.

    Raises:
        UserError: a flag the method does not take, naming the fix.
    """
    method = None if args.method is None else Method(args.method)
    target = method or planned
    named = args.method or (f"{planned.value} (the plan's)" if planned else "the planner's choice")
    check_local_flags(args, target is not None and METHODS[target].params is LocalParams, f"--method is {named}")
    check_vertical_sync(args, method, f"--method {named}")
    if args.virtual_stages is not None:
        _chunking(None if method is None else METHODS[method])


def _chunking(spec: MethodSpec | None) -> MethodSpec:
    """The method ``--virtual-stages`` re-cuts a plan for (``--method``'s, None: not given).

    Raises:
        UserError: no method, or one with a stage per rank.
    """
    if spec is None or not spec.multi_stage:
        chunked = [m for m, s in METHODS.items() if s.multi_stage]
        raise UserError(f"--virtual-stages is for --method {listed(chunked)}; add one or drop --virtual-stages")
    return spec


def rechunked(plan: Plan, args: argparse.Namespace, graph: LayerGraph) -> Plan:
    """``simulate|train --method interleaved|interleaved-zb --virtual-stages V``: the plan's layers cut
    into ``V·R`` stages balanced on the profile, stage ``s`` on rank ``s mod R``, with the plan's
    micro-batch count (equal sizes); the plan itself without ``--virtual-stages``. A method placed in a
    V (``zbv``): a plan with 2 chunks per rank placed in a V, else its layers cut into ``2R`` such stages."""
    spec = None if args.method is None else METHODS[Method(args.method)]
    if spec is not None and spec.placement is Placement.V and plan.placement is not Placement.V:
        if plan.virtual_stages == 2 and args.virtual_stages in (None, 2):
            return v_placed(dataclasses.replace(plan, method=spec.method))
        args = argparse.Namespace(**{**vars(args), "virtual_stages": args.virtual_stages or 2})
    if args.virtual_stages is None:
        return plan
    spec = _chunking(spec)
    if plan.edges or plan.replicated:
        raise UserError("--virtual-stages re-cuts a chain plan with one rank per stage; drop it for this plan")
    cluster, profile = cluster_and_profiles(args, graph, plan.batch_size, plan.n_ranks, plan.precision)
    cost = CostModel(profile, cluster, optimizer=plan.optimizer, clip_grad_norm=plan.clip_grad_norm)
    cut = build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=plan.n_ranks, chunks=args.virtual_stages,
                                 batch_size=plan.batch_size, n_micro=len(plan.stages[0].forward_sizes),
                                 method=spec.method)
    return dataclasses.replace(cut, precision=plan.precision, optimizer=plan.optimizer,
                               clip_grad_norm=plan.clip_grad_norm)
