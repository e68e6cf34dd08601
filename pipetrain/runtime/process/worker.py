"""One rank's life: join the group, run every job's program step by step, report, leave.

Both launchers run this: the local launcher (one spawned process per rank, results back through a
queue) and torchrun (ranks started by torchrun, results on rank 0). A session may run several
jobs (plans) one after another in one process group, so tests and benchmarks pay the start-up once;
a rank that a job's plan does not use runs an empty program but still joins its barriers.

What a job does on a rank, step by step, is :mod:`pipetrain.runtime.job.loop`'s.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store

from pipetrain.allocator import keep_freed_memory
from pipetrain.device_select import rank_device
from pipetrain.errors import Interrupted, PipelineFailure
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.transport import Transport, TransportError
from pipetrain.runtime.job.config import StepMetrics, TrainConfig, TrainJob, TrainResult
from pipetrain.runtime.job.loop import run_job
from pipetrain.runtime.process import interrupts
from pipetrain.runtime.process.watchdog import Watchdog
from pipetrain.schedule.prepost import prepost_budget

__all__ = ["RankFailure", "Rendezvous", "Reporter", "in_communication", "rank_label", "run_session", "tcp_store"]

logger = logging.getLogger(__name__)

_TRIPPED_EXIT_CODE = 3
_CAUSE_WAIT_S = 2.0  # how long a rank that lost a peer waits to learn the peer's own error
_DISTRIBUTED_DIR = os.path.join("torch", "distributed", "")


def in_communication(error: BaseException) -> bool:
    """Whether ``error`` was raised inside ``torch.distributed`` (a collective such as the step's
    barrier, or a wait): gloo reports a dead peer there as a plain ``RuntimeError`` ("Connection reset
    by peer"), which makes this rank's failure a consequence, not the cause."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and _DISTRIBUTED_DIR in frames[-1].filename


@dataclass(frozen=True)
class Rendezvous:
    """Where and as whom a rank joins.

    Attributes:
        host, port: the TCP store (hosted by the local launcher, torchrun's agent or rank 0).
        rank, world_size, local_rank: this process's place; ``local_rank`` picks its GPU
            (:func:`~pipetrain.device_select.rank_device`).
        store_is_master: this rank hosts the store (torchrun without an agent store, rank 0).
        prefix: key prefix in the store (torchrun restarts get a fresh one).
    """

    host: str
    port: int
    rank: int
    world_size: int
    local_rank: int
    store_is_master: bool = False
    prefix: str = "pipetrain"


class Reporter(Protocol):
    """Where a rank tells the outside world what happens (a queue, or the log)."""

    def started(self, rank: int, job: int) -> None: ...

    def progress(self, job: int, row: StepMetrics) -> None: ...

    def failed(self, rank: int, message: str, secondary: bool, details: str) -> None: ...

    def flush(self) -> None: ...


class RankFailure(PipelineFailure):
    """This rank failed. ``secondary`` when it only lost a peer (the peer's failure is the cause).

    Attributes:
        message: one line naming stage, rank, step and error.
        secondary: the error came from communication with a failed peer.
        details: the formatted traceback.
    """

    def __init__(self, message: str, secondary: bool, details: str) -> None:
        super().__init__(message)
        self.message = message
        self.secondary = secondary
        self.details = details


def tcp_store(host: str, port: int, is_master: bool, timeout: timedelta) -> Store:
    """A TCP key-value store: the server when ``is_master`` (``port=0`` picks a free port), else a client."""
    return dist.TCPStore(  # type: ignore[attr-defined]  # not re-exported in torch's stubs
        host, port, None, is_master, timeout=timeout, wait_for_workers=False
    )


def rank_label(plan: Plan | None, rank: int) -> str:
    """``"stage 1 (rank 1)"``, or ``"rank 3"`` for a rank the plan does not use."""
    if plan is not None and rank < plan.n_ranks:
        return f"stage {plan.stage_of_rank(rank)} (rank {rank})"
    return f"rank {rank}"


class _Session:
    """A rank's process-group membership, watchdog and current position (for messages)."""

    def __init__(self, rdv: Rendezvous, config: TrainConfig, reporter: Reporter, parent_pid: int | None) -> None:
        self.rdv = rdv
        self.reporter = reporter
        self.plan: Plan | None = None
        self.step: int | None = None
        timeout = timedelta(seconds=config.timeout_s)
        store = tcp_store(rdv.host, rdv.port, rdv.store_is_master, timeout)
        self.backend = backend = config.resolved_backend()
        self.device = rank_device(config.resolved_device(), rdv.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.watchdog = Watchdog(
            PrefixStore(f"{rdv.prefix}/watchdog", store), rdv.rank, rdv.world_size,
            config.timeout_s, lambda r: rank_label(self.plan, r), self._trip, parent_pid,
        )
        self.watchdog.start()
        dist.init_process_group(
            backend, store=PrefixStore(f"{rdv.prefix}/pg", store),
            rank=rdv.rank, world_size=rdv.world_size, timeout=timeout,
        )
        self.transport = Transport(self.device, use_tags=backend == "gloo",
                                   host_staged=backend == "gloo" and self.device.type == "cuda")
        self.prepost_budget = prepost_budget(backend)
        self.restore_signals = interrupts.install()

    @property
    def label(self) -> str:
        return rank_label(self.plan, self.rdv.rank)

    @property
    def rank(self) -> int:
        return self.rdv.rank

    @property
    def world_size(self) -> int:
        return self.rdv.world_size

    def report(self, job: int, row: StepMetrics) -> None:
        self.reporter.progress(job, row)

    def _trip(self, reason: str) -> None:
        """Watchdog thread: a peer failed or went silent; report and leave at once."""
        when = "during setup" if self.step is None else f"at step {self.step}"
        self.reporter.failed(self.rdv.rank, f"{reason} ({self.label} stopped {when})", True, "")
        self.reporter.flush()
        os._exit(_TRIPPED_EXIT_CODE)

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()

    def agree_stop(self, step_s: float) -> tuple[int, float]:
        """The step's barrier, which also tells whether any rank received a stop signal (0: no) and the
        slowest rank's ``step_s`` (each rank passes its previous step's wall time)."""
        return interrupts.agree(self.device, step_s)

    def failure(self, error: BaseException) -> RankFailure:
        """Turn an exception into a one-line failure; publish it if this rank is the cause."""
        secondary = isinstance(error, TransportError | dist.DistError) or in_communication(error)
        when = "during setup" if self.step is None else f"at step {self.step}"
        if isinstance(error, TransportError):
            message = f"{self.label} stopped {when}: lost {rank_label(self.plan, error.peer)}: {error}"
        else:
            verb = "stopped" if secondary else "failed"
            message = f"{self.label} {verb} {when}: {type(error).__name__}: {error}"
        if not secondary:
            self.watchdog.report_failure(message)
        else:
            cause = self.watchdog.failure(wait_s=_CAUSE_WAIT_S)
            message = message if cause is None else f"{cause} ({message})"
        return RankFailure(message, secondary, traceback.format_exc())

    def close(self) -> None:
        """Leave after a successful run (peers may exit first, so stop judging them).

        Two barriers: after the second, no rank's watchdog touches the store any more, so a rank
        that hosts the store (or whose launcher does) can exit without failing a slower peer.
        """
        self.watchdog.quiet()
        self.barrier()
        self.watchdog.stop()
        self.barrier()
        dist.destroy_process_group()
        self.restore_signals()


def run_session(
    rdv: Rendezvous, jobs: Sequence[TrainJob], reporter: Reporter, *, parent_pid: int | None = None
) -> list[TrainResult]:
    """Run every job on this rank; rank 0 returns their results, other ranks an empty list.

    Raises:
        RankFailure: this rank failed (or lost a peer); the message names stage, rank and step.
    """
    torch.set_num_threads(jobs[0].config.threads_per_rank)
    if jobs[0].config.keep_freed_memory:
        keep_freed_memory()
    session: _Session | None = None
    try:
        session = _Session(rdv, jobs[0].config, reporter, parent_pid)
        results = []
        for index, job in enumerate(jobs):
            reporter.started(rdv.rank, index)
            results.append(run_job(session, index, job))
        session.close()
    except Interrupted:
        if session is not None:
            session.close()
        raise
    except RankFailure:
        raise
    except BaseException as e:
        if session is None:
            raise RankFailure(f"rank {rdv.rank} failed to start: {type(e).__name__}: {e}", True,
                              traceback.format_exc()) from e
        raise session.failure(e) from e
    return [r for r in results if r is not None]
