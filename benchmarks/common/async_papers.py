"""The 2BW paper's setting, shared by the simulated asynchronous benchmarks (async-sim, 2bw-width).

PipeDream-2BW (Narayanan et al., ICML'21, §5) trains GPT models of 1.3B, 2.2B and 3.8B parameters on
p3.16xlarge servers: 8 V100-16GB each, NVLink inside, 25 Gbit/s between; batch 512, Adam. Here the
zoo's GPT takes the paper's sizes (context 512, vocabulary 50257), its profile is *estimated* for a
V100 and every time is the event simulator's.
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.profile.estimate import estimate_profile

__all__ = ["GPT_BATCH", "GPT_SIZES", "PAPER_2BW", "QUICK_GPT", "describe", "gpt_problem", "v100_16gb"]

V100_16GB = 16 * 2**30
GPT_SIZES: dict[str, dict[str, int]] = {"gpt-1.3b": dict(blocks=24, hidden=2048, heads=16),
                                        "gpt-2.2b": dict(blocks=24, hidden=2560, heads=20),
                                        "gpt-3.8b": dict(blocks=32, hidden=3072, heads=24)}
QUICK_GPT = {"gpt-quick": dict(blocks=4, hidden=1024, heads=8)}  # --quick: the same search on a small GPT
GPT_BATCH = 512
P3 = (Link(5e-6, 150e9), Link(2e-5, 25e9 / 8))  # p3.16xlarge: NVLink inside a server, 25 Gbit/s between
PAPER_2BW = 3.2  # "up to 3.2× over GPipe" (GPT on 64 V100s, w × d)


def v100_16gb(servers: int, per_server: int, intra: Link, inter: Link) -> Cluster:
    """V100-16GB servers (the PipeDream and 2BW papers' devices)."""
    base = Cluster.homogeneous("v100", servers, per_server, intra, inter)
    return replace(base, devices=tuple(replace(d, memory_bytes=V100_16GB) for d in base.devices))


def gpt_problem(name: str, devices: int) -> PlanningProblem:
    """The GPT size ``name`` (:data:`GPT_SIZES` or :data:`QUICK_GPT`) to plan on ``devices`` V100-16GB
    in servers of 8, batch :data:`GPT_BATCH`, Adam."""
    sizes = {**GPT_SIZES, **QUICK_GPT}[name]
    graph = build_model("gpt1-14", vocab=50257, context=512, **sizes)
    servers, per = max(1, devices // 8), min(devices, 8)
    cost = CostModel(estimate_profile(graph, "v100", batch_size=GPT_BATCH), v100_16gb(servers, per, *P3))
    return PlanningProblem(ModelRef.of(graph), cost, GPT_BATCH, optimizer="adam")


def describe(plan: Plan) -> str:
    """``w=2 d=8 b=8 recompute``: width (replicas per stage), depth, micro-batch size, recompute."""
    b = plan.batch_size // len(plan.stages[0].forward_sizes)
    return f"w={len(plan.stages[0].ranks)} d={plan.n_stages} b={b}{' recompute' if plan.recompute_stages else ''}"
