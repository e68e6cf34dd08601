"""Starting the ranks locally: one spawned process per rank (torchrun's ranks: :mod:`.torchrun`).

Local launch::

    parent: TCP store on 127.0.0.1 (free port) ── spawn ──► rank 0 … rank R-1
            ◄── queue: started / progress (last stage) / failed / results (rank 0)
            watches exit codes; on the first failure, stops every rank and raises PipelineFailure

The parent hosts the rendezvous store itself (port 0, so no port race). Ranks use gloo on CPU or
NCCL with one GPU per rank (``cuda:{rank}``). A failure is reported as the *cause*: a rank that
raised beats a rank that died without a word (killed), which beats ranks that only lost contact with
a failed peer.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.distributed.distributed_c10d import Store

from pipetrain.callables import cwd_first
from pipetrain.errors import Interrupted, PipelineFailure, UserError
from pipetrain.runtime.job.config import StepMetrics, TrainJob, TrainResult
from pipetrain.runtime.process import interrupts
from pipetrain.runtime.process.progress import ProgressDisplay, open_display
from pipetrain.runtime.process.worker import RankFailure, Rendezvous, rank_label, run_session, tcp_store

__all__ = ["describe_exit", "launch_local", "refuse_rerun_of_main"]

_GRACE_S = 2.0  # after a first failure, how long to wait for the ranks' own reports
_POLL_S = 0.05
_RANK_NAME = "pipetrain-rank"  # a spawned rank's process name, followed by its rank
_RERUN_EXIT_CODE = 4  # a spawned rank found itself training again while importing the user's script
_RERUN_ADVICE = ("the ranks are spawned processes that import your script, and its top level starts training again "
                 "in each of them; put the training call under 'if __name__ == \"__main__\":'")


# ---- messages from the ranks to the parent ---------------------------------------------------


@dataclass(frozen=True)
class _Started:
    """A rank began job ``job`` (the parent learns which plan names its stage)."""

    rank: int
    job: int


@dataclass(frozen=True)
class _Progress:
    """The last stage finished a step of ``job``: its ``metrics.csv`` row."""

    job: int
    row: StepMetrics


@dataclass(frozen=True)
class _Report:
    """A rank failed (``secondary``: only because a peer did)."""

    rank: int
    message: str
    secondary: bool
    details: str


@dataclass(frozen=True)
class _Result:
    """Rank 0's result of ``job``, its state_dict as ``torch.save`` bytes (:func:`_to_wire`)."""

    job: int
    result: TrainResult
    state_dict: bytes


@dataclass(frozen=True)
class _Stopped:
    """Every rank stopped on a signal at a step boundary (rank 0 tells)."""

    error: Interrupted


_Message = _Started | _Progress | _Report | _Result | _Stopped


# ---- inside a spawned rank ------------------------------------------------------------------


