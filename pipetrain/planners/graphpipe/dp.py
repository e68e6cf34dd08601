"""GraphPipe's DP over (SP subgraph, device count) and the binary search on the target TPS
(GraphPipe §3.3, Algorithm 1; in-flight counts §3.4).

    strategies, shallowest, visited = search(tree, estimator, n_devices=8)
    best = min(strategies.values(), key=Strategy.key)
    best.stages      # ((layer indices, replicas), ...), every stage's TPS <= best.worst_tps

``DP(G, n, d)``, memoised, is the strategy for the SP subgraph ``G`` on exactly ``n`` devices, when
the stage after ``G``'s sink has ``d`` stages on its longest path to the sink (0 for the model's
sink), that keeps every stage's TPS within the target and every device within its memory, and
among those **minimises the in-flight micro-batches of ``G``'s source stage(s)** (its depth), then
the latency (one micro-batch's seconds along its slowest path: the fill and drain), then the worst
stage TPS. The paper's second criterion is the worst TPS; but at a target every strategy is within
it, and the binary search drives the target to the least bottleneck anyway, while among equal
bottlenecks the one with more, smaller stages simulates faster (issue 29: MMT on 8 GPUs, 9 layers
× 2 replicas beside 18 × 4 simulates 0.47 s, four stages of 9 × 2 0.43 s, at the same TPS).
Series and parallel nodes are n-ary (:mod:`.sp`); a run of their first ``h``
children is solved by peeling the last part:

* **one stage** over children ``k..h-1`` on ``r`` devices (any ``r <= m`` micro-batches and ``<= N``,
  data parallel), with depth ``d + 1`` in a series node and ``d + 1`` beside the rest in a parallel
  node; the first ``k`` children take the other ``n - r`` devices;
* **the last child on its own**, recursively on ``n2`` devices, the first ``h - 1`` children on
  ``n - n2``: in series the rest sees the child's source depth as its ``d`` (GraphPipe solves the
  downstream part first), in parallel both see ``d`` and the depth is the larger of the two;
* **the merge folded into a branch** (series node, after a parallel child ``k``): children
  ``k+1..h-1`` (MMT's ``concat`` and ``head``) share one stage with a tail of one branch ``i`` of
  child ``k`` (its series children ``j..``; the whole branch for ``j = 0``). Such a stage is convex
  (C1): every edge out of the branch tail and out of the merge stays inside it, so no path leaves
  and re-enters. The rest of child ``k`` (branch ``i``'s first ``j`` children beside the other
  branches, at depth ``d + 1``) is memoised per ``(i, j, n, d)``; without this shape the merge
  needs a stage, a device, of its own, and 4 equal branches share ``N - 1`` devices.

Smaller ``d`` never hurts (memory grows with in-flight), so minimising the source depth composes.
Per target, each memo entry tries ``h`` stages × ``N`` replica counts; the stages feasible at the
target are tabled per ``(layers, depth)`` from the estimator's cached TPS rows. Two shortcuts give
the same answers with less work: a series run that fits as one stage on all ``n`` devices is that
stage (depth ``d + 1``; every other strategy has ``>= d + 2``), and a branch identical to an earlier
one (:func:`twins`) is solved as that one and renumbered (MMT: one branch solved of four; on 16 and 32
GPUs the two cut the DP's CPU time 3–4×, issue 29). The search over targets
halves ``[every layer's work spread evenly over the devices, TPS of the min-depth plan]`` (no strategy
has its bottleneck below the even spread) to a relative 1e-2 (the TPS model is itself a few per cent
from the simulator, which ranks the answers). The min-depth plan is the whole model as one
data-parallel stage when that fits memory; only otherwise does a DP with no target find it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import NamedTuple

from pipetrain.planners.graphpipe.costs import StageEstimator
from pipetrain.planners.graphpipe.sp import SPNode

__all__ = ["Searched", "Stage", "Strategy", "search", "solve", "twins"]

Stage = tuple[tuple[int, ...], int]
"""A stage: its layer indices (increasing) and its replica count."""


@dataclass(frozen=True, slots=True)
class Strategy:
    """A set of stages covering an SP subgraph.

    Attributes:
        depth: stages on the longest path from its source stage(s) to the model's sink.
        worst_tps: the largest stage TPS (seconds per sample).
        stages: ``(layers, replicas)`` per stage, in no particular order.
        devices: the replicas of all stages together.
        latency: seconds of one micro-batch along the slowest path through the stages (their
            :meth:`~.costs.StageEstimator.latency_s` summed in series, the largest in parallel): the
            fill and drain the TPS leaves out.
    """

    depth: int
    worst_tps: float
    stages: tuple[Stage, ...]
    devices: int
    latency: float = 0.0

    def key(self) -> tuple[int, float, float, int]:
        """The DP's preference within a target: least source in-flight (GraphPipe's), then the least
        latency, then the lowest bottleneck, then fewest stages."""
        return self.depth, self.latency, self.worst_tps, len(self.stages)


def _joined(best: Strategy | None, rest: Strategy, tail: Strategy, series: bool) -> Strategy:
    """The better (:func:`_better`) of ``best`` and the stages of ``rest`` and ``tail`` together: one
    after the other (``series``: the depth is ``rest``'s, which was solved below ``tail``; the
    latencies add) or side by side (the larger depth and latency); built only when it wins."""
    if series:
        depth, latency = rest.depth, rest.latency + tail.latency
    else:
        depth, latency = max(rest.depth, tail.depth), max(rest.latency, tail.latency)
    worst = max(rest.worst_tps, tail.worst_tps)
    if best is not None and (best.depth, best.latency, best.worst_tps, len(best.stages)) <= (
            depth, latency, worst, len(rest.stages) + len(tail.stages)):
        return best
    return Strategy(depth, worst, rest.stages + tail.stages, rest.devices + tail.devices, latency)


def _better(a: Strategy | None, b: Strategy | None) -> Strategy | None:
    """``b`` when its key (:meth:`Strategy.key`) is less than ``a``'s, else ``a`` (ties keep the first found)."""
    if a is None:
        return b
    if b is None:
        return a
    if b.depth != a.depth:
        return b if b.depth < a.depth else a
    if b.latency != a.latency:
        return b if b.latency < a.latency else a
    if b.worst_tps != a.worst_tps:
        return b if b.worst_tps < a.worst_tps else a
    return b if len(b.stages) < len(a.stages) else a


