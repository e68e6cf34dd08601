"""The GraphPipe planner: SP decomposition, DP and TPS search per micro-batch size, simulated
(GraphPipe §3.3–3.5).

    result = plan_graphpipe(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan.method        # Method.GRAPH: a DAG of stages, edges = the ones the layers induce
    result.report.tree        # the SP tree, e.g. "S(P(S(0,1,3),2),4,5)"

For every micro-batch size ``b`` a power of two up to ``B`` (GraphPipe's default: one equal size
for every stage; ``m = ceil(B / b)`` micro-batches of the equal partition), the binary search of
:func:`~.dp.search` finds the lowest bottleneck TPS with a strategy that fits memory, for each
device count up to the cluster's. Of every strategy the search met on its way (each target gives
one per device count), the best few per size by :func:`estimate_s` (bottleneck plus fill and drain,
then fewest in flight) and the shallowest one (least depth, often one data-parallel stage) become
plans (:func:`~.stages.to_plan`, each in both placements), are simulated under the DAG's 1F1B
(:func:`~pipetrain.planners.score.score`, which also costs the fill and drain the TPS leaves out) and
memory-checked (one over memory tries recomputing its overflowing stages,
:mod:`pipetrain.planners.recompute`; the DP's own memory estimate keeps every activation); the
fastest feasible candidate wins. A chain model is one series node: the result
is then a sequential pipeline (still method ``graph``, with the chain's edges). Deterministic: no
randomness, ties broken by the order of the candidates.

Pruning (same answer, less work): the sizes are visited in the order of a lower bound of any plan's
simulated iteration at that size, the larger of :func:`work_floor_s` (every layer's work spread over
all devices) and :func:`path_floor_s` (the longest path of layers, and the busiest layer's share of
the micro-batches); a size whose bound is over the best simulated iteration by more than
:data:`PRUNE_MARGIN` is not searched, and a strategy whose busiest replica's compute
(:func:`stage_floor_s`) is is not simulated.
The report gives the seconds of the search (the planner's own work) and of the simulations apart.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import MethodSpec, StageGraph
from pipetrain.plan.plan import Plan, equal_sizes
from pipetrain.planners.contract import Candidate, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.graphpipe.costs import StageEstimator
from pipetrain.planners.graphpipe.dp import Searched, Strategy, search
from pipetrain.planners.graphpipe.sp import SPNode, decompose
from pipetrain.planners.graphpipe.stages import layer_edges, to_plan
from pipetrain.planners.recompute import as_chosen, recomputing
from pipetrain.planners.score import memory_checked, score

__all__ = ["GraphPipeReport", "estimate_s", "graphpipe_plans", "micro_batch_options", "path_floor_s", "plan_graphpipe",
           "stage_floor_s", "work_floor_s"]

log = logging.getLogger(__name__)

KEEP_PER_SIZE = 3
"""Strategies simulated per micro-batch size (of those the target search met), besides the shallowest."""

PRUNE_MARGIN = 1.02
"""A lower bound must exceed the best simulated iteration by this factor to prune: the ranking
compares iterations to 3 significant digits (:func:`~pipetrain.planners.contract.rank_key`), which
rounds by at most 0.5 %."""


@dataclass(frozen=True)
class GraphPipeReport:
    """GraphPipe's own account of its answer.

    Attributes:
        tree: the SP decomposition (:meth:`~.sp.SPNode.describe`), over layer indices.
        micro_batch: the chosen micro-batch size.
        target_tps: the chosen strategy's bottleneck seconds per sample (the DP's estimate).
        skipped: ``(micro-batch size, why)`` for sizes with no runnable plan.
        pruned: micro-batch sizes and strategies not searched or simulated: their lower bound was
            slower than a plan already simulated.
        search_s: wall seconds of the DP and target search (the planner's own work).
        simulate_s: wall seconds of simulating and memory-checking candidates.
    """

    tree: str
    micro_batch: int
    target_tps: float
    skipped: tuple[tuple[int, str], ...]
    pruned: int = 0
    search_s: float = 0.0
    simulate_s: float = 0.0


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


def estimate_s(strategy: Strategy, batch: int) -> float:
    """The strategy's iteration as the DP sees it: its bottleneck's share of the batch (worst TPS ×
    ``batch``: its micro-batches and all-reduce) plus one micro-batch's way through the stages (the
    fill and drain). On MMT it is 2–15 % under the simulator, but it orders plans as the simulator
    does where the bottleneck alone did not (issue 29: 8 GPUs, ``18×3 9×2 11×2`` has the lower
    bottleneck, ``9×2 5 9×2 9×2 6`` simulates 24 % faster)."""
    return batch * strategy.worst_tps + strategy.latency


def _chosen(found: Searched, batch: int) -> list[Strategy]:
    """The strategies to simulate: of every strategy the target search met, the least
    :func:`estimate_s` first (then fewest in flight), distinct, and the shallowest strategy."""
    ranked = sorted(found.visited, key=lambda s: (round(estimate_s(s, batch), 12), s.depth, s.devices))
    kept: list[Strategy] = []
    for s in ranked:
        if all(sorted(s.stages) != sorted(k.stages) for k in kept):
            kept.append(s)
    kept = kept[:KEEP_PER_SIZE]
    if found.shallowest is not None and all(sorted(found.shallowest.stages) != sorted(k.stages) for k in kept):
        kept.append(found.shallowest)
    return kept


def work_floor_s(problem: PlanningProblem, sizes: tuple[int, ...]) -> float:
    """A lower bound of any plan's simulated iteration at these micro-batch sizes: the forward and
    backward of every layer on every micro-batch, spread evenly over all devices at the fastest's speed."""
    cost = problem.cost
    fastest = max(range(cost.cluster.n_devices), key=lambda r: (cost.cluster.devices[r].speed, -r))
    work = sum(cost.layer_work_s(name, b, fastest) for name in problem.layer_names for b in sizes)
    return work / cost.cluster.n_devices


