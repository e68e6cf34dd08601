"""Width buckets: the dense ``[P, W]`` scans behind :func:`pipetrain.simulate.vectorised.iteration_times`.

Each plan's micro-batches of one stage and direction (a *lane*: ``2K`` lanes, forward stages then
backward stages) are packed to the left of a row of ``W + 1`` cells: cell 0 is a dummy of size 0,
cells ``1..n`` are the plan's ``n`` micro-batches, and cells past ``n`` are padding of size 0.
Plans are grouped into buckets by their widest lane, so a bucket's ``W`` is the largest micro-batch
count among its own plans rather than the population's (a random plan with 200 micro-batches no
longer pads a converged one with 20 to 200 cells). Every scan then runs over a dense ``[n_b, W + 1]``
block with no scatter or gather, and a bucket of ``n_b`` plans costs about ``_BUCKET_CELLS`` cells
of overhead, which decides when two width classes share a bucket (:func:`_buckets`).

Padding is harmless and makes the last column hold the last micro-batch's end: a padding cell has
duration 0 and is ready when the upstream's last message arrives (the same time as the real last
micro-batch, whose last sample is ``B - 1``), so with ``d >= 0`` and monotone rounding it repeats
the end of the cell before it. Each plan's numbers follow the same floating-point operations in the
same order whatever bucket it lands in, so the times stay bit-identical to
:func:`~pipetrain.simulate.vectorised.iteration_time`.

The upstream message holding a micro-batch's last sample comes from one ``searchsorted`` per
direction and bucket, over integer keys ``(lane * P + plan) * B + end`` that increase through the
bucket's whole buffer (dummy cells ``... - 1``, padding ``... + B - 1``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["bucketed_times"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

_BUCKET_CELLS = 24_576
"""A bucket's fixed cost (its ~130 numpy calls), in cells of scan work; two width classes share a
bucket when the padding that costs is no more than this."""


@dataclass(frozen=True)
class _Bucket:
    """Plans whose widest lane has at most ``width`` micro-batches, and where their cells live."""

    members: IntArray
    width: int
    offset: int

    def cells(self, lanes: int) -> int:
        return lanes * len(self.members) * (self.width + 1)


def _buckets(widths: IntArray, lanes: int) -> list[_Bucket]:
    """Group plans by power-of-two width class, merging neighbouring classes when padding is cheap."""
    order = np.argsort(widths, kind="stable")
    ranked = widths[order]
    classes = np.ceil(np.log2(ranked)).astype(np.intp)
    bounds = [0, *(np.flatnonzero(np.diff(classes)) + 1).tolist(), len(ranked)]
    groups: list[tuple[int, int, int]] = []  # (start, end, width) in ``order``
    for start, end in itertools.pairwise(bounds):
        width = int(ranked[end - 1])
        if groups and (groups[-1][1] - groups[-1][0]) * (width - groups[-1][2]) * lanes <= _BUCKET_CELLS:
            groups[-1] = (groups[-1][0], end, width)
        else:
            groups.append((start, end, width))
    out, offset = [], 0
    for start, end, width in groups:
        out.append(_Bucket(np.sort(order[start:end]), width, offset))
        offset += out[-1].cells(lanes)
    return out


def _rows_differ(a: BoolArray, b: BoolArray) -> BoolArray:
    """``[P, K]``: whether each stage's forward and backward rows differ (8 samples per word if it can)."""
    if a.shape[-1] % 8 == 0 and a.flags.c_contiguous and b.flags.c_contiguous:
        return np.asarray(np.any(a.view(np.uint64) != b.view(np.uint64), axis=-1))
    return np.asarray(np.any(a != b, axis=-1))


@dataclass(frozen=True)
class _Layout:
    """The population's cells in flat buffers; per bucket, ``seconds`` holds
    ``[2 (compute, link), 2K lanes, W_b + 1, n_b]`` (plans along the last axis, so every scan step
    is one vector operation over the bucket's plans) and ``keys`` ``[2K, n_b, W_b + 1]`` (plan-major,
    sorted within a lane)."""

    buckets: list[_Bucket]
    seconds: FloatArray
    keys: IntArray


