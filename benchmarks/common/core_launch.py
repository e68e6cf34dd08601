"""Run one job on a few spawned local processes, bounded in time: the launcher of the torch baselines
(:mod:`common.torch_baseline`) and of other measured runs that are not pipetrain's (single-process
loops, torch's ``pipeline()``).

Each rank is a spawned process calling a module-level ``run(rank, port, job)``; the parent collects
every rank's result, and a run that does not finish within its time (torch's schedules can hang) is
killed with its processes and reported as ``"timeout"``, one that raises with its error.
"""

from __future__ import annotations

import queue
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import torch.multiprocessing as mp

from common.measured import WARMUP_STEPS

__all__ = ["N_RANKS", "RankRun", "TorchRun", "free_port", "launch", "launch_timed"]

N_RANKS = 2


@dataclass(frozen=True)
class TorchRun:
    """The outcome of one torch-pipelining run.

    Attributes:
        status: ``"ok"``, ``"timeout"`` (killed after ``timeout_s``) or ``"error: ..."``.
        samples_per_s: batch / median timed step time; None unless ``status == "ok"``.
        step_times_s: every step's time (slowest rank), warm-up included.
        wall_s: wall time of the whole run, process start-up included.
    """

    status: str
    samples_per_s: float | None = None
    step_times_s: tuple[float, ...] = field(default=())
    wall_s: float = 0.0

    @property
    def iteration_s(self) -> float | None:
        """Median timed step time (s)."""
        timed = self.step_times_s[WARMUP_STEPS:]
        return statistics.median(timed) if timed else None


RankRun = Callable[[int, int, Any], Any]
"""What each rank of a launch does: ``run(rank, port, job)`` returns its result (step times, gradients);
a module-level function, so that it crosses to the spawned processes."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process group's ``tcp://`` rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank_main(rank: int, port: int, job: Any, results: mp.Queue, run: RankRun) -> None:  # type: ignore[type-arg]
    """One rank: ``run`` ``job``, put ``(rank, "ok", times or gradients)`` on ``results``."""
    try:
        results.put((rank, "ok", run(rank, port, job)))
    except BaseException as e:  # report anything, then let the parent clean up
        first = str(e).splitlines()[0] if str(e) else ""
        results.put((rank, f"error: {type(e).__name__}: {first}", []))


def _stop(procs: Sequence[BaseProcess]) -> None:
    """Kill whatever is still alive and reap every process (no orphans)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def launch(job: Any, timeout_s: float, run: RankRun, n_ranks: int = N_RANKS) -> tuple[str, dict[int, Any], float]:
    """Run ``job`` on ``n_ranks`` spawned ranks, each calling ``run``: (status, each rank's result, wall
    seconds)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    start = time.perf_counter()
    procs = [ctx.Process(target=_rank_main, args=(r, port, job, results, run), daemon=True)
             for r in range(n_ranks)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    status = "ok"
    try:
        while len(got) < n_ranks:
            left = timeout_s - (time.perf_counter() - start)
            if left <= 0:
                status = "timeout"
                break
            try:
                rank, rank_status, out = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    status = "error: a rank died"
                    break
                continue
            if rank_status != "ok":
                status = f"rank {rank} {rank_status}"
                break
            got[rank] = out
    finally:
        _stop(procs)
        results.close()
    return status, got, time.perf_counter() - start


def launch_timed(job: Any, batch: int, timeout_s: float, run: RankRun, n_ranks: int = N_RANKS) -> TorchRun:
    """:func:`launch` a job whose ranks return their step times; a step's time is the slowest rank's."""
    status, got, wall = launch(job, timeout_s, run, n_ranks)
    if status != "ok":
        return TorchRun(status, wall_s=wall)
    step_times = tuple(max(per_step) for per_step in zip(*got.values(), strict=True))
    timed = step_times[WARMUP_STEPS:]
    return TorchRun("ok", batch / statistics.median(timed), step_times, wall)
