"""BaPipe benchmark (b): heterogeneity-aware exploration on 2 H100 + 2 V100, event-simulated.

    .venv/bin/python benchmarks/bench_hetero.py                     # full: 4 models
    .venv/bin/python benchmarks/bench_hetero.py --quick             # vgg16, no uedp
    .venv/bin/python benchmarks/bench_hetero.py --inter-gbit 200    # a faster link between the servers

Results go to ``benchmarks/results/hetero/`` (the 200 Gbit/s run before the harness:
``benchmarks/results/hetero-200g/``).
Cluster (assumptions): two servers, one with 2 H100 (devices 0, 1) and one with 2 V100 (devices 2,
3); NVLink inside a server (150 GB/s, 10 µs), 25 Gbit/s Ethernet between them (3.125 GB/s, 10 µs;
``--inter-gbit`` changes it).
Profiles are *estimated* per device kind (:mod:`pipetrain.profile.estimate`), batch 64. For each
model of the zoo among vgg16, gpt1-14, resnet50 and gnmt it reports, all times from the event
simulator on the real (heterogeneous) cluster:

* ``identical (4 stages)``: the plan that assumes identical devices: the equal planner
  (:func:`~pipetrain.planners.balanced.plan_balanced`, gpipe and 1f1b, every micro-batch count) on the
  cluster taken as 4 V100s (or 4 H100s: the better of the two is kept), one stage per device as
  ``pipetrain plan`` does by default, then simulated on the real cluster;
* ``identical (best S)``: the same for 1..4 stages (ranks 0..S-1, so the H100s first), the stage
  count that is fastest on the real cluster (an oracle choice, generous to the baseline);
* ``bapipe (4 stages)``: :func:`~pipetrain.planners.bapipe.explore` restricted to one stage per device,
  so only the partition and the device order differ from the first baseline;
* ``bapipe``: the full exploration (gpipe, 1f1b and uedp; 1..4 stages; every device order; both
  communication models propose partitions);
* ablations, gpipe and 1f1b only: ``bapipe §4.2 serial`` proposes partitions scored ``F + B + C``
  serially as PAPERS.md §4.2 writes it (``comm="serial"``), ``bapipe overlap`` only with transfers
  on their own link beside compute (``comm="overlap"``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.partition_hetero import BATCH, EQUAL, KINDS, bapipe_row, cluster, identical_rows
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.planners.bapipe import explore
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.profile.estimate import estimate_profile

MODELS = ("vgg16", "gpt1-14", "resnet50", "gnmt")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inter-gbit", type=float, default=25.0,
                   help="bandwidth between the two servers, Gbit/s (default 25)")


def settings(ctx: Context) -> list[str]:
    return ["vgg16"] if ctx.quick else list(MODELS)


def run(name: str, ctx: Context) -> list[Row]:
    graph = build_model(name)
    profiles = {kind: estimate_profile(graph, kind, BATCH) for kind in KINDS}
    real = CostModel(profiles, cluster(ctx.args.inter_gbit))
    rows = identical_rows(graph, profiles, real)
    problem = PlanningProblem(ModelRef.of(graph), real, BATCH)
    methods = EQUAL if ctx.quick else (*EQUAL, Method.UEDP)
    for label, options in (("bapipe (4 stages)", dict(stage_counts=[min(4, len(graph.names))])),
                           ("bapipe", dict(methods=methods)),
                           ("bapipe §4.2 serial", dict(methods=EQUAL, comm="serial")),
                           ("bapipe overlap", dict(methods=EQUAL, comm="overlap"))):
        t0 = time.perf_counter()
        rows.append(bapipe_row(label, explore(problem, **options), time.perf_counter() - t0))
    t = {r["planner"]: r["iteration_s"] for r in rows}
    ctx.log(f"{name}: bapipe {t['identical (4 stages)'] / t['bapipe']:.2f}× over identical (4 stages)")
    return [{"model": name, "n_layers": len(graph.names), **r} for r in rows]


def report(rows: list[Row], info: RunInfo) -> Report:
    models = list(dict.fromkeys(r["model"] for r in rows))
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    inter = info.options.get("inter_gbit", 25.0)
    lines = [f"Batch {BATCH}; NVLink 150 GB/s inside a server, {inter:g} Gbit/s between the H100 and the V100 server.",
             "", "## Iteration time (ms) and speed-up of bapipe", "",
             "| model | layers | " + " | ".join(planners) + " | bapipe vs identical (4 stages) | bapipe vs identical "
             "(best S) | bapipe (4 stages) vs identical (4 stages) |", "|---|---|" + "---|" * (len(planners) + 3)]
    speedups: dict[str, list[float]] = {"vs identical (4 stages)": [], "vs identical (best S)": []}
    for m in models:
        t = {r["planner"]: r["iteration_s"] for r in rows if r["model"] == m}
        four, best = t["identical (4 stages)"], t["identical (best S)"]
        speedups["vs identical (4 stages)"].append(four / t["bapipe"])
        speedups["vs identical (best S)"].append(best / t["bapipe"])
        layers = next(r["n_layers"] for r in rows if r["model"] == m)
        lines.append(f"| {m} | {layers} | " + " | ".join(f"{1e3 * t[p]:.2f}" for p in planners)
                     + f" | {four / t['bapipe']:.2f}× | {best / t['bapipe']:.2f}× | "
                       f"{four / t['bapipe (4 stages)']:.2f}× |")
    lines += ["", "## Plans side by side (stages in pipeline order as device:layers)", "",
              "| model | planner | method | micro-batches | stages | search s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['planner']} | {r['method']} | {r['n_micro']} | {' '.join(r['stages'])} | "
              f"{r['search_s']:.2f} |" for r in rows]
    if not models:
        return Report("No rows.")
    config = f"simulated, estimated profiles, 2 H100 + 2 V100 ({inter:g} Gbit/s between), batch {BATCH}, " \
             f"median of {len(models)} models"
    labels = {"vs identical (4 stages)": "over the plan that assumes identical devices, 4 stages",
              "vs identical (best S)": "over the identical-devices plan at its best stage count (hindsight)"}
    headlines = tuple(Headline("methods", f"BaPipe on 2 H100 + 2 V100 {labels[k]}", statistics.median(v),
                               config=config) for k, v in speedups.items())
    chart = Chart("methods", "speedup", "BaPipe on 2 H100 + 2 V100: speed-up over identical-device plans", "bars",
                  "speed-up (×)", categories=tuple(models), series=tuple((k, tuple(v)) for k, v in speedups.items()))
    return Report("\n".join(lines), headlines, (chart,))


EXPERIMENT = Experiment(name="hetero", title="Partitioning (b): BaPipe on a heterogeneous cluster, 2 H100 + 2 V100",
                        settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
