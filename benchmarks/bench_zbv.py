"""ZB-V (method ``zbv``) against 1f1b, zb1 and interleaved-zb: simulated at unit costs and at V100 scale.

    .venv/bin/python benchmarks/bench_zbv.py             # ~1 min on the shared 2-core machine
    .venv/bin/python benchmarks/bench_zbv.py --quick     # R = 2 at unit costs, R = 4 and m = 8 at V100 scale, 6 blocks

Method ``zbv`` (:mod:`pipetrain.schedule.zbv`) is Zero Bubble's ZB-V (Qi et al. 2024 §6): ``2R``
stages, two per rank in a V, the backward split into B and W, orders from pipetrain's greedy list
scheduler under 1F1B's activation memory.

**Unit costs.** One layer per chunk with F = B = W = 1 (a layer with parameters, backward 2 split in
half), free links; 1f1b and zb1 on ``R`` stages of two layers, interleaved-zb and zbv on ``2R``
stages of one; R = 2, 4, 8 and m = R, 2R, 4R.

**V100 scale.** gpt1-14 with ``--blocks`` transformer blocks (default 30), estimated V100 profiles
and links (:func:`pipetrain.api.estimated_cluster`), batch ``--batch`` (default 64), R = 4 and 8,
m = 8, 16, 32: 1f1b and zb1 on R balanced stages, interleaved-zb on 2R balanced stages (looping),
zbv on 2R stages balanced per rank pair in a V (the ``interleaved`` planner's cut). The event
simulator's iteration time, bubble and the most activation bytes any rank holds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.zb_grid import plan_for, simulated_rows, unit_cost, unit_plan
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.planners.contract import ModelRef
from pipetrain.profile.estimate import estimate_profile

METHODS = (Method.ONE_F_ONE_B, Method.ZB1, Method.INTERLEAVED_ZB, Method.ZBV)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blocks", type=int, default=30, help="gpt1-14's transformer blocks (default 30; 6 with --quick)")
    p.add_argument("--batch", type=int, default=64, help="batch at V100 scale (default 64)")


def settings(ctx: Context) -> list[tuple[str, int]]:
    if ctx.quick:
        return [("unit", 2), ("v100", 4)]
    return [("unit", r) for r in (2, 4, 8)] + [("v100", r) for r in (4, 8)]


def run(setting: tuple[str, int], ctx: Context) -> list[Row]:
    """Every (m, method) of one setting and rank count: iteration (units or ms), bubble, the most
    activation bytes any rank holds (pairs' bytes at unit costs, MiB at V100 scale), speed-up over 1f1b."""
    kind, ranks = setting
    if kind == "unit":
        cost = unit_cost(2 * ranks, ranks)
        return [{"setting": kind, **row} for m in (ranks, 2 * ranks, 4 * ranks)
                for row in simulated_rows(cost, [unit_plan(method, ranks, m) for method in METHODS], 1.0, 1.0)]
    blocks, batch = (6, ctx.args.batch) if ctx.quick else (ctx.args.blocks, ctx.args.batch)
    graph = build_model("gpt1-14", blocks=blocks)
    model = ModelRef.of(graph)
    cost = CostModel(estimate_profile(graph, "v100", batch), api.estimated_cluster("v100", ranks)[0])
    rows = []
    for m in (8,) if ctx.quick else (8, 16, 32):
        plans = [plan_for(model, cost, method, ranks, 2, batch, m) for method in METHODS]
        rows += [{"setting": kind, **row} for row in simulated_rows(cost, plans, 1e3, 2.0**-20)]
    return rows


def _at(rows: list[Row], setting: str, ranks: int, micro: int, method: Method) -> Row:
    return next(r for r in rows if (r["setting"], r["ranks"], r["micro"], r["method"]) == (setting, ranks, micro,
                                                                                              method.value))


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = []
    for setting, unit in (("unit", "units, bubble, peak bytes"), ("v100", "ms, bubble, peak MiB")):
        lines += [f"| {setting}: R | m | " + " | ".join(m.value for m in METHODS) + f" ({unit}) |",
                  "|---|---|" + "---|" * len(METHODS)]
        for ranks, micro in sorted({(r["ranks"], r["micro"]) for r in rows if r["setting"] == setting}):
            cells = [_at(rows, setting, ranks, micro, m) for m in METHODS]
            lines.append(f"| {ranks} | {micro} | " + " | ".join(
                f"{r['iteration']:.1f} ({r['bubble']:.3f}, {r['peak_activation']:.0f}) {r['speedup']:.2f}×"
                for r in cells) + " |")
        lines.append("")
    v100 = [r for r in rows if r["setting"] == "v100"]
    grid = sorted({(r["ranks"], r["micro"]) for r in v100})
    blocks = 6 if info.quick else info.options["blocks"]
    config = f"simulated, gpt1-14 with {blocks} blocks, estimated V100s, R × m in {len(grid)} settings"
    zbv = [r["speedup"] for r in v100 if r["method"] == "zbv"]
    best = max((r for r in v100 if r["method"] == "zbv"), key=lambda r: r["speedup"])
    headlines = (Headline("methods", "zbv over 1f1b at V100 scale, median", statistics.median(zbv), config=config),
                 Headline("methods", f"zbv over 1f1b at V100 scale, the most (R = {best['ranks']}, "
                                     f"m = {best['micro']})",
                          best["speedup"], config=config))
    chart = Chart("methods", "v100", "Speed-up over 1f1b at V100 scale (gpt1-14, simulated)", "bars", "× 1f1b",
                  categories=tuple(f"R={r} m={m}" for r, m in grid),
                  series=tuple((method.value, tuple(_at(v100, "v100", r, m, method)["speedup"] for r, m in grid))
                               for method in METHODS[1:]))
    return Report("\n".join(lines), headlines, (chart,))


EXPERIMENT = Experiment(name="zbv", title="ZB-V (zbv) against 1f1b, zb1 and interleaved-zb, simulated",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=1)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
