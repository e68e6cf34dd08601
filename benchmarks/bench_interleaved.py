"""Interleaved 1F1B against 1F1B: simulated at V100 scale, and measured on two local ranks.

    .venv/bin/python benchmarks/bench_interleaved.py                    # ~5 min on a quiet 2-core machine
    .venv/bin/python benchmarks/bench_interleaved.py --skip-measured    # the simulated part alone (~1 min)
    .venv/bin/python benchmarks/bench_interleaved.py --quick            # 4 ranks at m = 8; mlp-digits measured

**Simulated.** A GPT-1-sized model (zoo ``gpt1-14`` with ``--blocks`` transformer blocks, default 30,
so that 8 ranks × 4 chunks still get whole blocks), estimated V100 profiles and links
(:func:`pipetrain.api.estimated_cluster`), ``--batch`` samples (default 64). On R = 4 and 8 ranks and
m = 8, 16, 32 equal micro-batches: 1F1B on R balanced stages beside interleaved 1F1B with v = 2, 3, 4
chunks per rank (``v·R`` balanced stages, looping placement), each from the event simulator; the
bubble fraction beside the speed-up. Megatron-LM (Narayanan et al. 2021) reports the interleaved
schedule up to 10 % faster than 1F1B at scale; its bubble shrinks by v.

**Measured.** On two local CPU ranks (gloo, one thread each), ``mlp`` (batch 128) and ``gpt-tiny``
(batch 64): the interleaved planner's plan (:func:`~pipetrain.planners.interleaved.plan_interleaved`,
method interleaved, v and m searched on a measured profile) and the balanced 1F1B plan, trained
``--steps`` steps each in one launch per round, the order reversed every other round, ``--repeats``
rounds; the median samples/s of each and the paired ratio, each plan's prediction beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import profile_logged
from common.zb_grid import gpt_grid, plan_for, simulated
from common.zb_measured import MEASURED, QUICK_BLOCKS, Case, Setting, add_grid_arguments, train_cases
from common.zb_report import error_headline, measured_table
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.planners.registry import run_planner


def arguments(p: argparse.ArgumentParser) -> None:
    add_grid_arguments(p)
    p.add_argument("--skip-measured", action="store_true", help="the simulated part only")


def _cases(name: str, batch: int) -> tuple[Case, ...]:
    """The balanced 1F1B plan and the interleaved planner's on 2 local ranks, with their predictions."""
    graph = build_model(name)
    cost = CostModel(profile_logged(graph, batch), api.local_cluster(2))
    one = run_planner("balanced", PlanningProblem(ModelRef.of(graph), cost, batch,
                                                  constraints=Constraints(method=Method.ONE_F_ONE_B))).plan
    inter = plan_interleaved(PlanningProblem(ModelRef.of(graph), cost, batch,
                                             constraints=Constraints(method=Method.INTERLEAVED))).plan
    return tuple(Case(name, f"{label} m={len(plan.stages[0].forward_sizes)}", plan,
                      plan.prediction.iteration_s if plan.prediction else simulated(plan, cost).iteration_s)
                 for label, plan in (("1f1b", one), (f"interleaved v={inter.virtual_stages}", inter)))


def settings(ctx: Context) -> list[Setting]:
    out: list[Setting] = [("simulated", r) for r in ((4,) if ctx.quick else (4, 8))]
    if not ctx.args.skip_measured:
        out += [_cases(m, b) for m, b in ({"mlp-digits": 32} if ctx.quick else MEASURED).items()]
    return out