class _QueueReporter:
    """A rank's reports to the parent through the multiprocessing queue.

    Thread-safe: the watchdog thread may report while the main thread does; after :meth:`flush`
    (the rank is about to exit) further messages are dropped.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._closed = False

    def _put(self, message: _Message) -> None:
        with self._lock:
            if not self._closed:
                self.channel.put(message)

    def started(self, rank: int, job: int) -> None:
        self._put(_Started(rank, job))

    def progress(self, job: int, row: StepMetrics) -> None:
        self._put(_Progress(job, row))

    def failed(self, rank: int, message: str, secondary: bool, details: str) -> None:
        self._put(_Report(rank, message, secondary, details))

    def interrupted(self, error: Interrupted) -> None:
        self._put(_Stopped(error))

    def result(self, job: int, result: TrainResult) -> None:
        self._put(_Result(job, *_to_wire(result)))

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self.channel.close()
                self.channel.join_thread()


def _to_wire(result: TrainResult) -> tuple[TrainResult, bytes]:
    """The state_dict as ``torch.save`` bytes: a plain pickle, any dtype, independent of the sender."""
    buffer = io.BytesIO()
    torch.save(result.state_dict, buffer)
    return replace(result, state_dict={}), buffer.getvalue()


def _from_wire(message: _Result) -> TrainResult:
    state = torch.load(io.BytesIO(message.state_dict), weights_only=True)
    return replace(message.result, state_dict=state)


def _rank_main(rank: int, world_size: int, port: int, jobs: Sequence[TrainJob], channel: Any, parent_pid: int) -> None:
    """Entry point of a spawned rank process."""
    reporter = _QueueReporter(channel)
    rdv = Rendezvous("127.0.0.1", port, rank, world_size, local_rank=rank)
    try:
        results = run_session(rdv, jobs, reporter, parent_pid=parent_pid)
    except Interrupted as e:
        if rank == 0:
            reporter.interrupted(e)
        reporter.flush()
        return
    except RankFailure as e:
        reporter.failed(rank, e.message, e.secondary, e.details)
        reporter.flush()
        os._exit(1)  # no interpreter teardown: a process group with a dead peer may block in it
    for index, result in enumerate(results):
        reporter.result(index, result)
    reporter.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the results are delivered; no interpreter teardown, where leftover C++ threads may abort


# ---- in the parent --------------------------------------------------------------------------


@dataclass
class _Monitor:
    """The parent's view of a local run: messages from the queue, exit codes of the ranks."""

    jobs: Sequence[TrainJob]
    procs: list[Any]
    channel: Any
    display: ProgressDisplay
    results: dict[int, TrainResult] = field(default_factory=dict)
    reports: list[_Report] = field(default_factory=list)
    job_of_rank: dict[int, int] = field(default_factory=dict)
    stopped: Interrupted | None = None

    def run(self) -> list[TrainResult]:
        while True:
            self._drain(_POLL_S)
            if self.reports or any(p.exitcode not in (None, 0) for p in self.procs):
                if any(p.exitcode == _RERUN_EXIT_CODE for p in self.procs):
                    raise UserError(_RERUN_ADVICE)
                if interrupts.requested():  # a signal reached the ranks before they could catch it
                    raise Interrupted(interrupts.requested(), 0)
                raise self._failure()
            if all(p.exitcode == 0 for p in self.procs):
                self._drain(0)
                if self.stopped is not None:
                    raise self.stopped
                return self._collect()

    def _drain(self, wait_s: float) -> None:
        """Handle every queued message, waiting up to ``wait_s`` for the first."""
        try:
            message = self.channel.get(timeout=wait_s) if wait_s > 0 else self.channel.get_nowait()
            while True:
                self._handle(message)
                message = self.channel.get_nowait()
        except queue_module.Empty:
            return

    def _handle(self, message: _Message) -> None:
        if isinstance(message, _Started):
            self.job_of_rank[message.rank] = message.job
        elif isinstance(message, _Progress):
            self.display.update(message.job, message.row)
        elif isinstance(message, _Report):
            self.reports.append(message)
        elif isinstance(message, _Stopped):
            self.stopped = message.error
        else:
            self.results[message.job] = _from_wire(message)

    def _collect(self) -> list[TrainResult]:
        deadline = time.monotonic() + _GRACE_S
        while len(self.results) < len(self.jobs) and time.monotonic() < deadline:
            self._drain(_POLL_S)
        if len(self.results) < len(self.jobs):
            raise PipelineFailure("rank 0 finished without reporting its results")
        return [self.results[i] for i in range(len(self.jobs))]

    def _deaths(self) -> list[str]:
        """Ranks that exited with an error and never said why (killed, crashed)."""
        told = {r.rank for r in self.reports}
        out = []
        for rank, proc in enumerate(self.procs):
            if proc.exitcode not in (None, 0) and rank not in told:
                out.append(f"{self._label(rank)} died ({describe_exit(proc.exitcode)})")
        return out

    def _label(self, rank: int) -> str:
        job = self.job_of_rank.get(rank)
        return rank_label(self.jobs[job].plan if job is not None else None, rank)

    def _cause_known(self) -> bool:
        return any(not r.secondary for r in self.reports) or bool(self._deaths())

    def _failure(self) -> PipelineFailure:
        deadline = time.monotonic() + _GRACE_S
        while not self._cause_known() and time.monotonic() < deadline:
            self._drain(_POLL_S)
        self._drain(0)
        primary = [r for r in self.reports if not r.secondary]
        causes = [r.message for r in primary] + self._deaths() + [r.message for r in self.reports if r.secondary]
        message = causes[0] if causes else "a rank failed without a report"
        error = PipelineFailure(message)
        for note in causes[1:]:
            error.add_note(f"also: {note}")
        if primary and primary[0].details:
            error.add_note(f"traceback of {self._label(primary[0].rank)}:\n{primary[0].details}")
        return error


