"""Exact min–max partition of a chain of layer costs into contiguous stages.

Given per-layer costs ``c[0..L-1]`` and ``K`` stages, find boundaries minimising the largest stage
sum — the bottleneck stage that bounds a pipeline's throughput (the balance objective of torchgpipe's
``balance_by_time`` and of BaPipe's balanced partition, here solved exactly).

Dynamic programme over prefix sums, O(K · L²) time, O(K · L) memory::

    best[k][i] = min over j < i of max(best[k-1][j], sum(c[j:i]))

Ties are broken toward the earliest boundary so the result is deterministic. A stage may also pay
for where it ends: with ``ends``, a stage ``c[j:i]`` costs ``sum(c[j:i]) + ends[i - 1]`` (method
``local``: the auxiliary head after its last layer).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pipetrain.errors import UserError

__all__ = ["balanced_partition"]


def balanced_partition(costs: Sequence[float], n_stages: int,
                       ends: Sequence[float] | None = None) -> tuple[int, ...]:
    """Stage sizes (layer counts, each >= 1) that minimise the maximum stage cost.

    Args:
        costs: per-layer cost (seconds), length ``L``.
        n_stages: ``K``, at most ``L``.
        ends: per layer, what a stage ending with it pays besides its layers (default 0), length ``L``.

    Returns:
        ``K`` layer counts summing to ``L``.

    Raises:
        UserError: if there are more stages than layers.
    """
    n = len(costs)
    if not 1 <= n_stages <= n:
        raise UserError(
            f"cannot cut {n} layers into {n_stages} stages; use between 1 and {n} stages"
        )
    end = [0.0, *(ends if ends is not None else [0.0] * n)]
    prefix = [0.0, *itertools.accumulate(costs)]
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j] + end[i])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    sizes = []
    i = n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return tuple(reversed(sizes))
