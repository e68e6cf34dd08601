"""zb1-ga (unequal micro-batches under ZB-H1) against the best equal zb1 plan, simulated on V100s.

    .venv/bin/python benchmarks/bench_zb1_ga_sim.py             # ~6 min on the shared 2-core machine
    .venv/bin/python benchmarks/bench_zb1_ga_sim.py --quick     # synthetic-0 on 4 V100s, a tiny GA

The networks and clusters of BENCHMARKS.md "UMPIPE (a)" (:mod:`common.umpipe_networks`: gpt1-14,
vgg16, synthetic 0-9 at 8 layers and width 8; batch 64; one stage per device; profiles *estimated*
for the V100 device model, with the backward's weight-gradient share traced per layer) on 4 and 8
V100s. For each network and cluster:

* ``zb1`` and ``1f1b``: the best equal plan of each method (the balanced planner: exact min-max
  layer split, every micro-batch count up to 64 and the powers of two simulated);
* ``zb1-ga`` on the zb1 plan's stages: per-stage unequal sizes under the ZB-H1 order (Zero Bubble,
  Qi et al., ICLR 2024; UMPIPE's per-stage partitions, Zhou et al., TPDS 2025), forward = backward;
* ``1f1b-ga`` on the 1f1b plan's stages: the same under the 1F1B order.

Every reported time is the **event simulator's** iteration time of the final plan (the GA's own
score agrees to 1e-9, tests/unit/test_zb1_ga.py). Memory is not capped; the peak activation bytes of
the busiest rank are reported beside the times, since ZB-H1 holds more than 1F1B on later stages.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.umpipe_networks import BATCH, V100_CLUSTERS, build, cluster_of, networks
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.microbatch.ga import GAConfig, one_f_one_b_ga, zb1_ga
from pipetrain.planners.microbatch.uedp import with_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.vectorised import StageTables

PLANS = ("1f1b", "zb1", "1f1b-ga", "zb1-ga")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--population", type=int, default=48, help="GA population (default 48; 8 with --quick)")
    p.add_argument("--generations", type=int, default=80, help="GA generations (default 80; 4 with --quick)")


def settings(ctx: Context) -> list[tuple[str, str]]:
    if ctx.quick:
        return [(V100_CLUSTERS[0], "synthetic-0")]
    return [(c, n) for c in V100_CLUSTERS for n in networks(quick=False)]


def run(setting: tuple[str, str], ctx: Context) -> list[Row]:
    """One network on one cluster: per plan, event-simulated seconds, the busiest rank's peak
    activation bytes and micro-batch sizes per stage; per GA, its search seconds."""
    cluster_name, network = setting
    o = ctx.args
    config = GAConfig(population=8, generations=4) if ctx.quick else GAConfig(o.population, o.generations)
    graph = build(network)
    cluster = cluster_of(cluster_name)
    cost = CostModel(estimate_profile(graph, "v100", BATCH), cluster)
    plans: dict[str, Plan] = {}
    search: dict[str, float] = {}
    for method, ga in ((Method.ONE_F_ONE_B, one_f_one_b_ga), (Method.ZB1, zb1_ga)):
        constraints = Constraints(method=method, n_stages=cluster.n_devices)
        base = plan_balanced(PlanningProblem(ModelRef.of(graph), cost, BATCH, constraints=constraints)).plan
        t0 = time.perf_counter()
        result = ga(StageTables.from_plan(base, cost), seed=ctx.seed, config=config)
        search[result.planner] = time.perf_counter() - t0
        plans[method.value], plans[result.planner] = base, with_sizes(base, result)
    timelines = {name: simulate(build_schedule(plan), plan, cost) for name, plan in plans.items()}
    return [{"network": network, "cluster": cluster_name, "times_s": {n: t.iteration_s for n, t in timelines.items()},
             "peak_bytes": {n: max(t.peak_activation_bytes) for n, t in timelines.items()},
             "sizes": {n: [list(s.forward_sizes) for s in p.stages] for n, p in plans.items()}, "search_s": search}]


def speedup(r: Row, plan: str, baseline: str) -> float:
    return r["times_s"][baseline] / r["times_s"][plan]


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| network | cluster | 1f1b ms | zb1 ms | 1f1b-ga ms | zb1-ga ms | zb1-ga / best equal zb1 "
             "| zb1-ga / 1f1b-ga | zb1-ga / best equal 1f1b | peak act. GiB zb1 / zb1-ga "
             "| zb1-ga micro-batches per stage |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = " | ".join(f"{1e3 * r['times_s'][p]:.2f}" for p in PLANS)
        counts = "/".join(str(len(s)) for s in r["sizes"]["zb1-ga"])
        lines.append(f"| {r['network']} | {r['cluster']} | {ms} | {speedup(r, 'zb1-ga', 'zb1'):.3f}× | "
                     f"{speedup(r, 'zb1-ga', '1f1b-ga'):.3f}× | {speedup(r, 'zb1-ga', '1f1b'):.3f}× | "
                     f"{r['peak_bytes']['zb1'] / 2**30:.2f} / {r['peak_bytes']['zb1-ga'] / 2**30:.2f} | {counts} |")
    lines += ["", "Medians per cluster (zb1-ga over best equal zb1, over 1f1b-ga, over best equal 1f1b):", ""]
    clusters = list(dict.fromkeys(r["cluster"] for r in rows))
    for cluster in clusters:
        rs = [r for r in rows if r["cluster"] == cluster]
        med = [statistics.median(speedup(r, "zb1-ga", b) for r in rs) for b in ("zb1", "1f1b-ga", "1f1b")]
        lines.append(f"- {cluster}: " + ", ".join(f"{m:.3f}×" for m in med)
                     + f" (max over zb1: {max(speedup(r, 'zb1-ga', 'zb1') for r in rs):.3f}×)")
    config = f"simulated, estimated V100 profiles, {' and '.join(clusters)}, batch {BATCH}, {len(rows)} cases"
    best = max(rows, key=lambda r: speedup(r, "zb1-ga", "zb1"))
    headlines = (
        Headline("methods", "zb1-ga over the best equal zb1 plan, median", statistics.median(
            speedup(r, "zb1-ga", "zb1") for r in rows), config=config),
        Headline("methods", f"zb1-ga over the best equal zb1 plan, the most ({best['network']}, {best['cluster']})",
                 speedup(best, "zb1-ga", "zb1"), config=config),
        Headline("methods", "zb1-ga over the best equal 1f1b plan, median", statistics.median(
            speedup(r, "zb1-ga", "1f1b") for r in rows), config=config))
    nets = list(dict.fromkeys(r["network"] for r in rows))
    chart = Chart("methods", "speedups", "zb1-ga over the best equal zb1 plan, per network", "bars", "speed-up (×)",
                  categories=tuple(nets), series=tuple((c, tuple(next((speedup(r, "zb1-ga", "zb1") for r in rows if (
                      r["network"], r["cluster"]) == (n, c)), None) for n in nets)) for c in clusters))
    return Report("\n".join(lines), headlines, (chart,))


EXPERIMENT = Experiment(name="zb1-ga-sim", title="Unequal micro-batches under ZB-H1 (zb1-ga), simulated",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=1)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
