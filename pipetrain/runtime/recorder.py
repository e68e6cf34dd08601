"""Timing every action and assembling the measured :class:`Timeline`.

Each rank times its own actions with ``time.perf_counter`` relative to a per-step origin ``t0``
taken right after a barrier, so all ranks share (to within the barrier's skew) the same origin.
At the end of a run the events go to rank 0 once (``dist.gather_object``), never during timed
steps. A step's time is the latest action end over all ranks. The timeline kept is that of the
median timed step (warm-up steps excluded); ``iterations_s`` holds every timed step's time.

For a SEND the event spans the call that posted it; for a RECV, the time the rank waited; for
compute, the computation (on CUDA the recorder synchronises the device after each action).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipetrain.runtime.config import StepMetrics
from pipetrain.runtime.memory import MeasuredMemory
from pipetrain.schedule.action import Action
from pipetrain.simulate.timeline import Event, Timeline

__all__ = ["RankRecord", "StepRecorder", "assemble_timeline", "median_step", "step_times"]

StepEvents = list[Event]


@dataclass(frozen=True)
class RankRecord:
    """What one rank measured over a run.

    Attributes:
        rank: the rank.
        steps: per step, the rank's events (times relative to that step's ``t0``).
        peak_activation_bytes: peak saved-activation bytes over the run.
        metrics: per step, what ``metrics.csv`` records (the last stage's first rank only; otherwise empty).
        data_wait_s: per step, the seconds the rank waited for its batch.
        checkpoint_s: per checkpoint written, the seconds the rank spent on it.
        memory: what the rank held at its peak (its ``activation_bytes`` is
            ``peak_activation_bytes``); None for a rank that ran no stage.
    """

    rank: int
    steps: tuple[tuple[Event, ...], ...]
    peak_activation_bytes: int
    metrics: tuple[StepMetrics, ...] = ()
    data_wait_s: tuple[float, ...] = ()
    checkpoint_s: tuple[float, ...] = ()
    memory: MeasuredMemory | None = None


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


def step_times(records: Sequence[RankRecord]) -> list[float]:
    """Every step's time: the latest event end over all ranks (0 for a step with no events)."""
    n_steps = max((len(r.steps) for r in records), default=0)
    return [
        max((e.end_s for r in records if s < len(r.steps) for e in r.steps[s]), default=0.0)
        for s in range(n_steps)
    ]


def median_step(times: Sequence[float], warmup_steps: int) -> int:
    """Index of the median timed step (the lower median for an even count)."""
    timed = list(range(warmup_steps, len(times)))
    if not timed:
        raise ValueError(f"no timed steps: {len(times)} steps, {warmup_steps} warm-up")
    timed.sort(key=lambda s: times[s])
    return timed[(len(timed) - 1) // 2]


def assemble_timeline(records: Sequence[RankRecord], warmup_steps: int, label: str = "") -> Timeline:
    """The measured timeline of the median timed step, from every rank's record.

    Args:
        records: one per rank, any order; ranks ``0..R-1``.
        warmup_steps: leading steps excluded from ``iterations_s`` and the median.
    """
    times = step_times(records)
    chosen = median_step(times, warmup_steps)
    by_rank = sorted(records, key=lambda r: r.rank)
    events = tuple(e for r in by_rank if chosen < len(r.steps) for e in r.steps[chosen])
    return Timeline(
        events=events,
        n_ranks=len(records),
        kind="measured",
        peak_activation_bytes=tuple(r.peak_activation_bytes for r in by_rank),
        label=label,
        iterations_s=tuple(times[warmup_steps:]),
    )
