"""A balanced partition for the V placement (method ``zbv``, Qi et al. 2024 §6; pipetrain's own).

Under ZB-V every rank ``r`` runs the F, B and W of two stages, ``r`` and ``2R − 1 − r``, for every
micro-batch, so in the steady state a rank's time per micro-batch is the *sum* of its two stages'
costs; the slowest rank sets the pace. The per-stage min–max partition
(:func:`~pipetrain.planners.partition.balanced.balanced_partition`) can leave that sum unequal
(6 equal layers in 4 stages: ``2/1/1/2`` puts 4 layers on rank 0 and 2 on rank 1), so this one
minimises, lexicographically, the largest rank sum, then the largest stage (the fill and drain
still pass through the stages one by one):

    key(counts) = (max_r  c(r) + c(2R − 1 − r),  max_s c(s))

starting from the per-stage min–max partition and moving one cut by one layer at a time while the
key improves (a local search, ours: at most ``L`` moves per cut, ``O(R · L)`` key evaluations per
move). ``costs = [1] * 6``, ``R = 2``: ``(2, 1, 1, 2)`` → ``(2, 1, 2, 1)`` (ranks 3 and 3).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pipetrain.planners.partition.balanced import balanced_partition

__all__ = ["v_balanced_partition", "v_key"]


def v_key(costs: Sequence[float], counts: Sequence[int]) -> tuple[float, float]:
    """``(largest rank sum, largest stage)`` of ``counts`` (``2R`` layer counts) over per-layer ``costs``."""
    ends = list(itertools.accumulate(counts))
    stage = [sum(costs[e - c:e]) for c, e in zip(counts, ends, strict=True)]
    k = len(counts)
    return max(stage[r] + stage[k - 1 - r] for r in range(k // 2)), max(stage)


def v_balanced_partition(costs: Sequence[float], n_ranks: int) -> tuple[int, ...]:
    """``2R`` stage sizes (layer counts, each >= 1) balancing each rank's two stages (module docstring).

    Args:
        costs: per-layer cost (seconds), length ``L >= 2R``.
        n_ranks: ``R``.

    Raises:
        UserError: fewer layers than ``2R`` (from the per-stage partition).
    """
    counts = list(balanced_partition(costs, 2 * n_ranks))
    best = v_key(costs, counts)
    improved = True
    while improved:
        improved = False
        for cut, shift in itertools.product(range(len(counts) - 1), (-1, 1)):
            trial = list(counts)
            trial[cut] += shift
            trial[cut + 1] -= shift
            if min(trial) < 1:
                continue
            key = v_key(costs, trial)
            if key < best:
                counts, best, improved = trial, key, True
    return tuple(counts)
