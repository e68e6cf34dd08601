"""A job's checkpoints on one rank: when to save, what each rank writes, how a run resumes.

Saving is collective: every rank of the launch writes its shard (:func:`stage_state`, only the
first rank of a stage writes the stage's tensors), then the shards' descriptions go to rank 0, which
writes the manifest last (:func:`~pipetrain.runtime.job.checkpoint.write_manifest`). Resuming: every rank
reads the newest whole checkpoint's manifest and the shards holding its layers; with the plan's
layout unchanged it also takes back its RNG state, so the resumed run equals an unbroken one bit
for bit; with another layout the tensors are resharded by name and the RNG states start afresh.

An asynchronous run (``pipedream``, ``2bw``) drains its pipeline before each checkpoint step and
before the step it resumes at (:func:`drains`, :mod:`pipetrain.schedule.segments`), so a checkpoint
holds no micro-batch in flight and is saved, resumed, resharded and exported as a synchronous one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph
from pipetrain.graph.ties import saved_name
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.context import RankContext
from pipetrain.runtime.interp.rank_setup import HEAD_PREFIX
from pipetrain.runtime.job.checkpoint import (
    MANIFEST,
    Checkpoint,
    State,
    newest_checkpoint,
    open_checkpoint,
    plan_layout,
    restore_stage,
    stage_state,
    step_folder,
    write_manifest,
    write_shard,
)
from pipetrain.runtime.job.config import TrainJob
from pipetrain.runtime.job.loss_scale import LossScaler
from pipetrain.schedule.segments import drain_points

__all__ = ["LOSS_SCALE", "checkpoint_due", "drains", "find_resume", "manifest_fields", "resume", "resume_checkpoint",
           "resume_step", "save"]

log = logging.getLogger(__name__)


def checkpoint_due(job: TrainJob, done: int) -> bool:
    """Whether to checkpoint after ``done`` steps: after the last, and every ``checkpoint_every``."""
    config = job.config
    if config.checkpoint_dir is None:
        return False
    return done == config.steps or (config.checkpoint_every > 0 and done % config.checkpoint_every == 0)


def drains(job: TrainJob, first_step: int) -> tuple[int, ...]:
    """The steps before which an asynchronous run of ``job`` resumed at ``first_step`` (0: afresh) drains
    its pipeline: its checkpoint steps before the last (:func:`checkpoint_due`) and ``first_step``;
    none for a synchronous plan, which flushes every step."""
    config = job.config
    if not job.plan.asynchronous:
        return ()
    every = config.checkpoint_every if config.checkpoint_dir is not None else 0
    return drain_points(config.steps, every, first_step)


def find_resume(job: TrainJob) -> Checkpoint | None:
    """The checkpoint ``config.resume`` names, checked against the job before any rank starts.

    Raises:
        UserError: no whole checkpoint there, one of another model, or one already at ``steps``.
    """
    folder = job.config.resume
    return None if folder is None else resume_checkpoint(folder, job.graph, job.config.steps)


def resume_checkpoint(folder: Path, graph: LayerGraph, steps: int | None) -> Checkpoint:
    """The newest whole checkpoint in ``folder`` to resume ``graph``'s training from, before ``steps``
    (None: not known yet, the run counts epochs); the CLI calls it before any profiling too.

    Raises:
        UserError: no whole checkpoint there, one of another model, or one already at ``steps``.
    """
    checkpoint = newest_checkpoint(folder)
    if checkpoint is None:
        raise UserError(f"--resume {folder}: no whole checkpoint there (a folder with {folder}/step-*/manifest.json); "
                        "check the path, or train without --resume")
    checkpoint.check_model(graph)
    if steps is not None and checkpoint.step >= steps:
        raise UserError(f"--resume {folder}: its newest checkpoint is at step {checkpoint.step}, not before the "
                        f"{steps} steps asked for; ask for more steps (or epochs)")
    return checkpoint


def save(job: TrainJob, ctxs: Sequence[RankContext], rank: int, world_size: int, done: int,
         fields: dict[str, Any] | None = None) -> Path:
    """Every rank: write this rank's shard of the checkpoint after ``done`` steps (every stage it runs:
    one, or several under method interleaved); rank 0 then writes the manifest (with ``fields``,
    :func:`manifest_fields` of the job, computed once per job by the caller; None computes them now).
    Returns the checkpoint's folder."""
    config, plan = job.config, job.plan
    assert config.checkpoint_dir is not None
    entry = None
    if ctxs:
        state: State = {}
        for ctx in ctxs:
            owner = rank == plan.stages[ctx.stage].ranks[0]
            module, layers = _with_head(ctx, job.graph.layers_named(plan.stages[ctx.stage].layers))
            for part, values in stage_state(module, layers, ctx.optimizer, owner=owner, ties=job.graph.ties).items():
                state.setdefault(part, {}).update(values)
        entry = write_shard(config.checkpoint_dir, done, rank, state)
    entries: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(entry, entries, dst=0)
    if entries is not None:
        fields = {**(fields or manifest_fields(job)), "samples_seen": done * plan.batch_size}
        write_manifest(config.checkpoint_dir, done, [e for e in entries if e is not None], fields, config.keep)
    return step_folder(config.checkpoint_dir, done)


