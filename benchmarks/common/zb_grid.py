"""What the zero-bubble and interleaved benchmarks share: their plans on a grid, and a plan's figures.

:func:`plan_for` builds the plan of one method on ``R`` ranks: 1f1b, zb1 and zb2 on ``R`` balanced
stages, the interleaved family on ``v·R`` stages (looping, or a V for zbv). :func:`simulated`
runs it through the event simulator. :func:`gpt_grid` is the interleaved benchmarks' simulated
setting (gpt1-14 on estimated V100s, the micro-batch counts to sweep). :func:`unit_cost` and
:func:`unit_plan` are ZB-V's unit-cost setting (one layer per chunk, F = B = W = 1, free links).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetrain import api
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import Placement, placed_ranks
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline

__all__ = ["MULTI_CHUNK", "GptGrid", "gpt_grid", "plan_for", "simulated", "simulated_rows", "unit_cost", "unit_plan"]

MULTI_CHUNK = (Method.INTERLEAVED, Method.INTERLEAVED_ZB, Method.ZBV)  # several stages per rank


@dataclass(frozen=True)
class GptGrid:
    """The simulated setting: gpt1-14 with ``blocks`` blocks, priced on ``ranks`` estimated V100s at
    ``batch`` samples, swept over ``micro`` micro-batch counts."""

    blocks: int
    model: ModelRef
    cost: CostModel
    micro: tuple[int, ...]


def gpt_grid(blocks: int, batch: int, ranks: int, quick: bool) -> GptGrid:
    """gpt1-14 on ``ranks`` estimated V100s; m ∈ {8, 16, 32} (8 only with ``quick``)."""
    graph = build_model("gpt1-14", blocks=blocks)
    cost = CostModel(estimate_profile(graph, "v100", batch), api.estimated_cluster("v100", ranks)[0])
    return GptGrid(blocks, ModelRef.of(graph), cost, (8,) if quick else (8, 16, 32))


def plan_for(model: ModelRef, cost: CostModel, method: Method, ranks: int, chunks: int, batch: int, m: int) -> Plan:
    """1f1b/zb1/zb2: ``ranks`` balanced stages; interleaved[-zb]/zbv: ``chunks · ranks`` stages."""
    if method in MULTI_CHUNK:
        return build_interleaved_plan(model, cost, n_ranks=ranks, chunks=chunks, batch_size=batch, n_micro=m,
                                      method=method)
    return build_balanced_plan(model, cost, method=method, n_stages=ranks, batch_size=batch, n_micro=m)


def simulated(plan: Plan, cost: CostModel) -> Timeline:
    """The event simulator's timeline of ``plan``."""
    return simulate(build_schedule(plan), plan, cost)


def simulated_rows(cost: CostModel, plans: list[Plan], time_scale: float, byte_scale: float) -> list[dict[str, object]]:
    """One row per plan: ranks, micro, method, iteration (s × ``time_scale``), bubble, peak_activation
    (the busiest rank's bytes × ``byte_scale``) and speedup (the first plan's time over this one's)."""
    out, base = [], 0.0
    for plan in plans:
        timeline = simulated(plan, cost)
        base = base or timeline.iteration_s
        out.append({"ranks": plan.n_ranks, "micro": len(plan.stages[0].forward_sizes), "method": plan.method.value,
                    "iteration": timeline.iteration_s * time_scale, "bubble": timeline.bubble_fraction(),
                    "peak_activation": max(timeline.peak_activation_bytes) * byte_scale,
                    "speedup": base / timeline.iteration_s})
    return out


def unit_cost(n_layers: int, ranks: int) -> CostModel:
    """``n_layers`` layers with F = 1 and backward 2 split evenly into B and W, on ``ranks`` free links."""
    layers = tuple(LayerProfile(f"l{k}", (1, 2), (1.0, 1.0), (2.0, 2.0), 0, 1, 4, 0.0) for k in range(n_layers))
    return CostModel(Profile("unit", "", "cpu", "synthetic", 0, layers), Cluster.local(ranks, link=Link(0, 1e30)))


def unit_plan(method: Method, ranks: int, m: int) -> Plan:
    """One layer per chunk: 1f1b/zb1 two layers per stage on R stages, else 2R stages placed by the method."""
    sizes, names = equal_sizes(2 * m, m), [f"l{k}" for k in range(2 * ranks)]
    if method in (Method.ONE_F_ONE_B, Method.ZB1):
        stages = tuple(StagePlan((names[2 * k], names[2 * k + 1]), (k,), sizes, sizes) for k in range(ranks))
    else:
        placed = placed_ranks(Placement.V if method is Method.ZBV else Placement.LOOPING, 2 * ranks, ranks) or ()
        stages = tuple(StagePlan((n,), r, sizes, sizes) for n, r in zip(names, placed, strict=True))
    return Plan("unit", "", 2 * m, method, stages)
