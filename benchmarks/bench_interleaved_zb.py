"""interleaved-zb against interleaved, zb1 and 1f1b: simulated at V100 scale, and measured on two local ranks.

    .venv/bin/python benchmarks/bench_interleaved_zb.py                      # ~10 min on the shared 2-core machine
    .venv/bin/python benchmarks/bench_interleaved_zb.py --skip-measured      # the simulated part alone (~20 s)
    .venv/bin/python benchmarks/bench_interleaved_zb.py --skip-simulated --models gpt-tiny --repeats 5
    .venv/bin/python benchmarks/bench_interleaved_zb.py --quick              # 4 ranks at m = 8; mlp-digits at m = 2

Method ``interleaved-zb`` (:mod:`pipetrain.schedule.interleaved_zb`) is interleaved 1F1B (Narayanan
et al. 2021, §2.2) with each backward split into B and a deferred W (Qi et al. 2024, ZB-H1, §2–3).

**Simulated.** gpt1-14 with ``--blocks`` transformer blocks (default 30), estimated V100 profiles and
links (:func:`pipetrain.api.estimated_cluster`), batch ``--batch`` (default 64), R = 4 and 8 ranks,
m = 8, 16, 32 equal micro-batches: 1f1b and zb1 on R balanced stages; interleaved and interleaved-zb
with v = 2 and 4 chunks (``v·R`` balanced stages, looping placement), and interleaved-zb's
memory-strict variant (``interleaved-zb-strict``, the plan's ``ZeroBubbleParams(strict_memory=True)``:
no rank holds more than under interleaved); the event simulator's iteration time, bubble and the
most activation bytes any rank holds.

**Measured.** On two local CPU ranks (gloo, one thread each; the cluster probed for contention),
``mlp`` (batch 128) and ``gpt-tiny`` (batch 64), m = 2 and 4 (``--micro``): 1f1b and zb1 on the
balanced 2-stage plan, interleaved and interleaved-zb on the same 4-stage looping plan (v = 2); all
of a model's configurations trained ``--steps`` steps each in one launch per round, the order
reversed every other round, ``--repeats`` rounds; the median samples/s of each, the paired ratio
against the same round's 1f1b at the same m, and the simulator's prediction on the measured profile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import profile_logged
from common.zb_grid import MULTI_CHUNK, gpt_grid, plan_for, simulated
from common.zb_measured import MEASURED, QUICK_BLOCKS, Case, Setting, add_grid_arguments, this_machine, train_cases
from common.zb_report import error_headline, interleaved_zb_simulated, measured_table
from harness import Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain.cluster import CPU_ACTION_OVERHEAD_S
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, ZeroBubbleParams
from pipetrain.planners.contract import ModelRef

METHODS = (Method.ONE_F_ONE_B, Method.ZB1, Method.INTERLEAVED, Method.INTERLEAVED_ZB)
STRICT = "interleaved-zb-strict"  # simulated only: interleaved-zb with ZeroBubbleParams(strict_memory=True)


def arguments(p: argparse.ArgumentParser) -> None:
    add_grid_arguments(p)
    p.add_argument("--micro", type=int, nargs="+", default=[2, 4], help="measured micro-batch counts (default 2 4)")
    p.add_argument("--probes", type=int, default=3, help="probes of the 2-rank cluster (default 3)")
    p.add_argument("--models", nargs="+", choices=list(MEASURED), default=list(MEASURED), help="measured models")
    p.add_argument("--skip-measured", action="store_true", help="the simulated part only")
    p.add_argument("--skip-simulated", action="store_true", help="the measured part only")


def _cases(name: str, batch: int, ctx: Context) -> tuple[Case, ...]:
    """Every measured configuration of ``name``: 1f1b and zb1 on 2 stages, interleaved[-zb] on 4 (v = 2)."""
    graph = build_model(name)
    profile = profile_logged(graph, batch)
    cost = CostModel(profile, this_machine(ctx.quick, CPU_ACTION_OVERHEAD_S, ctx.args.probes))
    plans = [(m, plan_for(ModelRef.of(graph), cost, method, 2, 2, batch, m))
             for m in ((2,) if ctx.quick else ctx.args.micro) for method in METHODS]
    return tuple(Case(name, f"{plan.method.value} m={m}", plan, simulated(plan, cost).iteration_s) for m, plan in plans)


def settings(ctx: Context) -> list[Setting]:
    out: list[Setting] = [] if ctx.args.skip_simulated else [("simulated", r) for r in ((4,) if ctx.quick else (4, 8))]
    if not ctx.args.skip_measured:
        models = {"mlp-digits": 32} if ctx.quick else {m: MEASURED[m] for m in ctx.args.models}
        out += [_cases(m, b, ctx) for m, b in models.items()]
    return out


def run(setting: Setting, ctx: Context) -> list[Row]:
    if isinstance(setting[0], Case):
        cases = [c for c in setting if isinstance(c, Case)][::1 if ctx.round % 2 == 0 else -1]
        rows = train_cases(cases, 4 if ctx.quick else ctx.args.steps, 120.0)
        return [{"part": "measured", "method": r["label"].split()[0], "micro": int(r["label"].split("=")[1]), **r}
                for r in rows]
    if ctx.round > 0:  # deterministic: once
        return []
    ranks, batch = int(setting[1]), ctx.args.batch
    grid = gpt_grid(QUICK_BLOCKS if ctx.quick else ctx.args.blocks, batch, ranks, ctx.quick)
    model, cost, blocks = grid.model, grid.cost, grid.blocks
    rows: list[Row] = []
    for m in grid.micro:
        base = 0.0
        for label in (*(method.value for method in METHODS), STRICT):
            method = Method.INTERLEAVED_ZB if label == STRICT else Method(label)
            for chunks in (2, 4) if method in MULTI_CHUNK else (1,):
                plan = plan_for(model, cost, method, ranks, chunks, batch, m)
                if label == STRICT:
                    plan = replace(plan, params=ZeroBubbleParams(strict_memory=True))
                timeline = simulated(plan, cost)
                base = base or timeline.iteration_s
                rows.append({"part": "simulated", "blocks": blocks, "ranks": ranks, "micro": m, "method": label,
                             "chunks": chunks,
                             "iteration_ms": timeline.iteration_s * 1e3, "bubble": timeline.bubble_fraction(),
                             "peak_activation_mib": max(timeline.peak_activation_bytes) / 2**20,
                             "speedup": base / timeline.iteration_s})
    return rows


def report(rows: list[Row], info: RunInfo) -> Report:
    sim, measured = [r for r in rows if r["part"] == "simulated"], [r for r in rows if r["part"] == "measured"]
    o, lines, headlines, charts = info.options, [], [], []
    if sim:
        blocks = sim[0].get("blocks", o["blocks"])  # rows from before the harness lack it
        config = f"simulated, gpt1-14 with {blocks} blocks, batch {o['batch']}, estimated V100s"
        table, headline, chart = interleaved_zb_simulated(sim, config)
        lines += [f"Setting: {config}.", "", *table]
        headlines.append(headline)
        charts.append(chart)
    if measured:
        batches = {"mlp-digits": 32} if info.quick else MEASURED
        table, ratios, errors = measured_table(measured, batches, lambda model, label: f"1f1b {label.split()[1]}")
        lines += ["", f"Measured: 2 local CPU ranks, {4 if info.quick else o['steps']} steps per run, {info.repeats} "
                      "rounds, order reversed every other round; paired against the same round's 1f1b at the same m.",
                  "", *table]
        for model in dict.fromkeys(r["model"] for r in measured):
            mine = [v for (name, label), v in ratios.items() if name == model and label.startswith("interleaved-zb")
                    and v is not None]
            headlines.append(Headline("methods", f"interleaved-zb (v = 2) over 1f1b, measured, {model}, median over m",
                                      statistics.median(mine) if mine else None,
                                      config=f"2 local CPU ranks, batch {batches.get(model, '?')}, paired"))
        headlines += error_headline(errors, "interleaved-zb, interleaved, zb1 and 1f1b",
                                    "2 local CPU ranks, measured profile, probed cluster")
    return Report("\n".join(lines), tuple(headlines), tuple(charts))


EXPERIMENT = Experiment(name="interleaved-zb",
                        title="Interleaved zero bubble (interleaved-zb): simulated at V100 scale, measured here",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
