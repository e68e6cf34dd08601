"""The real-models benchmark's baselines on spawned ranks: torch's ``pipeline()`` and one process.

* **torch**: ``torch.distributed.pipelining.pipeline()`` on the model as it is, split at the given
  blocks, stages from ``Pipe.build_stage``, run by one of torch's schedules with
  ``scale_grads=False`` and ``return_outputs=False``; or, where torch cannot run its own split,
  ``PipelineStage`` s built by hand from the same blocks (pipetrain's captured layers). torch's
  ``pipeline()`` copies a tied weight into every stage that uses it and never syncs the copies'
  gradients (a TODO in its ``_IR.py``): that trains an untied model, so each rank sums the tied
  copies' gradients (one all-reduce per step, as pipetrain does) to train the same model.
* **single**: the plain model in this process.

Every rank runs one thread and keeps freed memory in its heap (pipetrain's default allocator
setting, :mod:`pipetrain.allocator`), so the comparison is of schedules, not of ``malloc``. A
step: the schedule step, the tied-gradient sum and the SGD step, timed after a barrier.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from common.real_models import LR, MODELS, SEED, RealModel
from common.torch_baseline import N_RANKS, timed_steps
from common.torch_schedules import schedule_of
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.packing import pack

__all__ = ["TorchJob", "pipeline_failure", "single_rank", "tied_groups", "torch_rank"]

Tied = tuple[tuple[str, ...], torch.Size]
Named = list[tuple[str, nn.Parameter]]


@dataclass(frozen=True)
class TorchJob:
    """One torch run (picklable). ``splits``: the block starting each stage after the first;
    ``schedule`` empty: the plain model in one process. ``captured``: stages built by hand from
    pipetrain's captured layers (the same blocks), where torch's ``pipeline()`` split cannot run."""

    model: str
    steps: int
    schedule: str = ""
    n_micro: int = 1
    splits: tuple[str, ...] = ()
    captured: LayerGraph | None = None


def _rank_setup() -> None:
    from pipetrain.allocator import keep_freed_memory

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    keep_freed_memory()
    torch.manual_seed(SEED)


def single_rank(rank: int, port: int, job: TorchJob) -> list[float]:
    """The plain model trained in this process: its step times."""
    _rank_setup()
    model = MODELS[job.model]
    module = model.build().train()
    optimizer = torch.optim.SGD(module.parameters(), lr=LR)
    times = []
    for step in range(job.steps):
        inputs, targets = model.batch_at(step)
        args, kwargs = model.call(inputs)
        t0 = time.perf_counter()
        torch.autograd.backward(model.loss(module(*args, **kwargs), targets))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def tied_groups(module: nn.Module) -> list[Tied]:
    """The names that share one parameter in ``module``, and its shape (GPT-2: ``transformer.wte.weight``
    and ``lm_head.weight``)."""
    names: dict[int, tuple[list[str], torch.Size]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), ([], p.shape))[0].append(name)
    return [(tuple(group), shape) for group, shape in names.values() if len(group) > 1]


def _sum_tied(named: Sequence[tuple[str, nn.Parameter]], groups: Sequence[Tied]) -> None:
    """Give every copy of each tied parameter (by the model's names) the sum of all copies'
    gradients, over all ranks (a rank without a copy adds zeros)."""
    import torch.distributed as dist

    for group, shape in groups:
        copies = [p for name, p in named if name in group]
        total = torch.zeros(shape)
        for p in copies:
            if p.grad is not None:
                total += p.grad
        dist.all_reduce(total)
        for p in copies:
            p.grad = total.clone()


def torch_rank(rank: int, port: int, job: TorchJob) -> list[float]:
    """This rank's stages of torch's ``pipeline()`` split, run by ``job.schedule``: its step times."""
    import torch.distributed as dist
    import torch.distributed.pipelining as pipelining

    _rank_setup()
    model, spec = MODELS[job.model], schedule_of(job.schedule)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=N_RANKS,
                            timeout=timedelta(seconds=600))
    try:
        module = model.build().train()
        groups = tied_groups(module)
        mine, n_stages = spec.rank_stages(rank, N_RANKS), spec.n_stages(N_RANKS)
        stages, named = (_captured_stages(job, mine, n_stages) if job.captured is not None
                         else _pipeline_stages(module, job, mine, n_stages))
        cls = getattr(pipelining, spec.class_name)
        schedule = cls(stages if spec.multi else stages[0], job.n_micro, loss_fn=model.loss, scale_grads=False)
        optimizer = torch.optim.SGD([p for _, p in named], lr=LR)
        first, last = 0 in mine, n_stages - 1 in mine

        def batch_at(step: int) -> tuple[tuple[Any, ...], dict[str, Any], torch.Tensor | None]:
            inputs, targets = model.batch_at(step)
            args, kwargs = ((_packed(model, inputs),), {}) if job.captured is not None else model.call(inputs)
            return (*((args, kwargs) if first else ((), {})), targets if last else None)

        def train_step(batch: tuple[tuple[Any, ...], dict[str, Any], torch.Tensor | None]) -> None:
            args, kwargs, target = batch
            schedule.step(*args, target=target, return_outputs=False, **kwargs)
            _sum_tied(named, groups)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return timed_steps(job.steps, batch_at, train_step)
    finally:
        dist.destroy_process_group()


def _packed(model: RealModel, inputs: torch.Tensor) -> torch.Tensor:
    """The captured graph's one input: the keyword inputs packed (:mod:`pipetrain.graph.packing`), or the tensor."""
    return pack([inputs]) if model.keyword else inputs


def _pipeline_stages(module: nn.Module, job: TorchJob, mine: Sequence[int], n_stages: int) -> tuple[list[Any], Named]:
    """This rank's ``PipelineStage`` s of torch's ``pipeline()`` split, and their parameters by the model's names."""
    import torch.distributed.pipelining as pipelining

    model = MODELS[job.model]
    args, kwargs = model.call(model.batch_at(0)[0][: model.batch // job.n_micro])
    pipe = pipelining.pipeline(module, mb_args=args, mb_kwargs=kwargs,
                               split_spec={name: pipelining.SplitPoint.BEGINNING for name in job.splits})
    assert pipe.num_stages == n_stages, f"pipeline() made {pipe.num_stages} stages, not {n_stages}"
    stages = [pipe.build_stage(s, torch.device("cpu")) for s in mine]
    return stages, [(name, p) for stage in stages for name, p in stage.submod.named_parameters()]


def _captured_stages(job: TorchJob, mine: Sequence[int], n_stages: int) -> tuple[list[Any], Named]:
    """This rank's ``PipelineStage`` s built by hand from pipetrain's captured layers, cut at ``job.splits``."""
    import torch.distributed.pipelining as pipelining

    graph = job.captured
    assert graph is not None
    starts = [0, *(graph.names.index(name) for name in job.splits), len(graph)]
    stages, named = [], []
    for s in mine:
        layers = range(starts[s], starts[s + 1])
        chunk = nn.Sequential(*(graph.build_layer(i) for i in layers))
        stages.append(pipelining.PipelineStage(chunk, s, n_stages, torch.device("cpu")))
        named += [(graph.layers[i].qualified(name), p) for i, layer in zip(layers, chunk, strict=True)
                  for name, p in layer.named_parameters()]
    return stages, named


def pipeline_failure(build: Callable[[], nn.Module], model: RealModel, split: str) -> str | None:
    """What torch's ``pipeline()`` says about ``build()`` split at ``split``, or None when it splits it."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    args, kwargs = model.call(model.batch_at(0)[0][:2])
    try:
        pipeline(build(), mb_args=args, mb_kwargs=kwargs, split_spec={split: SplitPoint.BEGINNING})
    except Exception as e:  # the failure is the result
        cause = e.__cause__ or e
        return f"{type(e).__name__}: {str(e).splitlines()[0]} (cause: {str(cause).splitlines()[0]})"
    return None
