"""What a job is checked for before any rank starts: the plan against the model, the schedule
against the plan and the handlers, the settings against the method, the data, the loss and the
checkpoint to resume (:func:`check_job`; every launcher and the single-process references call it).
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import check_aux
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import LocalParams
from pipetrain.plan.plan import Plan
from pipetrain.plan.stage_graph import validate_for_graph
from pipetrain.runtime.interp.executor import check_runnable
from pipetrain.runtime.interp.ties import check_ties
from pipetrain.runtime.job.config import TrainConfig, TrainJob, job_loss
from pipetrain.runtime.job.data import steps_per_epoch, timed_batch
from pipetrain.runtime.job.evaluate import eval_dataset, has_eval_set
from pipetrain.runtime.job.optim import check_lr_schedule
from pipetrain.runtime.job.rank_checkpoint import drains, find_resume
from pipetrain.schedule.segments import segmented_schedule
from pipetrain.schedule.versions import check_chunks

__all__ = ["check_job"]


def check_job(job: TrainJob) -> TrainJob:
    """Everything that can be checked before starting processes; returns the job with its schedule
    resolved (the plan's own when it has none) and validated against the plan, and ``epochs``
    turned into ``steps``.

    Raises:
        UserError: naming what to change.
    """
    plan, graph, config = _with_precision(job.plan, job.config), job.graph, job.config
    validate_for_graph(plan, graph)
    check_ties(graph, plan)
    config = _resolve_steps(job)
    if not plan.spec.gradients_cross_stages and config.clip_grad_norm is not None:
        raise UserError(f"--clip-grad-norm clips the whole model's gradient, which local learning never forms; "
                        f"drop it with --method {plan.method.value}")
    if not plan.spec.gradients_cross_stages:
        _check_heads(plan, graph)
    resumed = find_resume(replace(job, config=config))
    drained = drains(replace(job, config=config), 0 if resumed is None else resumed.step)
    if job.schedule is not None and plan.asynchronous and (config.checkpoint_dir is not None or resumed is not None):
        raise UserError(f"method {plan.method.value} drains its pipeline to checkpoint and to resume, which a given "
                        "schedule cannot be made to do; leave out --schedule, or --checkpoint-dir and --resume")
    schedule = segmented_schedule(plan, config.steps, drained) if job.schedule is None else job.schedule
    check_runnable(schedule, plan)
    if plan.asynchronous:
        check_chunks(schedule, plan, config.steps)
    if config.fault is not None and config.fault.rank >= plan.n_ranks:
        raise UserError(f"fault rank {config.fault.rank} is not one of the plan's {plan.n_ranks} ranks")
    if config.fault is not None and config.fault.kind == "overflow" and plan.precision != "fp16":
        raise UserError("a fault of kind 'overflow' fakes an fp16 gradient overflow; train with precision fp16")
    timed_batch(graph, plan.batch_size, 0, config.seed, config.data)
    job_loss(job)
    if has_eval_set(config.data):
        eval_dataset(config.data, graph)
    if resumed is not None:  # every rank then reads this very checkpoint
        config = replace(config, resume=resumed.folder)
    return replace(job, plan=plan, schedule=schedule, config=config)


def _with_precision(plan: Plan, config: TrainConfig) -> Plan:
    """``plan`` at ``config.precision`` when that is given (it overrides the plan's), checked against the method.

    Raises:
        UserError: fp16 with a method whose stages do not step together (asynchronous, local learning),
            where one agreed overflow check per step has no meaning.
    """
    if config.precision is not None and config.precision != plan.precision:
        plan = replace(plan, precision=config.precision)
    if plan.precision == "fp16" and not (plan.spec.flush and plan.spec.gradients_cross_stages):
        raise UserError(f"fp16 loss scaling skips a step on every stage at once, which method {plan.method.value} "
                        "(its stages step at their own moments) cannot; train it with --precision bf16")
    return plan


def _check_heads(plan: Plan, graph: LayerGraph) -> None:
    """Local learning: every stage but the last has a head that predicts the model's output from the
    stage's (:func:`~pipetrain.graph.aux_heads.check_aux`)."""
    if not isinstance(plan.params, LocalParams):
        raise UserError(f"method {plan.method.value} trains on local losses but its plan has no auxiliary heads; "
                        "re-plan it")
    outputs = graph.output_specs()
    check_aux(graph, plan.params.aux, [outputs[graph.index(s.layers[-1])] for s in plan.stages[:-1]])


def _resolve_steps(job: TrainJob) -> TrainConfig:
    """The job's config with ``epochs`` turned into ``steps``."""
    config, graph = job.config, job.graph
    if config.epochs is None:
        return config
    per_epoch = steps_per_epoch(graph, job.plan.batch_size, config.seed, config.data)
    if per_epoch is None:
        raise UserError(f"data {config.data!r} has no epochs; give steps instead")
    config = replace(config, steps=config.epochs * per_epoch)
    if config.warmup_steps >= config.steps:
        config = replace(config, warmup_steps=0)
    check_lr_schedule(config.lr_schedule, config.lr_warmup_steps, config.steps)
    return config
