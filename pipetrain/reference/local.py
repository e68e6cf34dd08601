"""Local learning in one process: the reference the pipelined method ``local`` must equal.

PPLL (Guo et al. 2024, docs/algorithms.md §6) trains every stage on its own loss, so stage ``k``'s
updates depend only on its own micro-batches and on the activations stage ``k − 1`` produced for
them, each with the weights it held at that moment. Running the stages one after the other on every
mini-batch (stage 0's micro-batches, then stage 1's, …) therefore makes exactly the local updates
of the pipeline, in the same order per stage, however the pipeline overlapped them: this is the
exactness reference of the runtime (DESIGN invariant 6 of the project) and "local learning run
sequentially", the paper's baseline.

Per mini-batch ``(x [B, *in], y [B])`` and stage ``k`` with micro-batches ``[lo, hi)``::

    h[lo:hi] = stage_k(a[lo:hi])                  a = x for k = 0, else stage k-1's outputs, detached
    loss = head_k(h, y[lo:hi], x[lo:hi], ℓ)       the head's prediction of the model's output scored by
                                                  the task's loss ℓ (the job's), mean over the micro-batch;
                                                  ℓ(h, y[lo:hi]) / (hi - lo) on the last stage
    loss.backward(); optimizer_k.step(); zero_grad()

The stages, heads and optimizers are built as the ranks build them (same seeds, same learning-rate
schedule), so the final state_dict matches the runtime's ``TrainResult.state_dict``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.data import EvalResult, Loss
from pipetrain.graph.aux_heads import AuxHead, build_aux_head, check_aux
from pipetrain.graph.dataflow import chain_stage
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import LocalParams
from pipetrain.plan.plan import Plan, ranges
from pipetrain.runtime.interp.rank_setup import HEAD_PREFIX, stage_specs
from pipetrain.runtime.job.checks import check_job
from pipetrain.runtime.job.config import TrainConfig, TrainJob, job_loss
from pipetrain.runtime.job.data import make_batch
from pipetrain.runtime.job.evaluate import eval_dataset, evaluate_module, has_eval_set
from pipetrain.runtime.job.optim import set_lr

__all__ = ["LocalRun", "emulate_local"]


@dataclass(frozen=True)
class LocalRun:
    """What :func:`emulate_local` returns.

    Attributes:
        state_dict: the main network's parameters and buffers by the model's names, and the heads' as
            ``aux{k}.<name>``.
        step_times_s: seconds per mini-batch.
        losses: the last stage's loss per mini-batch (mean over samples).
        evaluation: the main path on the eval set after the last step, or None without an eval set.
    """

    state_dict: dict[str, torch.Tensor]
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    evaluation: EvalResult | None


@dataclass
class _Stage:
    module: nn.Module
    head: AuxHead | None
    optimizer: torch.optim.Optimizer
    sizes: tuple[int, ...]


def _stages(graph: LayerGraph, plan: Plan, config: TrainConfig) -> list[_Stage]:
    own = plan.params
    kind = check_aux(graph, own.aux if isinstance(own, LocalParams) else "")
    stages = []
    for k, stage in enumerate(plan.stages):
        indices = [graph.index(name) for name in stage.layers]
        module = chain_stage(graph, indices)
        last = k == plan.n_stages - 1
        head = None if last else build_aux_head(kind, graph, stage_specs(graph, indices)[1], k, plan.n_stages)
        params = list(module.parameters()) + (list(head.parameters()) if head is not None else [])
        stages.append(_Stage(module, head, config.build_optimizer(params), stage.forward_sizes))
    return stages


def _train_batch(stages: list[_Stage], loss_fn: Loss, x: torch.Tensor, y: torch.Tensor) -> float:
    """One mini-batch, stage after stage; the last stage's mean loss."""
    a, total = x, 0.0
    for stage in stages:
        outputs = []
        for lo, hi in ranges(stage.sizes):
            h = stage.module(a[lo:hi])
            if stage.head is None:
                loss = loss_fn(h, y[lo:hi]) / (hi - lo)
                total += float(loss.detach()) * (hi - lo) / len(y)
            else:
                loss = stage.head(h, y[lo:hi], x[lo:hi], loss_fn)
            torch.autograd.backward(loss)
            stage.optimizer.step()
            stage.optimizer.zero_grad(set_to_none=True)
            outputs.append(h.detach())
        a = torch.cat(outputs)
    return total


def emulate_local(graph: LayerGraph, plan: Plan, config: TrainConfig) -> LocalRun:
    """Train ``plan`` (method ``local``) in this process with ``config`` (see the module docstring),
    on ``config.threads_per_rank`` threads.

    Raises:
        UserError: the plan is not a local-learning plan for ``graph``, or the job is not runnable.
    """
    if plan.spec.gradients_cross_stages:
        raise ValueError(f"emulate_local runs local learning (gradients that stay in their stage), not method "
                         f"{plan.method.value}")
    job = check_job(TrainJob(graph, plan, config))
    config, loss_fn = job.config, job_loss(job)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads_per_rank)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            stages = _stages(graph, plan, config)
            times, losses = [], []
            for step in range(config.steps):
                x, y = make_batch(graph, plan.batch_size, step, config.seed, config.data)
                for stage in stages:
                    set_lr(stage.optimizer, config.lr_at(step))
                start = time.perf_counter()
                losses.append(_train_batch(stages, loss_fn, x, y))
                times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    main = nn.Sequential(*(s.module for s in stages))
    evaluation = None
    if has_eval_set(config.data):
        evaluation = evaluate_module(main, loss_fn, eval_dataset(config.data, graph), plan.batch_size)
    return LocalRun(_state_dict(graph, plan, stages), tuple(times), tuple(losses), evaluation)


def _state_dict(graph: LayerGraph, plan: Plan, stages: list[_Stage]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, (stage_plan, stage) in enumerate(zip(plan.stages, stages, strict=True)):
        for layer, child in zip(graph.layers_named(stage_plan.layers), stage.module.children(), strict=True):
            out.update({layer.qualified(n): v.detach().clone() for n, v in child.state_dict().items()})
        if stage.head is not None:
            out.update({f"{HEAD_PREFIX}{k}.{n}": v.detach().clone() for n, v in stage.head.state_dict().items()})
    return out
