"""Training entry points: pipelined :func:`train`, and :func:`reference_train`, its unpipelined twin.

    result = train(graph, plan, TrainConfig(steps=10))           # spawns plan.n_ranks processes
    base = reference_train(graph, plan.batch_size, TrainConfig(steps=10))

Both use the same data (:func:`~pipetrain.runtime.job.data.timed_batch`), loss (sum of per-sample
losses / batch size), evaluations, optimizer and initial weights, so for the synchronous methods their parameters
agree after any number of steps up to floating-point rounding (docs/architecture.md §5.2).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from pipetrain.allocator import keep_freed_memory
from pipetrain.data import EvalResult, Loss
from pipetrain.device_select import check_placement
from pipetrain.errors import UserError
from pipetrain.graph.dataflow import whole_model
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.ties import alias_names
from pipetrain.plan.batch_norm import warn_batch_norm
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.interp.precision import StagePrecision
from pipetrain.runtime.job.checks import check_job
from pipetrain.runtime.job.config import StepMetrics, TrainConfig, TrainJob, TrainResult, job_loss
from pipetrain.runtime.job.data import timed_batch
from pipetrain.runtime.job.evaluate import eval_dataset, evaluate_module, has_eval_set
from pipetrain.runtime.job.loss_scale import LossScaler, unscale_
from pipetrain.runtime.job.optim import clip_grad_norm_global, set_lr
from pipetrain.runtime.job.records import median_step
from pipetrain.runtime.process.spawn import launch_local
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.timeline import Event, Timeline

__all__ = ["reference_train", "single_stage_plan", "train", "train_many"]


def train(
    graph: LayerGraph, plan: Plan, config: TrainConfig, *, schedule: Schedule | None = None,
    return_state_dict: bool = False,
) -> TrainResult:
    """Train ``graph`` with ``plan`` on locally spawned ranks; returns in the calling process.

    Args:
        schedule: what the ranks execute, e.g. a hand-edited ``schedule.csv`` or the schedule the
            simulator scored; validated against ``plan`` first. Default: the plan's own.
        return_state_dict: gather the trained model's state_dict (parameters and buffers) into the result.

    Raises:
        UserError: the plan (or schedule) does not fit the model or asks for something the runtime lacks.
        PipelineFailure: a rank failed or died; the message names its stage and rank.
    """
    return train_many([TrainJob(graph, plan, config, return_state_dict, schedule)])[0]


def train_many(jobs: Sequence[TrainJob]) -> list[TrainResult]:
    """Run several jobs one after another in one launch (ranks start once), e.g. a sweep.

    Every job must agree on the launch settings: device, backend, timeout and threads per rank.
    """
    if not jobs:
        return []
    jobs = [check_job(job) for job in jobs]
    for job in jobs:
        warn_batch_norm(job.plan, job.graph)
    first = jobs[0].config
    settings = (first.resolved_device(), first.resolved_backend(), first.timeout_s, first.threads_per_rank)
    for job in jobs[1:]:
        c = job.config
        if (c.resolved_device(), c.resolved_backend(), c.timeout_s, c.threads_per_rank) != settings:
            raise UserError("jobs in one launch must share device, backend, timeout_s and threads_per_rank")
    check_placement(settings[0], settings[1], max(job.plan.n_ranks for job in jobs))
    return launch_local(jobs, progress=any(job.config.progress for job in jobs))


def reference_train(
    graph: LayerGraph, batch_size: int, config: TrainConfig, *, return_state_dict: bool = True
) -> TrainResult:
    """Single-process, unpipelined training: the baseline the pipeline must reproduce.

    Same data, loss (``loss / batch_size``), optimizer, initial weights
    (:func:`~pipetrain.graph.dataflow.whole_model`) and evaluations as :func:`train`; runs with
    ``config.threads_per_rank`` threads. At ``config.precision`` bf16 or fp16 the forward and the loss
    run under autocast, the weights stay float32, and fp16 scales the loss
    (:mod:`~pipetrain.runtime.job.loss_scale`); nothing is cast between layers, as no message is sent.
    Its timeline has one rank with ``F``, ``B`` and ``STEP`` over the whole batch.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads_per_rank)
    if config.keep_freed_memory:
        keep_freed_memory()
    plan = single_stage_plan(graph, batch_size)
    config = check_job(TrainJob(graph, plan, config)).config
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            return _reference(graph, batch_size, config, return_state_dict)
    finally:
        torch.set_num_threads(threads)


