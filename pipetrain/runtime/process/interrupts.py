"""Stopping on SIGINT or SIGTERM: every rank stops at the same step boundary, cleanly.

A signal only records itself (:func:`install`'s handler); nothing stops mid-step. Before each step
every rank of the launch takes part in one all-reduce (MAX) of the signal it has received, 0 if
none (:func:`agree`): it is the step's barrier as well, so it costs nothing extra, and it makes every
rank see the same answer at the same step even when the signal reached only some of them (a
``kill -TERM`` to one process, a terminal's Ctrl-C reaching all). The ranks then write a checkpoint
if checkpointing is on (an asynchronous run first drains the micro-batches in flight,
:mod:`pipetrain.schedule.segments`) and raise :class:`~pipetrain.errors.Interrupted`.

The local launcher forwards the signal it receives to its ranks (:func:`forward`); torchrun's agent
forwards SIGINT/SIGTERM to its workers itself.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["STOP_SIGNALS", "agree", "forward", "install", "requested"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received = 0


def _record(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = _received or signum


def requested() -> int:
    """The first stop signal this process received, or 0."""
    return _received


def install(on_signal: Callable[[int], None] | None = None) -> Callable[[], None]:
    """Record SIGINT and SIGTERM instead of dying (main thread only; elsewhere a no-op).

    Args:
        on_signal: also called with the signal number (e.g. to forward it to child processes).

    Returns:
        A function that restores the previous handlers.
    """
    global _received
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _received = 0

    def handler(signum: int, frame: FrameType | None) -> None:
        _record(signum, frame)
        if on_signal is not None:
            on_signal(signum)

    previous: dict[int, Any] = {s: signal.signal(s, handler) for s in STOP_SIGNALS}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def agree(device: torch.device, step_s: float = 0.0) -> tuple[int, float]:
    """All ranks: the largest stop signal any rank has received (0: go on), and the largest ``step_s``
    (each rank passes its previous step's wall time: the slowest rank's, what the run's samples/s is
    made of). A collective over the default group, so it doubles as the step's barrier."""
    flag = torch.tensor([float(requested()), step_s], dtype=torch.float64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag[0].item()), float(flag[1].item())


def forward(pids: Callable[[], Sequence[int]]) -> Callable[[int], None]:
    """A handler hook that sends the signal on to the processes ``pids()`` names when it comes
    (processes already gone are skipped)."""

    def send(signum: int) -> None:
        for pid in pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    return send
