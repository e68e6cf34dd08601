"""PipeDream's partitioner: a hierarchical DP over layers, machines and replication (docs/algorithms.md §3.3).

    >>> conv, fc = 8, 2  # VGG-like: heavy compute and activations, then huge weights (1 GB/s links)
    >>> pipedream_partition([1.0] * conv + [0.2] * fc, [1e6] * conv + [1e4] * fc,
    ...                     [1e6] * conv + [4e8] * fc, [Level(machines=16, bandwidth_bytes_per_s=1e9)]).config
    '15-1'

A chain of ``L`` layers is cut into contiguous stages; a stage runs on ``r`` replicas (data parallel
inside the stage) and the objective is the *seconds per item of the slowest stage or link*, the
steady-state bottleneck of PipeDream's 1F1B pipeline. We follow the public code (docs/algorithms.md §3.3):

* **Stage** ``[i, j)`` on ``r`` components of level ``k``: compute plus weight sync, a SUM as in the
  code (the paper overlaps them with a max)::

      T(i, j, r) = (C[i, j] + sync_scale * (2 (r-1)/r * P[i, j] / (B_k n_in) + 2 (r-1) latency_k)) / r

  ``C[i, j]``: the span's seconds per item on one component (level 1: the sum of ``compute_s``;
  higher up, the optimal sub-pipeline of the level below); ``P[i, j]``: its parameter bytes;
  ``n_in``: devices per component (the code divides by them: each device syncs its share over its
  own link). Ring all-reduce ``2 (r-1)/r``: we assume full-duplex links, where the code's
  ``4 (r-1)/r`` counts send and receive on half-duplex ones. With ``synchronous`` (pipetrain's flush
  schedules, where each replica all-reduces once per iteration however few items it ran) the sync
  term is added after the division by ``r``. ``sync_scale`` is 1 for PipeDream's
  asynchronous runtime (a sync per item) and ``1/m`` for a synchronous schedule of ``m`` items.
* **Cut** before layer ``s``: activation forward and gradient back, ``2 (latency_k + output_bytes[s-1]
  / B_k)`` per item, divided by the replicas of the receiving stage, and a term of its own in the
  max (it overlaps compute). The code adds these only with a compression ratio; we always do, and
  charge nothing for a span's own output (the level above charges that cut on its link).
* **Recurrence** over suffixes, ``A[i, j, m]`` on exactly ``m`` components, ``d`` of them after the
  first stage, ``r'`` the first replication of the rest::

      A[i, j, m] = min( T(i, j, m),  min_{i<s<j, r+d=m} max(T(i, s, r), cut_s / r', A[s, j, d]) )

  Solving from the output side (the code starts from the input) makes ``d`` exact, which the
  memory check needs. The answer is the best ``m <= M``: idle devices are allowed (the code's
  option), since more replicas also mean more sync.
* **Memory** (optional): a stage fits a device if ``state_copies * P + in_flight * saved_bytes <=
  device_bytes``, where ``in_flight = ceil(D / r) + 1`` items are stashed and ``D`` counts the
  devices after the stage (the code's stash count). With one level the check is exact. The code
  checks each level against its own machines only, which misses the devices in later servers; we
  count them. A span on ``m`` servers with ``D_after`` devices after it stashes, in a level-1 stage
  with ``r`` replicas and ``d`` devices after it in its server, ``ceil((d + x) / r) + 1`` items with
  ``x = D_after / m`` (the flat count). So the level below is solved once per ``x`` on a grid,
  exact up to 8 and then 25 % apart, and a stage takes the grid point at or above its ``x``: it can
  only overcount (safe). Later servers count whole, idle devices included.
* **Hierarchy**: level 1 (devices in a server) is solved for every span, and ``min_m A[i, j, m]``
  becomes level 2's ``C[i, j]``, and so on; the top level needs only ``[0, L)``.
  **Flattening**: a top stage ``[i, j)`` on ``m`` servers runs, in each server, the level-1 optimal
  sub-pipeline of ``[i, j)``; a level-1 stage of ``r`` replicas becomes a flat stage of ``r * m``
  (recursively through every level).
* **Ties** (within a relative 1e-9): fewest stages, then, from the input side, the earliest cut,
  the fewest replicas for that stage and the fewest devices after it. A second DP, over stage
  counts with the optimum as a limit, picks that answer exactly.

**Complexity.** Evaluated directly, the recurrence costs ``O(L^3 M_k^2)`` per lower level (all
spans) and ``O(L^2 M^2)`` at the top (one span). We use that ``T(i, s, r)`` rises with ``s`` while
the running minimum of ``A[s', j, d]`` over ``s' <= s`` falls: the best cut is where they cross,
found by binary search. That costs ``O(L^3 M_k + L^2 M_k^2 log L)`` per lower level and
``O(L^2 M + L M^2 log L)`` at the top; loops run over the first layer only, numpy does the rest.
With a memory limit in a hierarchy, each lower level is solved once per stash grid point
(``O(log N)`` of them for ``N`` devices).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from pipetrain.errors import UserError
from pipetrain.planners.partition.pipedream_types import DeviceMemoryLimit, DPResult, DPStage, Level

__all__ = ["DPResult", "DPStage", "DeviceMemoryLimit", "Level", "pipedream_partition"]

Array = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]
_TIE_RTOL = 1e-9
_INF = math.inf


@dataclass(frozen=True)
class _Costs:
    """One level's cost tables, for one stash grid point; spans are half-open ``[i, j)``."""

    compute_s: Array  # [G, L+1, L+1] seconds per item on one component, by the level below's grid point
    parameter_bytes: Array  # [L+1, L+1]
    saved_bytes: Array | None  # [L+1, L+1] saved activation bytes per item, where memory is checked
    cut_s: Array  # [L+1] forward + backward transfer seconds per item at boundary s
    link: Level
    inner_devices: int  # devices in one component of this level
    sync_scale: float
    synchronous: bool
    memory: DeviceMemoryLimit | None
    straight: bool
    extra_devices: int  # devices after this level's span, per replica of it (for stashes)
    sub_grid: Ints  # [G] the extra devices the level below was solved for

    @property
    def machines(self) -> int:
        return self.link.machines

    @property
    def replicas(self) -> Ints:
        """``[R]``: the replication a stage may have at this level."""
        return np.arange(1, 2 if self.straight else self.machines + 1)

    @cached_property
    def splits(self) -> tuple[Ints, Ints, Ints, Ints]:
        """Every (first-stage replicas ``r``, rest components ``d >= 1``) with ``r + d <= M``, sorted by
        ``m = r + d``: ``(r, d, group starts, m per group)`` for ``np.minimum.reduceat``."""
        r_grid, d_grid = np.meshgrid(self.replicas, np.arange(1, self.machines), indexing="ij")
        keep = r_grid + d_grid <= self.machines
        r_of, d_of = r_grid[keep], d_grid[keep]
        order = np.lexsort((r_of, r_of + d_of))
        r_of, d_of = r_of[order], d_of[order]
        starts = np.flatnonzero(np.diff(r_of + d_of, prepend=-1))
        return r_of, d_of, starts, (r_of + d_of)[starts]

    @cached_property
    def sub_rows(self) -> Ints:
        """``[R, M+1]``: the level-below grid point of a stage with ``r`` replicas and ``d`` components
        after it: ``(d * inner_devices + extra_devices) / r`` devices, rounded up onto the grid."""
        if self.sub_grid.size == 1:
            return np.zeros((self.replicas.size, self.machines + 1), dtype=np.intp)
        d = np.minimum(np.arange(self.machines + 1)[None, :], self.machines - self.replicas[:, None])  # r + d <= M
        after = d * self.inner_devices + self.extra_devices
        return np.searchsorted(self.sub_grid, -(-after // self.replicas[:, None]))

    def first_stage(self, i: int) -> tuple[Array, Ints, Ints]:
        """Stages starting at layer ``i``: ``time_s[R*G, S]``, seconds per item of ``[i, i+1+s)`` on
        ``replicas[R]`` components over grid point ``G`` (non-decreasing in ``s``); ``rows[R, M+1]``,
        the row of ``time_s`` for ``r`` replicas and ``d`` components after; ``fits[R, M+1]``, how many
        leading ``s`` fit in memory."""
        params = self.parameter_bytes[i, i + 1 :]
        r = self.replicas[:, None, None].astype(np.float64)
        # the code lets each of a component's n_in devices sync its share on its own link; pipetrain's
        # runtime (and simulator) runs one flat ring over the slowest link, so synchronous plans use n_in = 1
        n_in = 1 if self.synchronous else self.inner_devices
        allreduce_s = 2 * (r - 1) / r * params / (self.link.sync_bandwidth_bytes_per_s * n_in)
        sync_s = self.sync_scale * (allreduce_s + 2 * (r - 1) * self.link.sync_latency_s)
        # asynchronous: each replica syncs per item it runs (1/r of them); synchronous: once per iteration
        per_item_sync_s = sync_s if self.synchronous else sync_s / r
        time_s = (self.compute_s[None, :, i, i + 1 :] / r + per_item_sync_s).reshape(-1, params.size)
        rows = np.arange(self.replicas.size)[:, None] * self.compute_s.shape[0] + self.sub_rows
        fits = np.full(rows.shape, params.size, dtype=np.intp)
        if self.saved_bytes is not None and self.memory is not None:
            after = np.arange(self.machines + 1)[None, :] + self.extra_devices
            in_flight, where = np.unique(-(-after // self.replicas[:, None]) + 1, return_inverse=True)
            need = self.memory.state_copies * params + in_flight[:, None] * self.saved_bytes[i, i + 1 :]
            fits = np.count_nonzero(need <= self.memory.device_bytes, axis=1)[where].reshape(rows.shape)
        return time_s, rows, fits


def _span_sums(values: Array) -> Array:
    """``[L+1, L+1]``: ``out[i, j] = sum(values[i:j])`` summed left to right, 0 where ``j <= i``."""
    n = values.size
    out = np.zeros((n + 1, n + 1))
    out[:n, 1:] = np.cumsum(np.triu(np.broadcast_to(values, (n, n))), axis=1)
    return np.triu(out, 1)


def _best_split(time_s: Array, prefix: Array, last: Ints, time_row: Ints, d_row: Ints, first: int) -> Array:
    """``[E, P]``: ``min over s <= last of max(time_s[row, s], rest[e, d, first + s])`` by binary search.

    ``prefix[e, d, s]`` is the running minimum of the rest over ``s`` from ``first``, so it falls as
    ``s`` grows while ``time_s`` rises: the best ``s`` is where they cross, and ``max(time_s, prefix)``
    has the same minimum as ``max(time_s, rest)``. ``last[e, p]`` bounds ``s`` (``-1``: no split).
    """
    n_e, n_d, n_s = prefix.shape
    rest_flat, time_flat = prefix.reshape(-1), time_s.reshape(-1)
    rest_at = (np.arange(n_e)[:, None] * n_d + d_row[None, :]) * n_s + first  # + s: flat index of rest
    time_at = time_row[None, :] * time_s.shape[1]  # + s: flat index of time_s
    lo, hi = np.zeros_like(last), last + 1  # the crossing lies in [lo, hi]; hi = last + 1: none
    for _ in range(int(last.max(initial=0) + 1).bit_length()):
        mid = (lo + hi) // 2
        probe = np.minimum(mid, np.maximum(last, 0))
        rises = time_flat[time_at + probe] >= rest_flat[rest_at + probe]
        hi = np.where(rises & (lo < hi), mid, hi)
        lo = np.where(~rises & (lo < hi), mid + 1, lo)
    at = np.where(lo <= last, time_flat[time_at + np.minimum(lo, np.maximum(last, 0))], _INF)
    before = np.where(lo >= 1, rest_flat[rest_at + np.maximum(lo - 1, 0)], _INF)
    return np.minimum(at, before)


def _suffix_dp(costs: _Costs, ends: Ints) -> Array:
    """``[L+1, len(ends)]``: best time per item of span ``[i, ends[e])`` on at most ``M`` components.

    ``into[e, d, s]`` is the best for ``[s, ends[e])`` on exactly ``d`` components with the input cut
    at ``s`` charged to its first stage; the loop over ``i`` goes from the output side.
    """
    n, m_max, reps = costs.cut_s.size - 1, costs.machines, costs.replicas
    r_of, d_of, starts, m_of = costs.splits
    best = np.full((n + 1, ends.size), _INF)
    into = np.full((ends.size, m_max + 1, n + 1), _INF)
    prefix = into.copy()  # running minimum of `into` over s from i + 1
    for i in range(n - 1, -1, -1):
        lo = int(np.searchsorted(ends, i + 1))
        if i + 1 < n:
            np.minimum(prefix[lo:, :, i + 1 :], into[lo:, :, i + 1, None], out=prefix[lo:, :, i + 1 :])
        time_s, rows, fits = costs.first_stage(i)
        span = ends[lo:] - i - 1
        exact = np.full((span.size, m_max + 1), _INF)
        exact[:, reps] = np.where(span[:, None] < fits[:, 0], time_s[rows[:, 0][:, None], span].T, _INF)
        exact_in = exact.copy()
        exact_in[:, reps] = np.maximum(exact[:, reps], costs.cut_s[i] / reps)
        if r_of.size and i + 1 < n:
            last = np.minimum(span[:, None] - 1, fits[r_of - 1, d_of] - 1)
            split = _best_split(time_s, prefix[lo:], last, rows[r_of - 1, d_of], d_of, i + 1)
            exact[:, m_of] = np.minimum(exact[:, m_of], np.minimum.reduceat(split, starts, axis=1))
            split_in = np.maximum(split, costs.cut_s[i] / r_of)
            exact_in[:, m_of] = np.minimum(exact_in[:, m_of], np.minimum.reduceat(split_in, starts, axis=1))
        into[lo:, :, i] = exact_in
        best[i, lo:] = exact.min(axis=1)
    return best


def _stage_counts(costs: _Costs, start: int, end: int, limit_s: float) -> tuple[Array, Array]:
    """Fewest stages with every term ``<= limit_s``: ``(counts[d, s], root[m])``.

    ``counts[d, s]`` covers ``[s, end)`` on exactly ``d`` components with the input cut at ``s``;
    ``root[m]`` covers ``[start, end)`` on exactly ``m`` components, without an input cut.
    """
    m_max, reps = costs.machines, costs.replicas
    r_of, d_of, starts, m_of = costs.splits
    counts = np.full((m_max + 1, end + 1), _INF)
    prefix = counts.copy()  # running minimum over s from i + 1
    root = np.full(m_max + 1, _INF)
    for i in range(end - 1, start - 1, -1):
        np.minimum(prefix[:, i + 1 : end], counts[:, i + 1, None], out=prefix[:, i + 1 : end])
        allowed = _allowed(costs, i, end, limit_s)
        cut_fits = costs.cut_s[i] / reps <= limit_s
        single = np.where(allowed[:, 0] >= end - i, 1.0, _INF)
        row, row_in = np.full(m_max + 1, _INF), np.full(m_max + 1, _INF)
        row[reps], row_in[reps] = single, np.where(cut_fits, single, _INF)
        if r_of.size and i + 1 < end:
            last = np.minimum(allowed[r_of - 1, d_of], end - i - 1) - 1
            rest = np.where(last >= 0, prefix[d_of, i + 1 + np.maximum(last, 0)] + 1, _INF)
            row[m_of] = np.minimum(row[m_of], np.minimum.reduceat(rest, starts))
            rest_in = np.where(cut_fits[r_of - 1], rest, _INF)
            row_in[m_of] = np.minimum(row_in[m_of], np.minimum.reduceat(rest_in, starts))
        counts[:, i], root = row_in, row
    return counts, root


def _allowed(costs: _Costs, i: int, end: int, limit_s: float) -> Ints:
    """``[R, M+1]``: how many stage ends ``s = i+1, ...`` (up to ``end``) keep the stage ``<= limit_s``
    and in memory, by replicas and components downstream (stage time rises with ``s``)."""
    time_s, rows, fits = costs.first_stage(i)
    allowed: Ints = np.minimum(np.count_nonzero(time_s[:, : end - i] <= limit_s, axis=1)[rows], fits)
    return allowed


def _next_stage(
    costs: _Costs, i: int, end: int, limit_s: float, counts: Array, n_stages: float, budget: int | None
) -> tuple[int, int, int]:
    """The tie-broken ``(stage end, replicas, components left)`` of an optimal stage starting at ``i``
    with ``n_stages`` to go on exactly ``budget`` components; ``None``: the root, any count, no cut."""
    reps = costs.replicas
    allowed = _allowed(costs, i, end, limit_s)
    usable = np.ones(reps.size, dtype=bool) if budget is None else costs.cut_s[i] / reps <= limit_s
    single = usable & (allowed[:, 0] >= end - i) & (n_stages == 1)
    r_of, d_of, _, _ = costs.splits
    hits = counts[:, i + 1 : end] == n_stages - 1
    first_hit = np.argmax(np.hstack([hits, np.ones((hits.shape[0], 1), dtype=bool)]), axis=1)  # end - i - 1: none
    split = usable[r_of - 1] & (first_hit[d_of] < np.minimum(allowed[r_of - 1, d_of], end - i - 1))
    if budget is not None:
        single &= reps == budget
        split &= r_of + d_of == budget
    ends = np.concatenate([np.full(int(single.sum()), end), i + 1 + first_hit[d_of[split]]])
    r_all = np.concatenate([reps[single], r_of[split]])
    d_all = np.concatenate([np.zeros(int(single.sum()), dtype=np.intp), d_of[split]])
    if not ends.size:
        raise AssertionError("the stage-count DP and its walk disagree")
    pick = np.lexsort((d_all, r_all, ends))[0]
    return int(ends[pick]), int(r_all[pick]), int(d_all[pick])


def _walk(costs: _Costs, start: int, end: int, limit_s: float) -> list[tuple[int, int, int, int]]:
    """Optimal stages ``(first, end, replicas, components after)`` of ``[start, end)`` at this level."""
    counts, root = _stage_counts(costs, start, end, limit_s)
    n_stages = float(root.min())
    stages = []
    i, budget = start, None
    while i < end:
        stop, r, budget = _next_stage(costs, i, end, limit_s, counts, n_stages, budget)
        stages.append((i, stop, r, budget))
        i, n_stages = stop, n_stages - 1
    return stages


def _flatten(
    tables: Sequence[Sequence[_Costs]], k: int, g: int, start: int, end: int, limit_s: float, bases: tuple[int, ...]
) -> list[DPStage]:
    """Flat stages of ``[start, end)`` at level ``k`` (0-based) and stash grid point ``g``, run in each
    of the components of level ``k`` whose first devices are ``bases``; a stage takes the next ``r``
    machines of each component."""
    costs = tables[k][g]
    flat: list[DPStage] = []
    used = 0
    for first, stop, r, after in _walk(costs, start, end, limit_s):
        machines = tuple(b + (used + i) * costs.inner_devices for b in bases for i in range(r))
        used += r
        if k == 0:
            flat.append(DPStage(first, stop, len(machines), tuple(sorted(machines))))
        else:
            sub = int(costs.sub_rows[r - 1, after])
            inner_s = float(costs.compute_s[sub, first, stop]) * (1 + _TIE_RTOL)
            flat.extend(_flatten(tables, k - 1, sub, first, stop, inner_s, machines))
    return flat


def _per_layer(name: str, values: Sequence[float], n_layers: int) -> Array:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (n_layers,):
        raise UserError(f"{name} has {array.size} entries but compute_s has {n_layers}; give one value per layer")
    if not np.all(np.isfinite(array) & (array >= 0)):
        bad = int(np.flatnonzero(~(np.isfinite(array) & (array >= 0)))[0])
        raise UserError(f"{name}[{bad}]={array[bad]}: give finite values >= 0")
    return array


def _stash_grids(levels: Sequence[Level], memory: DeviceMemoryLimit | None) -> list[Ints]:
    """Per level, the extra devices after a span (per replica) its tables are solved for.

    The top sees none. Below a level with ``M`` components of ``n`` devices and at most ``X`` extra,
    up to ``(M - 1) n + X`` come after; exact up to 8, then 25 % apart, rounded up (a safe overcount).
    Without a memory limit stashes do not matter: one grid point, 0.
    """
    grids = [np.zeros(1, dtype=np.intp) for _ in levels]
    if memory is None:
        return grids
    for k in range(len(levels) - 2, -1, -1):
        most = (levels[k + 1].machines - 1) * math.prod(level.machines for level in levels[: k + 1])
        most += int(grids[k + 1][-1])
        points = list(range(min(most, 8) + 1))
        while points[-1] < most:
            points.append(math.ceil(points[-1] * 1.25))
        grids[k] = np.array(points, dtype=np.intp)
    return grids


def _tables(
    compute_s: Array, output_bytes: Array, parameter_bytes: Array, levels: Sequence[Level], *,
    sync_scale: float, synchronous: bool, memory: DeviceMemoryLimit | None, straight: bool,
) -> list[list[_Costs]]:
    """Every level's costs, bottom-up, one per stash grid point; each level's compute is the level
    below's best time over every span (docs/algorithms.md §3.3, hierarchy)."""
    n = compute_s.size
    cut_by_level = []
    for link in levels:
        cut_s = np.zeros(n + 1)
        cut_s[1:n] = 2 * (link.latency_s + output_bytes[:-1] / link.bandwidth_bytes_per_s)
        cut_by_level.append(cut_s)
    saved = None if memory is None else _span_sums(_per_layer("memory.activation_bytes", memory.activation_bytes, n))
    params = _span_sums(parameter_bytes)
    span_s = np.where(np.triu(np.ones((n + 1, n + 1), dtype=bool), 1), _span_sums(compute_s), _INF)[None]
    grids = _stash_grids(levels, memory)
    sub_grid = np.zeros(1, dtype=np.intp)
    tables: list[list[_Costs]] = []
    for k, link in enumerate(levels):
        inner_devices = math.prod(level.machines for level in levels[:k])
        tables.append([_Costs(span_s, params, saved if inner_devices == 1 else None, cut_by_level[k], link,
                              inner_devices, sync_scale, synchronous, memory, straight, int(x), sub_grid)
                       for x in grids[k]])
        if k + 1 < len(levels):
            span_s = np.stack([_suffix_dp(costs, np.arange(n + 1)) for costs in tables[-1]])
            sub_grid = grids[k]
    return tables


def _out_of_memory(memory: DeviceMemoryLimit, parameter_bytes: Array, levels: Sequence[Level]) -> UserError:
    """The error for a model that fits nowhere, naming the largest single-layer need."""
    alone_bytes = memory.state_copies * parameter_bytes + np.asarray(memory.activation_bytes, dtype=np.float64)
    worst = int(np.argmax(alone_bytes))
    return UserError(
        f"no partition of {parameter_bytes.size} layers over {math.prod(level.machines for level in levels)} devices "
        f"fits memory.device_bytes={memory.device_bytes:.4g} with state_copies={memory.state_copies} (layer {worst} "
        f"alone needs {alone_bytes[worst]:.4g} bytes); use more devices (fewer layers per device), smaller "
        "micro-batches (fewer activation bytes), fewer state copies or a larger limit")


def _checked_inputs(
    compute_s: Sequence[float],
    output_bytes: Sequence[float],
    parameter_bytes: Sequence[float],
    levels: Sequence[Level],
    sync_scale: float,
) -> tuple[Array, Array, Array]:
    """The three per-layer sequences as arrays, once they and the other arguments are checked.

    Raises:
        UserError: no layers, no levels, a ``sync_scale`` below 0, or a per-layer sequence of
            another length or with a value that is not finite and ``>= 0``.
    """
    n = len(compute_s)
    if n == 0:
        raise UserError("compute_s is empty: give at least one layer (profile the model first)")
    if not levels:
        raise UserError("levels is empty: give at least one Level (e.g. Level(machines=8, bandwidth_bytes_per_s=...))")
    if not (math.isfinite(sync_scale) and sync_scale >= 0):
        raise UserError(f"sync_scale={sync_scale}: give a finite value >= 0 (1/m for m micro-batches per sync)")
    compute = _per_layer("compute_s", compute_s, n)
    return compute, _per_layer("output_bytes", output_bytes, n), _per_layer("parameter_bytes", parameter_bytes, n)


def pipedream_partition(
    compute_s: Sequence[float],
    output_bytes: Sequence[float],
    parameter_bytes: Sequence[float],
    levels: Sequence[Level],
    *,
    sync_scale: float = 1.0,
    synchronous: bool = False,
    straight: bool = False,
    memory: DeviceMemoryLimit | None = None,
) -> DPResult:
    """PipeDream's hierarchical partition of a layer chain (module docstring; docs/algorithms.md §3.3).

    Args:
        compute_s: per layer ``[L]``, forward + backward seconds of one item on one device.
        output_bytes: per layer ``[L]``, bytes of its output activation for one item (the gradient
            sent back has the same size).
        parameter_bytes: per layer ``[L]``, bytes of its weights.
        levels: the topology bottom-up; ``prod(machines)`` devices in all.
        synchronous: every replica all-reduces once per ``1 / sync_scale`` items whatever its share
            of them (pipetrain's flush schedules): the sync term is not divided by the replicas.
        sync_scale: multiplies the weight-sync term: 1 for PipeDream's asynchronous runtime (one
            sync per item), ``1/m`` for a synchronous schedule with ``m`` micro-batches.
        straight: forbid replication (PipeDream's straight pipeline).
        memory: an optional per-device memory check.

    Returns:
        The flat stages, the bottleneck seconds per item and the config string.

    Raises:
        UserError: on empty or mismatched inputs, no levels, a negative ``sync_scale``, or when no
            partition fits in memory.
    """
    compute, outputs, params = _checked_inputs(compute_s, output_bytes, parameter_bytes, levels, sync_scale)
    n = compute.size
    tables = _tables(compute, outputs, params, levels, sync_scale=sync_scale, synchronous=synchronous, memory=memory,
                     straight=straight)
    bottleneck_s = float(_suffix_dp(tables[-1][0], np.array([n]))[0, 0])
    if not math.isfinite(bottleneck_s):  # only memory can rule every partition out
        assert memory is not None
        raise _out_of_memory(memory, params, levels)
    stages = tuple(_flatten(tables, len(tables) - 1, 0, 0, n, bottleneck_s * (1 + _TIE_RTOL), (0,)))
    return DPResult(stages, bottleneck_s, "-".join(str(stage.replicas) for stage in stages))
