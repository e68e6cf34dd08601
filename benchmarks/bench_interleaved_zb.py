"""interleaved-zb against interleaved, zb1 and 1f1b: simulated at V100 scale, and measured on two local ranks.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved_zb.py --out benchmarks/results/interleaved-zb
    PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved_zb.py --skip-measured --out /tmp/izb  # simulation
    PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved_zb.py --skip-simulated --models gpt-tiny --out /tmp/g

Method ``interleaved-zb`` (:mod:`pipetrain.schedule.interleaved_zb`) is interleaved 1F1B (Narayanan
et al. 2021, §2.2) with each backward split into B and a deferred W (Qi et al. 2024, ZB-H1, §2–3).

**Simulated.** gpt1-14 with ``--blocks`` transformer blocks (default 30), estimated V100 profiles and
links (:func:`pipetrain.api.estimated_cluster`), batch ``--batch`` (default 64), R = 4 and 8 ranks,
m = 8, 16, 32 equal micro-batches: 1f1b and zb1 on R balanced stages; interleaved and interleaved-zb
with v = 2 and 4 chunks (``v·R`` balanced stages, looping placement), and interleaved-zb's
memory-strict variant (``interleaved-zb-strict``, the plan's ``ZeroBubbleParams(strict_memory=True)``: no rank
holds more than under interleaved; :func:`~pipetrain.schedule.interleaved_zb.interleaved_zb_sequence`); the event
simulator's iteration
time, bubble and the most activation bytes any rank holds.

**Measured.** On two local CPU ranks (gloo, one thread each; the cluster probed for contention),
``mlp`` (batch 128) and ``gpt-tiny`` (batch 64), m = 2 and 4 (``--micro``): 1f1b and zb1 on the
balanced 2-stage plan, interleaved and interleaved-zb on the same 4-stage looping plan (v = 2); all
eight trained ``--steps`` steps each in one launch per model, round-robin (1 2 … 8 1 2 … 8 …,
each round reversed after the first) ``--repeats`` times; the median samples/s of each beside the
simulator's prediction on the measured profile.

Output under ``--out``: ``interleaved_zb.json`` and ``interleaved_zb.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import WARMUP_STEPS, probe_cluster, profile_logged

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, ZeroBubbleParams
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.runtime import TrainConfig, TrainJob, train_many
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

METHODS = (Method.ONE_F_ONE_B, Method.ZB1, Method.INTERLEAVED, Method.INTERLEAVED_ZB)
STRICT = "interleaved-zb-strict"  # simulated only: interleaved-zb with ZeroBubbleParams(strict_memory=True)
MEASURED = {"mlp": 128, "gpt-tiny": 64}


@dataclass(frozen=True)
class SimRow:
    """One simulated configuration."""

    ranks: int
    micro: int
    method: str
    chunks: int
    iteration_ms: float
    bubble: float
    peak_activation_mib: float
    speedup: float  # 1f1b's time / this one's


@dataclass(frozen=True)
class MeasuredRow:
    """One measured configuration: median samples/s over rounds, every round, and the prediction."""

    model: str
    method: str
    micro: int
    samples_per_s: float
    runs: list[float]
    predicted_samples_per_s: float


def plan_for(model: ModelRef, cost: CostModel, method: Method, ranks: int, chunks: int, batch: int, m: int) -> Plan:
    """1f1b/zb1: ``ranks`` balanced stages; interleaved[-zb]: ``chunks · ranks`` stages, looping."""
    if method in (Method.INTERLEAVED, Method.INTERLEAVED_ZB):
        return build_interleaved_plan(model, cost, n_ranks=ranks, chunks=chunks, batch_size=batch, n_micro=m,
                                      method=method)
    return build_balanced_plan(model, cost, method=method, n_stages=ranks, batch_size=batch, n_micro=m)


def simulate_grid(args: argparse.Namespace) -> list[SimRow]:
    """Every (R, m, method, v) row of the simulated part (module docstring)."""
    graph = build_model("gpt1-14", blocks=args.blocks)
    profile, model, rows = estimate_profile(graph, "v100", args.batch), ModelRef.of(graph), []
    for ranks in (4, 8):
        cost = CostModel(profile, api.estimated_cluster("v100", ranks)[0])
        for m in (8, 16, 32):
            base = 0.0
            for label in (*(method.value for method in METHODS), STRICT):
                method = Method.INTERLEAVED_ZB if label == STRICT else Method(label)
                for chunks in ((2, 4) if method in (Method.INTERLEAVED, Method.INTERLEAVED_ZB) else (1,)):
                    plan = plan_for(model, cost, method, ranks, chunks, args.batch, m)
                    if label == STRICT:
                        plan = replace(plan, params=ZeroBubbleParams(strict_memory=True))
                    schedule = build_schedule(plan)
                    timeline = simulate(schedule, plan, cost)
                    base = base or timeline.iteration_s
                    rows.append(SimRow(ranks, m, label, chunks, timeline.iteration_s * 1e3,
                                       timeline.bubble_fraction(), max(timeline.peak_activation_bytes) / 2**20,
                                       base / timeline.iteration_s))
            print(f"simulated R={ranks} m={m}", flush=True)
    return rows


def measured_plans(name: str, batch: int, cluster: Cluster,
                   micro: tuple[int, ...]) -> list[tuple[str, int, Plan, float]]:
    """``(method, m, plan, predicted samples/s)`` for every measured configuration of ``name``."""
    graph = build_model(name)
    profile = profile_logged(graph, batch)
    cost, model, out = CostModel(profile, cluster), ModelRef.of(graph), []
    for m in micro:
        for method in METHODS:
            plan = plan_for(model, cost, method, 2, 2, batch, m)
            predicted = batch / simulate(build_schedule(plan), plan, cost).iteration_s
            out.append((method.value, m, plan, predicted))
    return out


def measure(name: str, batch: int, cluster: Cluster, args: argparse.Namespace) -> list[MeasuredRow]:
    """Every configuration of ``name`` trained round-robin in one launch; medians per configuration."""
    configs = measured_plans(name, batch, cluster, tuple(args.micro))
    graph = build_model(name)
    config = TrainConfig(steps=args.steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                         timeout_s=120)
    order = [list(range(len(configs))) if r % 2 == 0 else list(reversed(range(len(configs))))
             for r in range(args.repeats)]
    jobs = [TrainJob(graph, configs[i][2], config) for rnd in order for i in rnd]
    t0 = time.perf_counter()
    results = train_many(jobs)
    print(f"[{name}] {len(jobs)} runs in {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()}",
          flush=True)
    runs: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    for i, result in zip((i for rnd in order for i in rnd), results, strict=True):
        runs[i].append(result.samples_per_s)
    return [MeasuredRow(name, method, m, statistics.median(runs[i]), runs[i], predicted)
            for i, (method, m, _, predicted) in enumerate(configs)]


def report(sim: list[SimRow], measured: list[MeasuredRow], args: argparse.Namespace, loads: list[float]) -> str:
    lines = [f"Simulated: gpt1-14 with {args.blocks} blocks, batch {args.batch}, estimated V100s.", "",
             "| ranks | m | method | v | iteration ms | bubble | peak act. MiB | vs 1f1b |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.ranks} | {r.micro} | {r.method} | {r.chunks} | {r.iteration_ms:.2f} | {r.bubble:.1%} | "
              f"{r.peak_activation_mib:.0f} | {r.speedup:.3f}× |" for r in sim]
    if measured:
        lines += ["", f"Measured: 2 local CPU ranks, {args.steps} steps per run, {args.repeats} rounds, round-robin; "
                  f"load average (1 min) before/after: {', '.join(f'{x:.2f}' for x in loads)}.", "",
                  "| model | method | m | samples/s (median) | runs | predicted samples/s |",
                  "|---|---|---:|---:|---|---:|"]
        lines += [f"| {r.model} | {r.method} | {r.micro} | {r.samples_per_s:.1f} | "
                  f"{', '.join(f'{x:.0f}' for x in r.runs)} | {r.predicted_samples_per_s:.1f} |" for r in measured]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=list(MEASURED), default=list(MEASURED))
    parser.add_argument("--skip-measured", action="store_true")
    parser.add_argument("--skip-simulated", action="store_true")
    args = parser.parse_args(argv)
    sim = [] if args.skip_simulated else simulate_grid(args)
    loads, measured = [os.getloadavg()[0]], []
    if not args.skip_measured:
        cluster, _ = probe_cluster(CPU_ACTION_OVERHEAD_S, args.probes)
        measured = [row for name in args.models for row in measure(name, MEASURED[name], cluster, args)]
        loads.append(os.getloadavg()[0])
    text = report(sim, measured, args, loads)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
               "load_average_1min": loads}
    write_atomic(args.out / "interleaved_zb.json", json.dumps(
        {**machine, "simulated": [asdict(r) for r in sim], "measured": [asdict(r) for r in measured]}, indent=1))
    write_atomic(args.out / "interleaved_zb.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
