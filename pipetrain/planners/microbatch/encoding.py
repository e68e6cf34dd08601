"""Cut masks ↔ size vectors: the dual-chromosome encoding of UMPIPE's DGAP.

Reconstruction (docs/algorithms.md §2.4) of Zhou et al., IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804. A
stage's partition of ``B`` samples is a boolean row ``[B]`` whose entry ``i`` is True where a
micro-batch ends at sample ``i`` (0-based); the last entry is always True. Every such row is a valid
composition of ``B``, so crossover and mutation need no repair. A plan is two masks ``[K, B]``
(forward and backward); a population is two ``[P, K, B]`` arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "BoolArray",
    "Partition",
    "cap_cuts",
    "cuts_to_partition",
    "cuts_to_sizes",
    "equal_seeds",
    "partition_to_cuts",
    "sizes_to_cuts",
]

BoolArray = npt.NDArray[np.bool_]
Partition = tuple[tuple[int, ...], ...]
"""Per stage, the micro-batch sizes (each tuple sums to the batch)."""


def sizes_to_cuts(sizes: Sequence[int], batch: int) -> BoolArray:
    """The ``[batch]`` cut row of a size vector.

    Raises:
        ValueError: a size below 1, or sizes that do not sum to ``batch``.
    """
    if min(sizes, default=0) < 1 or sum(sizes) != batch:
        raise ValueError(f"sizes {list(sizes)} must all be >= 1 and sum to {batch}")
    cuts = np.zeros(batch, dtype=bool)
    cuts[np.cumsum(sizes) - 1] = True
    return cuts


def cuts_to_sizes(cuts: BoolArray) -> tuple[int, ...]:
    """The size vector of a ``[B]`` cut row (its last entry must be True)."""
    ends = np.flatnonzero(cuts) + 1
    if not cuts[-1]:
        raise ValueError("the last entry of a cut row must be True")
    return tuple(int(x) for x in np.diff(ends, prepend=0))


def partition_to_cuts(partition: Sequence[Sequence[int]], batch: int) -> BoolArray:
    """``[K, B]`` cut masks of a per-stage partition."""
    return np.stack([sizes_to_cuts(sizes, batch) for sizes in partition])


def cuts_to_partition(cuts: BoolArray) -> Partition:
    """The per-stage partition of ``[K, B]`` cut masks."""
    return tuple(cuts_to_sizes(row) for row in cuts)


def equal_seeds(n_stages: int, batch: int) -> BoolArray:
    """Every equal-micro-batch (GPipe) plan as cut masks ``[B, K, B]``: entry ``m - 1`` splits
    every stage into ``m`` sizes :func:`~pipetrain.plan.plan.equal_sizes` ``(B, m)``; use the same
    mask for forward and backward.

    Built without a Python loop: with ``q, r = divmod(B, m)`` the first ``r`` sizes are ``q + 1``,
    so micro-batch ``i`` (0-based) ends at sample ``(i + 1) q + min(i + 1, r) - 1``."""
    m = np.arange(1, batch + 1)[:, None]  # [B, 1] micro-batch counts
    i = np.arange(1, batch + 1)[None, :]  # [1, B] 1-based micro-batch index
    count, ends = np.broadcast_arrays(m, i * (batch // m) + np.minimum(i, batch % m) - 1)
    valid = i <= m
    rows = np.zeros((batch, batch), dtype=bool)
    rows[count[valid] - 1, ends[valid]] = True
    return np.repeat(rows[:, None, :], n_stages, axis=1)


def cap_cuts(cuts: BoolArray, caps: Sequence[int] | None) -> BoolArray:
    """Add the fewest cuts so no micro-batch of stage ``k`` exceeds ``caps[k]`` samples.

    Each too-long micro-batch is split into pieces of ``caps[k]`` and a shorter remainder. Cuts
    already present are kept, so a plan that meets the caps is returned unchanged.

    Args:
        cuts: ``[..., K, B]`` cut masks.
        caps: per stage, the largest micro-batch allowed (>= 1); None for no cap.
    """
    if caps is None:
        return cuts
    cap = np.asarray(caps, dtype=np.intp)
    if cap.shape != (cuts.shape[-2],) or np.any(cap < 1):
        raise ValueError(f"caps {list(caps)} must give one size >= 1 for each of {cuts.shape[-2]} stages")
    pos = np.arange(cuts.shape[-1])
    last = np.maximum.accumulate(np.where(cuts, pos, -1), axis=-1)
    previous = np.concatenate([np.full((*cuts.shape[:-1], 1), -1), last[..., :-1]], axis=-1)
    return np.asarray(cuts | ((pos - previous) % cap[:, None] == 0), dtype=bool)
