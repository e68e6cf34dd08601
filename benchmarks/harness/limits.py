"""A wall-clock bound on one setting: a run that hangs or fails is a result, not the end of a benchmark."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TypeVar

__all__ = ["RunTimeout", "bounded", "time_limit"]

T = TypeVar("T")


class RunTimeout(Exception):
    """A run went past its wall-clock bound."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`RunTimeout` in this (main) thread after ``seconds``."""

    def _fire(signum: int, frame: FrameType | None) -> None:
        raise RunTimeout(f"over {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def bounded(fn: Callable[[], T], timeout_s: float) -> tuple[T | None, str]:
    """``(fn(), "ok")``, or ``(None, "timeout: …")`` past ``timeout_s``, or ``(None, "error: …")``."""
    try:
        with time_limit(timeout_s):
            return fn(), "ok"
    except RunTimeout as e:
        return None, f"timeout: {e}"
    except Exception as e:  # a failed configuration is a result, not the end of the benchmark
        first = str(e).splitlines()[0] if str(e) else ""
        return None, f"error: {type(e).__name__}: {first}"
