"""One job on one rank: train its steps, evaluate when due, report every step, hand in the record.

Per step, every rank of the plan: takes its batch (stage 0 the inputs, the last stage the targets,
timed as data wait), waits at a barrier, takes the step's time origin and runs its program through
the interpreter with the recorder (and, in tests, a fault) hooked around every action. When an
evaluation is due (every ``eval_every`` steps and after the last), every rank runs the eval set
through the plan's forward-only programs (:mod:`pipetrain.runtime.job.evaluate`). The last stage's first
rank turns each step into a :class:`~pipetrain.runtime.job.config.StepMetrics` row: it reports it (the
progress bar), appends it to ``<out>/metrics.csv`` (flushed, so a killed run keeps its rows) and
keeps it for the result. At the end every rank's record goes to rank 0.
"""

from __future__ import annotations

import functools
import os
import signal
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.data import EvalResult
from pipetrain.errors import Interrupted, UserError
from pipetrain.graph.ties import alias_names
from pipetrain.plan.plan import Plan
from pipetrain.profile.clock import device_clock
from pipetrain.runtime.interp.context import Clip, ClipNorm, RankContext
from pipetrain.runtime.interp.executor import Contexts, expected_receives, receive_prepost, run_program
from pipetrain.runtime.interp.memory import MeasuredMemory, measured_memory
from pipetrain.runtime.interp.rank_setup import (
    build_rank_contexts,
    finish_pending_step,
    head_state_dict,
    reload_versions,
    stage_state_dict,
)
from pipetrain.runtime.interp.recorder import StepRecorder
from pipetrain.runtime.interp.ties import TiedGradients, tie_groups
from pipetrain.runtime.interp.transport import Message, Transport
from pipetrain.runtime.job import rank_checkpoint
from pipetrain.runtime.job.config import FaultInjection, InjectedFault, StepMetrics, TrainJob, TrainResult, job_loss
from pipetrain.runtime.job.data import timed_batch
from pipetrain.runtime.job.evaluate import eval_dataset, evaluate_rank, has_eval_set
from pipetrain.runtime.job.loss_scale import LossScaler, RankLossScaling
from pipetrain.runtime.job.metrics import MetricsLog
from pipetrain.runtime.job.optim import set_lr, start_clip_grad_norm
from pipetrain.runtime.job.records import RankRecord, assemble_timeline, step_times
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.prepost import Prepost
from pipetrain.schedule.segments import drain_suffix, segment_start
from pipetrain.schedule.versions import batch_chunks

__all__ = ["JobSession", "run_job"]


class JobSession(Protocol):
    """What a job needs of its rank's session (:class:`~pipetrain.runtime.process.worker._Session`)."""

    plan: Plan | None
    step: int | None
    transport: Transport
    device: torch.device
    prepost_budget: int

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def agree_stop(self, step_s: float) -> tuple[int, float]: ...

    def report(self, job: int, row: StepMetrics) -> None: ...


class _FaultHook:
    """Fires a :class:`FaultInjection` just before the middle action of the chosen step's program
    (``program_length``: its actions)."""

    def __init__(self, fault: FaultInjection | None, rank: int, program_length: int) -> None:
        armed = fault is not None and fault.rank == rank and program_length > 0 and fault.kind != "overflow"
        self.fault = fault if armed else None
        self.index = program_length // 2
        self.step = -1

    def before(self, index: int, action: Action) -> None:
        fault = self.fault
        if fault is None or self.step != fault.step or index != self.index:
            return
        if fault.kind == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
            return
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault before {action}")

    def after(self, index: int, action: Action) -> None:
        pass


def _clip_all(clip: Clip, params: list[nn.Parameter], _stage_params: list[nn.Parameter]) -> ClipNorm:
    """A STEP's clipping that covers ``params`` (every stage of the rank), not only its own stage's."""
    return clip(params)