def _shape(node: SPNode, index: dict[int, int]) -> str:
    """The node's SP tree with its layers renumbered by ``index``."""
    if node.kind == "leaf":
        return str(index[node.layers[0]])
    return f"{node.kind[0]}{int(node.linearised)}({','.join(_shape(c, index) for c in node.children)})"


def twins(tree: SPNode, est: StageEstimator) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The layers of every parallel branch identical to an earlier branch of the same node, each with
    the layers of the first such branch (its representative): the same SP shape, the same layer
    profiles (but names), the same tied parameters, the same edges inside and to the same layers
    outside. Two twins' DPs differ only in their layer numbers, so :class:`_Solver` solves the
    representative's and renumbers it (MMT's 4 branches: 1 of 4 solved); folding the merge into
    either twin gives strategies of equal key, and the DP keeps the first, so :meth:`_Solver._fold`
    tries only the representative."""
    found: dict[tuple[int, ...], tuple[int, ...]] = {}
    ties = est.cost.profile.ties

    def signature(branch: SPNode) -> object:
        index = {layer: k for k, layer in enumerate(branch.layers)}
        rows = tuple((replace(est.cost.profile.layer(est.names[i]), name=""),
                      tuple(sorted(index.get(p, -1 - p) for p in est.preds[i])),
                      tuple(sorted(index.get(c, -1 - c) for c in est.succs[i])),
                      tuple(k for k, tie in enumerate(ties) if est.names[i] in tie.layers)) for i in branch.layers)
        return _shape(branch, index), rows

    def visit(node: SPNode) -> None:
        if node.kind == "parallel":
            seen: dict[object, tuple[int, ...]] = {}
            for branch in node.children:
                first = seen.setdefault(signature(branch), branch.layers)
                if first != branch.layers:
                    found[branch.layers] = first
        for child in node.children:
            visit(child)

    visit(tree)
    return found


def _renumbered(s: Strategy | None, layers: dict[int, int]) -> Strategy | None:
    """``s`` with its stages' layers renumbered by ``layers`` (a representative's strategy for its twin)."""
    if s is None:
        return None
    stages = tuple((tuple(layers[i] for i in st), r) for st, r in s.stages)
    return Strategy(s.depth, s.worst_tps, stages, s.devices, s.latency)


class _Solver:
    """One DP run at one target TPS (the memo is valid for that target only); ``twin``: the branches
    :func:`twins` finds, each solved as its representative, renumbered, and not tried for a fold."""

    def __init__(self, tree: SPNode, est: StageEstimator, target: float,
                 twin: dict[tuple[int, ...], tuple[int, ...]] | None = None) -> None:
        self.est, self.target = est, target
        self.twin = twin or {}
        self.nodes: list[SPNode] = []
        self.children: list[tuple[int, ...]] = []
        self.root = self._index(tree)
        where = {node.layers: v for v, node in enumerate(self.nodes)}  # SP nodes have distinct layer sets
        self.alias = {where[t]: (where[r], dict(zip(r, t, strict=True))) for t, r in self.twin.items()}
        self.memo: dict[tuple[int, int, int, int, int], Strategy | None] = {}
        self.folds: dict[tuple[int, int, int, int, int], Strategy | None] = {}
        self.cuts: dict[tuple[int, int, int, int, int], Strategy | None] = {}
        self.unions: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self.feasible: dict[tuple[tuple[int, ...], int], tuple[list[Strategy], list[int]]] = {}

    def _index(self, node: SPNode) -> int:
        at = len(self.nodes)
        self.nodes.append(node)
        self.children.append(())
        self.children[at] = tuple(self._index(c) for c in node.children)
        return at

    def _union(self, v: int, k: int, h: int) -> tuple[int, ...]:
        key = (v, k, h)
        if key not in self.unions:
            kids = self.children[v]
            self.unions[key] = tuple(sorted(i for c in kids[k:h] for i in self.nodes[c].layers))
        return self.unions[key]

    def stage(self, layers: tuple[int, ...], r: int, depth: int) -> Strategy | None:
        """The whole of ``layers`` as one stage on ``r`` devices, if within the target and memory."""
        tps = self.est.tps(layers, r)
        if tps > self.target or not self.est.fits(layers, r, min(depth, self.est.n_micro)):
            return None
        return Strategy(depth, tps, ((layers, r),), r, self.est.latency(layers))

    def stages(self, layers: tuple[int, ...], depth: int, most: int) -> list[Strategy]:
        """``layers`` as one stage on each replica count up to ``most`` that is within the target and
        memory, fewest replicas first."""
        key = (layers, depth)
        found = self.feasible.get(key)
        if found is None:
            fewest = self.est.fewest_fitting(layers, min(depth, self.est.n_micro))
            row = self.est.tps_row(layers)
            latency = self.est.latency(layers)
            options = [Strategy(depth, t, ((layers, r),), r, latency)
                       for r, t in enumerate(row[fewest - 1:], start=fewest) if t <= self.target]
            found = options, [s.devices for s in options]
            self.feasible[key] = found
        options, counts = found
        if not counts or counts[-1] <= most:
            return options
        return options[:bisect_right(counts, most)]

    def full(self, v: int, n: int, d: int) -> Strategy | None:
        """DP(G_v, n, d) (module docstring)."""
        if not self.children[v]:
            return self.stage(self.nodes[v].layers, n, d + 1) if n <= self.est.max_replicas else None
        return self.run(v, len(self.children[v]), n, d)

    def run(self, v: int, h: int, n: int, d: int, skip: int = -1) -> Strategy | None:
        """DP over the first ``h`` children of node ``v`` but child ``skip`` on exactly ``n`` devices."""
        if skip >= h:
            skip = -1
        if skip == h - 1:
            return self._empty(n, d) if h == 1 else self.run(v, h - 1, n, d)
        key = (v, h, n, d, skip)
        if key in self.memo:
            return self.memo[key]
        found = None
        if v in self.alias:
            rep, layers = self.alias[v]
            found = _renumbered(self.run(rep, h, n, d, skip), layers)
        elif h >= 2 and self.nodes[v].kind == "series" and 1 <= n <= self.est.max_replicas and (
                whole := self.stage(self._union(v, 0, h), n, d + 1)) is not None:
            found = whole  # depth d + 1: any other strategy has a stage after another, depth >= d + 2
        elif n >= 1:
            found = self._last_child(v, h, n, d, skip, self._one_stage(v, h, n, d, skip))
            found = self._folded(v, h, n, d, found)
        self.memo[key] = found
        return found

    @staticmethod
    def _empty(n: int, d: int) -> Strategy | None:
        """No layers: a strategy on no devices."""
        return Strategy(d, 0.0, (), 0) if n == 0 else None

    def _join(self, best: Strategy | None, v: int, head: int, n: int, d: int, tail: Strategy,
              skip: int = -1) -> Strategy | None:
        """The better of ``best`` and ``tail`` after (series) or beside (parallel) the first ``head``
        children but ``skip`` on ``n`` devices."""
        if head == 0 or (head == 1 and skip == 0):
            return _better(best, tail) if n == 0 else best
        series = self.nodes[v].kind == "series"
        rest = self.run(v, head, n, tail.depth if series else d, skip)
        return best if rest is None else _joined(best, rest, tail, series)

    def _one_stage(self, v: int, h: int, n: int, d: int, skip: int) -> Strategy | None:
        best: Strategy | None = None
        for k in range(h - 1, skip, -1):
            for tail in self.stages(self._union(v, k, h), d + 1, n):
                best = self._join(best, v, k, n - tail.devices, d, tail, skip)
        return best

    def _last_child(self, v: int, h: int, n: int, d: int, skip: int, best: Strategy | None) -> Strategy | None:
        """The better of ``best`` and the last child on its own beside or after the rest."""
        last = self.children[v][h - 1]
        if not self.children[last]:
            return best  # a leaf on its own is a one-stage run
        for n2 in range(1, n + 1):
            tail = self.full(last, n2, d)
            if tail is not None:
                best = self._join(best, v, h - 1, n - n2, d, tail, skip)
        return best

    def _folded(self, v: int, h: int, n: int, d: int, best: Strategy | None) -> Strategy | None:
        """Series node: the better of ``best`` and the last children ``k+1..h-1`` after a parallel
        child ``k`` sharing a stage with a tail of one of its branches (module docstring), the first
        ``k`` children before it."""
        if self.nodes[v].kind != "series":
            return best
        for k in range(h - 2, -1, -1):
            if self.nodes[self.children[v][k]].kind != "parallel":
                continue
            for n2 in range(2, n + 1):
                tail = self._fold(v, k, h, n2, d)
                if tail is not None:
                    best = self._join(best, v, k, n - n2, d, tail)
        return best

    def _fold(self, v: int, k: int, h: int, n: int, d: int) -> Strategy | None:
        """Parallel child ``k`` of ``v`` and children ``k+1..h-1`` on ``n`` devices, the latter in one
        stage with a tail of one branch: the best over branches, tails and the stage's replicas."""
        key = (v, k, h, n, d)
        if key in self.folds:
            return self.folds[key]
        p, merge = self.children[v][k], self._union(v, k + 1, h)
        best: Strategy | None = None
        for i, branch in enumerate(self.children[p]):
            if self.nodes[branch].layers in self.twin:
                continue
            kids = self.children[branch] if self.nodes[branch].kind == "series" else ()
            for j in range(max(len(kids), 1)):  # the branch's first j children stay out of the stage
                tail = self._union(branch, j, len(kids)) if kids else self.nodes[branch].layers
                layers = tuple(sorted(merge + tail))
                for stage in self.stages(layers, d + 1, n - 1):
                    rest = self._cut(p, i, j, n - stage.devices, d + 1)
                    if rest is not None:
                        best = _joined(best, rest, stage, series=True)
        self.folds[key] = best
        return best

    def _cut(self, p: int, i: int, j: int, n: int, d: int) -> Strategy | None:
        """Parallel node ``p`` on ``n`` devices with branch ``i`` cut to its first ``j`` children (none: ``j = 0``)."""
        key = (p, i, j, n, d)
        if key in self.cuts:
            return self.cuts[key]
        h = len(self.children[p])
        if j == 0:
            best = self.run(p, h, n, d, skip=i)
        else:
            best = None
            for n1 in range(1, n):
                head = self.run(self.children[p][i], j, n1, d)
                others = self.run(p, h, n - n1, d, skip=i) if head is not None else None
                if head is not None and others is not None:
                    best = _joined(best, others, head, series=False)
        self.cuts[key] = best
        return best


