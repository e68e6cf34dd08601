"""A lower bound on every plan that keeps each stage on one rank: which of auto's runs cannot win.

    bound = single_rank_bound(cost, model.layers, batch)     # seconds, below any such plan's iteration
    if bound > best_s * (1 + BOUND_MARGIN): ...              # that run cannot beat best_s: auto skips it

At scale a plan that replicates stages (PipeDream's DP over layers, machines and replication,
docs/algorithms.md §3) can be many times faster than any plan that holds each layer on one device:
gpt1-14 at batch 512 on 512 A100s, 0.075 s against 4.2 s. The runs whose plans all keep a stage on one
rank (:attr:`~pipetrain.planners.spec.AutoRun.single_rank`: the micro-batch planners on a balanced
base, BaPipe, the interleaved planner) then spend most of auto's time without a chance of winning;
this bound lets auto skip them (pipetrain's, not a paper's).

The bound. In such a plan the rank that holds layer ``l`` runs its stage's forward and backward on
all ``B`` samples, in micro-batches ``x_1 + ... + x_m = B``, one action at a time. The cost model
prices a stage's action as one per-action overhead plus its layers' work over the device's speed
(:class:`~pipetrain.cost.CostModel`), so at least as layer ``l`` alone on that device; a split
backward (``B`` then ``W``) pays one more overhead, recomputing and sending only add. Hence

    T >= max_l min over compositions x of B of Σ_j (f_l(x_j) + g_l(x_j))      on the fastest device kind

where ``f_l(b) + g_l(b)`` is ``CostModel.forward_s((l,), b, r) + backward_s((l,), b, r)``. The inner
minimum is a min-plus recurrence over the batch, ``best[n] = min_b best[n - b] + c[b]``: ``B`` array
steps over ``[L, B]`` (``O(L B²)`` work; 14 layers at B = 512: milliseconds), after ``L B`` cost calls
per device kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipetrain.cost import CostModel

__all__ = ["BOUND_MARGIN", "single_rank_bound"]

BOUND_MARGIN = 0.02
"""Auto skips a run only when the bound exceeds the best plan so far by more than this fraction: far
beyond :func:`~pipetrain.planners.contract.rank_key`'s 3-digit ties and any rounding."""


def single_rank_bound(cost: CostModel, layers: Sequence[str], batch: int) -> float:
    """Seconds below the iteration time of every synchronous plan of ``layers`` at ``batch`` samples
    whose stages each run on one rank of ``cost``'s cluster (module docstring)."""
    devices = cost.cluster.devices
    ranks = {(d.kind, d.speed): r for r, d in reversed(list(enumerate(devices)))}.values()  # one per kind and speed
    sizes = range(1, batch + 1)
    per_rank = []
    for r in ranks:
        c = np.array([[0.0] + [cost.forward_s((name,), b, r) + cost.backward_s((name,), b, r) for b in sizes]
                      for name in layers])  # [L, B + 1]
        per_rank.append(_min_compositions(c))
    return float(np.max(np.min(per_rank, axis=0)))


def _min_compositions(c: np.ndarray) -> np.ndarray:
    """``[L]``: per row, the least ``Σ_j c[x_j]`` over compositions ``x`` of ``B`` (``c``: ``[L, B + 1]``)."""
    n_rows, width = c.shape
    best = np.zeros((n_rows, width))
    for n in range(1, width):
        best[:, n] = (best[:, n - 1::-1] + c[:, 1:n + 1]).min(axis=1)
    out: np.ndarray = best[:, -1]
    return out
