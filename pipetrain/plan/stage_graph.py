"""A plan's stages against the model's layer graph: GraphPipe's validity rules C1 and C2 (§3.2).

* C1: every stage is a *convex* set of layers (no path leaves a stage and comes back);
* C2: a layer edge between two stages is a stage edge, and (ours) every stage edge carries one.

The stage edges a partition *induces* are :func:`induced_edges`; a plan of method ``graph`` must list
exactly those. A stage graph whose edges all go from lower to higher stages has no cycle, so C1
holds for every stage exactly when every induced edge goes forward.

    >>> induced_edges(graph, [("a", "b1", "b2"), ("c1",), ("m", "h")])     # doctest: +SKIP
    ((0, 2), (1, 2))
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.batch_norm import check_batch_norm_sizes
from pipetrain.plan.methods import StageGraph
from pipetrain.plan.plan import Plan

__all__ = ["induced_edges", "validate_for_graph"]


def induced_edges(graph: LayerGraph, stages: Sequence[Sequence[str]]) -> tuple[tuple[int, int], ...]:
    """The stage edges ``(a, b)`` over which some layer of stage ``a`` feeds a layer of stage ``b``, sorted."""
    stage_of = {name: k for k, layers in enumerate(stages) for name in layers}
    found = set()
    for i in range(len(graph)):
        for j in graph.successors(i):
            a, b = stage_of[graph.layers[i].name], stage_of[graph.layers[j].name]
            if a != b:
                found.add((a, b))
    return tuple(sorted(found))


def validate_for_graph(plan: Plan, graph: LayerGraph) -> None:
    """:meth:`Plan.validate` against ``graph``, its micro-batches against the model's BatchNorms
    (:func:`~pipetrain.plan.batch_norm.check_batch_norm_sizes`), and for method ``graph`` rules C1 and C2.

    Raises:
        UserError: naming the stages and layers at fault, and what to change.
    """
    plan.validate(graph.names, graph.fingerprint())
    check_batch_norm_sizes(plan, graph)
    if plan.spec.graph is not StageGraph.DAG:
        return
    index = {name: i for i, name in enumerate(graph.names)}
    for k, stage in enumerate(plan.stages):
        order = [index[n] for n in stage.layers]
        if order != sorted(order):
            raise UserError(f"stage {k} lists its layers out of the model's order; list them as the model does: "
                            f"{[graph.names[i] for i in sorted(order)]}")
    induced = induced_edges(graph, [s.layers for s in plan.stages])
    backward = [(a, b) for a, b in induced if a > b]
    if backward:
        a, b = backward[0]
        raise UserError(f"stage {a} feeds stage {b} (an earlier one): a stage is not convex or the stages are not in "
                        "a topological order; renumber the stages or move layers so that every edge goes forward")
    if sorted(map(tuple, plan.stage_edges)) != list(induced):
        raise UserError(f"the plan's stage edges {sorted(plan.stage_edges)} are not the ones its layers induce "
                        f"({list(induced)}); set \"edges\" to {[list(e) for e in induced]}")
