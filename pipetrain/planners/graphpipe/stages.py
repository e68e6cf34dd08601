"""From GraphPipe stages to a :class:`~pipetrain.plan.plan.Plan` of method ``graph`` (GraphPipe §3.2).

    plan, cluster = to_plan(problem, layer_edges, [((0, 1, 3), 1), ((2,), 1), ((4, 5), 2)], sizes)

The stages (layer indices, replica count) are numbered in a topological order of the stage graph
they induce (ties: the stage with the earlier first layer first), so every stage edge goes from a
lower to a higher stage and the stage with the model's last layer is last (C1, C2); each lists its
layers in model order. Two placements: ``packed=False``, stage ``k`` gets the next ``r_k`` devices
(neighbours in the pipeline share nodes); ``packed=True``, each stage on as few nodes as it can be
(:func:`place`), which is what the DP's all-reduce price assumes (:mod:`.costs`): on 2 nodes of 4,
stages of 2, 4 and 2 replicas put the 4 on one node and the 2s on the other, where consecutive
devices split the 4 over both nodes' slower link (issue 29: MMT 0.47 against 0.56 s). Neither is
always faster (MMT on 32 GPUs, ``4×3 5×4 … 11×9`` at b = 16: 0.582 s packed, 0.581 s
consecutive), so the planner simulates both. A plan on fewer devices than the cluster has runs on
the sub-cluster of the devices it uses.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.planners.contract import PlanningProblem
from pipetrain.planners.device_orders import placed_cluster

__all__ = ["layer_edges", "place", "stage_edges", "to_plan", "topological_stages"]


def layer_edges(problem: PlanningProblem) -> tuple[tuple[int, int], ...]:
    """The model's edges as layer-index pairs; the chain's for a chain model.

    Raises:
        UserError: an edge naming a layer the model does not have.
    """
    names = problem.layer_names
    if not problem.model.edges:
        return tuple((i, i + 1) for i in range(len(names) - 1))
    where = {name: i for i, name in enumerate(names)}
    missing = [e for e in problem.model.edges if e[0] not in where or e[1] not in where]
    if missing:
        raise UserError(f"model edges {missing[:3]} name layers the model does not have; build the ModelRef with "
                        "ModelRef.of(graph)")
    return tuple(sorted((where[a], where[b]) for a, b in problem.model.edges))


def stage_edges(stages: Sequence[Sequence[int]], edges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The stage edges ``(a, b)`` the layer edges induce (as :func:`pipetrain.plan.stage_graph.induced_edges`)."""
    stage_of = {i: k for k, layers in enumerate(stages) for i in layers}
    return tuple(sorted({(stage_of[a], stage_of[b]) for a, b in edges if stage_of[a] != stage_of[b]}))


def topological_stages(stages: Sequence[tuple[tuple[int, ...], int]],
                       edges: Sequence[tuple[int, int]]) -> list[tuple[tuple[int, ...], int]]:
    """``stages`` in a topological order of their induced graph, earlier first layers first.

    Raises:
        UserError: the stages induce a cycle (they are not convex, or not a valid partition).
    """
    order = sorted(stages, key=lambda s: s[0][0])
    induced = stage_edges([s[0] for s in order], edges)
    indegree = [0] * len(order)
    for _, b in induced:
        indegree[b] += 1
    ready = [k for k in range(len(order)) if indegree[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        k = heapq.heappop(ready)
        out.append(order[k])
        for a, b in induced:
            if a == k:
                indegree[b] -= 1
                if indegree[b] == 0:
                    heapq.heappush(ready, b)
    if len(out) != len(order):
        raise UserError("the stages induce a cycle in the stage graph; give every stage a convex set of layers")
    return out


def place(cluster: Cluster, replicas: Sequence[int], packed: bool = True) -> list[tuple[int, ...]]:
    """The cluster devices of each stage (``replicas[k]`` of them): the next ones in order
    (``packed=False``), or packed on few nodes.

    Packed, the stages take devices in order of decreasing replicas (ties: the earlier stage first); one
    that fits a node's free devices takes the node with the fewest that fit (best fit), one that
    fits none takes the nodes with the most free devices first; within a node, its lowest-numbered
    free devices. ``sum(replicas)`` must not exceed the cluster's devices.
    """
    if not packed:
        starts = [sum(replicas[:k]) for k in range(len(replicas))]
        return [tuple(range(a, a + r)) for a, r in zip(starts, replicas, strict=True)]
    free: dict[int, list[int]] = {}
    for i, device in enumerate(cluster.devices):
        free.setdefault(device.node, []).append(i)
    out: list[tuple[int, ...]] = [()] * len(replicas)
    for k in sorted(range(len(replicas)), key=lambda k: (-replicas[k], k)):
        r, taken = replicas[k], list[int]()
        fitting = [node for node, ids in free.items() if len(ids) >= r]
        nodes = ([min(fitting, key=lambda node: len(free[node]))] if fitting
                 else sorted(free, key=lambda node: -len(free[node])))
        for node in nodes:
            take = min(r - len(taken), len(free[node]))
            taken += free[node][:take]
            free[node] = free[node][take:]
        out[k] = tuple(sorted(taken))
    return out


def to_plan(problem: PlanningProblem, edges: Sequence[tuple[int, int]],
            stages: Sequence[tuple[tuple[int, ...], int]], sizes: tuple[int, ...], *,
            packed: bool = False) -> tuple[Plan, Cluster]:
    """A validated plan of method ``graph`` for ``stages`` with the equal ``sizes``, and its cluster
    (``packed``: the placement, module docstring).

    Raises:
        UserError: more devices than the cluster has, or stages that do not make a valid plan.
    """
    ordered = topological_stages(stages, edges)
    n_devices = sum(r for _, r in ordered)
    cluster = problem.cost.cluster
    if n_devices > cluster.n_devices:
        raise UserError(f"the stages need {n_devices} devices and the cluster has {cluster.n_devices}; use fewer "
                        "replicas or a larger cluster")
    devices = place(cluster, [r for _, r in ordered], packed)
    sub, ranks = placed_cluster(cluster, [d for ds in devices for d in ds])
    names, plans, at = problem.layer_names, [], 0
    for layers, r in ordered:
        plans.append(StagePlan(tuple(names[i] for i in layers), ranks[at:at + r], sizes, sizes))
        at += r
    induced = stage_edges([s[0] for s in ordered], edges)
    model = problem.model
    plan = Plan(model.name, model.fingerprint, problem.batch_size, Method.GRAPH, tuple(plans), edges=induced)
    plan.validate(names, model.fingerprint or None)
    if any(a >= b for a, b in induced):
        raise UserError("a stage feeds an earlier one; give every stage a convex set of layers")
    return plan, sub
