"""Every level's cost tables for PipeDream's partitioner, built bottom-up (docs/algorithms.md §3.3).

**Hierarchy**: level 1 (devices in a server) is solved for every span ``[i, j)`` of the ``L``
layers, and ``min_m A[i, j, m]`` becomes level 2's compute ``C[i, j]`` (``[L+1, L+1]``), and so on
up to the top level. With a memory limit each lower level is solved once per point ``x`` of a
stash grid, the devices after a span per replica of it (exact up to 8, then 25 % apart, rounded
up: a safe overcount; ``O(log N)`` points for ``N`` devices), so a level's compute is
``[G, L+1, L+1]`` over the ``G`` grid points of the level below. :func:`_tables` returns, per
level, one :class:`~.pipedream_costs._Costs` per grid point of that level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipetrain.errors import UserError
from pipetrain.planners.partition.pipedream_costs import _INF, Array, Ints, _Costs
from pipetrain.planners.partition.pipedream_dp import _suffix_dp
from pipetrain.planners.partition.pipedream_types import DeviceMemoryLimit, Level

__all__: list[str] = []


def _span_sums(values: Array) -> Array:
    """``[L+1, L+1]``: ``out[i, j] = sum(values[i:j])`` summed left to right, 0 where ``j <= i``."""
    n = values.size
    out = np.zeros((n + 1, n + 1))
    out[:n, 1:] = np.cumsum(np.triu(np.broadcast_to(values, (n, n))), axis=1)
    return np.triu(out, 1)


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
