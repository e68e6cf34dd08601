"""Schedule passes: pure ``Schedule -> Schedule`` functions (STYLE.md L3).

:func:`add_communication` inserts the point-to-point messages of a chain of stages:

* after each forward ``F`` of stage ``k`` that has a successor, a ``SEND_F`` of the same range to
  the successor's rank;
* before each ``F`` of stage ``k + 1``, a ``RECV_F`` of every *sender* micro-batch overlapping its
  range that has not arrived yet (when partitions differ the receiver re-chunks by sample range);
* likewise ``SEND_B`` after each ``B`` of a stage with a predecessor, and ``RECV_B`` before each
  ``B`` that needs gradients from the successor.

Replicated stages (:meth:`~pipetrain.plan.plan.Plan.replica_rank`): every stage then cuts the batch
the same way, so micro-batch ``j``'s message goes from the replica of stage ``k`` that owns ``j`` to
the replica of stage ``k + 1`` that owns ``j``; a replica receives only the messages of its own
micro-batches.

Method ``local`` (no gradient crosses a stage) gets only the SEND_F and RECV_F.

Messages on one directed link are received in the order they are sent, which is what FIFO
transports (gloo, NCCL) require; the validator checks it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pipetrain.plan.plan import Method, Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule

__all__ = ["add_communication"]


def _messages(plan: Plan, sender: int, sizes: Sequence[int], rank: int, receiver: int) -> deque[tuple[int, int, int]]:
    """``(microbatch, lo, hi)`` of the sender stage's messages that ``rank`` (of stage ``receiver``) takes."""
    return deque((j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes)) if plan.replica_rank(receiver, j) == rank)


def _receives(
    kind: ActionKind, plan: Plan, sender: int, stage: int, needed_hi: int, pending: deque[tuple[int, int, int]]
) -> list[Action]:
    """Pop and return receives for every pending message that starts before ``needed_hi``."""
    out = []
    while pending and pending[0][1] < needed_hi:
        j, lo, hi = pending.popleft()
        out.append(Action(kind, stage, j, lo, hi, peer=plan.replica_rank(sender, j)))
    return out


def add_communication(schedule: Schedule, plan: Plan) -> Schedule:
    """Insert SEND/RECV actions for a chain of stages (see module docstring)."""
    last = plan.n_stages - 1
    gradients = plan.method is not Method.LOCAL
    programs: list[list[Action]] = []
    for rank, program in schedule:
        k = plan.stage_of_rank(rank)
        fwd_in = _messages(plan, k - 1, plan.stages[k - 1].forward_sizes, rank, k) if k > 0 else deque()
        bwd_in = _messages(plan, k + 1, plan.stages[k + 1].backward_sizes, rank, k) if k < last else deque()
        bwd_in = bwd_in if gradients else deque()
        out: list[Action] = []
        for a in program:
            if a.kind is ActionKind.F and k > 0:
                out += _receives(ActionKind.RECV_F, plan, k - 1, k, a.hi, fwd_in)
            if a.kind is ActionKind.B and k < last:
                out += _receives(ActionKind.RECV_B, plan, k + 1, k, a.hi, bwd_in)
            out.append(a)
            if a.kind is ActionKind.F and k < last:
                peer = plan.replica_rank(k + 1, a.microbatch)
                out.append(Action(ActionKind.SEND_F, k, a.microbatch, a.lo, a.hi, peer=peer))
            if a.kind is ActionKind.B and k > 0 and gradients:
                peer = plan.replica_rank(k - 1, a.microbatch)
                out.append(Action(ActionKind.SEND_B, k, a.microbatch, a.lo, a.hi, peer=peer))
        programs.append(out)
    return Schedule.from_lists(programs)
