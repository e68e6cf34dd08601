"""Timing every action of a rank's program: an action hook that records one event per action.

Each rank times its own actions with ``time.perf_counter`` relative to a per-step origin ``t0``
taken right after a barrier, so all ranks share (to within the barrier's skew) the same origin.
For a SEND the event spans the call that posted it; for a RECV, the time the rank waited; for
compute, the computation (on CUDA the recorder synchronises the device after each action). The job
turns every rank's events into the measured timeline (:mod:`pipetrain.runtime.job.records`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipetrain.schedule.action import Action
from pipetrain.simulate.timeline import Event

__all__ = ["StepRecorder"]

StepEvents = list[Event]


class StepRecorder:
    """An action hook (see ``executor.ActionHook``) that records one event per action.

    Args:
        rank: the rank recorded.
        synchronize: called before reading the clock (``torch.cuda.synchronize`` on CUDA).
    """

    def __init__(self, rank: int, synchronize: Callable[[], None] | None = None) -> None:
        self.rank = rank
        self._sync = synchronize
        self._t0 = 0.0
        self._start = 0.0
        self._events: StepEvents = []
        self.steps: list[tuple[Event, ...]] = []

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def start_step(self) -> None:
        """Take this step's time origin; call right after the step's barrier."""
        self._events = []
        self._t0 = self._now()

    def before(self, index: int, action: Action) -> None:
        self._start = self._now()

    def after(self, index: int, action: Action) -> None:
        end = self._now()
        self._events.append(Event(self.rank, action, self._start - self._t0, end - self._t0))

    def end_step(self) -> float:
        """Close the step; returns this rank's time for it (its last action's end, seconds)."""
        self.steps.append(tuple(self._events))
        return self._events[-1].end_s if self._events else 0.0
