"""What every schedule generator returns, and the helpers the one-stage-per-rank generators share.

A generator (:mod:`pipetrain.schedule.registry`) takes a plan and returns :data:`Orders`: the
programs before the replica split, each a list of compute actions (F, B, W, STEP) that runs on the
ranks of its stages. Under the single placement there is one program per stage, the stage's order
over *all* of its micro-batches; a replicated stage's replicas each run their own sub-sequence
(:func:`pipetrain.schedule.generators.compute_schedule`). Under a looping or V placement there is
one program per rank, holding all of its stages' actions. Two stages, two micro-batches of 2
samples, fill-drain::

    [[0F0[0:2], 0F1[2:4], 0B0[0:2], 0B1[2:4], 0STEP],
     [1F0[0:2], 1F1[2:4], 1B0[0:2], 1B1[2:4], 1STEP]]

Many orders are first built as *sequences*, per stage ``(is_backward, j)`` pairs with ``j`` the
micro-batch index in the stage's own partition (:func:`~pipetrain.schedule.one_f_one_b.one_f_one_b_sequences`);
:func:`sequenced` turns them into actions.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.errors import UserError
from pipetrain.plan.plan import StagePlan, ranges
from pipetrain.schedule.action import Action, ActionKind

__all__ = ["Orders", "Sequences", "backwards", "check_one_partition", "forwards", "sequenced"]

Orders = list[list[Action]]
"""A generator's programs before the replica split (module docstring)."""

Sequences = Sequence[Sequence[tuple[bool, int]]]
"""Per stage, its order as ``(is_backward, micro-batch index)`` pairs, without the STEP."""


def forwards(stage: int, sizes: tuple[int, ...]) -> list[Action]:
    """The stage's F actions over its partition ``sizes``, in sample order."""
    return [Action(ActionKind.F, stage, j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes))]


def backwards(stage: int, sizes: tuple[int, ...]) -> list[Action]:
    """The stage's B actions over its partition ``sizes``, in sample order."""
    return [Action(ActionKind.B, stage, j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes))]


def check_one_partition(stages: Sequence[StagePlan]) -> None:
    """Refuse a stage whose forward and backward sizes differ (an order built on one partition per stage).

    Raises:
        UserError: naming the stage, and the method that takes two partitions.
    """
    for k, s in enumerate(stages):
        if s.forward_sizes != s.backward_sizes:
            raise UserError(f"stage {k}: 1F1B needs equal forward and backward micro-batch sizes; "
                            "use method 'uedp' for different ones")


def sequenced(stages: Sequence[StagePlan], sequences: Sequences) -> Orders:
    """Each stage's ``(is_backward, j)`` sequence as actions, then its STEP.

    Raises:
        UserError: a stage whose forward and backward sizes differ (:func:`check_one_partition`).
    """
    check_one_partition(stages)
    orders = []
    for k, (s, sequence) in enumerate(zip(stages, sequences, strict=True)):
        fwd, bwd = forwards(k, s.forward_sizes), backwards(k, s.backward_sizes)
        orders.append([*(bwd[j] if backward else fwd[j] for backward, j in sequence), Action(ActionKind.STEP, k)])
    return orders
