"""The baselines and the row the partitioning experiments share (partition-sim, bapipe-fpga, pipedream-paper).

Data parallelism (one stage on every device) and an equal-layer split are planned here by brute
force over micro-batch counts; every plan is timed by the event simulator and its memory is the
most any one device holds (:func:`~pipetrain.simulate.memory.stage_memory`, SGD).
"""

from __future__ import annotations

from typing import Any

from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import PlanningProblem
from pipetrain.planners.counts import candidate_counts, thinned_counts
from pipetrain.planners.partition.balanced import balanced_partition
from pipetrain.planners.score import score_steady
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import stage_memory

__all__ = ["EQUAL", "GIB", "data_parallel", "equal_split", "per_server", "plan_row", "simulated"]

GIB = 2**30
EQUAL = (Method.GPIPE, Method.ONE_F_ONE_B)


def simulated(plan: Plan, cost: CostModel) -> tuple[float, float]:
    """``(iteration seconds, bubble fraction)`` of ``plan`` from the event simulator."""
    timeline = simulate(build_schedule(plan), plan, cost)
    return timeline.iteration_s, timeline.bubble_fraction()


def _fastest(plans: list[Plan], cost: CostModel) -> Plan:
    return min(plans, key=lambda p: simulated(p, cost)[0])


def data_parallel(graph: LayerGraph, cost: CostModel, batch: int) -> Plan:
    """One stage of all ``L`` layers on all ``D`` ranks, gpipe, the fastest ``m`` (a multiple of ``D``,
    so that each replica gets ``m / D`` micro-batches)."""
    d = cost.cluster.n_devices
    ranks = tuple(range(d))
    plans = [Plan(graph.name, graph.fingerprint(), batch, Method.GPIPE,
                  (StagePlan(tuple(graph.names), ranks, equal_sizes(batch, m), equal_sizes(batch, m)),))
             for m in candidate_counts(batch) if m % d == 0]
    return _fastest(plans, cost)


def _layer_split(names: list[str], n_stages: int) -> list[tuple[str, ...]]:
    """``names`` cut into ``n_stages`` runs of (nearly) equal counts, the longer runs first."""
    q, r = divmod(len(names), n_stages)
    runs, first = [], 0
    for k in range(n_stages):
        count = q + 1 if k < r else q
        runs.append(tuple(names[first:first + count]))
        first += count
    return runs


def equal_split(graph: LayerGraph, cost: CostModel, batch: int) -> Plan:
    """``min(D, L)`` stages of equal layer counts, one rank each; the fastest of gpipe/1f1b and every
    micro-batch count of :func:`~pipetrain.planners.counts.thinned_counts`."""
    runs = _layer_split(list(graph.names), min(cost.cluster.n_devices, len(graph.names)))
    plans = []
    for method in EQUAL:
        for m in thinned_counts(batch):
            sizes = equal_sizes(batch, m)
            stages = tuple(StagePlan(run, (k,), sizes, sizes) for k, run in enumerate(runs))
            plans.append(Plan(graph.name, graph.fingerprint(), batch, method, stages))
    return _fastest(plans, cost)


def plan_row(planner: str, plan: Plan, cost: CostModel, search_s: float, config: str = "") -> dict[str, Any]:
    """One planner's plan as a row: simulated on ``cost``'s cluster (the one its ranks index), its peak
    memory and whether that fits the smallest device. ``stages`` lists ``<layers>x<replicas>`` per
    stage; ``config`` is PipeDream's replication notation (e.g. ``"15-1"``) where it has one."""
    iteration_s, bubble = simulated(plan, cost)
    peak = max(m.total_bytes for m in stage_memory(plan, cost))
    capacity = min(d.memory_bytes for d in cost.cluster.devices)
    return {"planner": planner, "method": plan.method.value, "n_micro": len(plan.stages[0].forward_sizes),
            "stages": [f"{len(s.layers)}x{len(s.ranks)}" for s in plan.stages], "devices_used": plan.n_ranks,
            "iteration_s": iteration_s, "bubble_fraction": bubble, "peak_memory_bytes": peak,
            "fits": peak <= capacity, "search_s": search_s, "config": config}


def per_server(problem: PlanningProblem) -> float:
    """Steady-state seconds per batch of one stage per server on all its devices, the layers cut to
    balance their compute (:func:`~pipetrain.planners.partition.balanced.balanced_partition`), ``m`` =
    the device count, run by ``pipedream`` (1F1B-RR): pipedream-paper's reference plan."""
    cost, names = problem.cost, problem.layer_names
    nodes = sorted({d.node for d in cost.cluster.devices})
    ranks = [tuple(r for r, d in enumerate(cost.cluster.devices) if d.node == n) for n in nodes]
    m = cost.cluster.n_devices
    b = problem.batch_size // m
    sizes, stages, first = equal_sizes(problem.batch_size, m), [], 0
    for count, on in zip(balanced_partition([cost.layer_work_s(n, b, 0) for n in names], len(nodes)), ranks,
                         strict=True):
        stages.append(StagePlan(tuple(names[first:first + count]), on, sizes, sizes))
        first += count
    model = problem.model
    plan = Plan(model.name, model.fingerprint, problem.batch_size, Method.PIPEDREAM, tuple(stages))
    return score_steady(plan.run_by(Method.PIPEDREAM), cost).iteration_s