def _flat_cuts(forward_cuts: BoolArray, backward_cuts: BoolArray) -> tuple[IntArray, ...]:
    """Every cut of both masks: its row ``plan * 2K + lane``, column, size and rank in its row."""
    n_plans, n_stages, batch = forward_cuts.shape
    out: list[list[IntArray]] = [[], [], [], []]
    for direction, cuts in enumerate((forward_cuts, backward_cuts)):
        flat = np.flatnonzero(cuts)
        row, col = np.divmod(flat, batch)  # plan * K + stage
        counts = np.bincount(row, minlength=n_plans * n_stages)
        out[0].append(row + (row // n_stages + direction) * n_stages)
        out[1].append(col)
        out[2].append(np.diff(flat, prepend=-1))  # every row ends with a cut
        out[3].append(np.arange(len(flat)) - (np.cumsum(counts) - counts)[row])
    return tuple(np.concatenate(parts) for parts in out)


def _layout(
    forward_cuts: BoolArray, backward_cuts: BoolArray, compute: FloatArray, link: FloatArray,
    recompute: FloatArray | None,
) -> _Layout:
    """Pack both directions of every plan into its bucket's cells, with durations and keys.

    Args:
        compute: ``[2K, B + 1]`` rows ``f`` then ``g``; link: ``[2K, B + 1]`` rows ``cF`` then ``cB``.
        recompute: ``[K, B + 1]`` ``g`` of a stage that recomputes, or None if it costs nothing extra.
    """
    n_plans, n_stages, batch = forward_cuts.shape
    lanes = 2 * n_stages
    row, col, size, rank = _flat_cuts(forward_cuts, backward_cuts)
    counts = np.bincount(row, minlength=n_plans * lanes)
    plan, lane = np.divmod(row, lanes)
    buckets = _buckets(counts.reshape(n_plans, lanes).max(axis=1), lanes)
    local, width = np.empty(n_plans, np.intp), np.empty(n_plans, np.intp)
    offset, stride = np.empty(n_plans, np.intp), np.empty(n_plans, np.intp)
    total = buckets[-1].offset + buckets[-1].cells(lanes)
    keys = np.empty(total, np.intp)
    for b in buckets:
        n, w = len(b.members), b.width + 1
        local[b.members], width[b.members], offset[b.members], stride[b.members] = np.arange(n), w, b.offset, n
        block = keys[b.offset:b.offset + b.cells(lanes)].reshape(lanes, n, w)
        block[...] = (np.arange(n) * batch + (batch - 1))[:, None]
        block[..., 0] = np.arange(n) * batch - 1
    lane_base = offset[plan] + lane * stride[plan] * width[plan]
    keys[lane_base + local[plan] * width[plan] + rank + 1] = local[plan] * batch + col
    cell = lane_base + (rank + 1) * stride[plan] + local[plan]
    table = lane
    if recompute is not None:
        differ = _rows_differ(forward_cuts, backward_cuts).ravel()
        table = lane + np.where(lane >= n_stages, n_stages * differ[plan * n_stages + lane - n_stages], 0)
        compute = np.concatenate((compute, recompute))
    seconds = np.zeros((2, total))
    seconds[0, cell] = compute.ravel().take(table * (batch + 1) + size)
    seconds[1, cell] = link.ravel().take(lane * (batch + 1) + size)
    return _Layout(buckets, seconds, keys)


def _scan(ready: FloatArray, sums: FloatArray, slack: FloatArray) -> None:
    """``E_j = max(E_{j-1}, r_j) + d_j`` on ``[W + 1, n]`` columns, into ``slack``.

    ``sums`` are the prefix sums ``S`` (row 0 is 0); ``slack[0]`` holds ``E_0`` on entry; row 0 of
    ``ready`` is not read.
    """
    np.subtract(ready[1:], sums[:-1], out=slack[1:])
    np.maximum.accumulate(slack, axis=0, out=slack)
    np.add(slack, sums, out=slack)


def _prefix_sums(seconds: FloatArray) -> None:
    """In place along axis 2, one vector add per column (the sequential order of ``total += d``;
    faster here than ``cumsum`` along a middle axis)."""
    for j in range(1, seconds.shape[2]):
        np.add(seconds[:, :, j - 1], seconds[:, :, j], out=seconds[:, :, j])


def _gathers(keys: IntArray, n_stages: int) -> IntArray:
    """``[2K, W + 1, n]``: for each cell, the cell of its lane's upstream lane (forward ``k - 1``,
    backward ``k + 1``) that holds its last sample, as an index into that lane's ``[W + 1, n]`` block."""
    lanes, n, w1 = keys.shape
    found = np.zeros((lanes, n, w1), np.intp)
    for k in range(1, n_stages):
        found[k] = np.searchsorted(keys[k - 1].ravel(), keys[k].ravel()).reshape(n, w1)
        lane = n_stages + k - 1
        found[lane] = np.searchsorted(keys[lane + 1].ravel(), keys[lane].ravel()).reshape(n, w1)
    plan, cell = np.divmod(found, w1)
    out: IntArray = np.ascontiguousarray((cell * n + plan).transpose(0, 2, 1))
    return out


def _bucket_times(seconds: FloatArray, keys: IntArray, step_s: FloatArray) -> FloatArray:
    """Iteration seconds of one bucket's ``n`` plans.

    Args:
        seconds: ``[2, 2K, W + 1, n]`` compute and link seconds, summed in place here.
        keys: ``[2K, n, W + 1]`` the cells' keys.
        step_s: ``[K]`` optimizer steps.
    """
    lanes, w1, n = seconds.shape[1:]
    n_stages = lanes // 2
    _prefix_sums(seconds)
    gather = _gathers(keys, n_stages)
    done = np.empty((lanes, w1, n))
    sent = np.empty((lanes, w1, n))
    sent[:, 0] = -np.inf
    done[:n_stages, 0] = 0.0
    ready = np.zeros((w1, n))
    for k in range(n_stages):
        _scan(ready, seconds[0, k], done[k])
        if k + 1 < n_stages:
            _scan(done[k], seconds[1, k], sent[k])
            sent[k].ravel().take(gather[k + 1].ravel(), out=ready.ravel(), mode="clip")
    ready.fill(-np.inf)
    for k in range(n_stages - 1, -1, -1):
        lane = n_stages + k
        done[lane, 0] = done[k, -1]
        _scan(ready, seconds[0, lane], done[lane])
        if k > 0:
            _scan(done[lane], seconds[1, lane], sent[lane])
            sent[lane].ravel().take(gather[lane - 1].ravel(), out=ready.ravel(), mode="clip")
    finish: FloatArray = done[n_stages:, -1] + step_s[:, None]
    return np.asarray(finish.max(axis=0), dtype=np.float64)


def bucketed_times(
    forward_cuts: BoolArray, backward_cuts: BoolArray, compute: FloatArray, link: FloatArray,
    recompute: FloatArray | None, step_s: FloatArray,
) -> FloatArray:
    """``[P]`` iteration seconds of checked ``[P, K, B]`` cut masks (see the module docstring).

    Args:
        forward_cuts, backward_cuts: the plans; every row's last entry is True.
        compute: ``[2K, B + 1]`` forward rows then backward rows; link: ``[2K, B + 1]`` forward
            sends then backward sends; recompute: ``[K, B + 1]`` backward of a recomputing stage,
            None where it equals the backward; step_s: ``[K]``.
    """
    n_plans, n_stages, _ = forward_cuts.shape
    if n_plans == 0:
        return np.zeros(0)
    layout = _layout(forward_cuts, backward_cuts, compute, link, recompute)
    out = np.empty(n_plans)
    lanes = 2 * n_stages
    for b in layout.buckets:
        n, end = len(b.members), b.offset + b.cells(lanes)
        seconds = layout.seconds[:, b.offset:end].reshape(2, lanes, b.width + 1, n)
        out[b.members] = _bucket_times(seconds, layout.keys[b.offset:end].reshape(lanes, n, b.width + 1), step_s)
    return out
