"""Schedule passes: pure ``Schedule -> Schedule`` functions (STYLE.md L3).

:func:`add_communication` inserts the point-to-point messages along the plan's stage edges (the
chain ``k -> k + 1``, or a DAG of stages for method ``graph``, where each rule below applies once per
predecessor or successor, in increasing stage order):

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
    """Insert SEND/RECV actions along the plan's stage edges (see module docstring)."""
    gradients = plan.method is not Method.LOCAL
    programs: list[list[Action]] = []
    for rank, program in schedule:
        k = plan.stage_of_rank(rank)
        preds, succs = plan.stage_predecessors(k), plan.stage_successors(k)
        fwd_in = {p: _messages(plan, p, plan.stages[p].forward_sizes, rank, k) for p in preds}
        bwd_in = {t: _messages(plan, t, plan.stages[t].backward_sizes, rank, k) for t in succs} if gradients else {}
        out: list[Action] = []
        for a in program:
            if a.kind is ActionKind.F:
                for p in preds:
                    out += _receives(ActionKind.RECV_F, plan, p, k, a.hi, fwd_in[p])
            if a.kind is ActionKind.B:
                for t in bwd_in:
                    out += _receives(ActionKind.RECV_B, plan, t, k, a.hi, bwd_in[t])
            out.append(a)
            if a.kind is ActionKind.F:
                out += [Action(ActionKind.SEND_F, k, a.microbatch, a.lo, a.hi, peer=plan.replica_rank(t, a.microbatch))
                        for t in succs]
            if a.kind is ActionKind.B and gradients:
                out += [Action(ActionKind.SEND_B, k, a.microbatch, a.lo, a.hi, peer=plan.replica_rank(p, a.microbatch))
                        for p in preds]
        programs.append(out)
    return Schedule.from_lists(programs)
