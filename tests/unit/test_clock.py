"""The device clocks (pipetrain.profile.clock): the wall clock on a CPU, CUDA events (faked here) on a
GPU; the recorder and the profiler's timer through them."""

from __future__ import annotations

from typing import Any

import torch

from pipetrain.profile.clock import EventClock, WallClock, device_clock
from pipetrain.profile.timing import _Timer
from pipetrain.runtime.interp.recorder import StepRecorder
from pipetrain.schedule.action import Action


class _FakeStream:
    """A CUDA stream whose position advances by hand (milliseconds)."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.recorded: list[_FakeEvent] = []


class _FakeEvent:
    """``torch.cuda.Event``'s timing interface over a :class:`_FakeStream`."""

    def __init__(self) -> None:
        self.at_ms: float | None = None
        self.synchronized = False

    def record(self, stream: Any = None) -> None:
        assert isinstance(stream, _FakeStream)
        self.at_ms = stream.now_ms
        stream.recorded.append(self)

    def synchronize(self) -> None:
        self.synchronized = True

    def elapsed_time(self, end_event: Any) -> float:
        assert self.at_ms is not None and end_event.at_ms is not None, "both events must be recorded"
        assert end_event.synchronized, "elapsed_time before the end event completed"
        return float(end_event.at_ms - self.at_ms)


def _event_clock(stream: _FakeStream) -> EventClock:
    return EventClock(torch.device("cuda", 1), _FakeEvent, lambda device: stream)


def test_device_clock_is_the_wall_clock_on_a_cpu() -> None:
    assert isinstance(device_clock(torch.device("cpu")), WallClock)
    assert isinstance(device_clock(torch.device("cuda", 0)), EventClock)  # built lazily: no GPU touched
    clock = WallClock()
    start = clock.mark()
    assert clock.seconds(start, clock.mark()) >= 0


def test_event_clock_records_on_the_device_stream_and_converts_milliseconds() -> None:
    stream = _FakeStream()
    clock = _event_clock(stream)
    start = clock.mark()
    stream.now_ms = 12.5
    end = clock.mark()
    assert stream.recorded == [start, end]
    assert clock.seconds(start, end) == 0.0125


def test_recorder_resolves_event_marks_at_the_step_end() -> None:
    stream = _FakeStream()
    recorder = StepRecorder(2, _event_clock(stream))
    stream.now_ms = 100.0  # the stream's clock is not zero at the step's origin
    recorder.start_step()
    actions = [Action.parse("0F0[0:2]"), Action.parse("0B0[0:2]")]
    for index, (action, (begin, end)) in enumerate(zip(actions, [(101.0, 104.0), (104.0, 110.0)], strict=True)):
        stream.now_ms = begin
        recorder.before(index, action)
        stream.now_ms = end
        recorder.after(index, action)
    assert not any(e.synchronized for e in stream.recorded), "no wait while the step runs"
    assert recorder.end_step() == 0.010
    assert [(e.action, e.start_s, e.end_s) for e in recorder.steps[0]] == [
        (actions[0], 0.001, 0.004), (actions[1], 0.004, 0.010)]


def test_profiler_timer_takes_the_median_of_event_times(monkeypatch: Any) -> None:
    stream = _FakeStream()
    monkeypatch.setattr("pipetrain.profile.timing.device_clock", lambda device: _event_clock(stream))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    durations = iter([50.0, 3.0, 1.0, 2.0])  # one warm-up run, then three timed

    def run() -> None:
        stream.now_ms += next(durations)

    timer = _Timer(torch.device("cuda", 0), warmup=1, repeats=3, extra_rounds=0)  # ±25%, but no more rounds
    assert timer.median_s(lambda: run) == 0.002
