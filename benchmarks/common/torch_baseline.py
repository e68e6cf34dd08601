"""The baseline: ``torch.distributed.pipelining`` on two local processes, same maths as pipetrain.

Each run spawns two rank processes (gloo on 127.0.0.1, one thread each). Rank ``k`` builds the
layers of its stages from the zoo graph, wraps each in a ``PipelineStage`` built by hand (no
tracer), and runs one of torch's schedules (:data:`torch_schedules.SCHEDULES`: GPipe and 1F1B on
pipetrain's two-stage equal-layer split ``[0, L/2)``, ``[L/2, L)``; Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble, ZBVZeroBubble and DualPipeV on two model chunks per rank) with
``scale_grads=False`` and the loss ``loss_sum(kind, output, target) / batch``, so the gradients are
those of single-process training (and of pipetrain) whatever the micro-batching. SGD, synthetic
data from pipetrain's ``make_batch`` (generated before the step's clock starts).

Timing mirrors pipetrain's runtime: a barrier, then each rank times its step (schedule step,
optimizer step, zero_grad); a step's time is the slower rank's; samples/s is the batch over the
median timed step (warm-up steps excluded). The ranks are launched by :mod:`common.core_launch`: a
run that does not finish within ``timeout_s`` (torch's schedules can hang) is killed, with its
processes, and reported as ``"timeout"``; one that raises is reported with its error.

The Core benchmark runs it alone too: ``benchmarks/bench_core.py --kinds torch --models gpt-tiny``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import torch

from common.core_launch import N_RANKS, RankRun, TorchRun, free_port, launch, launch_timed
from common.measured import WARMUP_STEPS
from common.torch_schedules import TorchSchedule, chunk_layers, schedule_of
from common.torch_schedules import stage_layers as _stage_layers
from pipetrain.graph.layer_graph import LayerGraph

Schedule = str  # a key of torch_schedules.SCHEDULES

# the launcher's names are also this module's (other benchmarks import them from here)
__all__ = ["N_RANKS", "WARMUP_STEPS", "RankRun", "Schedule", "TorchRun", "free_port", "launch", "launch_timed",
           "layer_weights", "one_step_grads", "run_torch_pipelining", "stage_layers", "timed_steps",
           "torch_pipelining_samples_per_s"]


@dataclass(frozen=True)
class RankJob:
    """What every rank of one run does (picklable: it crosses to the spawned processes).

    Attributes:
        model: zoo name; ``overrides`` change its sizes (``build_model``).
        chunks: the layers of each pipeline stage, by stage index.
        keep_freed_memory: apply pipetrain's allocator setting in each rank first
            (:func:`pipetrain.allocator.keep_freed_memory`), as pipetrain's runtime does.
    """

    model: str
    batch: int
    n_micro: int
    schedule: str
    steps: int
    lr: float
    chunks: tuple[range, ...]
    overrides: tuple[tuple[str, float], ...] = ()
    keep_freed_memory: bool = False


def stage_layers(n_layers: int, stage: int, n_stages: int = N_RANKS) -> range:
    """Layer indices of ``stage`` in the equal-layer split (the first stages get any extra layer)."""
    return _stage_layers(n_layers, stage, n_stages)


def _graph(model: str, overrides: dict[str, float]) -> LayerGraph:
    """The zoo model ``model`` with ``overrides`` (sizes) applied."""
    from pipetrain.graph.zoo import build_model

    return build_model(model, **overrides)  # type: ignore[arg-type]  # sizes are ints or floats


def _build_pipe(rank: int, job: RankJob, spec: TorchSchedule) -> tuple[Any, list[torch.nn.Sequential]]:
    """This rank's stages (their modules, in stage order) and the schedule that runs them."""
    import torch.distributed.pipelining as pipelining

    from pipetrain.graph.layer_graph import loss_sum
    graph = _graph(job.model, dict(job.overrides))
    n_stages = spec.n_stages(N_RANKS)
    modules, stages = [], []
    for s in spec.rank_stages(rank, N_RANKS):
        module = torch.nn.Sequential(*(graph.build_layer(i) for i in job.chunks[s]))
        modules.append(module)
        stages.append(pipelining.PipelineStage(module, s, n_stages, torch.device("cpu")))
    kind, batch = graph.loss, job.batch

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_sum(kind, output, target) / batch

    cls = getattr(pipelining, spec.class_name)
    pipe = cls(stages if spec.multi else stages[0], job.n_micro, loss_fn=loss_fn, scale_grads=False)
    return pipe, modules


@contextmanager
def _rank_group(rank: int, port: int, keep_freed_memory: bool) -> Iterator[None]:
    """One thread per rank (pipetrain's allocator setting first if asked), in a gloo group of the ranks."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import torch.distributed as dist

    if keep_freed_memory:
        from pipetrain.allocator import keep_freed_memory as keep

        keep()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=N_RANKS, timeout=timedelta(seconds=600))
    try:
        yield
    finally:
        dist.destroy_process_group()


@dataclass
class _Part:
    """This rank's part of one run: its stages' modules, torch's schedule over them, and the batches."""

    pipe: Any
    modules: list[torch.nn.Sequential]
    mine: Sequence[int]
    batch_at: Callable[[int], tuple[tuple[torch.Tensor, ...], torch.Tensor | None]]


