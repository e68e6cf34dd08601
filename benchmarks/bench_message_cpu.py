"""What a gloo message costs the two ranks' CPUs, and what that cost is worth to the mlp's ranking.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_message_cpu.py --out benchmarks/results/message-cpu

The simulator runs a message on its link, overlapped with compute (:mod:`pipetrain.simulate.events`):
a SEND costs its rank nothing. On a machine whose ranks share the cores, gloo's I/O threads copy every
byte of a message through the loopback socket on the same cores the ranks compute on. Issue 17's Core
run named that as the suspected reason ``auto`` ranked the mlp's interleaved-zb plan (4 chunks per
rank, 28 messages per iteration) 4 % ahead of zbv m=2 (8 messages) where it measured 2.7 % behind.

1. **Cost per message.** Two spawned ranks (gloo, one torch thread each) pass ``--messages`` messages
   of each size, one at a time (``isend``/``irecv`` and wait); each rank records its wall time and its
   *process* CPU time (``time.process_time``: all threads, gloo's included) per message, median of
   ``--repeats`` rounds. A least-squares line ``a + b · bytes`` is fitted to each side's CPU seconds.
2. **What it is worth.** For the mlp's two best settings of the Core run (profile and cluster of
   ``--core``), the messages of one iteration from their schedules and the CPU seconds the fitted
   lines give them, against the predicted iteration: an upper bound on what charging the CPU cost
   to the ranks could move (every message's cost on the critical path of its rank).

Output under ``--out``: ``message_cpu.json`` and ``message_cpu.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.table import Profile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
MLP_BATCH = 128


def _rank(rank: int, port: int, sizes: tuple[int, ...], messages: int, repeats: int, queue: Any) -> None:
    """One rank: per size, per round, wall and process-CPU seconds per message."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    rows = []
    for n in sizes:
        tensor = torch.zeros(n // 4)
        for _ in range(3):  # warm the pair's buffers for this size
            (dist.send if rank == 0 else dist.recv)(tensor, 1 - rank)
        walls, cpus = [], []
        for _ in range(repeats):
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(messages):
                (dist.isend(tensor, 1) if rank == 0 else dist.irecv(tensor, 0)).wait()
            dist.barrier()
            walls.append((time.perf_counter() - wall) / messages)
            cpus.append((time.process_time() - cpu) / messages)
        rows.append((n, statistics.median(walls), statistics.median(cpus)))
    queue.put((rank, rows))
    dist.destroy_process_group()


def measure(sizes: tuple[int, ...], messages: int, repeats: int) -> list[dict[str, float]]:
    """Per size: wall seconds per message and each side's CPU seconds per message."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    procs = [context.Process(target=_rank, args=(r, port, sizes, messages, repeats, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    rows = dict(queue.get() for _ in procs)
    for proc in procs:
        proc.join()
    return [{"bytes": n, "wall_s": wall, "send_cpu_s": send_cpu, "recv_cpu_s": recv_cpu}
            for (n, wall, send_cpu), (_, _, recv_cpu) in zip(rows[0], rows[1], strict=True)]


def fit(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    """``(a, b)`` of ``cpu = a + b · bytes``, least squares."""
    n = np.array([r["bytes"] for r in rows])
    t = np.array([r[key] for r in rows])
    slope, intercept = np.polyfit(n, t, 1)
    return float(intercept), float(slope)


def messages_of(plan: Plan, cost: CostModel) -> list[int]:
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


def worth(core: Path, send: tuple[float, float], recv: tuple[float, float]) -> list[dict[str, float | str]]:
    """The mlp's two settings: messages, their CPU seconds by the fitted lines, the predicted iteration."""
    graph = build_model("mlp")
    profile, cluster = Profile.load(core / "profile_mlp.json"), Cluster.load(core / "cluster_mlp.json")
    cost = CostModel(profile, cluster)
    out: list[dict[str, float | str]] = []
    for label, method, chunks in (("interleaved-zb v=4 m=2", Method.INTERLEAVED_ZB, 4), ("zbv m=2", Method.ZBV, 2)):
        plan = build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=2, chunks=chunks, batch_size=MLP_BATCH,
                                      n_micro=2, method=method)
        sizes = messages_of(plan, cost)
        cpu = sum(send[0] + send[1] * n + recv[0] + recv[1] * n for n in sizes)
        predicted = api.predict(plan, profile, cluster)[1].iteration_s
        out.append({"setting": label, "messages": len(sizes), "bytes": float(sum(sizes)), "cpu_s": cpu,
                    "predicted_s": predicted, "cpu_share": cpu / predicted})
    return out


def report(rows: list[dict[str, float]], lines: dict[str, tuple[float, float]],
           settings: list[dict[str, float | str]]) -> str:
    """The markdown tables of ``message_cpu.md``."""
    text = ["| bytes | wall µs | sender CPU µs | receiver CPU µs |", "|---:|---:|---:|---:|"]
    text += [f"| {int(r['bytes'])} | {r['wall_s'] * 1e6:.1f} | {r['send_cpu_s'] * 1e6:.1f} | "
             f"{r['recv_cpu_s'] * 1e6:.1f} |" for r in rows]
    text += ["", "Fitted CPU seconds per message: " + "; ".join(
        f"{side} {a * 1e6:.1f} µs + {b * 1e9:.3f} ns/byte" for side, (a, b) in lines.items()), ""]
    text += ["| mlp setting | messages | MiB | CPU ms (both sides) | predicted ms | share |",
             "|---|---:|---:|---:|---:|---:|"]
    text += [f"| {s['setting']} | {s['messages']} | {float(s['bytes']) / 2**20:.1f} | {float(s['cpu_s']) * 1e3:.2f} | "
             f"{float(s['predicted_s']) * 1e3:.1f} | {float(s['cpu_share']) * 100:.2f} % |" for s in settings]
    return "\n".join(text) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/message-cpu"))
    parser.add_argument("--core", type=Path, default=Path("benchmarks/results/core-issue17-final"),
                        help="a Core run's directory: its profile_mlp.json and cluster_mlp.json")
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = measure(SIZES, args.messages, args.repeats)
    lines = {"sender": fit(rows, "send_cpu_s"), "receiver": fit(rows, "recv_cpu_s")}
    settings = worth(args.core, lines["sender"], lines["receiver"])
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "message_cpu.json", json.dumps(
        {"machine": platform.platform(), "torch": torch.__version__, "messages": args.messages,
         "repeats": args.repeats, "rows": rows, "fits": lines, "settings": settings}, indent=2))
    text = report(rows, lines, settings)
    write_atomic(args.out / "message_cpu.md", text)
    print(text)


if __name__ == "__main__":
    main()
