"""Iteration time of a chain plan under any per-stage compute order, from cost tables.

The max-plus closed form of :mod:`pipetrain.simulate.vectorised` needs the flush order (all
forwards, then all backwards), where the two passes are independent. A 1F1B order interleaves them,
so a stage's forward may wait for a gradient and the other way round; :func:`order_time` instead
plays the orders out, one action at a time, with the same model (docs/algorithms.md §2.3):

* an action starts when its stage is free and the message holding its last sample has arrived
  (forward: from ``k - 1``; backward: from ``k + 1``); it takes ``f[k](b)`` or ``g[k](b)`` seconds
  (``backward_recompute_s`` where the stage's backward partition differs from its forward one);
* a stage with a successor (predecessor) sends each forward output (input gradient) when it is
  computed, over one FIFO link per direction that is busy ``cF[k](b)`` (``cB[k](b)``) seconds;
* ``T = max_k (end of stage k's last action + step[k])``.

This is the event simulator's model of a chain without processor sharing, so both agree
(tested to 1e-9). Cost: ``O(actions)`` Python steps per plan, about 0.1–0.5 ms for 4–8 stages of
8–32 micro-batches: the evaluator of the GA over unequal 1F1B plans, one individual at a time.

Shapes: ``forward_sizes[k]`` and ``backward_sizes[k]`` are stage ``k``'s size vectors (each sums to
``B``); ``sequences[k]`` is its order as ``(is_backward, micro-batch index)`` pairs, as
:func:`pipetrain.schedule.generators.one_f_one_b_sequences` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from pipetrain.simulate.vectorised import StageTables

__all__ = ["order_time"]

_NEG_INF = float("-inf")


class _Inbox:
    """Messages arriving at a stage from one neighbour: ``(last sample + 1, arrival)``, in order."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.arrivals: list[float] = []
        self.cursor = 0

    def ready(self, hi: int) -> float | None:
        """Arrival of the message holding sample ``hi - 1``; None if it is not sent yet."""
        i = self.cursor
        while i < len(self.ends) and self.ends[i] < hi:
            i += 1
        self.cursor = i
        return self.arrivals[i] if i < len(self.ends) else None


def order_time(
    sequences: Sequence[Sequence[tuple[bool, int]]],
    forward_sizes: Sequence[Sequence[int]],
    backward_sizes: Sequence[Sequence[int]],
    tables: StageTables,
) -> float:
    """Iteration seconds of one chain plan under the given per-stage orders.

    Raises:
        ValueError: the orders deadlock (no stage can make progress), or sizes and tables disagree.
    """
    f, g_plain, c_f, c_b, g_rc = tables.rows
    n = tables.n_stages
    if not len(sequences) == len(forward_sizes) == len(backward_sizes) == n:
        raise ValueError(f"give an order and sizes for each of the {n} stages")
    g = [g_plain[k] if list(forward_sizes[k]) == list(backward_sizes[k]) else g_rc[k] for k in range(n)]
    free = _play_out(sequences, forward_sizes, backward_sizes, (f, g, c_f, c_b))
    return max(free[k] + float(tables.step_s[k]) for k in range(n))


def _play_out(
    sequences: Sequence[Sequence[tuple[bool, int]]],
    forward_sizes: Sequence[Sequence[int]],
    backward_sizes: Sequence[Sequence[int]],
    rows: tuple[list[list[float]], ...],
) -> list[float]:
    """Play the orders out; ``rows``: per stage ``f``, ``g`` (the backward row it pays, with recompute
    or not), ``cF``, ``cB`` by micro-batch size. Returns when each stage's last action ends.

    Raises:
        ValueError: the orders deadlock.
    """
    f, g, c_f, c_b = rows
    n = len(sequences)
    ends = [(list(accumulate(x)), list(accumulate(y))) for x, y in zip(forward_sizes, backward_sizes, strict=True)]
    from_up, from_down = [_Inbox() for _ in range(n)], [_Inbox() for _ in range(n)]
    link_up, link_down = [_NEG_INF] * n, [_NEG_INF] * n
    free, pos = [0.0] * n, [0] * n
    remaining = sum(len(s) for s in sequences)
    while remaining:
        progressed = False
        for k in range(n):
            sequence = sequences[k]
            while pos[k] < len(sequence):
                backward, j = sequence[pos[k]]
                if backward:
                    hi, size = ends[k][1][j], backward_sizes[k][j]
                    ready = from_down[k].ready(hi) if k < n - 1 else _NEG_INF
                else:
                    hi, size = ends[k][0][j], forward_sizes[k][j]
                    ready = from_up[k].ready(hi) if k > 0 else 0.0
                if ready is None:
                    break
                end = max(free[k], ready) + (g[k][size] if backward else f[k][size])
                free[k] = end
                if backward and k > 0:
                    link_down[k] = max(link_down[k], end) + c_b[k][size]
                    from_down[k - 1].ends.append(hi)
                    from_down[k - 1].arrivals.append(link_down[k])
                elif not backward and k < n - 1:
                    link_up[k] = max(link_up[k], end) + c_f[k][size]
                    from_up[k + 1].ends.append(hi)
                    from_up[k + 1].arrivals.append(link_up[k])
                pos[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"the orders deadlock at positions {pos}")
    return free
