"""Assembling the measured timeline from every rank's record (level a)."""

from __future__ import annotations

import pytest

from pipetrain.runtime.interp.recorder import StepRecorder
from pipetrain.runtime.job.records import RankRecord, assemble_timeline, median_step, step_times
from pipetrain.schedule.action import Action
from pipetrain.simulate.timeline import Event

F = Action.parse("0F0[0:2]")
G = Action.parse("1F0[0:2]")


def _record(rank: int, action: Action, ends: list[float], peak: int = 0) -> RankRecord:
    return RankRecord(rank, tuple((Event(rank, action, 0.0, end),) for end in ends), peak)


def test_step_time_is_latest_end_over_ranks() -> None:
    records = [_record(0, F, [1.0, 2.0, 3.0]), _record(1, G, [1.5, 1.0, 4.0]), RankRecord(2, ((), (), ()), 0)]
    assert step_times(records) == [1.5, 2.0, 4.0]


@pytest.mark.parametrize(
    ("times", "warmup", "expected"),
    [([9.0, 1.0, 3.0, 2.0], 1, 3), ([9.0, 1.0, 3.0, 2.0, 5.0], 1, 3), ([1.0], 0, 0), ([5.0, 4.0], 0, 1)],
)
def test_median_step_skips_warmup(times: list[float], warmup: int, expected: int) -> None:
    assert median_step(times, warmup) == expected


def test_median_step_needs_a_timed_step() -> None:
    with pytest.raises(ValueError, match="no timed steps"):
        median_step([1.0], 1)


def test_assemble_keeps_median_step_of_every_rank() -> None:
    records = [_record(1, G, [5.0, 1.0, 2.0, 3.0], peak=7), _record(0, F, [5.0, 0.5, 1.5, 2.5], peak=9)]
    timeline = assemble_timeline(records, warmup_steps=1, label="x")
    assert timeline.kind == "measured" and timeline.n_ranks == 2 and timeline.label == "x"
    assert timeline.iterations_s == (1.0, 2.0, 3.0)
    assert [(e.rank, e.end_s) for e in timeline.events] == [(0, 1.5), (1, 2.0)]
    assert timeline.peak_activation_bytes == (9, 7)
    assert timeline.iteration_s == 2.0


def test_step_recorder_times_each_action() -> None:
    recorder = StepRecorder(3)
    recorder.start_step()
    for index, action in enumerate([F, G]):
        recorder.before(index, action)
        recorder.after(index, action)
    end = recorder.end_step()
    events = recorder.steps[0]
    assert [e.action for e in events] == [F, G] and all(e.rank == 3 for e in events)
    assert 0 <= events[0].start_s <= events[0].end_s <= events[1].start_s <= events[1].end_s == end
