"""Timing every action of a rank's program: an action hook that records one event per action.

Each rank times its own actions relative to a per-step origin ``t0`` taken right after a barrier,
so all ranks share (to within the barrier's skew) the same origin. For a SEND the event spans the
call that posted it; for a RECV, the time the rank waited; for compute, the computation. The clock
is the device's (:mod:`pipetrain.profile.clock`): ``time.perf_counter`` on a CPU; on CUDA, events
on the rank's stream, resolved once at the step's end, so the host queues a step's kernels without
waiting for each action (a span is then the stream's time between its marks). The job turns every
rank's events into the measured timeline (:mod:`pipetrain.runtime.job.records`).
"""

from __future__ import annotations

from typing import Any

from pipetrain.profile.clock import Clock, WallClock
from pipetrain.schedule.action import Action
from pipetrain.simulate.timeline import Event

__all__ = ["StepRecorder"]


class StepRecorder:
    """An action hook (see ``executor.ActionHook``) that records one event per action.

    Args:
        rank: the rank recorded.
        clock: the device's clock (default: the wall clock, for a CPU rank).
    """

    def __init__(self, rank: int, clock: Clock[Any] | None = None) -> None:
        self.rank = rank
        self._clock: Clock[Any] = clock or WallClock()
        self._t0: Any = None
        self._start: Any = None
        self._marks: list[tuple[Action, Any, Any]] = []
        self.steps: list[tuple[Event, ...]] = []

    def start_step(self) -> None:
        """Take this step's time origin; call right after the step's barrier."""
        self._marks = []
        self._t0 = self._clock.mark()

    def before(self, index: int, action: Action) -> None:
        self._start = self._clock.mark()

    def after(self, index: int, action: Action) -> None:
        self._marks.append((action, self._start, self._clock.mark()))

    def end_step(self) -> float:
        """Close the step; returns this rank's time for it (its last action's end, seconds)."""
        seconds = self._clock.seconds
        events = tuple(Event(self.rank, action, seconds(self._t0, start), seconds(self._t0, end))
                       for action, start, end in self._marks)
        self.steps.append(events)
        return events[-1].end_s if events else 0.0
