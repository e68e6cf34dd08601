"""Interleaved 1F1B with a zero-bubble split backward (method ``interleaved-zb``, pipetrain's own).

Two published schedules combined: the looping placement and order of interleaved 1F1B (Narayanan et
al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21, §2.2;
:mod:`pipetrain.schedule.interleaved`), and the split backward of Zero Bubble (Qi, Wan, Huang and
Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2: a backward is ``B``, the input gradient the
previous stage waits for, and ``W``, the weight gradient only the step waits for; §3: W actions are
deferred to fill bubbles under a memory limit). Interleaving shrinks the fill and drain bubble by
``v``; deferring W lets the ranks that would wait in the drain compute weight gradients instead.

The rule, ZB-H1's (§2.1, :mod:`pipetrain.schedule.zero_bubble`) read over a rank's whole program.
Rank ``r`` of ``R``, ``v`` chunks, runs its interleaved F/B order unchanged (B where the fused
backward was); its warm-up is ``w_r = 2(R − r − 1) + (v − 1)R`` forwards, so under interleaved 1F1B
it holds at most ``w_r + 1`` (chunk, micro-batch) pairs from F to B, rank 0 the most: ``H = w_0 + 1
= (v + 1)R − 1``. Rank ``r`` may defer ``d_r = w_0 − w_r = 2r`` W actions: after each B, the oldest
pending W runs once more than ``d_r`` are pending, and, once the rank has no forward left (the
cool-down), after every B; before a forward, pending W actions run while the rank holds ``H`` pairs;
the rest run before the steps. Every rank then holds at most ``H`` pairs from F to W: the rank that
holds the most under interleaved 1F1B holds no more, and later ranks use what it left unused
(balanced chunks: peak activation bytes near interleaved 1F1B's; the unit tests check the counts).
W depends only on its own B on the same rank, so adding W actions removes no dependency's producer
and the order cannot deadlock (the validator's dry run checks it). Any ``m`` works, as for
``interleaved``. Two ranks, two chunks, four micro-batches (rank 0 holds stages 0 and 2)::

    rank 0:  0F0 0F1 2F0 2F1 0F2 2B0 2W0 0F3 2B1 2W1 2F2 0B0 0W0 2F3 0B1 0W1 2B2 2W2 2B3 2W3 0B2 0W2 0B3 0W3
             0STEP 2STEP
    rank 1:  1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 3W0 1F3 1B1 3W1 3F2 3B2 1W0 3F3 3B3 1W1 1B2 3W2 1B3 3W3 1W2 1W3
             1STEP 3STEP

Data: per rank, its compute actions (F, B, W, then one STEP per chunk) with sample ranges; stage
``c·R + r`` is chunk ``c`` of rank ``r``.
"""

from __future__ import annotations

from pipetrain.plan.plan import Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.interleaved import rank_order
from pipetrain.schedule.orders import Orders
from pipetrain.schedule.zero_bubble import ZbKind, place_weight_grads, strict_memory

__all__ = ["held_bound", "interleaved_zb_programs", "interleaved_zb_sequence"]

Pair = tuple[int, int]  # (chunk, micro-batch)


def held_bound(n_ranks: int, chunks: int) -> int:
    """``H = w_0 + 1 = (v + 1)R − 1``: the most (chunk, micro-batch) pairs rank 0 holds from F to B
    under interleaved 1F1B (with enough micro-batches)."""
    return (chunks + 1) * n_ranks - 1


def _held_peak(order: list[tuple[bool, Pair]]) -> int:
    """The most pairs ``order`` holds from F to B (fused backward)."""
    held = peak = 0
    for backward, _ in order:
        held += -1 if backward else 1
        peak = max(peak, held)
    return peak


def interleaved_zb_sequence(rank: int, n_micro: int, n_ranks: int, chunks: int,
                            strict_memory: bool = False) -> list[tuple[ZbKind, Pair]]:
    """Rank ``rank``'s ``(kind, (chunk, micro-batch))`` order without the steps (module docstring):
    its interleaved order with W placed, ``d_r = 2r`` deferred at most and ``H`` pairs held.

    ``strict_memory``: a variant (the plan's ``ZeroBubbleParams(strict_memory=True)``;
    benchmarks/bench_interleaved_zb.py simulates it) that holds no more pairs than the rank itself
    does under interleaved 1F1B, so its activation bytes stay at interleaved's (equal in the
    V100-scale simulation); it keeps about a third of the time saved."""
    order = rank_order(rank, n_micro, n_ranks, chunks)
    bound = _held_peak(order) if strict_memory else held_bound(n_ranks, chunks)
    return place_weight_grads(order, 2 * rank, bound)


def interleaved_zb_programs(plan: Plan) -> Orders:
    """Per rank, its compute actions for a plan of method ``interleaved-zb``: F, B, W, then one STEP
    per chunk, in chunk order; the plan's ``strict_memory`` parameter
    (:func:`~pipetrain.schedule.zero_bubble.strict_memory`) picks the variant of :func:`interleaved_zb_sequence`."""
    n_ranks, chunks = plan.n_ranks, plan.virtual_stages
    spans = ranges(plan.stages[0].forward_sizes)
    strict = strict_memory(plan)
    programs: Orders = []
    for rank in range(n_ranks):
        out = [Action(ActionKind(kind), chunk * n_ranks + rank, j, *spans[j])
               for kind, (chunk, j) in interleaved_zb_sequence(rank, len(spans), n_ranks, chunks, strict)]
        programs.append([*out, *(Action(ActionKind.STEP, chunk * n_ranks + rank) for chunk in range(chunks))])
    return programs
