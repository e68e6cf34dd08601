"""PipeDream-2BW's width: parallel pipelines (``w × d``) against straight ones and GPipe, simulated.

    .venv/bin/python benchmarks/bench_2bw_width.py --out benchmarks/results/2bw-width
    .venv/bin/python benchmarks/bench_2bw_width.py --quick --out /tmp/2bw-width      # gpt-1.3b on 8 only

The 2BW paper (Narayanan et al., ICML'21, §5) trains GPT models of 1.3B, 2.2B and 3.8B parameters
on V100-16GB servers (p3.16xlarge) and reports up to 3.2× over GPipe, most of it from running ``w``
parallel pipelines of depth ``d`` (``w · d = N``) with the stages' gradients all-reduced once per
batch. This script plans the same models (the zoo's GPT with the paper's sizes, as
``bench_async_sim.py`` builds them: context 512, vocabulary 50257; 1.3B: 24 blocks, hidden 2048;
2.2B: 24, 2560; 3.8B: 32, 3072; batch 512, Adam) on 8 and 16 V100-16GB (servers of 8, NVLink inside,
25 Gbit/s between), with profiles *estimated* for a V100 and every time from the event simulator:

* ``2bw``: ``plan --planner 2bw`` (docs/algorithms.md §3.6: width × depth, micro-batch size,
  recompute under memory); its chosen ``(w, d, b, recompute)`` and steady-state seconds per batch;
* ``2bw w=1``: the fastest straight pipeline of the same search (the planner's candidates with
  ``w = 1``: what the planner chose before replicated 2BW stages could run);
* ``gpipe``: the fastest GPipe plan that fits over the same pairs, stages and micro-batch sizes
  (replicated stages allowed, recompute only when needed), seconds per batch (one flush each);
  ``gpipe w=1`` the same over straight pipelines.

Output under ``--out``: ``2bw_width.json`` and ``2bw_width.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Candidate, ModelRef, PlanningProblem
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.score import over_memory
from pipetrain.planners.twobw import micro_batch_sizes, plan_2bw, two_bw_plan, widths_and_depths
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_async_sim import GPT_BATCH, GPT_SIZES, P3, cluster

DEVICES = (8, 16)
PAPER = "up to 3.2× (64 GPUs, w × d)"


@dataclass(frozen=True)
class Row:
    """One model on one cluster: seconds per batch (2bw: steady state) and the plans behind them."""

    model: str
    devices: int
    twobw_s: float
    twobw_plan: str
    straight_s: float
    straight_plan: str
    gpipe_s: float
    gpipe_plan: str
    gpipe_straight_s: float
    gpipe_straight_plan: str
    plan_s: float

    @property
    def samples_per_s(self) -> float:
        return GPT_BATCH / self.twobw_s


def describe(plan: Plan) -> str:
    """``w=2 d=8 b=8 recompute``: width, depth, micro-batch size, recompute."""
    b = plan.batch_size // len(plan.stages[0].forward_sizes)
    return f"w={len(plan.stages[0].ranks)} d={plan.n_stages} b={b}{' recompute' if plan.recompute_stages else ''}"


def gpipe_best(problem: PlanningProblem) -> dict[int, tuple[float, str]]:
    """Per width, the fastest GPipe plan that fits over 2BW's pairs, stages and micro-batch sizes:
    seconds per batch and the plan."""
    best: dict[int, tuple[float, str]] = {}
    for width, depth in widths_and_depths(problem.cost.cluster.n_devices, len(problem.layer_names)):
        sub, _ = placed_cluster(problem.cost.cluster, range(width * depth))
        cost = problem.cost.on(sub)
        for b in micro_batch_sizes(problem.batch_size, 1, width=width):
            for recompute in (False, True):
                plan = replace(two_bw_plan(problem, depth, b, recompute, width), method=Method.GPIPE,
                               weights=WeightPolicy.SYNC)
                if over_memory(plan, cost, problem.optimizer):
                    continue
                found = (simulate(build_schedule(plan), plan, cost).iteration_s, describe(plan))
                best[width] = min(best.get(width, found), found)
                break  # recompute only when needed: it is never faster
    return best


def fastest(candidates: tuple[Candidate, ...], width: int) -> Candidate:
    """The fastest of the planner's fitting candidates of ``width``."""
    return min((c for c in candidates if len(c.plan.stages[0].ranks) == width), key=lambda c: c.iteration_s)


