"""Event simulator: the predicted Timeline of any lowered Schedule on a CostModel.

Model (the assumptions of docs/algorithms.md §2.3, extended to any action order and to shared nodes):

* each rank computes one action at a time, in its program's order; F, B and STEP take the cost
  model's time for the stage's layers and the action's sample count;
* ranks of one node that compute at the same moment slow each other down (processor sharing):
  while ``n`` of them are busy, each progresses at ``cluster.concurrency_speed(n)`` of its own
  speed; with no ``shared_speed`` in the cluster, ranks never interfere;
* a SEND costs the rank nothing; its message goes on the directed link ``src -> dst`` (one FIFO
  channel per link, overlapped with compute), starting when both the data and the channel are ready
  and taking ``latency + bytes / bandwidth``;
* a RECV blocks the rank until the matching message (the next one on that channel) has arrived;
* a cost model that charges ranks for their messages (:class:`~pipetrain.cost.MessageHost`: the
  runtime's host work per message, its queue hand-off, copies through host memory) keeps a SEND's
  rank busy for :meth:`~pipetrain.cost.CostModel.send_host_s` before the message goes on its link,
  and a RECV's for :meth:`~pipetrain.cost.CostModel.recv_host_s` once it has arrived (its event then
  ends there); with none (the default) both cost the rank nothing, as above;
* local learning (method ``local``) bounds every channel: a SEND waits while its channel holds the
  plan's ``queue_depth`` messages not yet received, so a fast stage is held back; F and B add the
  auxiliary head's forward (with its local loss) and backward to the stage's layers' times, and each
  micro-batch's STEP steps the stage and its head (the cost model's heads,
  :meth:`~pipetrain.cost.CostModel.with_heads`; none counted when it has none); the head's saved
  activations are held from F to B as the stage's (:class:`~pipetrain.simulate.memory.ActivationLedger`);
  steady state is then 1 / max over stages of (F + B + head + STEP + the messages' host seconds) per
  micro-batch, or the slowest link's transfer (:func:`~pipetrain.simulate.steady.steady_state`);
* a split backward (method ``zb1``, Qi et al. 2024; a rank whose program has W actions): B costs
  the stage's input-gradient seconds and W its weight-gradient seconds
  (:meth:`~pipetrain.cost.CostModel.backward_input_s`, :meth:`~pipetrain.cost.CostModel.weight_grad_s`),
  as the runtime splits them per parameter owner (:mod:`pipetrain.graph.split_backward`);
* a stage that recomputes (:meth:`~pipetrain.plan.plan.Plan.recomputes`) pays its forward again in
  backward: in a fused B, or in a split backward's B (the re-run precedes the input gradient; W
  reuses the graph B built, so it costs what it costs without recompute);
* held activations follow :class:`~pipetrain.simulate.memory.ActivationLedger`: saved bytes from F to B,
  or stashed inputs (plus the re-run's saved bytes during B, or from B to W) on a recomputing stage; the receive
  buffers a rank posts at a step's start are the runtime's (:mod:`pipetrain.schedule.prepost`), reported
  per rank (``Timeline.prepost_bytes``), and cost no time;
* the replicas of a replicated stage start their STEP together (their ``i``-th), once the last one reaches it, and
  the STEP then costs the ring all-reduce of the stage's gradients (but those tied to another stage) plus the
  optimizer step; a replica's STEP event starts when it reached the STEP, its wait for the others
  included, as the runtime's all-reduce blocks inside its STEP;
* a rank holding a tied parameter that other stages hold too adds, to its first STEP, the all-reduce of its
  gradient over the owners (:meth:`~pipetrain.cost.CostModel.tied_allreduce_s`; the owners' wait for one another
  is not modelled: in a flushed schedule the first stage, holding the embedding, finishes last anyway);
* the STEP prices the cost model's optimizer (:attr:`~pipetrain.cost.CostModel.optimizer`), with the
  norm's share of clipping when it clips; every rank's first STEP then adds the all-reduce of the norm over
  the plan's ranks (:meth:`~pipetrain.cost.CostModel.clip_allreduce_s`; not under method pipedream, whose
  updates each clip their own stage's gradients; the ranks' wait for one another is not modelled, as for
  the tied copies).

The simulation advances in time order from event to event (an action ends, a message arrives);
between events every busy rank's remaining work shrinks at its current rate. Cost:
O(actions × (busy + waiting ranks)), at most O(actions × ranks): at each event only the ranks that
finished an action and those waiting are tried again. A schedule that cannot finish raises :class:`ScheduleError`.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from dataclasses import dataclass
from itertools import accumulate

from pipetrain.cost import CostModel
from pipetrain.plan.methods import StageGraph
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.prepost import device_backend, prepost_budget, prepost_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError
from pipetrain.simulate.memory import ActivationLedger
from pipetrain.simulate.timeline import Event, Timeline

__all__ = ["simulate"]

_Channel = tuple[int, int, str]  # (src rank, dst rank, "F" or "B")


@dataclass
class _Busy:
    """A compute action in progress: its start and the standalone seconds of work left."""

    action: Action
    start_s: float
    remaining_s: float


class _Simulator:
    def __init__(self, schedule: Schedule, plan: Plan, cost: CostModel) -> None:
        self.schedule, self.plan, self.cost = schedule, plan, cost
        self.stage_of = plan.rank_stages
        self.node_of = [cost.cluster.devices[r].node for r in range(schedule.n_ranks)]
        n = schedule.n_ranks
        self.now = 0.0
        self.pos = [0] * n
        self.steps_before = [list(accumulate((a.kind is ActionKind.STEP for a in p), initial=0))
                             for _, p in schedule]
        self.busy: dict[int, _Busy] = {}
        self.wait_since: dict[int, float] = {}
        self.split = [any(a.kind is ActionKind.W for a in p) for _, p in schedule]
        self.ledgers = [ActivationLedger(plan, cost, self.split[r]) for r in range(n)]
        self.link_free: dict[tuple[int, int], float] = defaultdict(float)
        self.arrivals: dict[_Channel, deque[float]] = defaultdict(deque)
        self.queued: dict[_Channel, int] = defaultdict(int)  # sent, not yet received
        self.capacity = plan.params.queue_bound
        self.events: list[Event] = []
        self.stages = [(s.layers, s.ranks) for s in plan.stages]
        self.tied_s = [cost.tied_allreduce_s(self.stages, r) for r in range(n)]
        self.clip_s = 0.0 if plan.spec.loss_per_microbatch else cost.clip_allreduce_s(range(plan.n_ranks))
        self.bytes_of: dict[tuple[int, int, bool, int], int] = {}
        self.reached: dict[tuple[int, int], int] = defaultdict(int)  # (stage, i): replicas at or past their i-th STEP
        self.woken: set[int] = set()  # ranks an advance may have unblocked (settle)
        self.due: list[tuple[float, int]] = []  # (arrival, rank) of each waiting receive's next message
        for r in range(n):
            self.arrive(r)

    # ---- costs --------------------------------------------------------------------------------

    def layers(self, a: Action) -> tuple[str, ...]:
        """The layers of the stage that runs ``a`` (a rank may run several: method interleaved)."""
        return self.plan.stages[a.stage].layers

    def compute_s(self, rank: int, a: Action) -> float:
        """Standalone seconds of a compute action; method local adds the stage's auxiliary head."""
        layers = self.layers(a)
        if a.kind is ActionKind.F:
            return self.cost.forward_s(layers, a.size, rank) + self.head_s(rank, a)
        if a.kind is ActionKind.B and not self.split[rank]:
            own = self.cost.backward_s(layers, a.size, rank, self.plan.recomputes(a.stage))
            return own + self.head_s(rank, a)
        if a.kind in (ActionKind.B, ActionKind.W):
            return self.split_s(rank, a)
        sync = self.cost.allreduce_s(self.cost.replica_bytes(self.stages, a.stage), self.plan.stages[a.stage].ranks)
        if self.steps_before[rank][self.pos[rank]] == 0:  # the rank's first STEP sums the tied copies, the norm
            sync += self.tied_s[rank] + self.clip_s
        return sync + self.cost.step_s(layers, rank) + self.head_s(rank, a)

    def split_s(self, rank: int, a: Action) -> float:
        """Seconds of B or W of a split backward (module docstring)."""
        layers = self.layers(a)
        if a.kind is ActionKind.B:
            return self.cost.backward_input_s(layers, a.size, rank, self.plan.recomputes(a.stage))
        return self.cost.weight_grad_s(layers, a.size, rank)

    def head_s(self, rank: int, a: Action) -> float:
        """The auxiliary head's part of F, B or STEP (0 but for method local with heads in the cost model)."""
        if self.plan.spec.gradients_cross_stages:  # no local losses: no heads
            return 0.0
        layers = self.layers(a)
        if a.kind is ActionKind.F:
            return self.cost.head_forward_s(layers, a.size, rank)
        if a.kind is ActionKind.B:
            return self.cost.head_backward_s(layers, a.size, rank)
        return self.cost.head_step_s(layers, rank)

    def message_bytes(self, rank: int, a: Action) -> int:
        """The bytes of a communication action's message: what crosses the stage's output boundary
        (SEND_F, RECV_B) or its input boundary (RECV_F, SEND_B); computed once per stage, peer
        stage, direction and size."""
        outgoing = a.kind in (ActionKind.SEND_F, ActionKind.RECV_B)
        dag = self.plan.spec.graph is StageGraph.DAG
        peer_stage = self.stage_of[a.peer] if dag and a.peer is not None else -1
        key = (a.stage, peer_stage, outgoing, a.size)
        if key not in self.bytes_of:
            layers = self.layers(a)
            if dag:  # the values this stage edge carries
                peer = self.plan.stages[peer_stage].layers
                found = self.cost.edge_bytes(*((layers, peer) if outgoing else (peer, layers)), a.size)
            else:
                found = self.cost.output_bytes(layers, a.size) if outgoing else self.cost.input_bytes(layers, a.size)
            self.bytes_of[key] = found
        return self.bytes_of[key]

    def prepost_bytes(self) -> tuple[int, ...]:
        """Per rank, the receive buffers it posts at a step's start, at most (the schedule pass
        :mod:`pipetrain.schedule.prepost`, on the backend the runtime would run the rank's device with)."""
        devices = self.cost.cluster.devices
        budgets = [prepost_budget(device_backend(devices[r].kind)) for r in range(self.schedule.n_ranks)]
        annotation = prepost_schedule(self.schedule, self.plan, self.message_bytes, budgets)
        return tuple(max((step.nbytes for step in steps), default=0) for steps in annotation)

    def track_memory(self, rank: int, a: Action) -> None:
        """Held activation bytes after ``a`` and their peak (:class:`~pipetrain.simulate.memory.ActivationLedger`)."""
        self.ledgers[rank].record(a)

    def rates(self) -> dict[int, float]:
        """Each busy rank's progress rate (standalone seconds of work per second) right now."""
        if not self.cost.cluster.shared_speed:  # ranks never interfere: every rate is 1
            return dict.fromkeys(self.busy, 1.0)
        per_node: dict[int, int] = defaultdict(int)
        for rank in self.busy:
            per_node[self.node_of[rank]] += 1
        speed = self.cost.cluster.concurrency_speed
        return {rank: speed(per_node[self.node_of[rank]]) for rank in self.busy}

    # ---- stepping -----------------------------------------------------------------------------

    def advance_rank(self, rank: int) -> bool:
        """Start or complete what ``rank`` can do at ``now``; False when it must wait."""
        program = self.schedule.ranks[rank]
        if rank in self.busy or self.pos[rank] >= len(program):
            return False
        a = program[self.pos[rank]]
        if a.peer is not None and a.is_send:
            channel = (rank, a.peer, a.channel)
            if self.capacity is not None and self.queued[channel] >= self.capacity:
                self.wait_since.setdefault(rank, self.now)
                return False
            self.queued[channel] += 1
            self.wait_since.pop(rank, None)
            host = self.cost.send_host_s(self.message_bytes(rank, a))
            if host > 0:  # the rank's own work on the message first; it goes on the link after (post_send)
                self.busy[rank] = _Busy(a, self.now, host)
                return True
            self.post_send(rank, a, 0.0)
        elif a.peer is not None:
            queue = self.arrivals[(a.peer, rank, a.channel)]
            if not queue or queue[0] > self.now:
                self.wait_since.setdefault(rank, self.now)
                return False
            queue.popleft()
            self.queued[(a.peer, rank, a.channel)] -= 1
            self.woken.add(a.peer)  # a send held by a full queue
            host = self.cost.recv_host_s(self.message_bytes(rank, a))
            if host > 0:  # the rank's own work on the arrived message: the event ends after it
                self.busy[rank] = _Busy(a, self.wait_since.pop(rank, self.now), host)
                return True
            self.events.append(Event(rank, a, self.wait_since.pop(rank, self.now), self.now))
        elif a.kind is ActionKind.STEP and not self.replicas_at_step(rank):
            self.wait_since.setdefault(rank, self.now)
            return False
        else:  # a replica's STEP spans its wait for the others, as the runtime's blocking all-reduce does
            waited = self.wait_since.pop(rank, self.now)
            self.busy[rank] = _Busy(a, waited if a.kind is ActionKind.STEP else self.now, self.compute_s(rank, a))
            return True
        self.move_on(rank)
        return True

    def post_send(self, rank: int, a: Action, host_s: float) -> None:
        """Put SEND ``a``'s message on its link at ``now``: it starts when the link is free; ``host_s``,
        the rank's work on it before, is recorded with the link's event (:attr:`Event.host_s`)."""
        assert a.peer is not None
        link = (rank, a.peer)
        begin = max(self.now, self.link_free[link])
        end = begin + self.cost.transfer_s(self.message_bytes(rank, a), rank, a.peer)
        self.link_free[link] = end
        self.arrivals[(rank, a.peer, a.channel)].append(end)
        self.events.append(Event(rank, a, begin, end, host_s))
        self.woken.add(a.peer)  # its receiver may be waiting

    def replicas_at_step(self, rank: int) -> bool:
        """Whether every replica of ``rank``'s stage has reached (or passed) the STEP ``rank`` is at:
        its ``i``-th, counting STEPs, as an asynchronous program steps many times."""
        stage = self.stage_of[rank]
        n_replicas = len(self.plan.stages[stage].ranks)
        return n_replicas == 1 or self.reached[(stage, self.steps_before[rank][self.pos[rank]])] == n_replicas

    def move_on(self, rank: int) -> None:
        """``rank`` is done with its current action: to its next one."""
        self.pos[rank] += 1
        self.arrive(rank)

    def arrive(self, rank: int) -> None:
        """Count ``rank`` among its stage's replicas at their ``i``-th STEP when its next action is that STEP."""
        program, at = self.schedule.ranks[rank], self.pos[rank]
        if at < len(program) and program[at].kind is ActionKind.STEP:
            stage = self.stage_of[rank]
            key = (stage, self.steps_before[rank][at])
            self.reached[key] += 1
            ranks = self.plan.stages[stage].ranks
            if len(ranks) > 1 and self.reached[key] == len(ranks):
                self.woken.update(ranks)

    def next_event_s(self, rates: dict[int, float]) -> float:
        """The earliest moment something changes: a compute action ends or a message arrives."""
        ends = [self.now + b.remaining_s / rates[r] for r, b in self.busy.items()]
        self.due = []
        for rank in self.wait_since:
            a = self.schedule.ranks[rank][self.pos[rank]]
            if a.peer is None or a.is_send:  # a replica at STEP, a send on a full queue: released by others
                continue
            queue = self.arrivals[(a.peer, rank, a.channel)]
            if queue:
                self.due.append((queue[0], rank))
        return min(ends + [t for t, _ in self.due], default=math.inf)

    def finish_until(self, t: float, rates: dict[int, float]) -> list[int]:
        """Move the clock to ``t``: busy ranks progress, and those whose work is done finish; returns those."""
        start, self.now = self.now, t
        finished = []
        for rank, b in list(self.busy.items()):
            # the very expression next_event_s took the minimum of, so the action that set ``t``
            # always ends here, even where ``t`` is so large that ``t + remaining`` rounds to ``t``
            if start + b.remaining_s / rates[rank] > t:
                b.remaining_s -= (t - start) * rates[rank]
                continue
            del self.busy[rank]
            if b.action.is_send:  # its host work done: the message leaves (its event is the link's)
                self.post_send(rank, b.action, t - b.start_s)
            else:
                self.events.append(Event(rank, b.action, b.start_s, t))
            if b.action.kind in (ActionKind.F, ActionKind.B, ActionKind.W):
                self.track_memory(rank, b.action)
            self.move_on(rank)
            finished.append(rank)
        return finished

    def settle(self, ranks: set[int]) -> None:
        """Advance ranks at ``now`` until none can, with the outcome and event order of passes over
        every rank in increasing order: a pass visits ``ranks`` and, after a rank advances, the
        higher ranks it may have unblocked (:attr:`woken`: its message's receiver, the sender its
        receive makes room for, the replicas it completes at a STEP); the next pass, those that
        advanced and the lower ranks they unblocked. A rank no advance touched since it last
        failed (busy, done, or still blocked) fails again, so skipping it changes nothing."""
        pending = sorted(ranks)
        while pending:
            queued, after = set(pending), set()
            while pending:
                rank = heapq.heappop(pending)
                self.woken.clear()
                if self.advance_rank(rank):
                    after.add(rank)
                for other in self.woken:
                    if other <= rank:
                        after.add(other)
                    elif other not in queued:
                        queued.add(other)
                        heapq.heappush(pending, other)
            pending = sorted(after)

    def run(self, label: str) -> Timeline:
        n = self.schedule.n_ranks
        ready = set(range(n))
        while True:
            self.woken.clear()
            self.settle(ready)
            rates = self.rates()
            t = self.next_event_s(rates)
            if t == math.inf:
                break
            self.woken.clear()
            finished = self.finish_until(t, rates)
            ready = {*finished, *self.woken, *(rank for arrival, rank in self.due if arrival <= t)}
        stuck = [r for r, p in enumerate(self.schedule.ranks) if self.pos[r] < len(p)]
        if stuck:
            raise ScheduleError(f"simulation deadlocked at rank {stuck[0]}, step {self.pos[stuck[0]]}; "
                                "validate the schedule first")
        return Timeline(tuple(self.events), n, "predicted", tuple(ledger.peak_bytes for ledger in self.ledgers), label,
                        prepost_bytes=self.prepost_bytes())


def simulate(schedule: Schedule, plan: Plan, cost: CostModel, label: str = "") -> Timeline:
    """Predict the timeline of one iteration of ``schedule`` (see module docstring)."""
    return _Simulator(schedule, plan, cost).run(label or plan.method.value)
