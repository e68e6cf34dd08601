"""The heterogeneous cluster of the hetero experiment (2 H100 + 2 V100) and its plans: the
identical-devices baselines (the balanced planner on the cluster taken as 4 V100s or 4 H100s) and
BaPipe's exploration, each as a row timed by the event simulator on the real cluster."""

from __future__ import annotations

import time

from harness import Row

from pipetrain.cluster import DEVICE_MODELS, Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import BapipeResult
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

__all__ = ["BATCH", "EQUAL", "KINDS", "bapipe_row", "cluster", "identical_rows"]

BATCH = 64
KINDS = ("h100", "v100")
NVLINK = Link(1e-5, 1.5e11)
EQUAL = (Method.GPIPE, Method.ONE_F_ONE_B)


def cluster(inter_gbit: float) -> Cluster:
    h, v = DEVICE_MODELS["h100"], DEVICE_MODELS["v100"]
    devices = (Device("h100", h.memory_bytes, node=0),) * 2 + (Device("v100", v.memory_bytes, node=1),) * 2
    return Cluster(devices, NVLINK, Link(1e-5, inter_gbit * 1e9 / 8), "2xH100+2xV100")


def assumed(real: Cluster, kind: str) -> Cluster:
    """The real cluster's layout and links with every device taken to be ``kind``."""
    d = DEVICE_MODELS[kind]
    devices = tuple(Device(kind, d.memory_bytes, node=x.node) for x in real.devices)
    return Cluster(devices, real.intra_node, real.inter_node, f"4x{kind} (assumed)")


def _row(planner: str, method: Method, iteration_s: float, n_micro: int, stages: list[str], search_s: float) -> Row:
    """One planner's plan: event-simulated seconds on the real cluster, stages as ``<device kind>:<layers>``,
    and the planner's own search (for the identical baselines: one plan_balanced call)."""
    return {"planner": planner, "method": method.value, "iteration_s": iteration_s, "n_micro": n_micro,
            "stages": stages, "search_s": search_s}


def identical_rows(graph: LayerGraph, profiles: dict[str, Profile], real: CostModel) -> list[Row]:
    """The identical-devices baselines: 4 stages, and the best stage count, on the real cluster."""
    model = ModelRef.of(graph)
    options: dict[int, tuple[float, Plan, float]] = {}
    for n_stages in range(1, min(4, len(graph.names)) + 1):
        for kind in KINDS:
            cost = CostModel(profiles[kind], assumed(real.cluster, kind))
            for method in EQUAL:
                t0 = time.perf_counter()
                problem = PlanningProblem(model, cost, BATCH, constraints=Constraints(method=method, n_stages=n_stages))
                plan = plan_balanced(problem).plan
                search_s = time.perf_counter() - t0
                truth = simulate(build_schedule(plan), plan, real).iteration_s
                if n_stages not in options or truth < options[n_stages][0]:
                    options[n_stages] = (truth, plan, search_s)
    rows = []
    for label, n_stages in (("identical (4 stages)", max(options)),
                            ("identical (best S)", min(options, key=lambda s: options[s][0]))):
        truth, plan, seconds = options[n_stages]
        stages = [f"{real.cluster.devices[s.ranks[0]].kind}:{len(s.layers)}" for s in plan.stages]
        rows.append(_row(label, plan.method, truth, len(plan.stages[0].forward_sizes), stages, seconds))
    return rows


def bapipe_row(label: str, result: BapipeResult, seconds: float) -> Row:
    best = result.best
    stages = [f"{kind}:{n}" for kind, n in zip(best.placement.kinds, best.layer_counts, strict=True)]
    return _row(label, best.method, best.iteration_s, best.n_micro, stages, seconds)
