"""Clocks that time device work: the wall clock on a CPU, CUDA events on a GPU.

    clock = device_clock(torch.device("cuda:0"))
    start = clock.mark()
    run()
    seconds = clock.seconds(start, clock.mark())   # on CUDA: waits for the end mark's event

On a CPU a mark is ``time.perf_counter()`` and the seconds are the difference, as the profiler and
the runtime's recorder have always timed. On CUDA a mark is an event recorded on the device's
current stream, and the seconds between two marks are the GPU's (``Event.elapsed_time``): an event
is stamped when the stream reaches it, so the span covers the work queued between the marks and
any time the stream waited for the host or for another stream (a receive). Nothing synchronises
between marks, so the host keeps queueing work while it is timed; :meth:`EventClock.seconds` waits
for its end mark only, and a caller resolves its marks once the timed work is done (the recorder:
at the end of a step). Marks compare only with marks of the same device and clock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

__all__ = ["Clock", "CudaEvent", "EventClock", "WallClock", "device_clock"]

M = TypeVar("M")


class Clock(Protocol[M]):
    """Marks points in a device's work and tells the seconds between two of them."""

    def mark(self) -> M:
        """A point in time: now on the host (CPU), or the stream's position now (CUDA)."""
        ...

    def seconds(self, start: M, end: M) -> float:
        """Seconds from ``start`` to ``end`` (both of this clock); may wait for ``end`` to happen."""
        ...


class WallClock:
    """The host's ``time.perf_counter``: for CPU work, which is done when the call returns."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaEvent(Protocol):
    """What :class:`EventClock` needs of ``torch.cuda.Event`` (tests pass a fake)."""

    def record(self, stream: Any = None) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...


class EventClock:
    """CUDA events on ``device``'s current stream (module docstring).

    Args:
        device: the GPU whose current stream is marked.
        new_event: makes a timing event (default ``torch.cuda.Event(enable_timing=True)``).
        stream: the stream to record on for a device (default ``torch.cuda.current_stream``).
    """

    def __init__(
        self, device: torch.device, new_event: Callable[[], CudaEvent] | None = None,
        stream: Callable[[torch.device], Any] | None = None,
    ) -> None:
        self.device = device
        self._new_event = new_event or functools.partial(torch.cuda.Event, enable_timing=True)
        self._stream = stream or torch.cuda.current_stream

    def mark(self) -> CudaEvent:
        event = self._new_event()
        event.record(self._stream(self.device))
        return event

    def seconds(self, start: CudaEvent, end: CudaEvent) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # milliseconds


def device_clock(device: torch.device) -> Clock[Any]:
    """The clock that times work on ``device``: CUDA events on a GPU, else the wall clock."""
    return EventClock(device) if device.type == "cuda" else WallClock()
