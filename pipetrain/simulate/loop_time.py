"""Iteration time of one UEDP plan, micro-batch by micro-batch: DGAP's evaluator.

UMPIPE's flush-schedule recurrence with unequal micro-batches (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025;
pipetrain's reconstruction, docs/algorithms.md §2.3 and :mod:`pipetrain.simulate.vectorised`, whose
notation this follows) evaluated for one plan at a time, as the paper's DGAP does; the vectorised
evaluator (TiDGAP's) runs the same floating-point operations in the same order for a whole
population, so the two return bit-identical times.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.simulate.vectorised import StageTables

__all__ = ["iteration_time"]

_NEG_INF = float("-inf")


def _chain(ready: Sequence[float], duration: Sequence[float], start: float) -> list[float]:
    """The loop form of :mod:`~pipetrain.simulate.vectorised`'s compute and link scans, with the same
    operations in the same order."""
    out, total, slack = [], 0.0, start
    for r, d in zip(ready, duration, strict=True):
        slack = max(slack, r - total)
        total = total + d
        out.append(total + slack)
    return out


def _ready(ends: Sequence[int], upstream: Sequence[tuple[int, float]]) -> list[float]:
    """Arrival of the upstream message holding each micro-batch's last sample.

    Args:
        ends: the micro-batches' last samples (exclusive prefix sums), increasing.
        upstream: ``(end, arrival)`` of each upstream message, increasing in ``end``.
    """
    out, i = [], 0
    for e in ends:
        while upstream[i][0] < e:
            i += 1
        out.append(upstream[i][1])
    return out


def _prefix(sizes: Sequence[int]) -> list[int]:
    out, total = [], 0
    for x in sizes:
        total += x
        out.append(total)
    return out


def iteration_time(
    forward_sizes: Sequence[Sequence[int]], backward_sizes: Sequence[Sequence[int]], tables: StageTables
) -> float:
    """Iteration seconds of one UEDP plan, micro-batch by micro-batch (DGAP's evaluator).

    Bit-identical to the matching entry of :func:`~pipetrain.simulate.vectorised.iteration_times`.

    Args:
        forward_sizes: per stage ``k``, the forward sizes ``x[k]`` (each sums to ``B``).
        backward_sizes: per stage, the backward sizes ``y[k]`` (each sums to ``B``).
        tables: costs, ``[K, B + 1]`` each.
    """
    f, g_plain, c_f, c_b, g_rc = tables.rows
    n, batch = tables.n_stages, tables.batch_size
    if len(forward_sizes) != n or len(backward_sizes) != n:
        raise ValueError(f"give sizes for each of the {n} stages")
    if any(sum(x) != batch or min(x) < 1 for x in (*forward_sizes, *backward_sizes)):
        raise ValueError(f"every size vector must hold sizes >= 1 that sum to the batch ({batch})")
    upstream = [(batch, 0.0)]
    forward_end = []
    for k, sizes in enumerate(forward_sizes):
        ends = _prefix(sizes)
        done = _chain(_ready(ends, upstream), [f[k][x] for x in sizes], 0.0)
        forward_end.append(done[-1])
        upstream = list(zip(ends, _chain(done, [c_f[k][x] for x in sizes], _NEG_INF), strict=True))
    upstream = [(batch, _NEG_INF)]
    finish = []
    for k in range(n - 1, -1, -1):
        sizes, ends = backward_sizes[k], _prefix(backward_sizes[k])
        g = g_plain if list(sizes) == list(forward_sizes[k]) else g_rc
        done = _chain(_ready(ends, upstream), [g[k][y] for y in sizes], forward_end[k])
        finish.append(done[-1] + float(tables.step_s[k]))
        upstream = list(zip(ends, _chain(done, [c_b[k][y] for y in sizes], _NEG_INF), strict=True))
    return max(finish)
