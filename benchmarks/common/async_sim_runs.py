"""The simulated cases of async-sim: PipeDream's plan against data parallelism on the PipeDream paper's
clusters, and 2BW's plan against the best GPipe and PipeDream-Flush plans on the 2BW paper's GPTs.

Each case returns one row (a JSON-ready dict, ``kind`` ``"pipedream"`` or ``"2bw"``); the
benchmark's module docstring says what each figure is.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pipetrain.cluster import Link
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.counts import candidate_counts, thinned_counts
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.pipedream import plan_pipedream
from pipetrain.planners.score import over_memory
from pipetrain.planners.twobw import micro_batch_sizes, plan_2bw, two_bw_plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

from .async_papers import describe, gpt_problem, v100_16gb

__all__ = ["CLUSTERS", "pipedream_row", "twobw_row"]

CLUSTERS = {  # the PipeDream paper's V100 clusters: (servers, devices per server, intra link, inter link)
    "A 4x4": (4, 4, Link(1e-5, 10e9), Link(2e-5, 10e9 / 8)),
    "B 2x8": (2, 8, Link(5e-6, 150e9), Link(2e-5, 25e9 / 8)),
}


def data_parallel_s(graph: LayerGraph, cost: CostModel, batch: int) -> tuple[float, int]:
    """The fastest data-parallel plan's seconds per batch (``m`` a multiple of ``D``) and its ``m``."""
    d = cost.cluster.n_devices
    best = (float("inf"), 0)
    for m in (m for m in candidate_counts(batch) if m % d == 0 and m <= 4 * d):
        sizes = equal_sizes(batch, m)
        plan = Plan(graph.name, graph.fingerprint(), batch, Method.GPIPE,
                    (StagePlan(tuple(graph.names), tuple(range(d)), sizes, sizes),))
        best = min(best, (simulate(build_schedule(plan), plan, cost).iteration_s, m))
    return best


def pipedream_row(name: str, cluster_name: str) -> dict[str, object]:
    """PipeDream's steady-state plan against data parallelism for ``name`` on one of :data:`CLUSTERS`."""
    servers, per, intra, inter = CLUSTERS[cluster_name]
    graph = build_model(name)
    batch = 64 * servers * per
    cost = CostModel(estimate_profile(graph, "v100", batch_size=batch), v100_16gb(servers, per, intra, inter))
    dp_s, dp_m = data_parallel_s(graph, cost, batch)
    start = time.perf_counter()
    problem = PlanningProblem(ModelRef.of(graph), cost, batch, constraints=Constraints(method=Method.PIPEDREAM))
    best = plan_pipedream(problem, counts=[m for m in thinned_counts(batch) if batch // m >= 32]).candidates[0]
    return {"kind": "pipedream", "model": name, "cluster": cluster_name, "batch": batch, "dp_batch_s": dp_s,
            "dp_micro": dp_m, "pipedream_batch_s": best.iteration_s,
            "pipedream_config": best.label.removeprefix("pipedream "),
            "pipedream_micro": len(best.plan.stages[0].forward_sizes), "speedup": dp_s / best.iteration_s,
            "search_s": time.perf_counter() - start}


def flush_best(problem: PlanningProblem, method: Method) -> tuple[float, str]:
    """The fastest straight ``method`` (gpipe or 1f1b) plan that fits, over 2BW's search space."""
    best = (float("inf"), "none fits")
    for depth in range(1, min(problem.cost.cluster.n_devices, len(problem.layer_names)) + 1):
        sub, _ = placed_cluster(problem.cost.cluster, range(depth))
        cost = problem.cost.on(sub)
        for b in micro_batch_sizes(problem.batch_size, 1):
            for recompute in (False, True):
                plan = replace(two_bw_plan(problem, depth, b, recompute), method=method, weights=WeightPolicy.SYNC)
                if over_memory(plan, cost, problem.optimizer):
                    continue
                best = min(best, (simulate(build_schedule(plan), plan, cost).iteration_s, describe(plan)))
                break  # recompute only when needed: it is never faster
    return best


def twobw_row(name: str, devices: int) -> dict[str, object]:
    """2BW's plan against the best GPipe and PipeDream-Flush plans for one GPT size on ``devices`` V100s."""
    problem = gpt_problem(name, devices)
    start = time.perf_counter()
    result = plan_2bw(problem)
    search_s = time.perf_counter() - start
    gpipe_s, gpipe_plan = flush_best(problem, Method.GPIPE)
    flush_s, flush_plan = flush_best(problem, Method.ONE_F_ONE_B)
    two = result.candidates[0].iteration_s
    return {"kind": "2bw", "model": name, "devices": devices, "gpipe_s": gpipe_s, "gpipe_plan": gpipe_plan,
            "flush_s": flush_s, "flush_plan": flush_plan, "twobw_s": two, "twobw_plan": describe(result.plan),
            "speedup_gpipe": gpipe_s / two, "speedup_flush": flush_s / two, "search_s": search_s}
