"""Interleaved 1F1B: ``v`` model chunks per rank, looping placement (Narayanan et al. 2021, §2.2).

The model is cut into ``K = v·R`` stages; stage ``s`` runs on rank ``s mod R``, so rank ``r`` holds
chunks ``r, r + R, …, r + (v − 1)R``. A micro-batch crosses every rank ``v`` times, and the
pipeline's fill and drain shrink by ``v``: the bubble of 1F1B, ``(R − 1)/m`` of an iteration, becomes
``(R − 1)/(v·m)``, for ``v`` times the point-to-point messages.

Every rank runs the same sequence of (chunk, micro-batch) pairs. Micro-batches go in groups of
``R``; forward takes each group through chunks ``0 … v−1`` in turn, backward through ``v−1 … 0``::

    forward   (c0, j0..jR-1) (c1, j0..jR-1) … (c0, jR..j2R-1) …
    backward  (cv-1, j0..jR-1) … (c0, j0..jR-1) (cv-1, jR..j2R-1) …

Rank ``r`` first issues ``w_r = (R − r − 1)·2 + (v − 1)·R`` forwards (all of them if fewer), then
alternates one forward and one backward, then drains the backwards, then steps every chunk. Unlike
torch's ``ScheduleInterleaved1F1B``, any micro-batch count ``m`` works: the order is Megatron's for
``m`` rounded up to whole groups, with the padding micro-batches' actions left out, which removes
dependencies and adds none, so it cannot deadlock either (the validator's dry run checks it). Two
chunks, two ranks, four micro-batches (rank 0 holds stages 0 and 2, rank 1 stages 1 and 3)::

    rank 0:  0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3 0STEP 2STEP
    rank 1:  1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3 1STEP 3STEP
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.plan.plan import Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.interleaved_unequal import Step, unequal_interleaved_orders
from pipetrain.schedule.orders import Orders

__all__ = ["interleaved_orders", "interleaved_programs", "interleaved_sequence", "rank_order"]

Pair = tuple[int, int]  # (chunk, micro-batch)


def interleaved_sequence(n_micro: int, n_ranks: int, chunks: int, backward: bool) -> list[Pair]:
    """The (chunk, micro-batch) pairs every rank runs forward (or backward), in order."""
    order: list[Pair] = []
    for first in range(0, n_micro, n_ranks):
        group = range(first, min(first + n_ranks, n_micro))
        for c in reversed(range(chunks)) if backward else range(chunks):
            order += [(c, j) for j in group]
    return order


def _warmup(rank: int, n_ranks: int, chunks: int, total: int) -> int:
    return min(total, (n_ranks - rank - 1) * 2 + (chunks - 1) * n_ranks)


def rank_order(rank: int, n_micro: int, n_ranks: int, chunks: int) -> list[tuple[bool, Pair]]:
    """Rank ``rank``'s ``(is_backward, (chunk, micro-batch))`` order (module docstring): Megatron's
    order for the micro-batch count rounded up to whole groups, without the padding micro-batches."""
    padded = -(-n_micro // n_ranks) * n_ranks
    forward = interleaved_sequence(padded, n_ranks, chunks, backward=False)
    backward = interleaved_sequence(padded, n_ranks, chunks, backward=True)
    warmup = _warmup(rank, n_ranks, chunks, len(forward))
    order: list[tuple[bool, Pair]] = [(False, pair) for pair in forward[:warmup]]
    for b, pair in enumerate(backward):
        if warmup + b < len(forward):
            order.append((False, forward[warmup + b]))
        order.append((True, pair))
    return [(backward, (c, j)) for backward, (c, j) in order if j < n_micro]


def interleaved_orders(partitions: Sequence[tuple[int, ...]], n_ranks: int) -> list[list[Step]]:
    """Per rank, its ``(is_backward, stage, micro-batch)`` order: Megatron's (above) when every stage
    has the same partition, else :func:`~pipetrain.schedule.interleaved_unequal.unequal_interleaved_orders`."""
    if len(set(partitions)) != 1:
        return unequal_interleaved_orders(partitions, n_ranks)
    chunks = len(partitions) // n_ranks
    return [[(b, c * n_ranks + r, j) for b, (c, j) in rank_order(r, len(partitions[0]), n_ranks, chunks)]
            for r in range(n_ranks)]


def interleaved_programs(plan: Plan) -> Orders:
    """Per rank, its compute actions for a plan of method ``interleaved``: F and B in
    :func:`interleaved_orders`' order, then one STEP per chunk, in chunk order."""
    n_ranks, chunks = plan.n_ranks, plan.virtual_stages
    partitions = [s.forward_sizes for s in plan.stages]
    spans = [ranges(sizes) for sizes in partitions]
    programs: Orders = []
    for rank, order in enumerate(interleaved_orders(partitions, n_ranks)):
        out = [Action(ActionKind.B if backward else ActionKind.F, stage, j, *spans[stage][j])
               for backward, stage, j in order]
        programs.append([*out, *(Action(ActionKind.STEP, chunk * n_ranks + rank) for chunk in range(chunks))])
    return programs
