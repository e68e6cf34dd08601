"""Local greedy baseline: each stage picks its own best micro-batch size, ignoring its neighbours.

UMPIPE (Zhou et al., IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804) compares TiDGAP with "the local
greedy algorithm"; its definition is not public, so this is **pipetrain's reconstruction**
(docs/algorithms.md §2.5). Stage ``k`` chooses

    b*_k = argmin_{1 <= b <= bound_k} t_k(b) / b          (t = f for forward, g for backward)

and splits the batch into chunks of ``b*_k`` in sample order (the remainder last). Unbounded
(``bound_k = B``), a fixed per-micro-batch overhead makes ``b* = B``: no pipelining at all. The
bounded variant stops at the stage's saturation point ``s_k`` (see :func:`saturation_point`),
where the device stops getting cheaper per sample, and at its memory cap. Cost: ``O(K B)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pipetrain.planners.microbatch.result import MicrobatchPlan, check_caps, evaluate
from pipetrain.simulate.vectorised import StageTables

__all__ = ["chunk_sizes", "local_greedy", "saturation_point"]


def saturation_point(table: npt.NDArray[np.float64]) -> int:
    """The size ``s`` past which one more sample costs at least half the large-size marginal cost.

    For ``t(b) = α + β·max(b, s)`` this is exactly ``s`` (``t`` is flat up to ``s``, then grows by
    ``β``); for a linear ``t`` it is 1; for a ``t`` that does not grow it is ``B``.

    Args:
        table: ``[B + 1]`` seconds by size (entry 0 unused).
    """
    batch = len(table) - 1
    if batch < 2:
        return batch
    half = math.ceil(batch / 2)
    slope = (table[batch] - table[half]) / (batch - half)
    if slope <= 0.0:
        return batch
    marginal = np.diff(table[1:])  # marginal[i] = t(i + 2) - t(i + 1)
    rising = np.flatnonzero(marginal >= slope / 2)
    return int(rising[0]) + 1 if rising.size else batch


def chunk_sizes(batch: int, size: int) -> tuple[int, ...]:
    """``batch`` in chunks of ``size`` samples, the remainder last."""
    full, rest = divmod(batch, size)
    return (size,) * full + ((rest,) if rest else ())


def _best_size(table: npt.NDArray[np.float64], bound: int) -> int:
    sizes = np.arange(1, bound + 1)
    return int(sizes[np.argmin(table[1:bound + 1] / sizes)])


def local_greedy(tables: StageTables, caps: Sequence[int] | None = None, bounded: bool = True) -> MicrobatchPlan:
    """Each stage's own best size for forward (from ``f``) and for backward (from ``g``).

    Args:
        tables: stage costs ``[K, B + 1]``.
        caps: per stage, the largest micro-batch allowed; None for no cap.
        bounded: bound each size at the stage's saturation point (else only at the cap).
    """
    batch = tables.batch_size
    limits = check_caps(caps, tables.n_stages) or (batch,) * tables.n_stages
    partitions: tuple[list[tuple[int, ...]], list[tuple[int, ...]]] = ([], [])
    for side, table in zip(partitions, (tables.forward_s, tables.backward_s), strict=True):
        for row, limit in zip(table, limits, strict=True):
            bound = min(limit, batch, saturation_point(row) if bounded else batch)
            side.append(chunk_sizes(batch, _best_size(row, bound)))
    return evaluate(partitions[0], partitions[1], tables, "greedy" if bounded else "greedy-unbounded")
