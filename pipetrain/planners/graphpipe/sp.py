"""Series-parallel (SP) decomposition of a layer DAG (GraphPipe §3.3, §3.5).

    tree = decompose(6, [(0, 1), (1, 3), (3, 4), (2, 4), (4, 5)])
    tree.kind, [c.layers for c in tree.children]
    # "series", [(0, 1, 2, 3), (4,), (5,)]: Parallel(Series(0, 1, 3), 2), then 4, then 5

The layers are numbered ``0..L-1`` in a topological order (``LayerGraph`` keeps them so) and the
edges ``(src, dst)`` go from lower to higher numbers. A convex set of layers ``V`` is split

* **in parallel** when its induced subgraph falls apart into several weakly connected components
  (branches with no edge between them: GraphPipe's branches sharing source and sink, once the shared
  source and sink have been split off in series);
* **in series** at every cut ``V = P ∪ S`` of the topological order where every layer of ``P``
  reaches every layer of ``S``: the articulation points, nodes every source→sink path crosses, are
  the one-layer factors. Splitting at *every* such cut gives an n-ary series node.

A connected set with more than one layer and no series cut is not series-parallel (e.g. the "N"
graph ``a→c, b→c, b→d``). GraphPipe converts such a graph into an arithmetically identical SP
graph; we instead **linearise** it: a ``series`` node of its single layers in topological order
with ``linearised=True``. Every contiguous run of a topological order is convex, so the DP's stages
stay valid; only the concurrency inside that part is lost.

Reachability uses Python ints as bit sets (bit ``j`` of ``reach[i]``: layer ``j`` is reachable from
``i``), so the whole decomposition is ``O(L² / w)`` per level with ``w`` the word size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

from pipetrain.errors import UserError

__all__ = ["SPNode", "decompose", "reachability"]

SPKind = Literal["leaf", "series", "parallel"]


@dataclass(frozen=True)
class SPNode:
    """One node of the SP tree.

    Attributes:
        kind: ``leaf`` (one layer), ``series`` (children run one after another) or ``parallel``
            (children are independent branches).
        layers: the layer indices it covers, increasing.
        children: ``series``: in dataflow order; ``parallel``: ordered by their first layer.
        linearised: a non-SP part flattened into a series of its layers (module docstring).
    """

    kind: SPKind
    layers: tuple[int, ...]
    children: tuple[SPNode, ...] = field(default=())
    linearised: bool = False

    def describe(self) -> str:
        """A compact text form: ``S(P(S(0,1,3),2),4,5)``."""
        if self.kind == "leaf":
            return str(self.layers[0])
        tag = "L" if self.linearised else ("S" if self.kind == "series" else "P")
        return f"{tag}({','.join(c.describe() for c in self.children)})"


def reachability(n_layers: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """``reach[i]``: the bit set of layers reachable from ``i`` by a path of one edge or more.

    Raises:
        UserError: an edge that does not go from a lower to a higher layer index.
    """
    succ: list[list[int]] = [[] for _ in range(n_layers)]
    for a, b in edges:
        if not 0 <= a < b < n_layers:
            raise UserError(f"edge ({a}, {b}) does not go forward in the layer order; list the layers in a "
                            "topological order")
        succ[a].append(b)
    reach = [0] * n_layers
    for i in range(n_layers - 1, -1, -1):
        for j in succ[i]:
            reach[i] |= reach[j] | (1 << j)
    return reach


def _bits(mask: int) -> tuple[int, ...]:
    out, i = [], 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def _components(members: tuple[int, ...], adjacent: list[int]) -> list[int]:
    """The weakly connected components of the subgraph induced on ``members``, as bit sets."""
    todo = 0
    for v in members:
        todo |= 1 << v
    found = []
    while todo:
        start = todo & -todo
        comp, frontier = start, start
        while frontier:
            v = (frontier & -frontier).bit_length() - 1
            frontier &= frontier - 1
            new = adjacent[v] & todo & ~comp
            comp |= new
            frontier |= new
        todo &= ~comp
        found.append(comp)
    return found


def _series_cuts(members: tuple[int, ...], reach: list[int]) -> list[int]:
    """Positions ``k`` where ``members[:k]`` all reach all of ``members[k:]`` (members in topological order)."""
    mask = 0
    for v in members:
        mask |= 1 << v
    cuts, common, prefix = [], -1, 0
    for k, v in enumerate(members[:-1], start=1):
        common &= reach[v]
        prefix |= 1 << v
        if mask & ~prefix & ~common == 0:
            cuts.append(k)
    return cuts


def _decompose(members: tuple[int, ...], reach: list[int], adjacent: list[int]) -> SPNode:
    if len(members) == 1:
        return SPNode("leaf", members)
    comps = _components(members, adjacent)
    if len(comps) > 1:
        parts = sorted((_bits(c) for c in comps), key=lambda p: p[0])
        return SPNode("parallel", members, tuple(_decompose(p, reach, adjacent) for p in parts))
    cuts = _series_cuts(members, reach)
    if not cuts:
        return SPNode("series", members, tuple(SPNode("leaf", (v,)) for v in members), linearised=True)
    bounds = [0, *cuts, len(members)]
    parts = [members[a:b] for a, b in pairwise(bounds)]
    return SPNode("series", members, tuple(_decompose(p, reach, adjacent) for p in parts))


def decompose(n_layers: int, edges: Sequence[tuple[int, int]]) -> SPNode:
    """The SP tree of the DAG on layers ``0..n_layers-1`` (module docstring).

    Args:
        n_layers: ``L``, the layer count.
        edges: ``(src, dst)`` index pairs, ``src < dst``; empty means the chain ``0 → 1 → … → L-1``.

    Returns:
        The root, covering every layer; a leaf for ``L = 1``.
    """
    if n_layers < 1:
        raise UserError("the model has no layers; give at least one")
    pairs = list(edges) if edges else [(i, i + 1) for i in range(n_layers - 1)]
    reach = reachability(n_layers, pairs)
    adjacent = [0] * n_layers
    for a, b in pairs:
        adjacent[a] |= 1 << b
        adjacent[b] |= 1 << a
    return _decompose(tuple(range(n_layers)), reach, adjacent)
