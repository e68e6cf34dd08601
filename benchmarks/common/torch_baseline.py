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
median timed step (warm-up steps excluded). A run that does not finish within ``timeout_s``
(torch's schedules can hang) is killed, with its processes, and reported as ``"timeout"``; one that
raises is reported with its error.

The Core benchmark runs it alone too: ``benchmarks/bench_core.py --kinds torch --models gpt-tiny``.
"""

from __future__ import annotations

import queue
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from common.measured import WARMUP_STEPS
from common.torch_schedules import TorchSchedule, chunk_layers, schedule_of
from common.torch_schedules import stage_layers as _stage_layers
from pipetrain.graph.layer_graph import LayerGraph

Schedule = str  # a key of torch_schedules.SCHEDULES

__all__ = ["RankRun", "Schedule", "TorchRun", "free_port", "launch", "launch_timed", "one_step_grads",
           "run_torch_pipelining", "stage_layers", "torch_pipelining_samples_per_s"]

N_RANKS = 2


@dataclass(frozen=True)
class TorchRun:
    """The outcome of one torch-pipelining run.

    Attributes:
        status: ``"ok"``, ``"timeout"`` (killed after ``timeout_s``) or ``"error: ..."``.
        samples_per_s: batch / median timed step time; None unless ``status == "ok"``.
        step_times_s: every step's time (slowest rank), warm-up included.
        wall_s: wall time of the whole run, process start-up included.
    """

    status: str
    samples_per_s: float | None = None
    step_times_s: tuple[float, ...] = field(default=())
    wall_s: float = 0.0

    @property
    def iteration_s(self) -> float | None:
        """Median timed step time (s)."""
        timed = self.step_times_s[WARMUP_STEPS:]
        return statistics.median(timed) if timed else None


@dataclass(frozen=True)
class RankJob:
    """What every rank of one run does (picklable: it crosses to the spawned processes).

    Attributes:
        model: zoo name; ``overrides`` change its sizes (``build_model``).
        chunks: the layers of each pipeline stage, by stage index.
        grads: run one step and return the gradients instead of timing ``steps`` steps.
    """

    model: str
    batch: int
    n_micro: int
    schedule: str
    steps: int
    lr: float
    chunks: tuple[range, ...]
    overrides: tuple[tuple[str, float], ...] = ()
    grads: bool = False


def stage_layers(n_layers: int, stage: int, n_stages: int = N_RANKS) -> range:
    """Layer indices of ``stage`` in the equal-layer split (the first stages get any extra layer)."""
    return _stage_layers(n_layers, stage, n_stages)


def _graph(model: str, overrides: dict[str, float]) -> LayerGraph:
    """The zoo model ``model`` with ``overrides`` (sizes) applied."""
    from pipetrain.graph.zoo import build_model

    return build_model(model, **overrides)  # type: ignore[arg-type]  # sizes are ints or floats


RankRun = Callable[[int, int, Any], Any]
"""What each rank of a launch does: ``run(rank, port, job)`` returns its result (step times, gradients);
a module-level function, so that it crosses to the spawned processes."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process group's ``tcp://`` rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank_main(rank: int, port: int, job: Any, results: mp.Queue, run: RankRun) -> None:  # type: ignore[type-arg]
    """One rank: ``run`` ``job``, put ``(rank, "ok", times or gradients)`` on ``results``."""
    try:
        results.put((rank, "ok", run(rank, port, job)))
    except BaseException as e:  # report anything, then let the parent clean up
        first = str(e).splitlines()[0] if str(e) else ""
        results.put((rank, f"error: {type(e).__name__}: {first}", []))


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


def _run_rank(rank: int, port: int, job: RankJob) -> list[float] | dict[str, np.ndarray]:
    """Build this rank's part, then time ``job.steps`` steps (or return one step's gradients)."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import torch.distributed as dist

    from pipetrain.runtime.job.data import make_batch

    spec = schedule_of(job.schedule)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=N_RANKS, timeout=timedelta(seconds=600))
    try:
        graph = _graph(job.model, dict(job.overrides))
        pipe, modules = _build_pipe(rank, job, spec)
        mine = spec.rank_stages(rank, N_RANKS)
        first, last = 0 in mine, spec.n_stages(N_RANKS) - 1 in mine
        optimizer = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=job.lr)
        times = []
        for step in range(1 if job.grads else job.steps):
            inputs, targets = make_batch(graph, job.batch, step, 0, "synthetic")
            args = (inputs,) if first else ()
            dist.barrier()
            t0 = time.perf_counter()
            pipe.step(*args, target=targets if last else None)
            if job.grads:
                return _gradients(mine, modules, job.chunks)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        dist.barrier()
        return times
    finally:
        dist.destroy_process_group()


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


def _stop(procs: Sequence[BaseProcess]) -> None:
    """Kill whatever is still alive and reap every process (no orphans)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def layer_weights(model: str, overrides: dict[str, float] | None = None) -> list[float]:
    """Parameters per layer of a zoo model (built on the meta device: free), the chunks' balance."""
    graph = _graph(model, overrides or {})
    return [float(sum(p.numel() for p in graph.build_layer(i, "meta").parameters())) for i in range(len(graph))]


def launch(job: Any, timeout_s: float, run: RankRun | None = None,
           n_ranks: int = N_RANKS) -> tuple[str, dict[int, Any], float]:
    """Run ``job`` on ``n_ranks`` spawned ranks, each calling ``run`` (default: this module's torch
    pipelining rank, for a :class:`RankJob`): (status, each rank's result, wall seconds)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    start = time.perf_counter()
    procs = [ctx.Process(target=_rank_main, args=(r, port, job, results, run or _run_rank), daemon=True)
             for r in range(n_ranks)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    status = "ok"
    try:
        while len(got) < n_ranks:
            left = timeout_s - (time.perf_counter() - start)
            if left <= 0:
                status = "timeout"
                break
            try:
                rank, rank_status, out = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    status = "error: a rank died"
                    break
                continue
            if rank_status != "ok":
                status = f"rank {rank} {rank_status}"
                break
            got[rank] = out
    finally:
        _stop(procs)
        results.close()
    return status, got, time.perf_counter() - start


def _job(model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, lr: float,
         overrides: dict[str, float] | None = None, grads: bool = False) -> RankJob:
    spec = schedule_of(schedule)
    chunks = tuple(chunk_layers(layer_weights(model, overrides), spec, N_RANKS))
    return RankJob(model, batch, n_micro, schedule, steps, lr, chunks, tuple(sorted((overrides or {}).items())),
                   grads)


def run_torch_pipelining(
    model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, timeout_s: float, lr: float = 0.01
) -> TorchRun:
    """Run torch pipelining once; never hangs longer than ``timeout_s`` (plus start-up of 10 s at most).

    Args:
        model: a zoo name (``"mlp"``, ``"gpt-tiny"``).
        batch: samples per mini-batch.
        n_micro: equal micro-batches per mini-batch.
        schedule: a key of :data:`torch_schedules.SCHEDULES` (``"gpipe"``, ``"1f1b"``, ``"zbv"``, ...).
        steps: optimizer steps, the first ``WARMUP_STEPS`` untimed; must exceed ``WARMUP_STEPS``.
        timeout_s: wall-clock limit for the whole run.
    """
    if steps <= WARMUP_STEPS:
        raise ValueError(f"steps must exceed the {WARMUP_STEPS} warm-up steps, got {steps}")
    return launch_timed(_job(model, batch, n_micro, schedule, steps, lr), batch, timeout_s)


def launch_timed(job: Any, batch: int, timeout_s: float, run: RankRun | None = None,
                 n_ranks: int = N_RANKS) -> TorchRun:
    """:func:`launch` a job whose ranks return their step times; a step's time is the slowest rank's."""
    status, got, wall = launch(job, timeout_s, run, n_ranks)
    if status != "ok":
        return TorchRun(status, wall_s=wall)
    step_times = tuple(max(per_step) for per_step in zip(*got.values(), strict=True))
    timed = step_times[WARMUP_STEPS:]
    return TorchRun("ok", batch / statistics.median(timed), step_times, wall)


def one_step_grads(
    model: str, batch: int, n_micro: int, schedule: Schedule, timeout_s: float = 60.0,
    overrides: dict[str, float] | None = None,
) -> tuple[str, dict[str, np.ndarray]]:
    """One step of ``schedule`` (step 0's synthetic batch): status and every parameter's gradient,
    named ``"<layer index>.<parameter name>"`` (the ranks' gradients together)."""
    status, got, _ = launch(_job(model, batch, n_micro, schedule, 1, 0.0, overrides, grads=True), timeout_s)
    grads: dict[str, np.ndarray] = {}
    for part in got.values():
        grads.update(part)
    return status, grads


def torch_pipelining_samples_per_s(
    model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, timeout_s: float
) -> float | None:
    """Median samples/s of torch pipelining on 2 local ranks, or None if it hung, timed out or failed."""
    return run_torch_pipelining(model, batch, n_micro, schedule, steps, timeout_s).samples_per_s
