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
transports (gloo, NCCL) require; the validator checks it. A rank that runs several stages (method
``interleaved``) may consume two stages' messages from one link in another order than they were sent
(with per-stage partitions, :mod:`pipetrain.schedule.interleaved_unequal`), so each receive is
preceded by the receives of every message sent before it on its link (:class:`_InOrder`): those are
received early and held. With one stage pair per link this changes nothing.

Two neighbouring stages on the same rank (the V placement of ZB-V, stages ``R − 1`` and ``R``,
:attr:`~pipetrain.plan.plan.Plan.local_edges`) exchange no message: the pass adds no SEND or RECV
along such an edge; the successor's F reads what the predecessor's F left on the rank, the
predecessor's B what the successor's B left (the runtime shares the buffer between the two stages'
contexts; the validator counts the predecessor's F and the successor's B as the delivery).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence

from pipetrain.plan.plan import Plan, ranges
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
    """Insert SEND/RECV actions along the plan's stage edges (see module docstring); a rank that runs
    several stages (method ``interleaved``) gets each stage's messages around that stage's actions.

    Cost: O(actions + ranks · stages), each stage's message targets read once (:class:`_Targets`)
    and every rank's incoming links indexed in one pass over the schedule (:func:`_incoming`)."""
    gradients = plan.spec.gradients_cross_stages
    targets = _Targets(plan, gradients)
    incoming = _incoming(schedule, plan, targets)
    programs: list[list[Action]] = []
    for rank, program in schedule:
        pending = {k: _pending(plan, rank, k, gradients) for k in plan.stages_of_rank(rank)}
        in_order = _InOrder(incoming[rank])
        out: list[Action] = []
        for a in program:
            fwd_in, bwd_in = pending[a.stage]
            if a.kind is ActionKind.F:
                for p, queue in fwd_in.items():
                    out += in_order.take(_receives(ActionKind.RECV_F, plan, p, a.stage, a.hi, queue))
            if a.kind is ActionKind.B:
                for t, queue in bwd_in.items():
                    out += in_order.take(_receives(ActionKind.RECV_B, plan, t, a.stage, a.hi, queue))
            out.append(a)
            out += _sends(plan, a, targets)
        programs.append(out)
    return Schedule.from_lists(programs)


Pending = dict[int, deque[tuple[int, int, int]]]


def _pending(plan: Plan, rank: int, k: int, gradients: bool) -> tuple[Pending, Pending]:
    """The messages ``rank`` receives for stage ``k``: activations per predecessor, gradients per
    successor (none from a neighbour on the same rank)."""
    local = plan.local_edges
    fwd_in = {p: _messages(plan, p, plan.stages[p].forward_sizes, rank, k) for p in plan.stage_predecessors(k)
              if (p, k) not in local}
    bwd_in = {t: _messages(plan, t, plan.stages[t].backward_sizes, rank, k) for t in plan.stage_successors(k)
              if (k, t) not in local}
    return fwd_in, bwd_in if gradients else {}


class _Targets:
    """Per stage, the stages its output goes to by message: every successor (F), every predecessor
    (B, its input gradients; none without ``gradients``), but a neighbour on the same rank (module
    docstring); read from the plan once, not per action."""

    def __init__(self, plan: Plan, gradients: bool) -> None:
        local = plan.local_edges
        stages = range(plan.n_stages)
        self.forward = [[t for t in plan.stage_successors(k) if (k, t) not in local] for k in stages]
        self.backward = [[p for p in plan.stage_predecessors(k) if (p, k) not in local] if gradients else []
                         for k in stages]

    def of(self, a: Action) -> list[int]:
        """The stages ``a``'s output goes to (none for W and STEP)."""
        if a.kind is ActionKind.F:
            return self.forward[a.stage]
        if a.kind is ActionKind.B:
            return self.backward[a.stage]
        return []


def _sends(plan: Plan, a: Action, targets: _Targets) -> list[Action]:
    """The sends after ``a``: its activations to every successor (F), its input gradients to every predecessor (B)."""
    kind = ActionKind.SEND_F if a.kind is ActionKind.F else ActionKind.SEND_B
    return [Action(kind, a.stage, a.microbatch, a.lo, a.hi, peer=plan.replica_rank(t, a.microbatch))
            for t in targets.of(a)]


Links = dict[tuple[int | None, ActionKind], deque[Action]]


def _incoming(schedule: Schedule, plan: Plan, targets: _Targets) -> list[Links]:
    """Per rank, the receives it has to make, per (sender rank, direction), in the order the sender sends them."""
    links: list[Links] = [defaultdict(deque) for _ in range(schedule.n_ranks)]
    for peer, program in schedule:
        for a in program:
            kind = ActionKind.RECV_F if a.kind is ActionKind.F else ActionKind.RECV_B
            for t in targets.of(a):
                dst = plan.replica_rank(t, a.microbatch)
                links[dst][(peer, kind)].append(Action(kind, t, a.microbatch, a.lo, a.hi, peer=peer))
    return links


class _InOrder:
    """One rank's receives in the order their senders send them, per directed link and direction."""

    def __init__(self, links: Links) -> None:
        self.links = links
        self.taken: set[Action] = set()

    def take(self, receives: list[Action]) -> list[Action]:
        """``receives`` not taken yet, each after the not yet taken ones sent before it on its link."""
        out: list[Action] = []
        for receive in receives:
            queue = self.links[(receive.peer, receive.kind)]
            while receive not in self.taken:
                head = queue.popleft()
                self.taken.add(head)
                out.append(head)
        return out
