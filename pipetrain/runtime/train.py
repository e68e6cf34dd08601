"""Training entry points: pipelined :func:`train`, and :func:`reference_train`, its unpipelined twin.

    result = train(graph, plan, TrainConfig(steps=10))           # spawns plan.n_ranks processes
    base = reference_train(graph, plan.batch_size, TrainConfig(steps=10))

Both use the same data (:func:`~pipetrain.runtime.data.make_batch`), loss (sum of per-sample
losses / batch size), optimizer and initial weights, so for the synchronous methods their parameters
agree after any number of steps up to floating-point rounding (DESIGN.md §5.2).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from pipetrain.allocator import keep_freed_memory
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, loss_sum
from pipetrain.plan.plan import Plan
from pipetrain.runtime.config import FaultInjection, TrainConfig, TrainJob, TrainResult
from pipetrain.runtime.data import make_batch
from pipetrain.runtime.launch import launch_local, run_worker_from_env
from pipetrain.runtime.memory import ActivationMeter
from pipetrain.runtime.recorder import median_step
from pipetrain.runtime.worker import check_job
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.timeline import Event, Timeline

__all__ = [
    "FaultInjection",
    "TrainConfig",
    "TrainJob",
    "TrainResult",
    "check_job",
    "reference_train",
    "run_worker_from_env",
    "train",
    "train_many",
]


def train(
    graph: LayerGraph, plan: Plan, config: TrainConfig, *, schedule: Schedule | None = None,
    return_parameters: bool = False,
) -> TrainResult:
    """Train ``graph`` with ``plan`` on locally spawned ranks; returns in the calling process.

    Args:
        schedule: what the ranks execute, e.g. a hand-edited ``schedule.csv`` or the schedule the
            simulator scored; validated against ``plan`` first. Default: the plan's own.
        return_parameters: gather the final parameters into the result.

    Raises:
        UserError: the plan (or schedule) does not fit the model or asks for something the runtime lacks.
        PipelineFailure: a rank failed or died; the message names its stage and rank.
    """
    return train_many([TrainJob(graph, plan, config, return_parameters, schedule)])[0]


def train_many(jobs: Sequence[TrainJob]) -> list[TrainResult]:
    """Run several jobs one after another in one launch (ranks start once), e.g. a sweep.

    Every job must agree on the launch settings: backend, timeout and threads per rank.
    """
    if not jobs:
        return []
    jobs = [check_job(job) for job in jobs]
    first = jobs[0].config
    settings = (first.resolved_backend(), first.timeout_s, first.threads_per_rank)
    for job in jobs[1:]:
        c = job.config
        if (c.resolved_backend(), c.timeout_s, c.threads_per_rank) != settings:
            raise UserError("jobs in one launch must share backend, timeout_s and threads_per_rank")
    world_size = max(job.plan.n_ranks for job in jobs)
    if settings[0] == "nccl" and world_size > torch.cuda.device_count():
        raise UserError(f"the plan needs {world_size} GPUs but {torch.cuda.device_count()} are visible; "
                        "use fewer stages or backend 'gloo'")
    return launch_local(jobs, progress=any(job.config.progress for job in jobs))


def reference_train(
    graph: LayerGraph, batch_size: int, config: TrainConfig, *, return_parameters: bool = True
) -> TrainResult:
    """Single-process, unpipelined training: the baseline the pipeline must reproduce.

    Same data, loss (``loss_sum / batch_size``), optimizer and initial weights
    (``graph.build_sequential()``) as :func:`train`; runs with ``config.threads_per_rank``
    threads. Its timeline has one rank with ``F``, ``B`` and ``STEP`` over the whole batch.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads_per_rank)
    if config.keep_freed_memory:
        keep_freed_memory()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            return _reference(graph, batch_size, config, return_parameters)
    finally:
        torch.set_num_threads(threads)


def _reference(graph: LayerGraph, batch_size: int, config: TrainConfig, return_parameters: bool) -> TrainResult:
    model = graph.build_sequential()
    optimizer = config.build_optimizer(model.parameters())
    meter = ActivationMeter(model.parameters())
    actions = (Action(ActionKind.F, 0, 0, 0, batch_size), Action(ActionKind.B, 0, 0, 0, batch_size),
               Action(ActionKind.STEP, 0))
    losses, times, steps = [], [], []
    for step in range(config.steps):
        x, y = make_batch(graph, batch_size, step, config.seed, config.data)
        clock = [time.perf_counter()]
        with meter.track(step):
            loss = loss_sum(graph.loss, model(x), y) / batch_size
        clock.append(time.perf_counter())
        torch.autograd.backward(loss)
        meter.release(step)
        clock.append(time.perf_counter())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.append(time.perf_counter())
        losses.append(float(loss.detach()))
        times.append(clock[-1] - clock[0])
        steps.append(tuple(Event(0, a, clock[i] - clock[0], clock[i + 1] - clock[0]) for i, a in enumerate(actions)))
    timeline = Timeline(steps[median_step(times, config.warmup_steps)], 1, "measured", (meter.peak_bytes,),
                        f"reference, batch {batch_size}", tuple(times[config.warmup_steps:]))
    parameters = {}
    if return_parameters:
        for layer, child in zip(graph.layers, model.children(), strict=True):
            for pname, p in child.named_parameters():
                parameters[layer.qualified(pname)] = p.detach().clone()
    return TrainResult(tuple(losses), tuple(times), batch_size / statistics.median(times[config.warmup_steps:]),
                       timeline, parameters)