class _JobRun:
    """A job's state on one rank while it trains."""

    def __init__(self, session: JobSession, index: int, job: TrainJob) -> None:
        self.session, self.index, self.job = session, index, job
        rank, plan = session.rank, job.plan
        assert job.schedule is not None, "check_job resolves the schedule"
        self.program = job.schedule.ranks[rank] if rank < job.schedule.n_ranks else ()
        # an asynchronous program spans the run: step t runs batch t's chunk of it
        self.chunks = batch_chunks(self.program, plan.batch_size, job.config.steps) if plan.asynchronous else None
        first = rank_checkpoint.resume_step(job)
        self.drains = rank_checkpoint.drains(job, first)  # an asynchronous run's segment boundaries
        ahead = self.program if self.chunks is None else tuple(a for c in self.chunks[first:] for a in c)
        groups = {k: dist.new_group(list(s.ranks)) for k, s in enumerate(plan.stages) if len(s.ranks) > 1}
        tied_groups = tie_groups(job.graph, plan)  # collective, like the replicas' groups
        # the plan's ranks (for clipping): the default group unless the launch has ranks the plan does not use
        self.group = dist.new_group(list(range(plan.n_ranks))) if plan.n_ranks < session.world_size else None
        # 2bw's clipping: the norms' all-reduces, started at STEP and finished later, on a group of their own
        deferred = job.config.clip_grad_norm is not None and plan.asynchronous and not plan.spec.loss_per_microbatch
        self.norm_group = dist.new_group(list(range(plan.n_ranks))) if deferred else None
        self.ctxs: dict[int, RankContext] = {}  # by stage: one, or several under a multi-stage placement
        session.transport.bound_sends(plan.params.queue_bound)
        session.transport.open_links(job.schedule.directed_links())
        if self.program:
            self.ctxs = build_rank_contexts(job.graph, plan, rank, session.transport, job.config.build_optimizer,
                                            groups, job_loss(job), ahead)
            ties = TiedGradients.build(job.graph, plan, {k: c.module for k, c in self.ctxs.items()}, tied_groups)
            if ties:
                self.ctxs[self._first_step_stage("tied weights", "use the method's own schedule")].ties = ties
            self._set_clipping(ties)
        self.scaling = self._loss_scaling() if self.ctxs and plan.precision == "fp16" else None
        self.ctx: RankContext | None = self.ctxs[max(self.ctxs)] if self.ctxs else None  # the last: its loss
        self.lr_scales = job.config.stage_rates(plan).scales  # per stage, on the schedule's rate
        # per step program: its receives, and how deep the transport posts them at its start
        self.receives = [self._receives(p) for p in (self.chunks if self.chunks is not None else [self.program])]
        self.recorder = StepRecorder(rank, device_clock(session.device))
        fault = job.config.fault
        step_program = self.program if self.chunks is None or fault is None else self.chunks[fault.step]
        self.fault = _FaultHook(fault, rank, len(step_program))
        self.reports = self.ctx is not None and self.ctx.is_last and rank == plan.stages[-1].ranks[0]
        self.rows: list[StepMetrics] = []
        self.first_step = rank_checkpoint.resume(job, list(self.ctxs.values()), rank)
        assert self.first_step == first, "the checkpoint read before building the stages"
        for c in self.ctxs.values() if first > 0 else ():
            reload_versions(c)
        if self.scaling is not None and first > 0:
            rank_checkpoint.resume_loss_scale(job, self.scaling.scaler)
        out = job.config.out
        self.log = MetricsLog.open(out, self.first_step or None) if self.reports and out is not None else None
        self.waits: list[float] = []
        self.previous_step_s = 0.0  # this rank's last step time, passed to the next step's barrier
        self.saves: list[float] = []
        self.manifest_fields: dict[str, Any] | None = None
        self.start = time.perf_counter()
        if session.device.type == "cuda":  # this job's peak, not an earlier job's of the launch
            torch.cuda.reset_peak_memory_stats(session.device)

    @property
    def contexts(self) -> Contexts:
        """What :func:`run_program` runs on: the rank's context, or its contexts by stage."""
        assert self.ctx is not None
        return self.ctx if len(self.ctxs) == 1 else self.ctxs

    def _receives(self, program: Sequence[Action]) -> tuple[list[Message], Prepost]:
        """``program``'s receives and their pre-posting (:mod:`pipetrain.schedule.prepost`)."""
        if self.ctx is None:
            return [], Prepost()
        budget, bound = self.session.prepost_budget, self.job.plan.params.queue_bound
        return expected_receives(self.contexts, program), receive_prepost(self.contexts, program, budget, bound)

    def train_step(self, step: int) -> None:
        """Run optimizer step ``step`` (and the evaluation after it when one is due)."""
        self.session.step = self.fault.step = step
        ctx, config = self.ctx, self.job.config
        wait = 0.0
        program = self.program if self.chunks is None else self.chunks[step]
        if ctx is not None:
            wait = sum(self._load_batch(c, step) for c in self.ctxs.values())
            self._begin_scaling(step)
            if self.chunks is None:
                ctx.transport.expect(*self.receives[0])
            self._set_lr(step)
        stop, slowest = self.session.agree_stop(self.previous_step_s)  # the step's barrier
        if stop:
            self._stop(stop, step)
        if ctx is not None and self.chunks is not None:  # after the barrier: a stop drains instead
            ctx.transport.expect(*self.receives[step])
            ctx.transport.wait_sends()  # the last chunk's gradients, received by this step's expect
        self.recorder.start_step()
        if ctx is not None:
            run_program(self.contexts, program, (self.fault, self.recorder))
            if self.chunks is None or step == config.steps - 1:  # an async run waits at its next step's start
                ctx.transport.wait_sends()  # local learning's STEP leaves the last sends outstanding
            for c in self.ctxs.values():
                c.meter.enabled = False  # every step holds the same activations: the first one tells
        step_s = self.recorder.end_step()
        self.previous_step_s = step_s
        loss = ctx.step_loss() if ctx is not None else None
        self.waits.append(wait)
        due = step == config.steps - 1 or (config.eval_every > 0 and (step + 1) % config.eval_every == 0)
        evaluation = self._evaluate() if due else None
        if self.reports and ctx is not None and loss is not None:
            previous_slowest_s = slowest if step > self.first_step else None  # the run's first step has none
            self._report(ctx, step, loss, step_s, previous_slowest_s, wait, evaluation)
        if rank_checkpoint.checkpoint_due(self.job, step + 1):
            self._save(step + 1)

    def _loss_scaling(self) -> RankLossScaling:
        """fp16: the rank's loss scaling over all its stages, given to each context
        (:mod:`~pipetrain.runtime.job.loss_scale`); its first STEP of a step decides for all of them."""
        if len(self.ctxs) > 1:
            self._first_step_stage("fp16 loss scaling", "train in bf16 or use the method's own schedule")
        params = [p for c in self.ctxs.values() for p in c.module.parameters() if p.requires_grad]
        scaling = RankLossScaling(LossScaler(), params, self.group, self.session.device)
        for c in self.ctxs.values():
            c.scaler = scaling
        return scaling

    def _begin_scaling(self, step: int) -> None:
        """fp16, before step ``step``'s program: the last stage's loss takes the current scale; a fault
        of kind ``overflow`` on this rank poisons a gradient of the step."""
        scaling = self.scaling
        if scaling is None:
            return
        scaling.begin_step()
        for c in self.ctxs.values():
            c.tally.scale = scaling.scaler.scale
        fault = self.job.config.fault
        if fault is not None and fault.kind == "overflow" and fault.rank == self.session.rank and fault.step == step:
            scaling.poison()

    def _set_lr(self, step: int) -> None:
        for c in self.ctxs.values():
            if c.optimizer is not None:
                set_lr(c.optimizer, self.job.config.lr_at(step) * self.lr_scales[c.stage])

    def _stop(self, signum: int, step: int) -> None:
        """Every rank, at step ``step``'s barrier, on a stop signal: save (checkpointing on, a step taken
        since the start), an asynchronous run draining its pipeline first (:meth:`_drain`).

        Raises:
            Interrupted: always.
        """
        saved = None
        if self.job.config.checkpoint_dir is not None and step > self.first_step:
            if self.chunks is not None:
                self._drain(step)
            saved = self._save(step)
        raise Interrupted(signum, step, saved)

    def _drain(self, step: int) -> None:
        """Finish the micro-batches in flight before batch ``step``: run the rest of the segment built
        for the batches up to ``step`` (:func:`~pipetrain.schedule.segments.drain_suffix`), with the
        learning rate of the step its STEPs belong to, so every stage has stepped for every batch."""
        ctx, chunks = self.ctx, self.chunks
        if ctx is None or chunks is None:
            return
        start = segment_start(self.drains, step - 1)
        ran = tuple(a for c in chunks[start:step] for a in c)
        before = sum(a.kind is ActionKind.STEP for c in chunks[:start] for a in c)
        drain = drain_suffix(self.job.plan, ran, self.session.rank, start, step, before)
        ctx.transport.expect(*self._receives(drain))
        ctx.transport.wait_sends()
        self._set_lr(step - 1)
        run_program(self.contexts, drain)
        ctx.transport.wait_sends()

    def _save(self, done: int) -> Path:
        start = time.perf_counter()
        for c in self.ctxs.values():  # the pipeline is drained: every STEP it ran is in the weights
            finish_pending_step(c)
        if self.manifest_fields is None and self.session.rank == 0:
            self.manifest_fields = rank_checkpoint.manifest_fields(self.job)
        fields = self.manifest_fields
        if fields is not None and self.scaling is not None:
            fields = {**fields, rank_checkpoint.LOSS_SCALE: self.scaling.scaler.state_dict()}
        folder = rank_checkpoint.save(self.job, list(self.ctxs.values()), self.session.rank,
                                     self.session.world_size, done, fields)
        self.saves.append(time.perf_counter() - start)
        return folder

    def _clipper(self, max_norm: float, replicas: int, ties: TiedGradients) -> Clip:
        """STEP's clipping (docs/algorithms.md §3.5). The global norm over the plan's ranks (tied copies
        counted once), as single-process training clips; under ``2bw``, whose stages step for a batch
        at different moments, its all-reduce runs on a group of its own without blocking
        (:mod:`pipetrain.runtime.interp.weights`). Under ``pipedream`` each update is a mini-batch of
        its own: the norm of the update, over the stage's parameters (its replicas hold the same sum)."""
        if self.job.plan.spec.loss_per_microbatch:
            return functools.partial(start_clip_grad_norm, max_norm=max_norm, world=None, device=self.session.device)
        deferred = self.norm_group is not None
        world = self.norm_group if deferred else self.group if self.group is not None else dist.group.WORLD
        return functools.partial(start_clip_grad_norm, max_norm=max_norm, world=world, replicas=replicas,
                                 device=self.session.device, copies=ties.copies(), async_op=deferred)

    def _first_step_stage(self, what: str, fix: str) -> int:
        """The stage of the rank's first STEP, where a step's work over all of the rank's stages runs
        (``what``: clipping, tied weights); with several stages, the program must run every compute
        action before it.

        Raises:
            UserError: a program of several stages with compute after its first STEP (``fix``: what to do).
        """
        steps = [i for i, a in enumerate(self.program) if a.kind is ActionKind.STEP]
        if len(self.ctxs) > 1 and any(a.kind is not ActionKind.STEP for a in self.program[steps[0]:]):
            raise UserError(f"{what} on rank {self.session.rank}, which runs several stages, needs every forward and "
                            f"backward before its first STEP; this schedule interleaves them: {fix}")
        return self.program[steps[0]].stage

    def _set_clipping(self, ties: TiedGradients) -> None:
        """Give each of the rank's contexts its STEP's clipping (``RankContext.clip``), once, when
        ``clip_grad_norm`` asks for it. One stage: its own, over the stage's replicas. Several stages
        (method interleaved): the first STEP clips the gradients of all of them, as one rank's share
        of the global norm, and the later STEPs clip nothing (:meth:`_first_step_stage`)."""
        max_norm = self.job.config.clip_grad_norm
        if max_norm is None or not self.ctxs:
            return
        if len(self.ctxs) == 1:
            (stage, ctx), = self.ctxs.items()
            ctx.clip = self._clipper(max_norm, len(self.job.plan.stages[stage].ranks), ties)
            return
        if not any(a.kind is ActionKind.STEP for a in self.program):
            return
        fix = "leave out --clip-grad-norm or use the method's own schedule"
        stage = self._first_step_stage("--clip-grad-norm", fix)
        params = [p for c in self.ctxs.values() for p in c.module.parameters() if p.requires_grad]
        self.ctxs[stage].clip = functools.partial(_clip_all, self._clipper(max_norm, 1, ties), params)

    def _load_batch(self, ctx: RankContext, step: int) -> float:
        """Load step ``step``'s batch; returns the seconds spent waiting for it."""
        job = self.job
        offset = step * job.plan.batch_size if self.chunks is not None else 0
        if not ctx.needs_batch:
            ctx.begin_step(None, None, offset=offset)
            return 0.0
        batch = timed_batch(job.graph, job.plan.batch_size, step, job.config.seed, job.config.data)
        ctx.begin_step(batch.inputs, batch.targets, offset=offset)
        return batch.wait_s

    def _evaluate(self) -> EvalResult | None:
        config = self.job.config
        if self.ctx is None or not has_eval_set(config.data):
            return None
        return evaluate_rank(self.contexts, self.job.plan, eval_dataset(config.data, self.job.graph),
                             self.session.prepost_budget)

    def _report(self, ctx: RankContext, step: int, loss: float, step_s: float, previous_slowest_s: float | None,
                wait: float, evaluation: EvalResult | None) -> None:
        """Emit step ``step``'s row: this rank's step time, and the slowest rank's of the step before."""
        lr = ctx.optimizer.param_groups[0]["lr"] if ctx.optimizer is not None else self.job.config.lr
        row = StepMetrics(
            step=step, samples_seen=(step + 1) * self.job.plan.batch_size, wall_s=time.perf_counter() - self.start,
            lr=float(lr), loss=loss, eval_loss=evaluation.loss if evaluation else None,
            eval_accuracy=evaluation.accuracy if evaluation else None, step_s=step_s, data_wait_s=wait,
            previous_slowest_s=previous_slowest_s,
            skipped=self.scaling is not None and self.scaling.skipped_last,
            loss_scale=self.scaling.scaler.scale if self.scaling is not None else None,
        )
        self.rows.append(row)
        if self.log is not None:
            self.log.append(row)
        self.session.report(self.index, row)

    def record(self) -> tuple[RankRecord, dict[str, torch.Tensor]]:
        """This rank's record of the run, and its part of the trained state_dict when the job asks for it
        (parameters; buffers on a stage's first rank)."""
        job, ctxs = self.job, list(self.ctxs.values())
        memory = _measured(self.session.rank, ctxs) if ctxs else None
        peak = sum(c.meter.peak_bytes for c in ctxs)
        prepost = max(p.nbytes for _, p in self.receives)
        device = self.session.device
        device_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        record = RankRecord(self.session.rank, tuple(self.recorder.steps), peak, tuple(self.rows), tuple(self.waits),
                            tuple(self.saves), memory, prepost, device_peak)
        state = {}
        for ctx in ctxs if job.return_state_dict else []:
            stage = job.plan.stages[ctx.stage]
            owner = self.session.rank == stage.ranks[0]  # replica 0 keeps the stage's buffers
            state.update(stage_state_dict(ctx, job.graph.layers_named(stage.layers), buffers=owner))
            state.update(head_state_dict(ctx, buffers=owner))
        return record, state