def row(name: str, devices: int) -> Row:
    """The 2BW planner's answer and the baselines for one GPT size on ``devices`` V100s."""
    graph = build_model("gpt1-14", vocab=50257, context=512, **GPT_SIZES[name])
    servers, per = max(1, devices // 8), min(devices, 8)
    cost = CostModel(estimate_profile(graph, "v100", batch_size=GPT_BATCH), cluster(servers, per, *P3))
    problem = PlanningProblem(ModelRef.of(graph), cost, GPT_BATCH, optimizer="adam")
    start = time.perf_counter()
    result = plan_2bw(problem)
    plan_s = time.perf_counter() - start
    best, straight = result.candidates[0], fastest(result.candidates, 1)
    gpipe = gpipe_best(problem)
    none = (float("inf"), "none fits")
    gpipe_s, gpipe_plan = min(gpipe.values(), default=none)
    gpipe_straight_s, gpipe_straight_plan = gpipe.get(1, none)
    return Row(name, devices, best.iteration_s, describe(best.plan), straight.iteration_s, describe(straight.plan),
               gpipe_s, gpipe_plan, gpipe_straight_s, gpipe_straight_plan, plan_s)


def report(rows: list[Row], seconds: float, command: str) -> str:
    """The Markdown table of ``2bw_width.md``."""
    lines = ["# PipeDream-2BW: width × depth, simulated (V100 device model)", "",
             f"`{command}` on {platform.node() or 'this machine'} ({platform.processor() or platform.machine()}), "
             f"{seconds:.0f} s. Profiles estimated for a V100; devices V100-16GB; times from the event simulator; "
             f"batch {GPT_BATCH}, Adam; seconds per batch (2bw: steady state).", "",
             "| model | devices | 2bw plan | 2bw (s) | samples/s | 2bw w=1 plan | 2bw w=1 (s) | gpipe plan | gpipe (s) "
             "| gpipe w=1 (s) | 2bw vs gpipe | 2bw vs gpipe w=1 | 2bw vs 2bw w=1 | paper vs GPipe | planner (s) |",
             "|---" * 15 + "|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.devices} | {r.twobw_plan} | {r.twobw_s:.3f} | {r.samples_per_s:.1f} | "
                     f"{r.straight_plan} | {r.straight_s:.3f} | {r.gpipe_plan} | {r.gpipe_s:.3f} | "
                     f"{r.gpipe_straight_s:.3f} | {r.gpipe_s / r.twobw_s:.2f}× | "
                     f"{r.gpipe_straight_s / r.twobw_s:.2f}× | {r.straight_s / r.twobw_s:.2f}× | {PAPER} | "
                     f"{r.plan_s:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/2bw-width"))
    parser.add_argument("--quick", action="store_true", help="gpt-1.3b on 8 devices only")
    parser.add_argument("--models", nargs="+", choices=list(GPT_SIZES), default=list(GPT_SIZES),
                        help="GPT sizes to plan (default all three)")
    parser.add_argument("--devices", type=int, nargs="+", default=list(DEVICES), help="cluster sizes (servers of 8)")
    args = parser.parse_args(argv)
    cases = [(m, d) for m in args.models for d in args.devices][:1 if args.quick else None]
    command = " ".join(["benchmarks/bench_2bw_width.py", *(["--quick"] if args.quick else []),
                        *(["--models", *args.models] if args.models != list(GPT_SIZES) else []),
                        *(["--devices", *map(str, args.devices)] if args.devices != list(DEVICES) else [])])
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, devices in cases:
        rows.append(row(name, devices))
        r = rows[-1]
        print(f"{name} on {devices}: 2bw {r.twobw_s:.3f} s ({r.twobw_plan}), w=1 {r.straight_s:.3f} s "
              f"({r.straight_plan}), gpipe {r.gpipe_s:.3f} s ({r.gpipe_plan})", flush=True)
        # after every case: a long run keeps what it measured
        write_atomic(args.out / "2bw_width.json", json.dumps([asdict(r) for r in rows], indent=1))
        write_atomic(args.out / "2bw_width.md", report(rows, time.perf_counter() - start, command))
    print(f"wrote {args.out}/2bw_width.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
