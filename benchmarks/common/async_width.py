"""2bw-width's planning and report: 2BW's ``w × d`` plan against its straight pipelines and GPipe's.

One row per GPT size and cluster (seconds per batch, 2bw at steady state, and the plans behind them);
the benchmark's module docstring says what each column is.
"""

from __future__ import annotations

import time
from dataclasses import replace

from harness import Chart, Headline, Report, Row, RunInfo

from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.planners.contract import Candidate, PlanningProblem
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.score import over_memory
from pipetrain.planners.twobw import micro_batch_sizes, plan_2bw, two_bw_plan, widths_and_depths
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

from .async_papers import GPT_BATCH, PAPER_2BW, describe, gpt_problem

__all__ = ["report", "width_row"]


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


def _fastest(candidates: tuple[Candidate, ...], width: int) -> Candidate:
    """The fastest of the planner's fitting candidates of ``width``."""
    return min((c for c in candidates if len(c.plan.stages[0].ranks) == width), key=lambda c: c.iteration_s)


def width_row(name: str, devices: int) -> Row:
    """The 2BW planner's answer and the baselines for one GPT size on ``devices`` V100s."""
    problem = gpt_problem(name, devices)
    start = time.perf_counter()
    result = plan_2bw(problem)
    plan_s = time.perf_counter() - start
    best, straight = result.candidates[0], _fastest(result.candidates, 1)
    gpipe = gpipe_best(problem)
    none = (float("inf"), "none fits")
    gpipe_s, gpipe_plan = min(gpipe.values(), default=none)
    gpipe_straight_s, gpipe_straight_plan = gpipe.get(1, none)
    return {"model": name, "devices": devices, "twobw_s": best.iteration_s, "twobw_plan": describe(best.plan),
            "straight_s": straight.iteration_s, "straight_plan": describe(straight.plan), "gpipe_s": gpipe_s,
            "gpipe_plan": gpipe_plan, "gpipe_straight_s": gpipe_straight_s,
            "gpipe_straight_plan": gpipe_straight_plan, "plan_s": plan_s}


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = [f"Profiles estimated for a V100; devices V100-16GB; times from the event simulator; batch {GPT_BATCH}, "
             "Adam; seconds per batch (2bw: steady state).", "",
             "| model | devices | 2bw plan | 2bw (s) | samples/s | 2bw w=1 plan | 2bw w=1 (s) | gpipe plan | gpipe (s) "
             "| gpipe w=1 (s) | 2bw vs gpipe | 2bw vs gpipe w=1 | 2bw vs 2bw w=1 | paper vs GPipe | planner (s) |",
             "|---" * 15 + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['devices']} | {r['twobw_plan']} | {r['twobw_s']:.3f} | "
                     f"{GPT_BATCH / r['twobw_s']:.1f} | {r['straight_plan']} | {r['straight_s']:.3f} | "
                     f"{r['gpipe_plan']} | {r['gpipe_s']:.3f} | {r['gpipe_straight_s']:.3f} | "
                     f"{r['gpipe_s'] / r['twobw_s']:.2f}× | {r['gpipe_straight_s'] / r['twobw_s']:.2f}× | "
                     f"{r['straight_s'] / r['twobw_s']:.2f}× | up to {PAPER_2BW}× (64 GPUs, w × d) | "
                     f"{r['plan_s']:.0f} |")
    if not rows:
        return Report("\n".join(lines))
    best = max(rows, key=lambda r: r["gpipe_s"] / r["twobw_s"])
    wide = max(rows, key=lambda r: r["straight_s"] / r["twobw_s"])
    headlines = (
        Headline("papers", "2BW (w × d) over the best GPipe plan, best of the GPT sizes",
                 best["gpipe_s"] / best["twobw_s"],
                 paper="up to 3.2× over GPipe (64 V100s, w × d)", paper_value=PAPER_2BW,
                 config=f"simulated, {best['model']} on {best['devices']} V100-16GB, batch {GPT_BATCH}"),
        Headline("methods", "2BW's width: w × d over its best straight pipeline, best case",
                 wide["straight_s"] / wide["twobw_s"],
                 config=f"simulated, {wide['model']} on {wide['devices']} V100-16GB ({wide['twobw_plan']})"))
    chart = Chart("papers", "speedups", "2BW over GPipe (paper: up to 3.2× on 64 V100s)", "bars", "speed-up (×)",
                  categories=tuple(f"{r['model']} on {r['devices']}" for r in rows),
                  series=(("vs best gpipe", tuple(r["gpipe_s"] / r["twobw_s"] for r in rows)),
                          ("vs straight gpipe", tuple(r["gpipe_straight_s"] / r["twobw_s"] for r in rows)),
                          ("vs 2bw w=1", tuple(r["straight_s"] / r["twobw_s"] for r in rows))))
    return Report("\n".join(lines), headlines, (chart,))
