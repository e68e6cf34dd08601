"""interleaved-ga (per-virtual-stage micro-batches) against the best equal interleaved plan, simulated.

    .venv/bin/python benchmarks/bench_interleaved_ga_sim.py             # ~1.5 min on the shared 2-core machine
    .venv/bin/python benchmarks/bench_interleaved_ga_sim.py --quick     # synthetic-0 on 4 V100s, a tiny GA

The networks, clusters and estimated V100 profiles of ``bench_zb1_ga_sim.py`` (BENCHMARKS.md
"UMPIPE (a)", :mod:`common.umpipe_networks`). For each network and cluster, the ``interleaved``
planner's plan (Megatron's interleaved 1F1B, Narayanan et al. SC'21: chunk and micro-batch counts
searched, equal micro-batches), then ``interleaved-ga`` on its stages: each virtual stage its own
partition (UMPIPE's per-stage sizes, Zhou et al. TPDS 2025), ordered by
:mod:`pipetrain.schedule.interleaved_unequal`. Times are the event simulator's; memory is not
capped. The GA is seeded with every equal count, so part of a gain can be an equal count the
interleaved planner's thinned search skipped: the last column says whether the stages' partitions
really differ.
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
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.planners.microbatch.ga import GAConfig, interleaved_ga
from pipetrain.planners.microbatch.uedp import with_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.vectorised import StageTables


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--population", type=int, default=32, help="GA population (default 32; 8 with --quick)")
    p.add_argument("--generations", type=int, default=40, help="GA generations (default 40; 4 with --quick)")


def settings(ctx: Context) -> list[tuple[str, str]]:
    if ctx.quick:
        return [(V100_CLUSTERS[0], "synthetic-0")]
    return [(c, n) for c in V100_CLUSTERS for n in networks(quick=False)]


def run(setting: tuple[str, str], ctx: Context) -> list[Row]:
    """The equal interleaved plan and interleaved-ga's, event-simulated."""
    cluster_name, network = setting
    o = ctx.args
    config = GAConfig(population=8, generations=4) if ctx.quick else GAConfig(o.population, o.generations)
    graph = build(network)
    cost = CostModel(estimate_profile(graph, "v100", BATCH), cluster_of(cluster_name))
    # method interleaved only: the planner also weighs interleaved-zb, zbv and dualpipev, not interleaved-ga's order
    problem = PlanningProblem(ModelRef.of(graph), cost, BATCH, constraints=Constraints(method=Method.INTERLEAVED))
    planned = plan_interleaved(problem)
    base, cost = planned.plan, cost.on(planned.cluster)
    t0 = time.perf_counter()
    result = interleaved_ga(StageTables.from_plan(base, cost), base.n_ranks, seed=ctx.seed, config=config)
    search_s = time.perf_counter() - t0
    plan = with_sizes(base, result)
    equal_s, ga_s = (simulate(build_schedule(p), p, cost).iteration_s for p in (base, plan))
    return [{"network": network, "cluster": cluster_name, "ranks": base.n_ranks, "chunks": base.virtual_stages,
             "equal_s": equal_s, "ga_s": ga_s, "search_s": search_s, "equal_micro": len(base.stages[0].forward_sizes),
             "ga_micro": [len(s.forward_sizes) for s in plan.stages],
             "unequal": len({s.forward_sizes for s in plan.stages}) > 1}]


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| network | cluster | ranks × chunks | equal interleaved ms (m) | interleaved-ga ms | speed-up | "
             "interleaved-ga micro-batches per stage | stages differ |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        counts, differ = "/".join(map(str, r["ga_micro"])), "yes" if r["unequal"] else "no"
        lines.append(f"| {r['network']} | {r['cluster']} | {r['ranks']} × {r['chunks']} | {1e3 * r['equal_s']:.2f} "
                     f"({r['equal_micro']}) | {1e3 * r['ga_s']:.2f} | {r['equal_s'] / r['ga_s']:.3f}× | {counts} | "
                     f"{differ} |")
    clusters = list(dict.fromkeys(r["cluster"] for r in rows))
    for cluster in clusters:
        gains = [r["equal_s"] / r["ga_s"] for r in rows if r["cluster"] == cluster]
        lines.append(f"\n- {cluster}: median {statistics.median(gains):.3f}×, max {max(gains):.3f}×")
    config = f"simulated, estimated V100 profiles, {' and '.join(clusters)}, batch {BATCH}, {len(rows)} cases"
    best = max(rows, key=lambda r: r["equal_s"] / r["ga_s"])
    headlines = (
        Headline("methods", "interleaved-ga over the best equal interleaved plan, median",
                 statistics.median(r["equal_s"] / r["ga_s"] for r in rows), config=config),
        Headline("methods", f"interleaved-ga over the best equal interleaved plan, the most ({best['network']}, "
                            f"{best['cluster']}, stages differ: {'yes' if best['unequal'] else 'no'})",
                 best["equal_s"] / best["ga_s"], config=config))
    nets = list(dict.fromkeys(r["network"] for r in rows))
    chart = Chart("methods", "speedups", "interleaved-ga over the equal interleaved plan, per network", "bars",
                  "speed-up (×)", categories=tuple(nets), series=tuple((c, tuple(next((
                      r["equal_s"] / r["ga_s"] for r in rows if (r["network"], r["cluster"]) == (n, c)), None)
                      for n in nets)) for c in clusters))
    return Report("\n".join(lines), headlines, (chart,))


EXPERIMENT = Experiment(name="interleaved-ga-sim",
                        title="Unequal micro-batches under interleaved 1F1B (interleaved-ga), simulated",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=1)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