def manifest_fields(job: TrainJob) -> dict[str, Any]:
    """What every checkpoint of ``job`` records about the run (the model, the plan's layout, ...)."""
    graph, plan, config = job.graph, job.plan, job.config
    return {"model": graph.name, "fingerprint": graph.fingerprint(),
            "layers": list(graph.names), "layout": plan_layout(plan), "batch_size": plan.batch_size,
            "optimizer": config.optimizer, "data": config.data, "seed": config.seed,
            "state_keys": _state_keys(job), "heads": [f"{HEAD_PREFIX}{k}" for k in _head_stages(plan)],
            "ties": [list(tie.names) for tie in graph.ties]}


def _head_stages(plan: Plan) -> range:
    """The stages with an auxiliary head: under local losses (gradients that stay in their stage,
    local learning) every stage but the last; else none."""
    return range(0 if plan.spec.gradients_cross_stages else plan.n_stages - 1)


def _with_head(ctx: RankContext, layers: tuple[Layer, ...], saved: bool = True) -> tuple[nn.Module, tuple[Layer, ...]]:
    """The stage as checkpoints hold it: its layers, then its auxiliary head (local learning) as one more
    layer named ``aux{stage}``, so the head's tensors are ``aux{stage}.<name>`` and its optimizer state
    follows the stage's (the optimizer's parameter order); the stage alone when it has no head or the
    checkpoint has none (``saved`` False: resuming a run of another method)."""
    head = ctx.kernel.head
    if head is None or not saved:
        return ctx.module, layers
    return nn.Sequential(*ctx.module.children(), head), (*layers, Layer(f"{HEAD_PREFIX}{ctx.stage}", nn.Identity))


def _state_keys(job: TrainJob) -> list[str]:
    """The model's state names in layer order (the order an export writes them in)."""
    keys = []
    for i, layer in enumerate(job.graph.layers):
        keys += [layer.qualified(k) for k in job.graph.build_layer(i, device="meta").state_dict()]
    return keys


def resume(job: TrainJob, ctxs: Sequence[RankContext], rank: int) -> int:
    """Load this rank's stages (one, or several under method interleaved) from the checkpoint folder
    ``config.resume`` names (the one :func:`find_resume` chose before launch); returns its step (0 when
    not resuming)."""
    checkpoint = _resumed(job)
    if checkpoint is None:
        return 0
    same = checkpoint.manifest.get("layout") == plan_layout(job.plan)
    if not same and rank == 0:
        log.warning("resuming %s with another plan layout: tensors resharded by name, RNG states start afresh",
                    checkpoint.folder)
    other_optimizer = checkpoint.manifest.get("optimizer") != job.config.optimizer
    if ctxs and other_optimizer and rank == 0:
        log.warning("the checkpoint's optimizer is %s: its state is not restored", checkpoint.manifest.get("optimizer"))
    for ctx in ctxs:
        saved_heads = f"{HEAD_PREFIX}{ctx.stage}" in checkpoint.manifest.get("heads", [])
        module, layers = _with_head(ctx, job.graph.layers_named(job.plan.stages[ctx.stage].layers), saved_heads)
        children = zip(layers, module.children(), strict=True)
        keys = [saved_name(layer.qualified(k), job.graph.ties) for layer, child in children for k in child.state_dict()]
        state = checkpoint.load(keys, rank=rank if same else None)
        if other_optimizer:
            state["optimizer"] = {}
        restore_stage(state, module, layers, ctx.optimizer, job.graph.ties)
    return checkpoint.step


LOSS_SCALE = "loss_scale"
"""The manifest's field holding an fp16 run's loss scaler
(:meth:`~pipetrain.runtime.job.loss_scale.LossScaler.state_dict`)."""


def resume_loss_scale(job: TrainJob, scaler: LossScaler) -> None:
    """Load an fp16 run's loss scaler from the checkpoint it resumes; one written without it (by a run
    at another precision) leaves the scaler at its start."""
    checkpoint = _resumed(job)
    state = checkpoint.manifest.get(LOSS_SCALE) if checkpoint is not None else None
    if state is not None:
        scaler.load_state_dict(state)


def resume_step(job: TrainJob) -> int:
    """The step the run resumes at, before any stage is built (0 when not resuming)."""
    checkpoint = _resumed(job)
    return 0 if checkpoint is None else checkpoint.step


def _resumed(job: TrainJob) -> Checkpoint | None:
    """The checkpoint ``config.resume`` names (the folder :func:`find_resume` chose before launch), or None."""
    folder = job.config.resume
    if folder is None:
        return None
    return open_checkpoint(folder) if (folder / MANIFEST).is_file() else find_resume(job)