def solve(tree: SPNode, est: StageEstimator, n_devices: int, target: float,
          twin: dict[tuple[int, ...], tuple[int, ...]] | None = None) -> dict[int, Strategy]:
    """For each device count ``n <= n_devices``, DP(root, n, 0) at ``target``, where one exists
    (``twin``: the branches :func:`twins` finds, solved once for all twins and folded into only the first)."""
    solver = _Solver(tree, est, target, twin)
    found = {}
    for n in range(1, n_devices + 1):
        s = solver.full(solver.root, n, 0)
        if s is not None:
            found[n] = s
    return found


def _one_stage_everywhere(tree: SPNode, est: StageEstimator) -> Strategy | None:
    """The whole model as one stage (data parallelism) on the replica count with the least TPS, if it
    fits memory on any: then the DP's least-depth answer with no target, found without the DP."""
    layers, row = tree.layers, est.tps_row(tree.layers)
    fewest = est.fewest_fitting(layers, 1)
    if fewest > est.max_replicas:
        return None
    r = min(range(fewest, est.max_replicas + 1), key=lambda k: (row[k - 1], k))
    return Strategy(1, row[r - 1], ((layers, r),), r, est.latency(layers))


class Searched(NamedTuple):
    """Algorithm 1's answer: ``strategies`` by device count at the smallest target found,
    ``shallowest``, GraphPipe's preferred strategy with no target (least depth, e.g. one stage on
    every device): the TPS leaves out the fill and drain that depth costs, so it is worth simulating;
    and ``visited``, every distinct strategy the search met at any target (the looser targets' have
    less latency and a higher bottleneck: the trade-off the planner's estimate ranks)."""

    strategies: dict[int, Strategy]
    shallowest: Strategy | None
    visited: tuple[Strategy, ...] = ()


