"""Event simulator: the predicted Timeline of any lowered Schedule on a CostModel.

Model (the assumptions of PAPERS.md §1.4, extended to any action order):

* each rank computes one action at a time, in its program's order; F, B and STEP take the cost
  model's time for the stage's layers and the action's sample count;
* a SEND costs the rank nothing; its message goes on the directed link ``src -> dst`` (one FIFO
  channel per link, overlapped with compute), starting when both the data and the channel are ready
  and taking ``latency + bytes / bandwidth``;
* a RECV blocks the rank until the matching message (the next one on that channel) has arrived;
* activation memory grows by the stage's saved bytes per sample on F and shrinks on B.

The schedule must be valid (see :mod:`pipetrain.schedule.validate`); a deadlock raises.
Cost: O(actions) after the per-action cost look-ups.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from pipetrain.cost import CostModel
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError
from pipetrain.simulate.timeline import Event, Timeline

__all__ = ["simulate"]

_Channel = tuple[int, int, str]  # (src rank, dst rank, "F" or "B")


@dataclass
class _State:
    clock: list[float]
    memory: list[int]
    peak: list[int]
    link_free: dict[tuple[int, int], float] = field(default_factory=lambda: defaultdict(float))
    arrivals: dict[_Channel, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    events: list[Event] = field(default_factory=list)


class _Simulator:
    def __init__(self, schedule: Schedule, plan: Plan, cost: CostModel) -> None:
        self.schedule, self.plan, self.cost = schedule, plan, cost
        self.stage_of = [plan.stage_of_rank(r) for r in range(schedule.n_ranks)]
        n = schedule.n_ranks
        self.state = _State(clock=[0.0] * n, memory=[0] * n, peak=[0] * n)

    def layers(self, rank: int) -> tuple[str, ...]:
        return self.plan.stages[self.stage_of[rank]].layers

    def compute_s(self, rank: int, a: Action) -> float:
        layers = self.layers(rank)
        if a.kind is ActionKind.F:
            return self.cost.forward_s(layers, a.size, rank)
        if a.kind is ActionKind.B:
            return self.cost.backward_s(layers, a.size, rank, self.plan.recompute)
        return self.cost.step_s(layers, rank)

    def message_bytes(self, rank: int, a: Action) -> int:
        layers = self.layers(rank)
        if a.kind is ActionKind.SEND_F:
            return self.cost.output_bytes(layers, a.size)
        return self.cost.input_bytes(layers, a.size)

    def track_memory(self, rank: int, a: Action) -> None:
        layers = self.layers(rank)
        per_b = self.cost.saved_bytes(layers, a.size)
        if self.plan.recompute:
            per_b = self.cost.input_bytes(layers, a.size)
        st = self.state
        st.memory[rank] += per_b if a.kind is ActionKind.F else -per_b
        st.peak[rank] = max(st.peak[rank], st.memory[rank])

    def try_step(self, rank: int, a: Action) -> bool:
        """Execute ``a`` on ``rank`` if it can run now; False when it waits for a message."""
        st = self.state
        start = st.clock[rank]
        if a.peer is not None and a.is_send:
            link = (rank, a.peer)
            begin = max(start, st.link_free[link])
            end = begin + self.cost.transfer_s(self.message_bytes(rank, a), rank, a.peer)
            st.link_free[link] = end
            st.arrivals[(rank, a.peer, a.kind.value[-1])].append(end)
            st.events.append(Event(rank, a, begin, end))
            return True
        if a.peer is not None:
            queue = st.arrivals[(a.peer, rank, a.kind.value[-1])]
            if not queue:
                return False
            st.clock[rank] = max(start, queue.popleft())
        else:
            st.clock[rank] = start + self.compute_s(rank, a)
            if a.kind in (ActionKind.F, ActionKind.B):
                self.track_memory(rank, a)
        st.events.append(Event(rank, a, start, st.clock[rank]))
        return True

    def run(self, label: str) -> Timeline:
        pos = [0] * self.schedule.n_ranks
        progress = True
        while progress:
            progress = False
            for rank, program in self.schedule:
                while pos[rank] < len(program) and self.try_step(rank, program[pos[rank]]):
                    pos[rank] += 1
                    progress = True
        stuck = [r for r, p in enumerate(self.schedule.ranks) if pos[r] < len(p)]
        if stuck:
            raise ScheduleError(f"simulation deadlocked at rank {stuck[0]}, step {pos[stuck[0]]}; "
                                "validate the schedule first")
        st = self.state
        return Timeline(tuple(st.events), self.schedule.n_ranks, "predicted", tuple(st.peak), label)


def simulate(schedule: Schedule, plan: Plan, cost: CostModel, label: str = "") -> Timeline:
    """Predict the timeline of one iteration of ``schedule`` (see module docstring)."""
    return _Simulator(schedule, plan, cost).run(label or f"{plan.method.value}, predicted")
