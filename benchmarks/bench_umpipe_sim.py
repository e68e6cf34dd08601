"""UMPIPE benchmark 7(a): simulated iteration time of unequal micro-batches on V100 and H100 clusters.

    .venv/bin/python benchmarks/bench_umpipe_sim.py                # ~55 min on the shared 2-core machine
    .venv/bin/python benchmarks/bench_umpipe_sim.py --quick        # 2 networks, 4 V100s, a tiny GA

For each cluster (4 and 8 V100s, 4 and 8 H100s) and network (gpt1-14, vgg16 and 10 synthetic
networks, :mod:`common.umpipe_networks`), with profiles *estimated* from the device models
(:mod:`pipetrain.profile.estimate`) and one stage per device, it plans the best equal gpipe and
1f1b plans (every count searched), the paper-style ``gpipe@4K`` and ``1f1b@4K`` (a fixed 4K
micro-batches for K stages, GPipe's own rule), and on the faster equal plan's stages UMPIPE's
planners (greedy, dp, tidgap, its single-chromosome and recompute-free ablations, 1f1b-ga) and
``tidgap-cuts``, tidgap with the stage cuts searched too (:mod:`common.umpipe_plans`).

Every reported time is the **event simulator's** iteration time of the final plan. Speed-ups are
``T_baseline / T``; the headlines put tidgap-cuts beside the paper's figures (UMPIPE's abstract:
+13.89% over GPipe on GPT1-14, +17.11% on VGG16, ≥ +170% on synthetic networks) against both
baselines, labelled: the paper does not publish its baselines' micro-batch count. The run's folder
keeps Gantt pictures (best equal plan beside tidgap-cuts') of gpt1-14 and synthetic-0 on 4xV100 and
8xH100.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.umpipe_networks import BATCH, CLUSTERS, build, networks
from common.umpipe_plans import plan_all
from common.umpipe_report import umpipe_report
from harness import Context, Experiment, Report, Row, RunInfo, main

from pipetrain.planners.microbatch.ga import GAConfig
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile
from pipetrain.viz.gantt import save_gantt

GANTT = {("gpt1-14", "4xV100"), ("gpt1-14", "8xH100"), ("synthetic-0", "4xV100"), ("synthetic-0", "8xH100")}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--population", type=int, default=128, help="GA population (default 128; 16 with --quick)")
    p.add_argument("--generations", type=int, default=500, help="GA generations (default 500; 10 with --quick)")
    p.add_argument("--cut-rounds", type=int, default=3, help="hill-climbing rounds of the cut search (default 3; "
                                                             "1 with --quick)")


def ga_configs(info: RunInfo) -> tuple[GAConfig, GAConfig, int]:
    """tidgap's GA, 1f1b-ga's (at most 64 × a quarter of the generations) and the cut-search rounds."""
    if info.quick:
        return GAConfig(population=16, generations=10), GAConfig(population=16, generations=2), 1
    population, generations = info.options["population"], info.options["generations"]
    return (GAConfig(population=population, generations=generations),
            GAConfig(population=min(64, population), generations=max(1, generations // 4)), info.options["cut_rounds"])


@functools.cache
def _profile(network: str, device: str) -> Profile:
    return estimate_profile(build(network), device, BATCH)


def settings(ctx: Context) -> list[tuple[str, str]]:
    clusters = ["4xV100"] if ctx.quick else list(CLUSTERS)
    return [(cluster, network) for cluster in clusters for network in networks(ctx.quick)]


def run(setting: tuple[str, str], ctx: Context) -> list[Row]:
    cluster, network = setting
    config, ga_1f1b, cut_rounds = ga_configs(ctx.info)
    row, timelines = plan_all(network, cluster, _profile(network, CLUSTERS[cluster][0]), config, ga_1f1b, ctx.seed,
                              cut_rounds)
    if (network, cluster) in GANTT:
        best = min(("gpipe", "1f1b"), key=lambda m: row["times_s"][m])  # type: ignore[index]
        save_gantt([timelines[best], timelines["tidgap-cuts"]], ctx.artifact(f"gantt_{network}_{cluster}.png"),
                   [f"best equal ({best})", "tidgap-cuts"])
    return [row]


def report(rows: list[Row], info: RunInfo) -> Report:
    config, _, cut_rounds = ga_configs(info)
    setting = (f"batch {BATCH}, one stage per device, GA population {config.population}, {config.generations} "
               f"generations, seed {info.seed}, cut search {cut_rounds} rounds")
    return umpipe_report(rows, setting)


EXPERIMENT = Experiment(name="umpipe-sim", title="UMPIPE (a): simulated speed-ups of unequal micro-batches",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=1)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