def search(tree: SPNode, est: StageEstimator, n_devices: int, rel_tol: float = 1e-2, *,
           prune: bool = True) -> Searched:
    """Algorithm 1: the smallest target TPS with a strategy (to ``rel_tol``), and its strategies by
    device count; empty when no strategy fits the devices' memory at any target. ``prune``: solve twin
    branches (:func:`twins`) once and fold the merge into only the first of them (the same answer)."""
    twin = twins(tree, est) if prune else {}
    visited: dict[tuple[Stage, ...], Strategy] = {}

    def solved(target: float) -> dict[int, Strategy]:
        found = solve(tree, est, n_devices, target, twin)
        for s in found.values():
            visited.setdefault(tuple(sorted(s.stages)), s)
        return found

    shallowest = _one_stage_everywhere(tree, est)
    if shallowest is None:  # the whole model fits no replica count: ask the DP with no target
        best = solved(float("inf"))
        if not best:
            return Searched({}, None)
        shallowest = min(best.values(), key=Strategy.key)
        hi = min(s.worst_tps for s in best.values())
    else:
        hi = shallowest.worst_tps
    lo = min(est.balanced_tps(n_devices), 0.99 * hi)
    best = solved(hi)
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        found = solved(mid)
        if found:
            best, hi = found, min(s.worst_tps for s in found.values())
        else:
            lo = mid
    return Searched(best, shallowest, tuple(visited.values()))