def path_floor_s(problem: PlanningProblem, edges: tuple[tuple[int, int], ...], sizes: tuple[int, ...]) -> float:
    """A lower bound of any plan's simulated iteration at these ``m`` micro-batch sizes, from the layer
    DAG: a replica of layer ``l``'s stage gets its first micro-batch only after that micro-batch's
    forward through ``l``'s ancestors, and its last backward still has to pass back through them;
    in between it runs ``ceil(m / r)`` micro-batches (``r <= min(m, N)`` replicas), or at least one
    micro-batch's way forward and back through ``l`` and its descendants. Work per layer and
    micro-batch: forward + backward of the smallest size on the fastest device.

    On MMT with few micro-batches (``B = 512``, ``b = 256``: 11 of 38 layers on the longest path) it is
    about twice :func:`work_floor_s`; with many it is below it."""
    cost, names = problem.cost, problem.layer_names
    fastest = max(range(cost.cluster.n_devices), key=lambda r: (cost.cluster.devices[r].speed, -r))
    b, m = min(sizes), len(sizes)
    work = [cost.layer_work_s(name, b, fastest) for name in names]
    preds: list[list[int]] = [[] for _ in names]
    for a, c in edges:
        preds[c].append(a)
    before = [0.0] * len(names)  # the longest path of work through the strict ancestors
    for i in range(len(names)):
        before[i] = max((before[p] + work[p] for p in preds[i]), default=0.0)
    after = [0.0] * len(names)  # the same through the strict descendants
    for a, c in sorted(edges, reverse=True):
        after[a] = max(after[a], work[c] + after[c])
    busiest = math.ceil(m / min(m, cost.cluster.n_devices))
    return max(before[i] + max(busiest * work[i], work[i] + after[i]) for i in range(len(names)))


def stage_floor_s(plan: Plan, cost: CostModel) -> float:
    """A lower bound of the plan's simulated iteration: its busiest replica's forwards and backwards
    (replicas take whole micro-batches round-robin, so one of ``r`` gets ``ceil(m / r)`` of them)."""
    floor = 0.0
    for stage in plan.stages:
        r, sizes = len(stage.ranks), stage.forward_sizes
        per = max(cost.forward_s(stage.layers, b, rank) + cost.backward_s(stage.layers, b, rank)
                  for b in set(sizes) for rank in stage.ranks)
        floor = max(floor, math.ceil(len(sizes) / r) * per)
    return floor


