"""GraphPipe's simulated part: the Summit-like clusters, each planner's answer as a row, and the
clock that separates a planner's own work from the CPU it spends in the simulator.

What a planner call's times include (:func:`timed`): everything ``run_planner`` does, from a cost model
with empty caches (each call gets a fresh one, so no planner runs on the caches another warmed). The
*simulator* share is the CPU inside the entry points of :data:`SIMULATOR` (building each candidate's
schedule, the event simulation, the memory check); the planner's *own work* is the rest: graphpipe's SP
decomposition, stage tables, DP and target search per micro-batch size and its plan building;
PipeDream's DP per micro-batch count and its plan building."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cache
from typing import Any

import pipetrain.planners.score as scoring
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem, PlanningResult
from pipetrain.planners.registry import run_planner
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile

__all__ = ["BRANCH_COUNT", "RESTRICTED", "RESTRICTED_IS", "problem_of", "profile_of", "sim_row", "timed"]

BRANCH_COUNT = {"mmt": 4, "dlrm": 14, "candle-uno": 7}  # the zoo defaults (dlrm: 7 dense + 7 sparse)
PER_NODE = 4
NVLINK = Link(5e-6, 150e9)
INFINIBAND = Link(5e-6, 100e9 / 8)  # EDR, 100 Gbit/s
RESTRICTED = "pipedream-1f1b"
RESTRICTED_IS = ("the paper's PipeDream baseline as we model it: PipeDream's DP on the linearised model, 1F1B only "
                 "(the pipedream planner with Constraints(method=1f1b); unrestricted, it also tries GPipe)")
SIMULATOR = ("simulate", "build_schedule", "steady_timeline", "overflows")
"""The functions of :mod:`pipetrain.planners.score` whose time counts as simulation."""


def summit(n_devices: int) -> Cluster:
    """``n_devices`` V100s, 4 per node on NVLink, nodes on 100 Gbit/s InfiniBand (Summit-like)."""
    return Cluster.homogeneous("v100", max(1, n_devices // PER_NODE), min(PER_NODE, n_devices), NVLINK, INFINIBAND)


def depth(plan: Plan) -> int:
    """Stages on the longest path of the plan's stage graph (a chain: its stage count)."""
    n = len(plan.stages)
    edges = plan.edges or tuple((k, k + 1) for k in range(n - 1))
    longest = [1] * n
    for a, b in sorted(edges):  # edges go from lower to higher stages
        longest[b] = max(longest[b], longest[a] + 1)
    return max(longest)


@cache
def profile_of(model: str, branches: int, batch: int, precision: str) -> Profile:
    """The estimated V100 profile of ``model`` (``branches`` 0: the zoo's), its grid up to ``batch``."""
    overrides = {"branches": branches} if branches else {}
    return estimate_profile(build_model(model, **overrides), "v100", batch, precision=precision)


def problem_of(model: str, branches: int, profile: Profile, n_devices: int, batch: int) -> PlanningProblem:
    graph = build_model(model, **({"branches": branches} if branches else {}))
    return PlanningProblem(ModelRef.of(graph), CostModel(profile, summit(n_devices)), batch)


@contextmanager
def simulation_clock() -> Iterator[list[float]]:
    """Count the CPU seconds spent in the simulator's entry points (:data:`SIMULATOR`) while inside;
    the planners reach them through :mod:`pipetrain.planners.score` (recompute's memory check too)."""
    spent = [0.0]
    saved = {name: getattr(scoring, name) for name in SIMULATOR}

    def clocked(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - t0
        return run

    for name, fn in saved.items():
        setattr(scoring, name, clocked(fn))
    try:
        yield spent
    finally:
        for name, fn in saved.items():
            setattr(scoring, name, fn)


def timed(planner: str, problem: PlanningProblem) -> tuple[PlanningResult, float, float, float]:
    """The planner's result, its wall and CPU seconds, and the CPU seconds of them in the simulator
    (module docstring), on a fresh cost model. ``pipedream-1f1b`` is the :data:`RESTRICTED` baseline."""
    cost = problem.cost
    problem = replace(problem, cost=CostModel(cost.profiles, cost.cluster, cost.action_overhead_s,
                                              optimizer=cost.optimizer, clip_grad_norm=cost.clip_grad_norm))
    if planner == RESTRICTED:
        planner, problem = "pipedream", PlanningProblem(problem.model, problem.cost, problem.batch_size,
                                                        constraints=Constraints(method=Method.ONE_F_ONE_B))
    with simulation_clock() as spent:
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_planner(planner, problem)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return result, wall, cpu, spent[0]


def sim_row(model: str, branches: int, sweep: bool, problem: PlanningProblem, planner: str) -> dict[str, Any]:
    """Plan ``problem`` with ``planner`` and describe its fastest feasible plan: ``stages`` as
    ``<layers>`` or ``<layers>×<replicas>``, ``depth`` the stages on the stage graph's longest path."""
    if planner == "balanced":
        n = min(problem.cost.cluster.n_devices, len(problem.layer_names))
        problem = PlanningProblem(problem.model, problem.cost, problem.batch_size, constraints=Constraints(n_stages=n))
    result, seconds, cpu, simulating = timed(planner, problem)
    plan, best = result.plan, result.candidates[0]
    sizes = plan.stages[0].forward_sizes
    return {"part": "sim", "model": model, "branches": branches, "sweep": sweep,
            "n_devices": problem.cost.cluster.n_devices, "batch": problem.batch_size, "planner": planner,
            "method": plan.method.value, "micro_batch": max(sizes), "n_micro": len(sizes),
            "stages": [s.label for s in plan.stages], "depth": depth(plan), "devices_used": plan.n_ranks,
            "iteration_s": best.iteration_s, "samples_per_s": problem.batch_size / best.iteration_s,
            "search_s": seconds, "cpu_s": cpu, "simulate_cpu_s": simulating}
