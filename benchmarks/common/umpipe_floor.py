"""The floor under every plan of UMPIPE's simulated benchmark: how fast any micro-batching of any cuts could run.

    floor = flush_floor_s(cost, [layer.name for layer in graph.layers], batch=64, n_stages=4)   # seconds

The benchmark's gains (bench_umpipe_sim) are ``T_baseline / T``; ``T_baseline / floor`` bounds them
from above: no plan that the benchmark's planners can return (gpipe, 1f1b and UMPIPE's flush order,
each stage with its own partitions, any stage cuts; PAPERS.md §1.4) beats the floor in the event
simulator. It tells whether a target is out of reach of *every* plan, not only of the search.

Every layer ``l`` runs on one device, one piece of work at a time, and every sample goes forward
through layers ``0 … l−1`` before ``l`` sees it and backward through them after ``l`` is done with
it. With ``f_i(b)``, ``g_i(b)`` layer ``i``'s forward and backward seconds on ``b`` samples (the
profile's, loss and data copies included; :class:`~pipetrain.cost.CostModel`, without its
per-action overhead) and the batch ``B``::

    fill_l  = Σ_{i<l} min_b f_i(b)              # the first sample's forward through the layers above l
    work_l  = min over compositions x of B of Σ_j (f_l(x_j) + g_l(x_j))   # l's own work, cheapest partition
    drain_l = Σ_{i<l} min_b g_i(b)              # the last gradient's backward through the layers above l
    layer   = max_l (fill_l + work_l + drain_l)
    stages  = min over cuts of the layers into at most K stages of max over stages s = [a, b] of
              (fill_a + Σ_{l=a..b} work_l + drain_a)
    floor   = max(layer, stages)

(pipetrain's; the per-stage form for one given plan is :mod:`pipetrain.simulate.bounds`). ``layer``
holds whatever the cuts (a layer sharing a device with its neighbours only waits longer); ``stages``
because a device runs its stage's layers one at a time (a dynamic program over the cuts, as a
linear partition). On few devices ``stages`` is the larger, on one device per layer ``layer``. Left out, since
they only add: transfers, the optimizer step, a recomputed forward (a stage whose backward partition
differs from its forward one), a layer's partition being its stage's rather than its own. It assumes
identical devices (the benchmark's clusters; rank 0's costs) and a backward that is not split into B
and W (a split one could defer W past the drain).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipetrain.cost import CostModel

__all__ = ["cheapest_partition_s", "flush_floor_s"]


def cheapest_partition_s(seconds: Callable[[int], float], batch: int) -> float:
    """The least ``Σ_j seconds(x_j)`` over the compositions ``x`` of ``batch`` (every way to cut the
    batch into micro-batches, in order): an O(batch²) dynamic program over the prefix sizes.

    >>> cheapest_partition_s(lambda b: 1.0 + b, 4)     # a fixed cost per micro-batch: one micro-batch
    5.0
    >>> cheapest_partition_s(lambda b: float(b * b), 4)  # convex: micro-batches of one sample
    4.0
    """
    cost = [seconds(b) for b in range(1, batch + 1)]  # cost[b - 1]: one micro-batch of b samples
    best = [0.0]  # best[n]: the cheapest partition of the first n samples
    for n in range(1, batch + 1):
        best.append(min(best[n - size] + cost[size - 1] for size in range(1, n + 1)))
    return best[batch]


def flush_floor_s(cost: CostModel, layers: Sequence[str], batch: int, n_stages: int) -> float:
    """Seconds that every plan of ``layers`` (a chain, in order) at ``batch`` samples on at most
    ``n_stages`` stages, one device each, takes at least on ``cost``'s cluster of identical devices
    (module docstring).

    Args:
        cost: the cost model; rank 0's device stands for every device.
        layers: the model's layer names, first to last.
        batch: the mini-batch size B.
        n_stages: the most stages (devices) K.

    Returns:
        ``max(layer, stages)`` of the module docstring, in seconds.
    """
    overhead = cost.action_overhead_s

    def forward(name: str, b: int) -> float:
        return cost.forward_s((name,), b, 0) - overhead

    def backward(name: str, b: int) -> float:
        return cost.backward_s((name,), b, 0) - overhead

    sizes = range(1, batch + 1)
    work = [cheapest_partition_s(lambda b: forward(name, b) + backward(name, b), batch)  # noqa: B023
            for name in layers]
    fill, drain = [0.0], [0.0]  # fill[a], drain[a]: the layers above layer a
    for name in layers:
        fill.append(fill[-1] + min(forward(name, b) for b in sizes))
        drain.append(drain[-1] + min(backward(name, b) for b in sizes))
    per_layer = max(fill[i] + work[i] + drain[i] for i in range(len(layers)))
    return max(per_layer, _cut_floor(work, fill, drain, n_stages))


def _cut_floor(work: Sequence[float], fill: Sequence[float], drain: Sequence[float], n_stages: int) -> float:
    """``min`` over the cuts of ``len(work)`` layers into at most ``n_stages`` stages of the largest
    ``fill[a] + Σ work[a:b] + drain[a]`` over their stages ``[a, b)``."""
    n = len(work)
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [0.0] + [inf] * n  # best[j]: the first j layers in the stages so far
    for _ in range(n_stages):
        best = [0.0] + [min(best[j], *(max(best[a], fill[a] + prefix[j] - prefix[a] + drain[a]) for a in range(j)))
                        for j in range(1, n + 1)]
    return best[n]
