"""Partition benchmark (a): PipeDream and BaPipe plans vs data parallelism vs an equal-layer split.

    .venv/bin/python benchmarks/bench_partition_sim.py            # full: 4 models × 4, 8, 16 V100s
    .venv/bin/python benchmarks/bench_partition_sim.py --quick    # vgg16 on 4 and 8 V100s

Results go to ``benchmarks/results/partition-sim/``. Clusters (assumptions): 4, 8 and 16 V100s in
servers of 4, NVLink inside a server (150 GB/s, 5 µs), 25 Gbit/s Ethernet between servers
(3.125 GB/s, 20 µs). Profiles are *estimated* (:mod:`pipetrain.profile.estimate`) at batch
``--batch`` (default 64). For vgg16, resnet50, gnmt and gpt1-14 (zoo) on each cluster of ``D``
devices it plans:

* ``data parallel``: one stage with every layer, replicated on all ``D`` ranks; micro-batches go
  round-robin to the replicas and the replicas all-reduce at the optimizer step; gpipe with ``m``
  equal micro-batches, ``m`` a multiple of ``D``, the fastest ``m``;
* ``equal split``: ``min(D, L)`` stages of (nearly) equal layer *counts*, one rank each, gpipe and
  1f1b, every micro-batch count of :func:`~pipetrain.planners.counts.thinned_counts`, the fastest;
* ``pipedream``: :func:`~pipetrain.planners.pipedream.plan_pipedream` (PAPERS.md §2.3–2.4: the
  hierarchical DP's stages and replicas, run synchronously);
* ``pipedream straight``: the same with ``straight=True`` (no replication: PipeDream's straight
  pipeline), the fair yardstick for BaPipe, which never replicates a stage;
* ``bapipe``: :func:`~pipetrain.planners.bapipe.explore` with gpipe and 1f1b (PAPERS.md §4).

Every time is the **event simulator's** iteration time (seconds per mini-batch). Memory is the peak
over stages of :func:`~pipetrain.simulate.memory.stage_memory` (SGD); ``fits`` compares it with the
V100's 32 GiB. Planner wall times are one call each on this machine. The papers' claims are beside
ours for reference only: PipeDream's "up to 5.3× over data parallelism" (VGG-16) is time-to-accuracy
measured on real clusters with asynchronous weight updates; BaPipe's "up to 3.2× faster, 4× less
memory" is measured on its own clusters. Ours is simulated iteration time of synchronous schedules.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.clusters import v100_servers
from common.partition_plans import EQUAL, data_parallel, equal_split, plan_row
from common.partition_report import partition_report
from harness import Context, Experiment, Row, main

from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.planners.bapipe import explore
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.planners.pipedream import PipeDreamReport, plan_pipedream
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile

MODELS = ("vgg16", "resnet50", "gnmt", "gpt1-14")
DEVICE_COUNTS = (4, 8, 16)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=64, help="samples per mini-batch (default 64)")


def settings(ctx: Context) -> list[tuple[str, int]]:
    if ctx.quick:
        return [("vgg16", 4), ("vgg16", 8)]
    return [(model, d) for model in MODELS for d in DEVICE_COUNTS]


@cache
def _profile(model: str, batch: int) -> Profile:
    return estimate_profile(build_model(model), "v100", batch)


def run(setting: tuple[str, int], ctx: Context) -> list[Row]:
    """The five planners' plans for one model on one cluster, simulated."""
    model, n_devices = setting
    batch = ctx.args.batch
    graph, profile = build_model(model), _profile(model, batch)
    cost = CostModel(profile, v100_servers(n_devices))
    problem = PlanningProblem(ModelRef.of(graph), cost, batch)
    rows = []
    for planner in ("data parallel", "equal split", "pipedream", "pipedream straight", "bapipe"):
        t0 = time.perf_counter()
        config = ""
        if planner == "data parallel":
            plan, plan_cost = data_parallel(graph, cost, batch), cost
        elif planner == "equal split":
            plan, plan_cost = equal_split(graph, cost, batch), cost
        elif planner == "bapipe":
            result = explore(problem, methods=EQUAL)
            plan, plan_cost = result.plan, CostModel(profile, result.cluster)
        else:
            result = plan_pipedream(problem, straight=planner == "pipedream straight")
            assert isinstance(result.report, PipeDreamReport)
            plan, plan_cost, config = result.plan, CostModel(profile, result.cluster), result.report.config
        seconds = time.perf_counter() - t0
        rows.append({"model": model, "n_layers": len(graph.names), "n_devices": n_devices, "batch": batch,
                     **plan_row(planner, plan, plan_cost, seconds, config)})
    t = {r["planner"]: r["iteration_s"] for r in rows}
    ctx.log(f"{model} D={n_devices}: pipedream {t['data parallel'] / t['pipedream']:.2f}×, "
            f"bapipe {t['data parallel'] / t['bapipe']:.2f}× over data parallelism")
    return rows


EXPERIMENT = Experiment(name="partition-sim",
                        title="Partitioning (a): PipeDream and BaPipe against data parallelism and an equal split",
                        settings=settings, run=run, report=partition_report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
