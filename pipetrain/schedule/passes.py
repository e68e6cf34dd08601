"""Schedule passes: pure ``Schedule -> Schedule`` functions (STYLE.md L3).

:func:`add_communication` inserts the point-to-point messages of a chain of stages:

* after each forward ``F`` of stage ``k`` that has a successor, a ``SEND_F`` of the same range to
  the successor's rank;
* before each ``F`` of stage ``k + 1``, a ``RECV_F`` of every *sender* micro-batch overlapping its
  range that has not arrived yet (when partitions differ the receiver re-chunks by sample range);
* likewise ``SEND_B`` after each ``B`` of a stage with a predecessor, and ``RECV_B`` before each
  ``B`` that needs gradients from the successor.

Messages on one directed link are received in the order they are sent, which is what FIFO
transports (gloo, NCCL) require; the validator checks it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pipetrain.plan.plan import Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule

__all__ = ["add_communication"]


def _messages(sizes: Sequence[int]) -> deque[tuple[int, int, int]]:
    """``(microbatch, lo, hi)`` of every micro-batch of a partition."""
    return deque((j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes)))


def _receives(
    kind: ActionKind, stage: int, peer: int, needed_hi: int, pending: deque[tuple[int, int, int]]
) -> list[Action]:
    """Pop and return receives for every pending message that starts before ``needed_hi``."""
    out = []
    while pending and pending[0][1] < needed_hi:
        j, lo, hi = pending.popleft()
        out.append(Action(kind, stage, j, lo, hi, peer=peer))
    return out


def add_communication(schedule: Schedule, plan: Plan) -> Schedule:
    """Insert SEND/RECV actions for a chain of single-rank stages (see module docstring)."""
    rank_of = [s.ranks[0] for s in plan.stages]
    last = plan.n_stages - 1
    programs: list[list[Action]] = []
    for rank, program in schedule:
        k = plan.stage_of_rank(rank)
        fwd_in = _messages(plan.stages[k - 1].forward_sizes) if k > 0 else deque()
        bwd_in = _messages(plan.stages[k + 1].backward_sizes) if k < last else deque()
        out: list[Action] = []
        for a in program:
            if a.kind is ActionKind.F and k > 0:
                out += _receives(ActionKind.RECV_F, k, rank_of[k - 1], a.hi, fwd_in)
            if a.kind is ActionKind.B and k < last:
                out += _receives(ActionKind.RECV_B, k, rank_of[k + 1], a.hi, bwd_in)
            out.append(a)
            if a.kind is ActionKind.F and k < last:
                out.append(Action(ActionKind.SEND_F, k, a.microbatch, a.lo, a.hi, peer=rank_of[k + 1]))
            if a.kind is ActionKind.B and k > 0:
                out.append(Action(ActionKind.SEND_B, k, a.microbatch, a.lo, a.hi, peer=rank_of[k - 1]))
        programs.append(out)
    return Schedule.from_lists(programs)
