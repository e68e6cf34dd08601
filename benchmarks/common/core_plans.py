"""The 2-rank pipetrain settings the Core benchmark and its diagnostics train.

A setting is a method on this machine's two ranks: two balanced stages, or for a looped method
(interleaved, interleaved-zb, zbv) ``chunks`` model chunks per rank, looping or in a V. The Core
benchmark labels its settings ``"pipetrain <schedule> m=<m>"``; the diagnostics write them
``method[:chunks]@m`` (``"interleaved-zb:4@2"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan

__all__ = ["CHUNKS", "LOOPED", "METHOD_OF", "SCHEDULES", "build_plan", "describe", "parse_setting", "setting_plans"]

SCHEDULES = ("gpipe", "1f1b", "zb1", "interleaved", "zbv")  # pipetrain's schedules in the Core grid
METHOD_OF: dict[str, Method] = {s: Method(s) for s in SCHEDULES}
LOOPED = (Method.INTERLEAVED, Method.INTERLEAVED_ZB, Method.ZBV)  # several chunks per rank
CHUNKS = 2  # chunks per rank of the Core grid's looped settings (torch's looped schedules: common.torch_schedules)


def build_plan(graph: LayerGraph, cost: CostModel, batch: int, method: Method, chunks: int, n_micro: int) -> Plan:
    """``method`` on 2 ranks with ``n_micro`` equal micro-batches: ``chunks`` per rank if it loops, else
    two balanced stages."""
    if method in LOOPED:
        return build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=2, chunks=chunks, batch_size=batch,
                                      n_micro=n_micro, method=method)
    return build_balanced_plan(ModelRef.of(graph), cost, method=method, n_stages=2, batch_size=batch, n_micro=n_micro)


def parse_setting(text: str) -> tuple[str, Method, int, int]:
    """``"interleaved-zb:4@2"`` -> (label, method, chunks per rank, micro-batches); a looped method's
    chunks default to 2, the others have one stage per rank."""
    name, _, m = text.partition("@")
    name, _, chunks = name.partition(":")
    method = Method(name)
    v = int(chunks or CHUNKS) if method in LOOPED else 1
    label = f"{name} v={v} m={m}" if method in LOOPED else f"{name} m={m}"
    return label, method, v, int(m)


def setting_plans(graph: LayerGraph, cost: CostModel, batch: int, micro: Sequence[int]) -> dict[str, Plan]:
    """The Core grid's plan of every schedule at every micro-batch count, by label."""
    return {f"pipetrain {s} m={m}": build_plan(graph, cost, batch, METHOD_OF[s], CHUNKS, m)
            for s in SCHEDULES for m in micro}


def describe(plan: Plan) -> str:
    """``"1f1b m=3 layers [4, 4]"``: a plan's method, micro-batch count and layers per stage."""
    sizes = plan.stages[0].forward_sizes
    return f"{plan.method.value} m={len(sizes)} layers {[len(s.layers) for s in plan.stages]}"
