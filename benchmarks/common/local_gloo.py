"""message-cpu's measurements: gloo messages between two spawned ranks, and the mlp's messages per iteration.

Kept apart from the benchmark script because the ranks are spawned processes: their entry point
must live in an importable module.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.table import Profile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

__all__ = ["MLP_BATCH", "measure", "mlp_messages"]

MLP_BATCH = 128


def _rank(rank: int, port: int, sizes: tuple[int, ...], messages: int, queue: Any) -> None:
    """One rank: per size, wall and process-CPU seconds per message."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    rows = []
    for n in sizes:
        tensor = torch.zeros(n // 4)
        for _ in range(3):  # warm the pair's buffers for this size
            (dist.send if rank == 0 else dist.recv)(tensor, 1 - rank)
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(messages):
            (dist.isend(tensor, 1) if rank == 0 else dist.irecv(tensor, 0)).wait()
        dist.barrier()
        rows.append((n, (time.perf_counter() - wall) / messages, (time.process_time() - cpu) / messages))
    queue.put((rank, rows))
    dist.destroy_process_group()


def measure(sizes: tuple[int, ...], messages: int) -> list[dict[str, float]]:
    """Per size: wall seconds per message and each side's CPU seconds per message."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    procs = [context.Process(target=_rank, args=(r, port, sizes, messages, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    rows = dict(queue.get() for _ in procs)
    for proc in procs:
        proc.join()
    return [{"bytes": n, "wall_s": wall, "send_cpu_s": send_cpu, "recv_cpu_s": recv_cpu}
            for (n, wall, send_cpu), (_, _, recv_cpu) in zip(rows[0], rows[1], strict=True)]


def _message_bytes(plan: Plan, cost: CostModel) -> list[int]:
    """The bytes of every message one iteration of the plan sends (its SEND actions)."""
    sizes = []
    for _, program in build_schedule(plan):
        for action in program:
            layers = plan.stages[action.stage].layers
            if action.kind is ActionKind.SEND_F:
                sizes.append(cost.output_bytes(layers, action.size))
            elif action.kind is ActionKind.SEND_B:
                sizes.append(cost.input_bytes(layers, action.size))
    return sizes


def mlp_messages(core: Path) -> list[dict[str, float | str]]:
    """The mlp's two best settings of a Core run: messages per iteration, their bytes, the predicted iteration."""
    if not (core / "profile_mlp.json").exists():
        raise SystemExit(f"{core} has no profile_mlp.json: give --core a Core run's folder "
                         "(e.g. benchmarks/results/core-issue17-final)")
    graph = build_model("mlp")
    profile, cluster = Profile.load(core / "profile_mlp.json"), Cluster.load(core / "cluster_mlp.json")
    cost = CostModel(profile, cluster)
    out: list[dict[str, float | str]] = []
    for label, method, chunks in (("interleaved-zb v=4 m=2", Method.INTERLEAVED_ZB, 4), ("zbv m=2", Method.ZBV, 2)):
        plan = build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=2, chunks=chunks, batch_size=MLP_BATCH,
                                      n_micro=2, method=method)
        sizes = _message_bytes(plan, cost)
        out.append({"setting": label, "messages": len(sizes), "bytes": float(sum(sizes)),
                    "predicted_s": api.predict(plan, profile, cluster)[1].iteration_s})
    return out
