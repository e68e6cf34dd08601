"""GraphPipe's DP over (SP subgraph, device count) and the binary search on the target TPS
(GraphPipe §3.3, Algorithm 1; in-flight counts §3.4).

    strategies = search(tree, estimator, n_devices=8)
    best = min(strategies.values(), key=Strategy.key)
    best.stages      # ((layer indices, replicas), ...), every stage's TPS <= best.worst_tps

``DP(G, n, d)``, memoised, is the strategy for the SP subgraph ``G`` on exactly ``n`` devices, when
the stage after ``G``'s sink has ``d`` stages on its longest path to the sink (0 for the model's
sink), that keeps every stage's TPS within the target and every device within its memory, and
among those **minimises the in-flight micro-batches of ``G``'s source stage(s)** (its depth), then
the worst stage TPS. Series and parallel nodes are n-ary (:mod:`.sp`); a run of their first ``h``
children is solved by peeling the last part:

* **one stage** over children ``k..h-1`` on ``r`` devices (``r`` a power of two, data parallel,
  ``r <= m`` micro-batches), with depth ``d + 1`` in a series node and ``d + 1`` beside the rest in
  a parallel node; the first ``k`` children take the other ``n - r`` devices;
* **the last child on its own**, recursively on ``n2`` devices, the first ``h - 1`` children on
  ``n - n2``: in series the rest sees the child's source depth as its ``d`` (GraphPipe solves the
  downstream part first), in parallel both see ``d`` and the depth is the larger of the two.

Smaller ``d`` never hurts (memory grows with in-flight), so minimising the source depth composes.
Cost per target: ``O(Σ_nodes h · N · D · (h · log N + N))`` for ``N`` devices, ``D`` distinct depths.
The search over targets halves ``[0, TPS of the min-depth plan]`` to a relative 1e-3.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetrain.planners.graphpipe.costs import StageEstimator
from pipetrain.planners.graphpipe.sp import SPNode

__all__ = ["Stage", "Strategy", "search", "solve"]

Stage = tuple[tuple[int, ...], int]
"""A stage: its layer indices (increasing) and its replica count."""


@dataclass(frozen=True)
class Strategy:
    """A set of stages covering an SP subgraph.

    Attributes:
        depth: stages on the longest path from its source stage(s) to the model's sink.
        worst_tps: the largest stage TPS (seconds per sample).
        stages: ``(layers, replicas)`` per stage, in no particular order.
    """

    depth: int
    worst_tps: float
    stages: tuple[Stage, ...]

    def key(self) -> tuple[int, float, int]:
        """GraphPipe's preference: least source in-flight, then the lowest bottleneck, then fewest stages."""
        return self.depth, self.worst_tps, len(self.stages)

    @property
    def devices(self) -> int:
        return sum(r for _, r in self.stages)


def _better(a: Strategy | None, b: Strategy | None) -> Strategy | None:
    if a is None:
        return b
    if b is None:
        return a
    return b if b.key() < a.key() else a


class _Solver:
    """One DP run at one target TPS (the memo is valid for that target only)."""

    def __init__(self, tree: SPNode, est: StageEstimator, target: float) -> None:
        self.est, self.target = est, target
        self.nodes: list[SPNode] = []
        self.children: list[tuple[int, ...]] = []
        self.root = self._index(tree)
        self.memo: dict[tuple[int, int, int, int], Strategy | None] = {}
        self.unions: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self.max_r = 1
        while self.max_r * 2 <= est.n_micro:
            self.max_r *= 2

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
        return Strategy(depth, tps, ((layers, r),))

    def full(self, v: int, n: int, d: int) -> Strategy | None:
        """DP(G_v, n, d) (module docstring)."""
        if not self.children[v]:
            return self.stage(self.nodes[v].layers, n, d + 1) if n & (n - 1) == 0 and n <= self.max_r else None
        return self.run(v, len(self.children[v]), n, d)

    def run(self, v: int, h: int, n: int, d: int) -> Strategy | None:
        """DP over the first ``h`` children of node ``v`` on exactly ``n`` devices."""
        key = (v, h, n, min(d, self.est.n_micro))
        if key not in self.memo:
            self.memo[key] = None if n < 1 else _better(self._one_stage(v, h, n, d), self._last_child(v, h, n, d))
        return self.memo[key]

    def _join(self, v: int, head: int, n: int, d: int, tail: Strategy | None) -> Strategy | None:
        """``tail`` after (series) or beside (parallel) the first ``head`` children on ``n`` devices."""
        if tail is None:
            return None
        if head == 0:
            return tail if n == 0 else None
        series = self.nodes[v].kind == "series"
        rest = self.run(v, head, n, tail.depth if series else d)
        if rest is None:
            return None
        depth = rest.depth if series else max(rest.depth, tail.depth)
        return Strategy(depth, max(rest.worst_tps, tail.worst_tps), rest.stages + tail.stages)

    def _one_stage(self, v: int, h: int, n: int, d: int) -> Strategy | None:
        best: Strategy | None = None
        r = 1
        while r <= min(n, self.max_r):
            for k in range(h - 1, -1, -1):
                tail = self.stage(self._union(v, k, h), r, d + 1)
                best = _better(best, self._join(v, k, n - r, d, tail))
            r *= 2
        return best

    def _last_child(self, v: int, h: int, n: int, d: int) -> Strategy | None:
        last = self.children[v][h - 1]
        if not self.children[last]:
            return None  # a leaf on its own is a one-stage run
        best: Strategy | None = None
        for n2 in range(1, n + 1):
            best = _better(best, self._join(v, h - 1, n - n2, d, self.full(last, n2, d)))
        return best


def solve(tree: SPNode, est: StageEstimator, n_devices: int, target: float) -> dict[int, Strategy]:
    """For each device count ``n <= n_devices``, DP(root, n, 0) at ``target``, where one exists."""
    solver = _Solver(tree, est, target)
    found = {}
    for n in range(1, n_devices + 1):
        s = solver.full(solver.root, n, 0)
        if s is not None:
            found[n] = s
    return found


def search(tree: SPNode, est: StageEstimator, n_devices: int, rel_tol: float = 1e-3) -> dict[int, Strategy]:
    """Algorithm 1: the smallest target TPS with a strategy (to ``rel_tol``), and its strategies by
    device count; empty when no strategy fits the devices' memory at any target."""
    best = solve(tree, est, n_devices, float("inf"))
    if not best:
        return {}
    lo, hi = 0.0, min(s.worst_tps for s in best.values())
    best = solve(tree, est, n_devices, hi)
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        found = solve(tree, est, n_devices, mid)
        if found:
            best, hi = found, min(s.worst_tps for s in found.values())
        else:
            lo = mid
    return best
