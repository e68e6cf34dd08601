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

The parts: one level's cost tables and its stage times ``T`` (:mod:`.pipedream_costs`), the
recurrence with its binary search (:mod:`.pipedream_dp`), the hierarchy's tables bottom-up
(:mod:`.pipedream_levels`), the ties and the flattening (:mod:`.pipedream_walk`); the inputs and the
answer are in :mod:`.pipedream_types`. This module checks the inputs and runs them in that order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipetrain.errors import UserError
from pipetrain.planners.partition.pipedream_costs import Array
from pipetrain.planners.partition.pipedream_dp import _suffix_dp
from pipetrain.planners.partition.pipedream_levels import _per_layer, _tables
from pipetrain.planners.partition.pipedream_types import DeviceMemoryLimit, DPResult, DPStage, Level
from pipetrain.planners.partition.pipedream_walk import _TIE_RTOL, _flatten

__all__ = ["DPResult", "DPStage", "DeviceMemoryLimit", "Level", "pipedream_partition"]


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
