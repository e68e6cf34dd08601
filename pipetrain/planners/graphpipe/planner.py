"""The GraphPipe planner: SP decomposition, DP and TPS search per micro-batch size, simulated
(GraphPipe §3.3–3.5).

    result = plan_graphpipe(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan.method        # Method.GRAPH: a DAG of stages, edges = the ones the layers induce
    result.report.tree        # the SP tree, e.g. "S(P(S(0,1,3),2),4,5)"

For every micro-batch size ``b`` a power of two up to ``B`` (GraphPipe's default: one equal size
for every stage; ``m = ceil(B / b)`` micro-batches of the equal partition), the binary search of
:func:`~.dp.search` finds the lowest bottleneck TPS with a strategy that fits memory, for each
device count up to the cluster's. The best few strategies per size (lowest bottleneck, then fewest
in flight) become plans (:func:`~.stages.to_plan`), are simulated under the DAG's 1F1B
(:func:`~pipetrain.planners.score.score`, which also costs the fill and drain the TPS leaves out) and
memory-checked (one over memory tries recomputing its overflowing stages,
:mod:`pipetrain.planners.recompute`; the DP's own memory estimate keeps every activation); the
fastest feasible candidate wins. A chain model is one series node: the result
is then a sequential pipeline (still method ``graph``, with the chain's edges). Deterministic: no
randomness, ties broken by the order of the candidates.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from pipetrain.errors import UserError
from pipetrain.plan.methods import MethodSpec, StageGraph
from pipetrain.plan.plan import equal_sizes
from pipetrain.planners.contract import Candidate, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.graphpipe.costs import StageEstimator
from pipetrain.planners.graphpipe.dp import Strategy, search
from pipetrain.planners.graphpipe.sp import SPNode, decompose
from pipetrain.planners.graphpipe.stages import layer_edges, to_plan
from pipetrain.planners.recompute import as_chosen, recomputing
from pipetrain.planners.score import memory_checked, score

__all__ = ["GraphPipeReport", "graphpipe_plans", "micro_batch_options", "plan_graphpipe"]

log = logging.getLogger(__name__)

KEEP_PER_SIZE = 3
"""Strategies simulated per micro-batch size (of one per device count)."""


@dataclass(frozen=True)
class GraphPipeReport:
    """GraphPipe's own account of its answer.

    Attributes:
        tree: the SP decomposition (:meth:`~.sp.SPNode.describe`), over layer indices.
        micro_batch: the chosen micro-batch size.
        target_tps: the chosen strategy's bottleneck seconds per sample (the DP's estimate).
        skipped: ``(micro-batch size, why)`` for sizes with no runnable plan.
    """

    tree: str
    micro_batch: int
    target_tps: float
    skipped: tuple[tuple[int, str], ...]


def micro_batch_options(batch: int, smallest: int = 1) -> list[tuple[int, ...]]:
    """The equal partitions of ``batch`` for micro-batch sizes ``1, 2, 4, …`` up to it, largest size
    first, without repeats (``B = 12``: sizes 12, 8 → 6+6, 4, 2, 1), and without micro-batches below
    ``smallest`` samples (a model with BatchNorm: 2)."""
    found: list[tuple[int, ...]] = []
    b = 1 << (batch.bit_length() - 1)
    for size in [batch, *(b >> i for i in range(b.bit_length()))]:
        sizes = equal_sizes(batch, math.ceil(batch / size))
        if sizes not in found and min(sizes) >= smallest:
            found.append(sizes)
    return found


def _chosen(strategies: dict[int, Strategy]) -> list[Strategy]:
    """The strategies to simulate: lowest bottleneck first (then fewest in flight), distinct."""
    ranked = sorted(strategies.values(), key=lambda s: (round(s.worst_tps, 12), s.depth, s.devices))
    kept: list[Strategy] = []
    for s in ranked:
        if all(sorted(s.stages) != sorted(k.stages) for k in kept):
            kept.append(s)
    return kept[:KEEP_PER_SIZE]


def _candidates_at(problem: PlanningProblem, tree: SPNode, edges: tuple[tuple[int, int], ...],
                   sizes: tuple[int, ...], skipped: list[tuple[int, str]]) -> list[tuple[Candidate, float]]:
    """The scored, memory-checked plans at one equal partition, with their DP bottleneck TPS."""
    b = max(sizes)
    est = StageEstimator(problem, edges, b, len(sizes))
    strategies = search(tree, est, problem.cost.cluster.n_devices)
    if not strategies:
        skipped.append((b, "no strategy fits the devices' memory"))
        return []
    found = []
    for s in _chosen(strategies):
        plan, cluster = to_plan(problem, edges, s.stages, sizes)
        sub_cost = problem.cost.on(cluster)
        label = f"graphpipe b={b} {'-'.join(st.label for st in plan.stages)}"
        choice = problem.constraints.recompute
        candidate = memory_checked(score(as_chosen(plan, choice), sub_cost, label=label), sub_cost, problem.optimizer)
        if not candidate.feasible and choice == "auto":
            candidate = recomputing(candidate, sub_cost, problem.optimizer) or candidate
        if candidate.feasible:
            found.append((candidate, s.worst_tps))
        else:
            skipped.append((b, candidate.infeasible))
    return found


def graphpipe_plans(spec: MethodSpec) -> bool:
    """The methods the graphpipe planner plans: those whose stages may form a DAG (method graph)."""
    return spec.graph is StageGraph.DAG


def plan_graphpipe(problem: PlanningProblem) -> PlanningResult:
    """The fastest feasible GraphPipe plan over micro-batch sizes (module docstring).

    Args:
        problem: the model (``ModelRef.of(graph)``: its edges for a DAG), the cost model, batch and optimizer.

    Returns:
        The plan (method ``graph``), its (sub-)cluster, every feasible candidate fastest first, and a
        :class:`GraphPipeReport`.

    Raises:
        UserError: no micro-batch size gives a plan that fits (says what to change).
    """
    edges = layer_edges(problem)
    tree = decompose(len(problem.layer_names), edges)
    scored: list[tuple[Candidate, float]] = []
    skipped: list[tuple[int, str]] = []
    for sizes in micro_batch_options(problem.batch_size, problem.smallest_microbatch):
        scored += _candidates_at(problem, tree, edges, sizes, skipped)
    if not scored:
        reasons = "; ".join(f"b={b}: {why}" for b, why in skipped[:3])
        raise UserError(f"the graphpipe planner found no plan that fits ({reasons}); use a smaller batch, more "
                        "devices or devices with more memory")
    scored.sort(key=lambda ct: rank_key(ct[0]))
    best, tps = scored[0]
    assert best.cluster is not None
    b = max(best.plan.stages[0].forward_sizes)
    log.info("graphpipe: chose %s: %.6f s", best.label, best.iteration_s)
    report = GraphPipeReport(tree.describe(), b, tps, tuple(skipped))
    return PlanningResult("graphpipe", best.plan, best.cluster, tuple(c for c, _ in scored), report)
