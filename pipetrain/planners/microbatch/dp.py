"""Global greedy-based DP baseline: greedy across stages, exact DP within a stage.

UMPIPE (Zhou et al., IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804) compares TiDGAP with "the global
greedy-based dynamic programming"; its definition is not public, so this is **pipetrain's
reconstruction** (docs/algorithms.md §2.5). Stage by stage in pipeline order (forward: 1..K, backward:
K..1), given the arrival time ``A(i)`` at the stage of the message holding sample ``i``, choose the
partition that finishes the stage's own work first:

    T(0) = start,   T(i) = min_{i - cap <= j < i} [ max(T(j), A(i)) + t(i - j) ]

(``start`` is 0 for forward and the stage's forward end for backward; ``t`` is ``f`` or ``g``).
Minimising ``T`` is optimal for that stage because the cost is monotone in ``T(j)``; then the
chosen partition's messages (FIFO link, ``cF`` / ``cB``) give the next stage's ``A``. Ties go to
the larger last micro-batch. Being blind to downstream stages, it tends toward few large
micro-batches. Cost: ``O(K B²)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pipetrain.planners.microbatch.result import MicrobatchPlan, check_caps, evaluate
from pipetrain.simulate.vectorised import StageTables

__all__ = ["global_dp", "stage_dp"]

FloatArray = npt.NDArray[np.float64]


def stage_dp(arrival: FloatArray, table: FloatArray, start: float, cap: int) -> tuple[tuple[int, ...], FloatArray]:
    """One stage's partition that minimises its own completion time.

    Args:
        arrival: ``[B + 1]``: ``arrival[i]`` is when sample ``i`` (1-based) is available
            (``arrival[0]`` unused).
        table: ``[B + 1]`` seconds by micro-batch size.
        start: when the stage is free to start.
        cap: the largest micro-batch allowed.

    Returns:
        The sizes, and ``[m]`` end times of the stage's micro-batches.
    """
    batch = len(table) - 1
    best, choice = np.empty(batch + 1), np.zeros(batch + 1, dtype=np.intp)
    best[0] = start
    for i in range(1, batch + 1):
        j = np.arange(max(0, i - cap), i)
        finish = np.maximum(best[j], arrival[i]) + table[i - j]
        pick = int(np.argmin(finish))
        best[i], choice[i] = finish[pick], j[pick]
    ends = [batch]
    while ends[-1] > 0:
        ends.append(int(choice[ends[-1]]))
    ends.reverse()
    sizes = tuple(int(b - a) for a, b in itertools.pairwise(ends))
    return sizes, best[ends[1:]]


def _messages(sizes: Sequence[int], done: FloatArray, send: FloatArray) -> FloatArray:
    """``[B + 1]`` arrivals downstream of a partition whose micro-batches end at ``done``: FIFO link."""
    arrival, channel, lo = np.zeros(sum(sizes) + 1), float("-inf"), 1
    for size, end in zip(sizes, done, strict=True):
        channel = max(channel, float(end)) + float(send[size])
        arrival[lo:lo + size] = channel
        lo += size
    return arrival


def global_dp(tables: StageTables, caps: Sequence[int] | None = None) -> MicrobatchPlan:
    """Forward stage by stage from the first, then backward from the last, each by :func:`stage_dp`.

    Args:
        tables: stage costs ``[K, B + 1]``.
        caps: per stage, the largest micro-batch allowed; None for no cap.
    """
    n, batch = tables.n_stages, tables.batch_size
    limits = check_caps(caps, n) or (batch,) * n
    forward: list[tuple[int, ...]] = []
    forward_end: list[float] = []
    arrival = np.zeros(batch + 1)
    for k in range(n):
        sizes, done = stage_dp(arrival, tables.forward_s[k], 0.0, limits[k])
        forward.append(sizes)
        forward_end.append(float(done[-1]))
        arrival = _messages(sizes, done, tables.send_forward_s[k])
    backward: list[tuple[int, ...]] = [()] * n
    arrival = np.full(batch + 1, float("-inf"))
    for k in range(n - 1, -1, -1):
        sizes, done = stage_dp(arrival, tables.backward_s[k], forward_end[k], limits[k])
        backward[k] = sizes
        arrival = _messages(sizes, done, tables.send_backward_s[k])
    return evaluate(forward, backward, tables, "dp")
