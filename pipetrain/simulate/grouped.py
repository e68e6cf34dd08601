"""TiDGAP's population evaluator: plans grouped by width, so few are padded to the widest.

UMPIPE's TiDGAP (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804) times a
whole population with matrix operations. :func:`~pipetrain.simulate.vectorised.iteration_times`
lays each stage's micro-batches on a ``[P, W + 1]`` grid, ``W`` being the most micro-batches any
plan has there, and its scans cost about the same per cell whether the cell holds a micro-batch or
padding. A GA population holds a few plans with many micro-batches (the random half of generation
0, fresh mutations) among many with few, so most of the grid can be padding.
:func:`population_times` sorts the plans by width (their most micro-batches at any stage, forward
or backward), splits them where the cells saved outweigh the fixed cost of one more call, splits
each part again while that pays, and times each group in its own call. A plan's time does not depend
on the plans beside it (each one's scans run along its own row), so the times are bit-identical to
one call over the whole population. The grouping is pipetrain's engineering, not the paper's.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipetrain.simulate.vectorised import StageTables, iteration_times

__all__ = ["population_times", "width_groups"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

CALL_CELLS = 2000
"""One more evaluator call costs about as much as scanning this many more grid cells (measured on
the 2-core development machine: ~10 µs of fixed cost per stage pass, ~5 ns per cell)."""


def width_groups(widths: IntArray, call_cells: int = CALL_CELLS) -> list[IntArray]:
    """Indices of the plans in each group, each group in increasing order.

    Args:
        widths: ``[P]`` each plan's most micro-batches at any stage.
        call_cells: the fixed cost of a call, in grid cells (:data:`CALL_CELLS`).

    Returns:
        index arrays that partition ``range(P)``; one group when no split pays.
    """
    order = np.argsort(widths, kind="stable")
    pending, groups = [order], []
    while pending:
        group = pending.pop()
        if len(group) > 1:
            w = widths[group] + 1  # sorted: a group's grid is len * (its widest + 1) cells
            narrow = np.arange(1, len(group))
            cost = narrow * w[:-1] + (len(group) - narrow) * w[-1] + call_cells
            split = int(np.argmin(cost)) + 1  # the first `split` plans form the narrow group
            if cost[split - 1] < len(group) * w[-1]:
                pending += [group[:split], group[split:]]
                continue
        groups.append(np.sort(group))
    return groups


def population_times(
    forward_cuts: BoolArray, backward_cuts: BoolArray, tables: StageTables, call_cells: int = CALL_CELLS
) -> FloatArray:
    """:func:`~pipetrain.simulate.vectorised.iteration_times` of ``P`` plans, one call per width group.

    Args:
        forward_cuts: ``[P, K, B]`` forward cut masks (last column True).
        backward_cuts: ``[P, K, B]`` backward cut masks; the very same array as ``forward_cuts``
            for single-chromosome plans.
        tables: costs, ``[K, B + 1]`` each.
        call_cells: the fixed cost of a call, in grid cells (:func:`width_groups`).

    Returns:
        ``[P]`` iteration seconds, bit-identical to one ``iteration_times`` call.
    """
    shared = backward_cuts is forward_cuts
    widths = np.sum(forward_cuts, axis=2, dtype=np.intp).max(axis=1, initial=0)
    if not shared:
        widths = np.maximum(widths, np.sum(backward_cuts, axis=2, dtype=np.intp).max(axis=1, initial=0))
    groups = width_groups(widths, call_cells)
    if len(groups) == 1:
        return iteration_times(forward_cuts, backward_cuts, tables)
    times = np.empty(len(forward_cuts))
    for group in groups:
        forward = forward_cuts[group]
        times[group] = iteration_times(forward, forward if shared else backward_cuts[group], tables)
    return times
