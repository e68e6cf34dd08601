"""What each rank measured over a run, and the measured :class:`Timeline` assembled from it.

At the end of a run every rank's :class:`RankRecord` goes to rank 0 once (``dist.gather_object``),
never during timed steps. A step's time is the latest action end over all ranks. The timeline kept
is that of the median timed step (warm-up steps excluded); ``iterations_s`` holds every timed step's
time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipetrain.runtime.interp.memory import MeasuredMemory
from pipetrain.runtime.job.config import StepMetrics
from pipetrain.simulate.timeline import Event, Timeline

__all__ = ["RankRecord", "assemble_timeline", "median_step", "step_times"]


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
        prepost_bytes: the receive buffers it posted at a step's start, at most
            (:mod:`pipetrain.schedule.prepost`).
        device_peak_bytes: on CUDA, the allocator's peak over the job (``torch.cuda.max_memory_allocated``:
            every tensor the rank's process held, messages and temporaries included); None on a CPU.
    """

    rank: int
    steps: tuple[tuple[Event, ...], ...]
    peak_activation_bytes: int
    metrics: tuple[StepMetrics, ...] = ()
    data_wait_s: tuple[float, ...] = ()
    checkpoint_s: tuple[float, ...] = ()
    memory: MeasuredMemory | None = None
    prepost_bytes: int = 0
    device_peak_bytes: int | None = None


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
        prepost_bytes=tuple(r.prepost_bytes for r in by_rank),
        label=label,
        iterations_s=tuple(times[warmup_steps:]),
    )