def _measured(rank: int, ctxs: list[RankContext]) -> MeasuredMemory:
    """What ``rank`` held over all its stages (the sum of each stage's)."""
    parts = [measured_memory(rank, c.meter, c.module, c.optimizer) for c in ctxs]
    fields = ("weight_bytes", "gradient_bytes", "optimizer_state_bytes", "activation_bytes")
    return MeasuredMemory(rank=rank, **{f: sum(getattr(p, f) for p in parts) for f in fields})


def run_job(session: JobSession, index: int, job: TrainJob) -> TrainResult | None:
    """Run ``job`` on this rank; rank 0 returns its result, the other ranks None."""
    session.plan, session.step = job.plan, None
    torch.manual_seed(job.config.seed)
    run = _JobRun(session, index, job)
    try:
        for step in range(run.first_step, job.config.steps):
            run.train_step(step)
    finally:
        if run.log is not None:
            run.log.close()
    session.step = None
    gathered = _gather(run.record(), session.rank, session.world_size)
    return None if gathered is None else _result(job, gathered)


def _gather(obj: Any, rank: int, world_size: int) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere)."""
    out: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def _result(job: TrainJob, gathered: list[Any]) -> TrainResult:
    """Rank 0: assemble the job's result from every rank's ``(RankRecord, state_dict part)``."""
    plan, config = job.plan, job.config
    records: list[RankRecord] = [g[0] for g in gathered[: plan.n_ranks]]
    state: dict[str, torch.Tensor] = {}
    for rank, (_record, part) in enumerate(gathered):
        for name, value in part.items():
            if name in state and not torch.equal(state[name], value):
                raise RuntimeError(f"the replicas of rank {rank}'s stage hold different values of {name} after "
                                   "training: their gradient all-reduce failed")
            state[name] = value
    state = alias_names(state, job.graph.ties)  # one tensor under each name of a tie
    metrics = next((r.metrics for r in records if r.metrics), ())
    times = step_times(records)
    sizes = plan.stages[0].forward_sizes
    label = f"{plan.method.value}, {plan.n_stages} stages, {len(sizes)} micro-batches of batch {plan.batch_size}"
    median_s = statistics.median(times[config.warmup_steps:])
    return TrainResult(
        losses=tuple(m.loss for m in metrics),
        step_times_s=tuple(times),
        samples_per_s=plan.batch_size / median_s if median_s > 0 else 0.0,
        timeline=assemble_timeline(records, config.warmup_steps, label),
        state_dict=state,
        memory=tuple(r.memory for r in records if r.memory is not None),
        metrics=metrics,
        data_wait_s=tuple(max(w) for w in zip(*(r.data_wait_s for r in records), strict=True)),
        checkpoint_s=tuple(max(s) for s in zip(*(r.checkpoint_s for r in records), strict=True)),
        device_peak_bytes=tuple(r.device_peak_bytes for r in records if r.device_peak_bytes is not None),
    )