@dataclass
class _Search:
    """What one planner call has found so far, and where its time went."""

    scored: list[tuple[Candidate, float, int]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    pruned: int = 0
    search_s: float = 0.0
    simulate_s: float = 0.0

    def beaten(self, floor: float, prune: bool) -> bool:
        """Whether a plan that cannot be faster than ``floor`` seconds surely ranks below the best found
        (by more than :data:`PRUNE_MARGIN`, beyond the 3 significant digits of the ranking)."""
        best = min((c.iteration_s for c, _, _ in self.scored if c.feasible), default=math.inf)
        return prune and floor > PRUNE_MARGIN * best


def _candidates_at(problem: PlanningProblem, tree: SPNode, edges: tuple[tuple[int, int], ...],
                   sizes: tuple[int, ...], found: _Search, order: int, prune: bool) -> None:
    """Score and memory-check the plans at one equal partition; add them, with their DP bottleneck TPS."""
    b = max(sizes)
    start = time.perf_counter()
    est = StageEstimator(problem, edges, b, len(sizes))
    strategies = search(tree, est, problem.cost.cluster.n_devices, prune=prune)
    found.search_s += time.perf_counter() - start
    if not strategies.strategies:
        found.skipped.append((b, "no strategy fits the devices' memory"))
        return
    cluster = problem.cost.cluster
    packings = (False, True) if len({d.node for d in cluster.devices}) > 1 else (False,)  # one node: the same
    for k, s in enumerate(_chosen(strategies, problem.batch_size)):
        placed = [to_plan(problem, edges, s.stages, sizes, packed=packed) for packed in packings]
        if len(placed) == 2 and placed[1] == placed[0]:
            placed = placed[:1]
        for packed, (plan, cluster) in enumerate(placed):
            _simulated(problem, plan, cluster, found, (s.worst_tps, 2 * (order * (KEEP_PER_SIZE + 1) + k) + packed),
                       " packed" if packed else "", prune)


def _simulated(problem: PlanningProblem, plan: Plan, cluster: Cluster, found: _Search, rank: tuple[float, int],
               placement: str, prune: bool) -> None:
    """Score and memory-check one plan, unless a bound says it cannot win; ``rank``: its DP bottleneck TPS and
    its order among the candidates (ties)."""
    sub_cost = problem.cost.on(cluster)
    if found.beaten(stage_floor_s(plan, sub_cost), prune):
        found.pruned += 1
        return
    start = time.perf_counter()
    b = max(plan.stages[0].forward_sizes)
    label = f"graphpipe b={b} {'-'.join(st.label for st in plan.stages)}{placement}"
    choice = problem.constraints.recompute
    candidate = memory_checked(score(as_chosen(plan, choice), sub_cost, label=label), sub_cost, problem.optimizer)
    if not candidate.feasible and choice == "auto":
        candidate = recomputing(candidate, sub_cost, problem.optimizer) or candidate
    found.simulate_s += time.perf_counter() - start
    if candidate.feasible:
        found.scored.append((candidate, *rank))
    else:
        found.skipped.append((b, candidate.infeasible))


def graphpipe_plans(spec: MethodSpec) -> bool:
    """The methods the graphpipe planner plans: those whose stages may form a DAG (method graph)."""
    return spec.graph is StageGraph.DAG


def plan_graphpipe(problem: PlanningProblem, *, prune: bool = True) -> PlanningResult:
    """The fastest feasible GraphPipe plan over micro-batch sizes (module docstring).

    Args:
        problem: the model (``ModelRef.of(graph)``: its edges for a DAG), the cost model, batch and optimizer.
        prune: skip the sizes and strategies whose lower bounds (:func:`work_floor_s`,
            :func:`stage_floor_s`) are slower than a plan already simulated; the answer is the same.

    Returns:
        The plan (method ``graph``), its (sub-)cluster, every feasible candidate fastest first, and a
        :class:`GraphPipeReport`.

    Raises:
        UserError: no micro-batch size gives a plan that fits (says what to change).
    """
    edges = layer_edges(problem)
    tree = decompose(len(problem.layer_names), edges)
    options = micro_batch_options(problem.batch_size, problem.smallest_microbatch)
    floors = [max(work_floor_s(problem, sizes), path_floor_s(problem, edges, sizes)) for sizes in options]
    found = _Search()
    for k in sorted(range(len(options)), key=floors.__getitem__) if prune else range(len(options)):
        if found.beaten(floors[k], prune):
            found.pruned += 1
            continue
        _candidates_at(problem, tree, edges, options[k], found, k, prune)
    if not found.scored:
        reasons = "; ".join(f"b={b}: {why}" for b, why in found.skipped[:3])
        raise UserError(f"the graphpipe planner found no plan that fits ({reasons}); use a smaller batch, more "
                        "devices or devices with more memory")
    found.scored.sort(key=lambda ct: (rank_key(ct[0]), ct[2]))
    best, tps, _ = found.scored[0]
    assert best.cluster is not None
    b = max(best.plan.stages[0].forward_sizes)
    log.info("graphpipe: chose %s: %.6f s", best.label, best.iteration_s)
    report = GraphPipeReport(tree.describe(), b, tps, tuple(found.skipped), found.pruned, found.search_s,
                             found.simulate_s)
    return PlanningResult("graphpipe", best.plan, best.cluster, tuple(c for c, _, _ in found.scored), report)
