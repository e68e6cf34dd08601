"""Interleaved 1F1B against 1F1B: simulated at V100 scale, and measured on two local ranks.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved.py --out benchmarks/results/interleaved
    PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved.py --skip-measured --out /tmp/int   # simulation only

**Simulated.** A GPT-1-sized model (zoo ``gpt1-14`` with ``--blocks`` transformer blocks, default 30,
so that 8 ranks × 4 chunks still get whole blocks), estimated V100 profiles and links
(:func:`pipetrain.api.estimated_cluster`), ``--batch`` samples (default 64). On R = 4 and 8 ranks and
m = 8, 16, 32 equal micro-batches: 1F1B on R balanced stages beside interleaved 1F1B with v = 2, 3, 4
chunks per rank (``v·R`` balanced stages, looping placement), each from the event simulator; the
bubble fraction beside the speed-up. Megatron-LM (Narayanan et al. 2021) reports the interleaved
schedule up to 10 % faster than 1F1B at scale; its bubble shrinks by v.

**Measured.** On two local CPU ranks (gloo, one thread each), ``mlp`` (batch 128) and ``gpt-tiny``
(batch 64): the interleaved planner's plan (:func:`~pipetrain.planners.interleaved.plan_interleaved`,
v and m searched on a measured profile) and the balanced 1F1B plan, trained ``--steps`` steps each,
alternately (A B A B …) ``--repeats`` times in one launch; the median samples/s of each, and each
plan's prediction beside it.

Output under ``--out``: ``interleaved.json`` and ``interleaved.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.interleaved import build_interleaved_plan, plan_interleaved
from pipetrain.planners.registry import run_planner
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.measure import measure_profile
from pipetrain.runtime import TrainConfig, TrainJob, train_many
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate


@dataclass(frozen=True)
class SimRow:
    """One simulated configuration."""

    ranks: int
    micro: int
    chunks: int  # 1: plain 1F1B
    iteration_ms: float
    bubble: float
    speedup: float  # 1F1B's time / this one's


@dataclass(frozen=True)
class MeasuredRow:
    """One measured plan: its label, median samples/s, runs, and prediction."""

    model: str
    label: str
    samples_per_s: float
    runs: list[float]
    predicted_samples_per_s: float


def _simulated(plan: Plan, cost: CostModel) -> tuple[float, float]:
    timeline = simulate(build_schedule(plan), plan, cost)
    return timeline.iteration_s, timeline.bubble_fraction()


def simulate_grid(args: argparse.Namespace) -> list[SimRow]:
    """1F1B and interleaved 1F1B on the grid of the module docstring."""
    graph = build_model("gpt1-14", blocks=args.blocks)
    profile = estimate_profile(graph, "v100", args.batch)
    model, rows = ModelRef.of(graph), []
    for ranks in (4, 8):
        cost = CostModel(profile, api.estimated_cluster("v100", ranks)[0])
        for m in (8, 16, 32):
            base = build_balanced_plan(model, cost, method=Method.ONE_F_ONE_B, n_stages=ranks,
                                       batch_size=args.batch, n_micro=m)
            t1, bubble = _simulated(base, cost)
            rows.append(SimRow(ranks, m, 1, t1 * 1e3, bubble, 1.0))
            for chunks in (2, 3, 4):
                plan = build_interleaved_plan(model, cost, n_ranks=ranks, chunks=chunks, batch_size=args.batch,
                                              n_micro=m)
                t, bubble = _simulated(plan, cost)
                rows.append(SimRow(ranks, m, chunks, t * 1e3, bubble, t1 / t))
    return rows


def _plans(name: str, batch: int) -> tuple[list[tuple[str, Plan]], object]:
    """The interleaved planner's plan and the balanced 1F1B plan for ``name`` on 2 local ranks."""
    graph = build_model(name)
    cost = CostModel(measure_profile(graph, batch), api.local_cluster(2))
    problem = PlanningProblem(ModelRef.of(graph), cost, batch, constraints=Constraints(method=Method.ONE_F_ONE_B))
    interleaved = plan_interleaved(PlanningProblem(problem.model, cost, batch)).plan
    one_f_one_b = run_planner("balanced", problem).plan
    return [("1f1b", one_f_one_b), (f"interleaved v={interleaved.virtual_stages}", interleaved)], graph


def measure_pair(name: str, batch: int, args: argparse.Namespace) -> list[MeasuredRow]:
    """Both plans trained alternately in one launch; median samples/s each."""
    plans, graph = _plans(name, batch)
    config = TrainConfig(steps=args.steps, warmup_steps=2, progress=False, timeout_s=120)
    jobs = [TrainJob(graph, plan, config) for _ in range(args.repeats) for _, plan in plans]  # type: ignore[arg-type]
    results = train_many(jobs)
    rows = []
    for i, (label, plan) in enumerate(plans):
        runs = [r.samples_per_s for r in results[i::len(plans)]]
        predicted = plan.batch_size / plan.prediction.iteration_s if plan.prediction else float("nan")
        rows.append(MeasuredRow(name, f"{label} m={len(plan.stages[0].forward_sizes)}", statistics.median(runs),
                                runs, predicted))
    return rows


def report(sim: list[SimRow], measured: list[MeasuredRow], args: argparse.Namespace) -> str:
    lines = [f"Simulated: gpt1-14 with {args.blocks} blocks, batch {args.batch}, estimated V100s.", "",
             "| ranks | m | chunks v | iteration ms | bubble | vs 1F1B |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.ranks} | {r.micro} | {'1 (1F1B)' if r.chunks == 1 else r.chunks} | {r.iteration_ms:.1f} | "
              f"{r.bubble:.1%} | {r.speedup:.3f}× |" for r in sim]
    if measured:
        lines += ["", f"Measured: 2 local CPU ranks, {args.steps} steps per run, {args.repeats} runs each, "
                  "alternating.", "", "| model | plan | samples/s (median) | runs | predicted samples/s |",
                  "|---|---|---:|---|---:|"]
        lines += [f"| {r.model} | {r.label} | {r.samples_per_s:.1f} | {', '.join(f'{x:.0f}' for x in r.runs)} | "
                  f"{r.predicted_samples_per_s:.1f} |" for r in measured]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-measured", action="store_true")
    args = parser.parse_args(argv)
    sim = simulate_grid(args)
    measured = [] if args.skip_measured else [*measure_pair("mlp", 128, args), *measure_pair("gpt-tiny", 64, args)]
    text = report(sim, measured, args)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.platform(), "processor": platform.processor(), "torch": torch.__version__}
    write_atomic(args.out / "interleaved.json", json.dumps(
        {**machine, "simulated": [asdict(r) for r in sim], "measured": [asdict(r) for r in measured]}, indent=1))
    write_atomic(args.out / "interleaved.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
