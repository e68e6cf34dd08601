"""One level's cost tables for PipeDream's partitioner (:mod:`.pipedream`, docs/algorithms.md §3.3).

A level ``k`` of the topology has ``M`` components (``Level.machines``) of ``n_in`` devices each.
:class:`_Costs` holds, for one point of the stash grid, what the DP reads there: the seconds per
item of every span ``[i, j)`` of the ``L`` layers on one component (``[G, L+1, L+1]``, one slice
per grid point of the level below), its parameter and saved-activation bytes (``[L+1, L+1]``), the
cut seconds at every boundary (``[L+1]``) and the link. From those :meth:`_Costs.first_stage`
prices every stage starting at one layer on ``r`` replicas, compute plus weight sync, a SUM as in
PipeDream's public code::

    T(i, j, r) = (C[i, j] + sync_scale * (2 (r-1)/r * P[i, j] / (B_k n_in) + 2 (r-1) latency_k)) / r

(the sync term added after the division by ``r`` for a synchronous schedule), with the memory
check ``state_copies * P + in_flight * saved_bytes <= device_bytes``, ``in_flight = ceil(D / r) + 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from pipetrain.planners.partition.pipedream_types import DeviceMemoryLimit, Level

__all__ = ["Array", "Ints"]

Array = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]
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
