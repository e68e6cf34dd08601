"""Where the vectorised evaluator puts each micro-batch: ``[P, K, B]`` cut masks laid out as grids.

A plan arrives as per-sample cut masks (True where a micro-batch ends, docs/algorithms.md §2.4):
forward and backward, ``[P, K, B]`` each for ``P`` plans, ``K`` stages and ``B`` samples. The
evaluator of :mod:`pipetrain.simulate.vectorised` (UMPIPE's flush schedule, Zhou et al., IEEE TPDS
2025; pipetrain's reconstruction, docs/algorithms.md §2.3) scans one row per stage and pass, so the
``K`` forward and ``K`` backward rows are parsed together into one :class:`_Layout`: each row's
micro-batches packed to the left of a ``[P, W + 1]`` slice of one ``[2K, P, W + 1]`` grid (column 0
holds the chain's initial value), ``W`` being the most micro-batches any plan has in any row.

This module computes, once per call and for all rows: each micro-batch's cell in that grid and its
entry in :attr:`~pipetrain.simulate.stage_tables.StageTables.chain_costs` (:func:`_layout`,
:func:`_recompute_codes`), and where each micro-batch finds its ready time, the cell of the
upstream message holding its last sample (:func:`_sources`, one running count of cuts for both
passes). Cost: ``O(P K B)`` to read the masks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["BoolArray", "IntArray"]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]


class _Layout(NamedTuple):
    """The micro-batches of ``R`` rows of masks in all ``P`` plans, packed to the left of one
    ``[R, P, W + 1]`` grid.

    :func:`_layout` builds ``R = 2K`` rows: row ``k`` is stage ``k`` forward, row ``K + k`` stage
    ``k`` backward. ``W`` is the most micro-batches any plan has in any row (at most ``B``, usually
    far fewer), so the scans cost ``O(R P W)`` rather than ``O(R P B)``. Column 0 holds each chain's
    initial value; micro-batch ``j`` (0-based) of plan ``p`` in row ``r`` sits in column ``j + 1``,
    the cell ``(r P + p)(W + 1) + j + 1`` of the flattened grid.

    Attributes:
        flat: ``[M]`` increasing positions ``(r P + p) B + i`` where a micro-batch ends (sample
            ``i``), over all rows and plans.
        code: ``[M]`` ``r (B + 1) + size``: the micro-batch's entry in
            :attr:`~pipetrain.simulate.stage_tables.StageTables.chain_costs` (its number of samples
            in its row's table).
        cell: ``[M]`` its own cell.
        last: ``[R P]`` the cell of each row and plan's final micro-batch.
        spans: ``R + 1`` offsets: row ``r``'s micro-batches are ``[spans[r], spans[r + 1])``.
        width: ``W``.
    """

    flat: IntArray
    code: IntArray
    cell: IntArray
    last: IntArray
    spans: list[int]
    width: int


def _steps(values: IntArray) -> IntArray:
    """``[N]`` increasing ``values`` -> ``[N]`` their differences, the first from -1."""
    out = np.empty_like(values)
    out[:1] = values[:1] + 1
    np.subtract(values[1:], values[:-1], out=out[1:])
    return out


def _parse(rows: BoolArray) -> _Layout:
    """The layout of ``[R, P, B]`` masks (every row's last entry a cut), in one pass over all rows;
    no micro-batch straddles rows, so a size is the distance to the previous cut in the flat grid."""
    _, n_plans, batch = rows.shape
    flat = np.flatnonzero(rows)
    line, col = np.divmod(flat, batch)  # line = r P + p
    last = np.flatnonzero(col == batch - 1)  # [R P]
    counts = _steps(last)  # micro-batches per line
    width = int(counts.max())
    shift = np.arange(1, len(last) * (width + 1), width + 1) - (last + 1 - counts)  # [R P]: cell - index
    cell = np.arange(len(flat)) + shift[line]
    code = (line // n_plans) * (batch + 1) + _steps(flat)  # + size
    spans = [0, *(last[n_plans - 1::n_plans] + 1).tolist()]
    return _Layout(flat, code, cell, cell[last], spans, width)


def _tiled(layout: _Layout, n_plans: int, batch: int, times: int) -> _Layout:
    """``layout``'s ``R`` rows repeated ``times`` times: row ``t R + r`` is row ``r``."""
    n_rows = len(layout.spans) - 1
    tile = np.arange(times)[:, None]
    flat, code, cell, last = (
        (values + tile * (n_rows * step)).reshape(-1)
        for values, step in ((layout.flat, n_plans * batch), (layout.code, batch + 1),
                             (layout.cell, n_plans * (layout.width + 1)), (layout.last, n_plans * (layout.width + 1)))
    )
    spans = [t * layout.spans[-1] + s for t in range(times) for s in layout.spans[:-1]] + [times * layout.spans[-1]]
    return _Layout(flat, code, cell, last, spans, layout.width)


def _same_stages(cuts: BoolArray) -> bool:
    """Whether every stage of every plan has stage 0's row (``[P, K, B]``); the first and last plans
    are checked first (in a GA population they seldom pass: the elite may be an equal plan, a child
    hardly ever is)."""
    return (bool(np.all(cuts[0] == cuts[0, :1])) and bool(np.all(cuts[-1] == cuts[-1, :1]))
            and np.array_equal(cuts, np.broadcast_to(cuts[:, :1], cuts.shape)))


def _layout(forward_cuts: BoolArray, backward_cuts: BoolArray) -> tuple[_Layout, IntArray]:
    """The ``2K`` rows (forward stages, then backward stages) of ``[P, K, B]`` masks, and their
    :func:`_sources`.

    Forward and backward masks are parsed together; where ``backward_cuts is forward_cuts`` the
    ``K`` rows are parsed once and repeated, and where every stage of every plan has the same row
    (TiDGAP's equal seeds) that one row is parsed once and each micro-batch's upstream message is
    the one in its own column.
    """
    n_plans, n_stages, batch = forward_cuts.shape
    if backward_cuts is not forward_cuts:
        rows = np.concatenate((forward_cuts.transpose(1, 0, 2), backward_cuts.transpose(1, 0, 2)))
        layout = _parse(rows)
    elif n_stages > 1 and _same_stages(forward_cuts):
        layout = _tiled(_parse(forward_cuts[:, :1].transpose(1, 0, 2)), n_plans, batch, 2 * n_stages)
        return layout, _sources(layout, n_stages, n_plans * (layout.width + 1))
    else:
        layout = _tiled(_parse(forward_cuts.transpose(1, 0, 2)), n_plans, batch, 2)
        rows = np.concatenate((forward_cuts.transpose(1, 0, 2),) * 2)
    return layout, _sources(layout, n_stages, n_plans * batch, rows)


def _sources(layout: _Layout, n_stages: int, block: int, rows: BoolArray | None = None) -> IntArray:
    """Where each micro-batch of rows ``1 .. 2K - 2`` finds its ready time: the cell of the
    upstream message holding its last sample.

    Forward row ``k`` reads row ``k - 1`` and backward row ``K + k`` reads row ``K + k + 1``, so a
    key shifted by one row lands in the upstream row; rows ``0`` and ``2K - 1`` open their passes
    and need none.

    Args:
        block: with ``rows``, ``P B``: one row's samples; the positions ``layout.flat`` are shifted
            and the first cut at or after each is found by counting the cuts before it (a running
            sum over the ``[2K, P, B]`` masks ``rows`` the layout was parsed from: the index a
            ``searchsorted`` of the positions would give, in ``O(K P B)`` rather than
            ``O(M log M)`` for ``M`` micro-batches). Without (all rows equal), ``P (W + 1)``: one
            row's cells; the upstream message is in the micro-batch's own column.

    Returns:
        ``[spans[2K - 1] - spans[1]]`` cells.
    """
    lo, mid, hi = layout.spans[1], layout.spans[n_stages], layout.spans[2 * n_stages - 1]
    keys = layout.flat if rows is not None else layout.cell
    query = keys[lo:hi] - block
    query[mid - lo:] += 2 * block
    if rows is None:
        return query
    mask = rows.reshape(-1)
    upto = np.cumsum(mask, dtype=np.int32 if mask.size < 2**31 else np.intp)  # cuts at or before each position
    sources: IntArray = layout.cell[upto[query] - mask[query]]
    return sources


def _recompute_codes(layout: _Layout, forward_cuts: BoolArray, backward_cuts: BoolArray) -> IntArray:
    """``layout.code`` with each backward micro-batch of a stage whose forward and backward rows
    differ pointed ``K`` table rows further on, at ``g`` with recompute (``[P, K, B]`` masks)."""
    n_plans, n_stages, batch = forward_cuts.shape
    differs = np.zeros((n_plans, n_stages), dtype=bool)  # a row index p K + k where any cut differs
    differs.reshape(-1)[np.flatnonzero(forward_cuts != backward_cuts) // batch] = True
    lo = layout.spans[n_stages]
    codes = layout.code.copy()
    codes[lo:] += differs.T.reshape(-1)[layout.flat[lo:] // batch - n_stages * n_plans] * (n_stages * (batch + 1))
    return codes