def run(setting: Setting, ctx: Context) -> list[Row]:
    if isinstance(setting[0], Case):
        cases = [c for c in setting if isinstance(c, Case)][::1 if ctx.round % 2 == 0 else -1]
        return [{"part": "measured", **row} for row in train_cases(cases, 4 if ctx.quick else ctx.args.steps, 120.0)]
    if ctx.round > 0:  # deterministic: once
        return []
    ranks, batch = int(setting[1]), ctx.args.batch
    grid = gpt_grid(QUICK_BLOCKS if ctx.quick else ctx.args.blocks, batch, ranks, ctx.quick)
    model, cost, blocks = grid.model, grid.cost, grid.blocks
    rows: list[Row] = []
    for m in grid.micro:
        base = simulated(plan_for(model, cost, Method.ONE_F_ONE_B, ranks, 1, batch, m), cost)
        rows.append({"part": "simulated", "blocks": blocks, "ranks": ranks, "micro": m, "chunks": 1,
                     "iteration_ms": 1e3 * base.iteration_s, "bubble": base.bubble_fraction(), "speedup": 1.0})
        for v in (2, 3, 4):
            t = simulated(plan_for(model, cost, Method.INTERLEAVED, ranks, v, batch, m), cost)
            rows.append({"part": "simulated", "blocks": blocks, "ranks": ranks, "micro": m, "chunks": v,
                         "iteration_ms": 1e3 * t.iteration_s,
                         "bubble": t.bubble_fraction(), "speedup": base.iteration_s / t.iteration_s})
    return rows


def report(rows: list[Row], info: RunInfo) -> Report:
    sim, measured = [r for r in rows if r["part"] == "simulated"], [r for r in rows if r["part"] == "measured"]
    o = info.options
    blocks = sim[0].get("blocks", o["blocks"]) if sim else o["blocks"]  # rows from before the harness lack it
    config = f"simulated, gpt1-14 with {blocks} blocks, batch {o['batch']}, estimated V100s"
    lines = [f"Setting: {config}.", "",
             "| ranks | m | chunks v | iteration ms | bubble | vs 1F1B |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['ranks']} | {r['micro']} | {'1 (1F1B)' if r['chunks'] == 1 else r['chunks']} | "
              f"{r['iteration_ms']:.1f} | {r['bubble']:.1%} | {r['speedup']:.3f}× |" for r in sim]
    headlines: list[Headline] = []
    charts = []
    if sim:
        best = max(sim, key=lambda r: r["speedup"])
        headlines.append(Headline("papers", f"interleaved 1F1B over 1F1B, simulated, the most (R = {best['ranks']}, "
                                            f"m = {best['micro']}, v = {best['chunks']})", best["speedup"],
                                  paper="up to 10% faster than 1F1B at scale (Megatron-LM)", paper_value=1.10,
                                  config=config))
        grid = sorted({(r["ranks"], r["micro"]) for r in sim})
        charts.append(Chart("methods", "simulated", "Interleaved 1F1B over 1F1B, simulated (gpt1-14, V100s)", "bars",
                            "× 1F1B", categories=tuple(f"R={r} m={m}" for r, m in grid),
                            series=tuple((f"v = {v}", tuple(next((x["speedup"] for x in sim if (
                                x["ranks"], x["micro"], x["chunks"]) == (r, m, v)), None) for r, m in grid))
                                for v in (2, 3, 4))))
    if measured:
        batches = {"mlp-digits": 32} if info.quick else MEASURED
        table, ratios, errors = measured_table(measured, batches, lambda model, label: next(
            r["label"] for r in measured if r["model"] == model and r["label"].startswith("1f1b")))
        lines += ["", f"Measured: 2 local CPU ranks, {4 if info.quick else o['steps']} steps per run, {info.repeats} "
                      "rounds, order reversed every other round.", "", *table]
        headlines += [Headline("methods", f"interleaved over 1F1B, measured, {model} ({label}, paired)", ratio,
                               config=f"2 local CPU ranks, batch {batches.get(model, '?')}, planner's v and m")
                      for (model, label), ratio in ratios.items() if label.startswith("interleaved")]
        headlines += error_headline(errors, "interleaved and 1f1b", "2 local CPU ranks, measured profile")
    return Report("\n".join(lines), tuple(headlines), tuple(charts))


EXPERIMENT = Experiment(name="interleaved",
                        title="Interleaved 1F1B against 1F1B: simulated at V100 scale, measured here",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
