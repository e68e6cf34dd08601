"""One rank's life: join the group, run every job's program step by step, report, leave.

Both launchers run this: the local launcher (one spawned process per rank, results back through a
queue) and torchrun (ranks started by torchrun, results on rank 0). A session may run several
jobs (plans) one after another in one process group, so tests and benchmarks pay the start-up once;
a rank that a job's plan does not use runs an empty program but still joins its barriers.

Per step, every rank: builds the mini-batch itself (stage 0 keeps the inputs, the last stage the
targets), waits at a barrier, takes the step's time origin and runs its program through the
interpreter with the recorder (and, in tests, a fault) hooked around every action.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store

from pipetrain.allocator import keep_freed_memory
from pipetrain.errors import PipelineFailure, UserError
from pipetrain.plan.plan import Plan, WeightPolicy
from pipetrain.runtime.config import FaultInjection, InjectedFault, TrainConfig, TrainJob, TrainResult
from pipetrain.runtime.data import make_batch
from pipetrain.runtime.executor import (
    RankContext,
    build_rank_context,
    check_runnable,
    expected_receives,
    run_program,
    stage_parameters,
)
from pipetrain.runtime.memory import measured_memory
from pipetrain.runtime.recorder import RankRecord, StepRecorder, assemble_timeline, step_times
from pipetrain.runtime.transport import Transport, TransportError
from pipetrain.runtime.watchdog import Watchdog
from pipetrain.schedule.action import Action
from pipetrain.schedule.generators import build_schedule

__all__ = ["RankFailure", "Rendezvous", "Reporter", "check_job", "rank_label", "run_session", "tcp_store"]

logger = logging.getLogger(__name__)

_TRIPPED_EXIT_CODE = 3
_CAUSE_WAIT_S = 2.0  # how long a rank that lost a peer waits to learn the peer's own error


@dataclass(frozen=True)
class Rendezvous:
    """Where and as whom a rank joins.

    Attributes:
        host, port: the TCP store (hosted by the local launcher, torchrun's agent or rank 0).
        rank, world_size, local_rank: this process's place; ``local_rank`` picks its GPU.
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

    def progress(self, job: int, step: int, loss: float, step_s: float) -> None: ...

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


def check_job(job: TrainJob) -> TrainJob:
    """Everything that can be checked before starting processes; returns the job with its schedule
    resolved (the plan's own when it has none) and validated against the plan.

    Raises:
        UserError: naming what to change.
    """
    plan, graph, config = job.plan, job.graph, job.config
    plan.validate(graph.names, graph.fingerprint())
    if plan.weights is not WeightPolicy.SYNC:
        raise UserError(f"weight policy {plan.weights.value!r} is not supported by the runtime yet; use 'sync'")
    schedule = build_schedule(plan) if job.schedule is None else job.schedule
    check_runnable(schedule, plan)
    if config.fault is not None and config.fault.rank >= plan.n_ranks:
        raise UserError(f"fault rank {config.fault.rank} is not one of the plan's {plan.n_ranks} ranks")
    make_batch(graph, plan.batch_size, 0, config.seed, config.data)
    return replace(job, schedule=schedule)


def rank_label(plan: Plan | None, rank: int) -> str:
    """``"stage 1 (rank 1)"``, or ``"rank 3"`` for a rank the plan does not use."""
    if plan is not None and rank < plan.n_ranks:
        return f"stage {plan.stage_of_rank(rank)} (rank {rank})"
    return f"rank {rank}"


class _FaultHook:
    """Fires a :class:`FaultInjection` just before the middle action of the chosen step."""

    def __init__(self, fault: FaultInjection | None, rank: int, program_length: int) -> None:
        armed = fault is not None and fault.rank == rank and program_length > 0
        self.fault = fault if armed else None
        self.index = program_length // 2
        self.step = -1

    def before(self, index: int, action: Action) -> None:
        fault = self.fault
        if fault is None or self.step != fault.step or index != self.index:
            return
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault before {action}")

    def after(self, index: int, action: Action) -> None:
        pass


class _Session:
    """A rank's process-group membership, watchdog and current position (for messages)."""

    def __init__(self, rdv: Rendezvous, config: TrainConfig, reporter: Reporter, parent_pid: int | None) -> None:
        self.rdv = rdv
        self.reporter = reporter
        self.plan: Plan | None = None
        self.step: int | None = None
        timeout = timedelta(seconds=config.timeout_s)
        store = tcp_store(rdv.host, rdv.port, rdv.store_is_master, timeout)
        backend = config.resolved_backend()
        self.device = torch.device(f"cuda:{rdv.local_rank}" if backend == "nccl" else "cpu")
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
        self.transport = Transport(self.device, use_tags=backend == "gloo")

    @property
    def label(self) -> str:
        return rank_label(self.plan, self.rdv.rank)

    def _trip(self, reason: str) -> None:
        """Watchdog thread: a peer failed or went silent; report and leave at once."""
        when = "during setup" if self.step is None else f"at step {self.step}"
        self.reporter.failed(self.rdv.rank, f"{reason} ({self.label} stopped {when})", True, "")
        self.reporter.flush()
        os._exit(_TRIPPED_EXIT_CODE)

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def failure(self, error: BaseException) -> RankFailure:
        """Turn an exception into a one-line failure; publish it if this rank is the cause."""
        secondary = isinstance(error, TransportError | dist.DistError)
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
        """Leave after a successful run (peers may exit first, so stop judging them)."""
        self.watchdog.quiet()
        self.barrier()
        self.watchdog.stop()
        dist.destroy_process_group()


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
        results = [_run_job(session, index, job) for index, job in enumerate(jobs)]
        session.close()
    except RankFailure:
        raise
    except BaseException as e:
        if session is None:
            raise RankFailure(f"rank {rdv.rank} failed to start: {type(e).__name__}: {e}", True,
                              traceback.format_exc()) from e
        raise session.failure(e) from e
    return [r for r in results if r is not None]


def _run_job(session: _Session, index: int, job: TrainJob) -> TrainResult | None:
    rank, config = session.rdv.rank, job.config
    session.plan, session.step = job.plan, None
    session.reporter.started(rank, index)
    torch.manual_seed(config.seed)
    schedule = job.schedule if job.schedule is not None else build_schedule(job.plan)
    program = schedule.ranks[rank] if rank < schedule.n_ranks else ()
    groups = _replica_groups(job.plan)
    ctx = None
    if program:
        stage = job.plan.stage_of_rank(rank)
        ctx = build_rank_context(job.graph, job.plan, rank, session.transport, config.build_optimizer,
                                 groups.get(stage))
    recorder = StepRecorder(rank, session.synchronize if session.device.type == "cuda" else None)
    fault = _FaultHook(config.fault, rank, len(program))
    losses: list[float] = []
    receives = expected_receives(ctx, program) if ctx is not None else []
    for step in range(config.steps):
        session.step = fault.step = step
        if ctx is not None:
            _load_batch(ctx, job, step)
            ctx.transport.expect(receives)
        session.barrier()
        recorder.start_step()
        if ctx is not None:
            run_program(ctx, program, (fault, recorder))
            ctx.meter.enabled = False  # every step holds the same activations: the first one tells
        step_s = recorder.end_step()
        loss = ctx.step_loss() if ctx is not None else None
        if loss is not None:
            losses.append(loss)
            session.reporter.progress(index, step, loss, step_s)
    record = RankRecord(rank, tuple(recorder.steps), ctx.meter.peak_bytes if ctx else 0, tuple(losses),
                        measured_memory(rank, ctx.meter, ctx.module, ctx.optimizer) if ctx else None)
    params = {}
    if ctx is not None and job.return_parameters:
        params = stage_parameters(ctx, job.graph.layers_named(job.plan.stages[ctx.stage].layers))
    session.step = None
    gathered = _gather((record, params), rank, session.rdv.world_size)
    return None if gathered is None else _result(job, gathered)


def _replica_groups(plan: Plan) -> dict[int, dist.ProcessGroup]:
    """A process group per replicated stage; every rank creates every group, in stage order."""
    return {k: dist.new_group(list(stage.ranks)) for k, stage in enumerate(plan.stages) if len(stage.ranks) > 1}


def _load_batch(ctx: RankContext, job: TrainJob, step: int) -> None:
    if not (ctx.is_first or ctx.is_last):
        ctx.begin_step(None, None)
        return
    inputs, targets = make_batch(job.graph, job.plan.batch_size, step, job.config.seed, job.config.data)
    ctx.begin_step(inputs, targets)


def _gather(obj: Any, rank: int, world_size: int) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere)."""
    out: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def _result(job: TrainJob, gathered: list[Any]) -> TrainResult:
    """Rank 0: assemble the job's result from every rank's ``(RankRecord, parameters)``."""
    plan, config = job.plan, job.config
    records: list[RankRecord] = [g[0] for g in gathered[: plan.n_ranks]]
    parameters: dict[str, torch.Tensor] = {}
    for rank, (_record, params) in enumerate(gathered):
        for name, value in params.items():
            if name in parameters and not torch.equal(parameters[name], value):
                raise RuntimeError(f"the replicas of {rank_label(plan, rank)} hold different values of {name} after "
                                   "training: their gradient all-reduce failed")
            parameters[name] = value
    losses = next((r.losses for r in records if r.losses), ())
    times = step_times(records)
    sizes = plan.stages[0].forward_sizes
    label = f"{plan.method.value}, {plan.n_stages} stages, {len(sizes)} micro-batches of batch {plan.batch_size}"
    median_s = statistics.median(times[config.warmup_steps:])
    return TrainResult(
        losses=losses,
        step_times_s=tuple(times),
        samples_per_s=plan.batch_size / median_s if median_s > 0 else 0.0,
        timeline=assemble_timeline(records, config.warmup_steps, label),
        parameters=parameters,
        memory=tuple(r.memory for r in records if r.memory is not None),
    )