def _part(rank: int, job: RankJob) -> _Part:
    from pipetrain.runtime.job.data import make_batch

    spec = schedule_of(job.schedule)
    graph = _graph(job.model, dict(job.overrides))
    pipe, modules = _build_pipe(rank, job, spec)
    mine = spec.rank_stages(rank, N_RANKS)
    first, last = 0 in mine, spec.n_stages(N_RANKS) - 1 in mine

    def batch_at(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        inputs, targets = make_batch(graph, job.batch, step, 0, "synthetic")
        return (inputs,) if first else (), targets if last else None

    return _Part(pipe, modules, mine, batch_at)


def _run_rank(rank: int, port: int, job: RankJob) -> list[float]:
    """Build this rank's part, then time ``job.steps`` steps."""
    with _rank_group(rank, port, job.keep_freed_memory):
        part = _part(rank, job)
        optimizer = torch.optim.SGD([p for m in part.modules for p in m.parameters()], lr=job.lr)

        def train_step(batch: tuple[tuple[torch.Tensor, ...], torch.Tensor | None]) -> None:
            part.pipe.step(*batch[0], target=batch[1])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return timed_steps(job.steps, part.batch_at, train_step)


def _grads_rank(rank: int, port: int, jobs: tuple[RankJob, ...]) -> list[dict[str, np.ndarray]]:
    """One step of each job in turn, in one process group (the ranks start once): each one's gradients."""
    grads = []
    with _rank_group(rank, port, keep_freed_memory=False):
        for job in jobs:
            part = _part(rank, job)
            args, target = part.batch_at(0)
            part.pipe.step(*args, target=target)
            grads.append(_gradients(part.mine, part.modules, job.chunks))
    return grads


Batch = TypeVar("Batch")


def timed_steps(steps: int, batch_at: Callable[[int], Batch], train_step: Callable[[Batch], None]) -> list[float]:
    """This rank's ``steps`` step times: each step's batch made first, then a barrier, then the timed
    ``train_step`` (the schedule's step, the optimizer's step, zero_grad); a last barrier so no rank
    leaves while another still sends."""
    import torch.distributed as dist

    times = []
    for step in range(steps):
        batch = batch_at(step)
        dist.barrier()
        t0 = time.perf_counter()
        train_step(batch)
        times.append(time.perf_counter() - t0)
    dist.barrier()
    return times


def _gradients(mine: Sequence[int], modules: Sequence[torch.nn.Sequential],
               chunks: Sequence[range]) -> dict[str, np.ndarray]:
    """The gradients of this rank's parameters, named ``"<layer index>.<parameter name>"``."""
    out = {}
    for s, module in zip(mine, modules, strict=True):
        for offset, layer in zip(chunks[s], module, strict=True):
            for name, p in layer.named_parameters():
                assert p.grad is not None, f"layer {offset} {name} has no gradient"
                out[f"{offset}.{name}"] = p.grad.detach().numpy().copy()
    return out


def layer_weights(model: str, overrides: dict[str, float] | None = None) -> list[float]:
    """Parameters per layer of a zoo model (built on the meta device: free), the chunks' balance."""
    graph = _graph(model, overrides or {})
    return [float(sum(p.numel() for p in graph.build_layer(i, "meta").parameters())) for i in range(len(graph))]


def _job(model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, lr: float,
         overrides: dict[str, float] | None = None, keep_freed_memory: bool = False) -> RankJob:
    spec = schedule_of(schedule)
    chunks = tuple(chunk_layers(layer_weights(model, overrides), spec, N_RANKS))
    return RankJob(model, batch, n_micro, schedule, steps, lr, chunks, tuple(sorted((overrides or {}).items())),
                   keep_freed_memory)


def run_torch_pipelining(
    model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, timeout_s: float, lr: float = 0.01,
    keep_freed_memory: bool = False,
) -> TorchRun:
    """Run torch pipelining once; never hangs longer than ``timeout_s`` (plus start-up of 10 s at most).

    Args:
        model: a zoo name (``"mlp"``, ``"gpt-tiny"``).
        batch: samples per mini-batch.
        n_micro: equal micro-batches per mini-batch.
        schedule: a key of :data:`torch_schedules.SCHEDULES` (``"gpipe"``, ``"1f1b"``, ``"zbv"``, ...).
        steps: optimizer steps, the first ``WARMUP_STEPS`` untimed; must exceed ``WARMUP_STEPS``.
        timeout_s: wall-clock limit for the whole run.
        keep_freed_memory: run with pipetrain's allocator setting (glibc: no mmap, no trim), so that
            torch and pipetrain compare on the same allocator.
    """
    if steps <= WARMUP_STEPS:
        raise ValueError(f"steps must exceed the {WARMUP_STEPS} warm-up steps, got {steps}")
    job = _job(model, batch, n_micro, schedule, steps, lr, keep_freed_memory=keep_freed_memory)
    return launch_timed(job, batch, timeout_s, _run_rank)


def one_step_grads(
    model: str, batch: int, n_micro: int, schedules: Sequence[Schedule], timeout_s: float = 60.0,
    overrides: dict[str, float] | None = None,
) -> tuple[str, dict[Schedule, dict[str, np.ndarray]]]:
    """One step of each of ``schedules`` (step 0's synthetic batch, fresh weights each), one after another
    in one launch: the status and, per schedule, every parameter's gradient, named
    ``"<layer index>.<parameter name>"`` (the ranks' gradients together)."""
    jobs = tuple(_job(model, batch, n_micro, s, 1, 0.0, overrides) for s in schedules)
    status, got, _ = launch(jobs, timeout_s, _grads_rank)
    grads: dict[Schedule, dict[str, np.ndarray]] = {s: {} for s in schedules}
    for per_rank in got.values():
        for schedule, part in zip(schedules, per_rank, strict=True):
            grads[schedule].update(part)
    return status, grads


def torch_pipelining_samples_per_s(
    model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, timeout_s: float
) -> float | None:
    """Median samples/s of torch pipelining on 2 local ranks, or None if it hung, timed out or failed."""
    return run_torch_pipelining(model, batch, n_micro, schedule, steps, timeout_s).samples_per_s
