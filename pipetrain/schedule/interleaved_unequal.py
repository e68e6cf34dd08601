"""Interleaved 1F1B with unequal micro-batches: each virtual stage its own partition (issue 17).

Megatron's interleaved order (Narayanan et al., SC'21, §2.2; :mod:`pipetrain.schedule.interleaved`)
moves micro-batch *indices* through the chunks, which presumes one partition for every stage. With
UMPIPE's per-stage partitions (Zhou et al., TPDS 2025) stage ``s`` cuts the batch its own way, so a
forward of stage ``s`` waits for the upstream forwards that cover its samples, not for "the same
micro-batch". pipetrain's extension builds the orders by **list scheduling in unit time**: in each
round, every rank runs at most one action of its stages ``r, r + R, …`` that is ready at the start of
the round, preferring

1. a backward (the highest stage first: closest to the loss), else
2. a forward (the highest stage first, so micro-batches go deep before new ones start) while the
   rank holds fewer than Megatron's ``w_r + 1`` micro-batches from F to B, ``w_r = 2 (R − r − 1) +
   (v − 1) R`` its warm-up forwards;

and when no rank can act under that bound, one round ignores it. Readiness: forward ``j`` of stage
``s`` (samples ``[lo, hi)``) needs stage ``s − 1`` to have forwarded samples up to ``hi``; backward
``j`` needs its own forward and stage ``s + 1``'s backwards up to ``hi``; each stage runs its
forwards, and its backwards, in sample order. The result is a feasible execution, so every
dependency precedes its action and the orders cannot deadlock (the validator's dry run checks it);
a round with the bound lifted always finds one action (the lowest stage with forwards left, or the
highest with backwards left), so the construction ends. Cost: ``O(rounds · K)`` with at most
``2 Σ_s m_s`` rounds.

Data: ``partitions[s]`` is stage ``s``'s size vector (forward = backward), each summing to ``B``;
the result is, per rank, ``(is_backward, stage, micro-batch index in the stage's partition)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

__all__ = ["unequal_interleaved_orders"]

Step = tuple[bool, int, int]  # (is_backward, stage, micro-batch index)


class _Progress:
    """Per stage, how many forwards and backwards have run and the samples they cover."""

    def __init__(self, partitions: Sequence[Sequence[int]]) -> None:
        self.ends = [list(accumulate(p)) for p in partitions]
        self.forwards = [0] * len(partitions)
        self.backwards = [0] * len(partitions)

    def covered(self, stage: int, backward: bool) -> int:
        """Samples stage ``stage`` has forwarded (backward: returned gradients for)."""
        done = (self.backwards if backward else self.forwards)[stage]
        return self.ends[stage][done - 1] if done else 0

    def ready(self, stage: int, backward: bool) -> bool:
        """Whether the stage's next forward (backward) has its inputs."""
        last = len(self.ends) - 1
        if backward:
            j = self.backwards[stage]
            if j >= self.forwards[stage]:
                return False
            return stage == last or self.covered(stage + 1, True) >= self.ends[stage][j]
        j = self.forwards[stage]
        if j >= len(self.ends[stage]):
            return False
        return stage == 0 or self.covered(stage - 1, False) >= self.ends[stage][j]


def _choose(progress: _Progress, stages: Sequence[int], bound: int | None) -> Step | None:
    """One rank's action this round (module docstring), or None."""
    for stage in reversed(stages):
        if progress.ready(stage, True):
            return True, stage, progress.backwards[stage]
    held = sum(progress.forwards[s] - progress.backwards[s] for s in stages)
    if bound is not None and held >= bound:
        return None
    for stage in reversed(stages):
        if progress.ready(stage, False):
            return False, stage, progress.forwards[stage]
    return None


def unequal_interleaved_orders(partitions: Sequence[Sequence[int]], n_ranks: int) -> list[list[Step]]:
    """Per rank, its interleaved order for per-stage partitions; stage ``s`` runs on rank ``s mod R``.

    Args:
        partitions: per stage of ``K = v R``, its micro-batch sizes (forward = backward).
        n_ranks: ``R``; ``K`` must be a multiple of it.

    Raises:
        ValueError: ``K`` is not a multiple of ``R``, or the partitions do not sum to one batch.
    """
    n = len(partitions)
    if n_ranks < 1 or n % n_ranks:
        raise ValueError(f"{n} stages do not loop over {n_ranks} ranks; give a multiple of the rank count")
    chunks = n // n_ranks
    owned = [list(range(r, n, n_ranks)) for r in range(n_ranks)]
    bounds = [2 * (n_ranks - r - 1) + (chunks - 1) * n_ranks + 1 for r in range(n_ranks)]
    progress = _Progress(partitions)
    orders: list[list[Step]] = [[] for _ in range(n_ranks)]
    remaining = 2 * sum(len(p) for p in partitions)
    while remaining:
        chosen = [_choose(progress, owned[r], bounds[r]) for r in range(n_ranks)]
        if not any(chosen):
            chosen = [_choose(progress, owned[r], None) for r in range(n_ranks)]
        if not any(chosen):
            raise ValueError(f"stage partitions sum to {sorted({sum(p) for p in partitions})}; each must sum to the "
                             "batch")
        for r, step in enumerate(chosen):
            if step is None:
                continue
            backward, stage, _ = step
            (progress.backwards if backward else progress.forwards)[stage] += 1
            orders[r].append(step)
            remaining -= 1
    return orders
