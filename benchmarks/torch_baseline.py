"""The baseline: ``torch.distributed.pipelining`` on two local processes, same maths as pipetrain.

Each run spawns two rank processes (gloo on 127.0.0.1, one thread each). Rank ``k`` builds the
layers of stage ``k`` of pipetrain's two-stage equal-layer split (``[0, L/2)`` and ``[L/2, L)``)
from the zoo graph, wraps them in a ``PipelineStage`` built by hand (no tracer), and runs
``ScheduleGPipe`` or ``Schedule1F1B`` with ``scale_grads=False`` and the loss
``loss_sum(kind, output, target) / batch``, so the gradients are those of single-process training
(and of pipetrain) whatever the micro-batching. SGD, synthetic data from pipetrain's
``make_batch`` (generated before the step's clock starts).

Timing mirrors pipetrain's runtime: a barrier, then each rank times its step (schedule step,
optimizer step, zero_grad); a step's time is the slower rank's; samples/s is the batch over the
median timed step (warm-up steps excluded). A run that does not finish within ``timeout_s``
(torch's schedules can hang) is killed, with its processes, and reported as ``None``.

    .venv/bin/python benchmarks/torch_baseline.py --model mlp --batch 128 --micro 4 --schedule gpipe
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Literal

import torch
import torch.multiprocessing as mp

Schedule = Literal["gpipe", "1f1b"]

__all__ = ["Schedule", "TorchRun", "run_torch_pipelining", "stage_layers", "torch_pipelining_samples_per_s"]

WARMUP_STEPS = 2
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


def stage_layers(n_layers: int, stage: int, n_stages: int = N_RANKS) -> range:
    """Layer indices of ``stage`` in the equal-layer split (the first stages get any extra layer)."""
    q, r = divmod(n_layers, n_stages)
    first = stage * q + min(stage, r)
    return range(first, first + q + (1 if stage < r else 0))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank_main(
    rank: int, port: int, model: str, batch: int, n_micro: int, schedule: Schedule, steps: int,
    lr: float, results: mp.Queue,  # type: ignore[type-arg]
) -> None:
    """One rank: build its stage, run ``steps`` steps, put ``(rank, "ok", times)`` on ``results``."""
    try:
        times = _train_rank(rank, port, model, batch, n_micro, schedule, steps, lr)
        results.put((rank, "ok", times))
    except BaseException as e:  # report anything, then let the parent clean up
        results.put((rank, f"error: {type(e).__name__}: {e}", []))


def _train_rank(
    rank: int, port: int, model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, lr: float
) -> list[float]:
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from pipetrain.graph.layer_graph import loss_sum
    from pipetrain.graph.zoo import build_model
    from pipetrain.runtime.data import make_batch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=N_RANKS, timeout=timedelta(seconds=600))
    try:
        graph = build_model(model)
        module = torch.nn.Sequential(*(graph.build_layer(i) for i in stage_layers(len(graph), rank)))
        stage = PipelineStage(module, rank, N_RANKS, torch.device("cpu"))
        kind = graph.loss

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return loss_sum(kind, output, target) / batch

        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        pipe = cls(stage, n_micro, loss_fn=loss_fn, scale_grads=False)
        optimizer = torch.optim.SGD(module.parameters(), lr=lr)
        times = []
        for step in range(steps):
            inputs, targets = make_batch(graph, batch, step, 0, "synthetic")
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                pipe.step(inputs)
            else:
                pipe.step(target=targets)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        dist.barrier()
        return times
    finally:
        dist.destroy_process_group()


def _stop(procs: Sequence[BaseProcess]) -> None:
    """Kill whatever is still alive and reap every process (no orphans)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def run_torch_pipelining(
    model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, timeout_s: float, lr: float = 0.01
) -> TorchRun:
    """Run torch pipelining once; never hangs longer than ``timeout_s`` (plus start-up of 10 s at most).

    Args:
        model: a zoo name (``"mlp"``, ``"gpt-tiny"``).
        batch: samples per mini-batch.
        n_micro: equal micro-batches per mini-batch.
        schedule: ``"gpipe"`` or ``"1f1b"``.
        steps: optimizer steps, the first ``WARMUP_STEPS`` untimed; must exceed ``WARMUP_STEPS``.
        timeout_s: wall-clock limit for the whole run.
    """
    if steps <= WARMUP_STEPS:
        raise ValueError(f"steps must exceed the {WARMUP_STEPS} warm-up steps, got {steps}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    start = time.perf_counter()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, model, batch, n_micro, schedule, steps, lr, results),
                    daemon=True)
        for r in range(N_RANKS)
    ]
    for p in procs:
        p.start()
    got: dict[int, list[float]] = {}
    status = "ok"
    try:
        while len(got) < N_RANKS:
            left = timeout_s - (time.perf_counter() - start)
            if left <= 0:
                status = "timeout"
                break
            try:
                rank, rank_status, times = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    status = "error: a rank died"
                    break
                continue
            if rank_status != "ok":
                status = f"rank {rank} {rank_status}"
                break
            got[rank] = times
    finally:
        _stop(procs)
        results.close()
    wall = time.perf_counter() - start
    if status != "ok":
        return TorchRun(status, wall_s=wall)
    step_times = tuple(max(per_step) for per_step in zip(*got.values(), strict=True))
    timed = step_times[WARMUP_STEPS:]
    return TorchRun("ok", batch / statistics.median(timed), step_times, wall)


def torch_pipelining_samples_per_s(
    model: str, batch: int, n_micro: int, schedule: Schedule, steps: int, timeout_s: float
) -> float | None:
    """Median samples/s of torch pipelining on 2 local ranks, or None if it hung, timed out or failed."""
    return run_torch_pipelining(model, batch, n_micro, schedule, steps, timeout_s).samples_per_s


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--schedule", choices=["gpipe", "1f1b"], nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, pid {os.getpid()}")
    for schedule in args.schedule:
        for m in args.micro:
            run = run_torch_pipelining(args.model, args.batch, m, schedule, args.steps, args.timeout)
            sps = f"{run.samples_per_s:8.1f} samples/s" if run.samples_per_s else "       -          "
            it = f"{run.iteration_s * 1e3:8.1f} ms" if run.iteration_s else ""
            print(f"{args.model:9s} b={args.batch:<4d} {schedule:5s} m={m:<2d} {sps} {it}  "
                  f"[{run.status}; {run.wall_s:.1f} s]", flush=True)


if __name__ == "__main__":
    _main()