def single_stage_plan(graph: LayerGraph, batch_size: int) -> Plan:
    """The one-rank GPipe plan of the whole model in one micro-batch (what :func:`reference_train` runs)."""
    stage = StagePlan(graph.names, (0,), (batch_size,), (batch_size,))
    return Plan(graph.name, graph.fingerprint(), batch_size, Method.GPIPE, (stage,))


_ACTIONS = (ActionKind.F, ActionKind.B, ActionKind.STEP)


def _reference(graph: LayerGraph, batch_size: int, config: TrainConfig, return_state_dict: bool) -> TrainResult:
    model = whole_model(graph)
    precision = StagePrecision(config.precision or "fp32", "cpu")
    scaler = LossScaler() if precision.precision == "fp16" else None
    optimizer = config.build_optimizer(model.parameters())
    loss_fn = job_loss(TrainJob(graph, single_stage_plan(graph, batch_size), config))
    meter = ActivationMeter(model.parameters())
    actions = tuple(Action(k, 0, 0, 0, batch_size) if k is not ActionKind.STEP else Action(k, 0) for k in _ACTIONS)
    rows, times, steps, waits = [], [], [], []
    start = time.perf_counter()
    for step in range(config.steps):
        batch = timed_batch(graph, batch_size, step, config.seed, config.data)
        set_lr(optimizer, config.lr_at(step))
        clock = [time.perf_counter()]
        with meter.track(step), precision.autocast():
            loss = loss_fn(model(batch.inputs), batch.targets) / batch_size
        clock.append(time.perf_counter())
        torch.autograd.backward(loss if scaler is None else loss * scaler.scale)
        meter.release(step)
        clock.append(time.perf_counter())
        skip = scaler is not None and _unscale(scaler, list(model.parameters()))
        if config.clip_grad_norm is not None and not skip:
            clip_grad_norm_global(list(model.parameters()), config.clip_grad_norm, world=None)
        if not skip:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.append(time.perf_counter())
        times.append(clock[-1] - clock[0])
        waits.append(batch.wait_s)
        steps.append(tuple(Event(0, a, clock[i] - clock[0], clock[i + 1] - clock[0]) for i, a in enumerate(actions)))
        with precision.autocast():
            evaluation = _reference_eval(model, loss_fn, graph, batch_size, config, step)
        rows.append(StepMetrics(step, (step + 1) * batch_size, time.perf_counter() - start,
                                float(optimizer.param_groups[0]["lr"]), float(loss.detach()),
                                evaluation.loss if evaluation else None, evaluation.accuracy if evaluation else None,
                                times[-1], batch.wait_s, skip, scaler.scale if scaler is not None else None))
    timeline = Timeline(steps[median_step(times, config.warmup_steps)], 1, "measured", (meter.peak_bytes,),
                        f"reference, batch {batch_size}", tuple(times[config.warmup_steps:]))
    state = {}
    if return_state_dict:
        for layer, child in zip(graph.layers, model.children(), strict=True):
            for name, value in child.state_dict().items():
                state[layer.qualified(name)] = value.detach().clone()
        state = alias_names(state, graph.ties)
    return TrainResult(tuple(r.loss for r in rows), tuple(times),
                       batch_size / statistics.median(times[config.warmup_steps:]), timeline, state,
                       metrics=tuple(rows), data_wait_s=tuple(waits))


def _unscale(scaler: LossScaler, params: list[torch.nn.Parameter]) -> bool:
    """fp16: unscale the gradients and update the scale (:mod:`~pipetrain.runtime.job.loss_scale`, one
    process); whether the step is skipped."""
    found = unscale_(params, scaler.scale)
    scaler.update(found)
    return found


def _reference_eval(model: torch.nn.Module, loss: Loss, graph: LayerGraph, batch_size: int, config: TrainConfig,
                    step: int) -> EvalResult | None:
    """The evaluation after ``step`` when one is due (as the pipeline's :mod:`~pipetrain.runtime.job.loop`)."""
    due = step == config.steps - 1 or (config.eval_every > 0 and (step + 1) % config.eval_every == 0)
    if not due or not has_eval_set(config.data):
        return None
    return evaluate_module(model, loss, eval_dataset(config.data, graph), batch_size)