def describe_exit(code: int) -> str:
    """``"exit code -9 / signal SIGKILL"`` for a signal, ``"exit code 1"`` otherwise."""
    if code < 0:
        try:
            return f"exit code {code} / signal {signal.Signals(-code).name}"
        except ValueError:
            return f"exit code {code} / signal {-code}"
    return f"exit code {code}"


def _port(store: Store) -> int:
    port: int = store.port  # type: ignore[attr-defined]  # a TCPStore
    return port


def _terminate(procs: Sequence[Any]) -> None:
    """Stop every rank still running: SIGTERM, then SIGKILL; reap them all."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 3.0
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2.0)


def refuse_rerun_of_main() -> None:
    """Stop a spawned process that reached training while importing the user's script.

    A spawned process imports the parent's main module before it runs (multiprocessing's
    bootstrapping phase), so a script that trains at its top level, without the
    ``if __name__ == "__main__":`` guard, would start training again in every rank. A rank of ours
    exits at once, silently, with :data:`_RERUN_EXIT_CODE`, which its parent turns into one line
    (:meth:`_Monitor.run`); any other process gets the line itself.

    Raises:
        UserError: a process that is not one of our ranks is bootstrapping.
    """
    process = multiprocessing.current_process()
    if not getattr(process, "_inheriting", False):  # multiprocessing's own flag for that phase
        return
    if process.name.startswith(_RANK_NAME):
        os._exit(_RERUN_EXIT_CODE)
    raise UserError(_RERUN_ADVICE)


def launch_local(jobs: Sequence[TrainJob], *, progress: bool = False) -> list[TrainResult]:
    """Run the jobs, in order, on locally spawned ranks (one process group for all of them).

    The group has ``max(plan.n_ranks)`` ranks; the first job's config gives the group's backend,
    timeout and threads per rank (callers check that every job agrees).

    Raises:
        UserError: the calling script trains at its top level without the ``__main__`` guard.
        PipelineFailure: a rank failed or died; the message names the stage and rank.
    """
    refuse_rerun_of_main()
    config = jobs[0].config
    world_size = max(job.plan.n_ranks for job in jobs)
    store = tcp_store("127.0.0.1", 0, True, timedelta(seconds=config.timeout_s))
    context = mp.get_context("spawn")
    channel = context.Queue()
    procs = [
        context.Process(
            target=_rank_main, args=(rank, world_size, _port(store), list(jobs), channel, os.getpid()),
            name=f"{_RANK_NAME}{rank}", daemon=True,
        )
        for rank in range(world_size)
    ]
    started = lambda: [p.pid for p in procs if p.pid is not None]  # noqa: E731
    restore_signals = interrupts.install(on_signal=interrupts.forward(started))
    try:
        with cwd_first():  # spawned ranks unpickle the user's modules and data factories from here too
            for proc in procs:
                proc.start()
        with open_display(jobs, enabled=progress) as display:
            return _Monitor(jobs, procs, channel, display).run()
    finally:
        restore_signals()
        _terminate(procs)
        channel.close()
        channel.cancel_join_thread()
        del store
