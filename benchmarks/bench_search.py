"""UMPIPE benchmark 7(b): search time of TiDGAP (vectorised fitness) against DGAP (one plan at a time).

    .venv/bin/python benchmarks/bench_search.py --repeats 9     # ~1 min on a quiet 2-core machine
    .venv/bin/python benchmarks/bench_search.py --quick         # small sizes, 1 round

Both GAs run the same operators from the same seed and their evaluators give bit-identical times,
so at equal population and generations they return the same plan; only the fitness call differs:
TiDGAP times the whole population ``[P, K, B]`` in one :func:`~pipetrain.simulate.vectorised.
iteration_times` call per generation, DGAP calls :func:`~pipetrain.simulate.vectorised.
iteration_time` ``P`` times. Each round measures:

1. **ratio**: DGAP / TiDGAP wall time at equal ``P`` and ``G`` (target ≥ 20×), one pair per round
   (which runs first alternates by round, after one untimed warm-up call of each in the first
   round); the report gives the median of the per-pair ratios and of the process's CPU-second
   ratios, which a shared, loaded machine distorts less, and checks that both return the same plan;
2. **headline**: TiDGAP on 8 stages, batch 256, population 128, 500 generations (target ≤ 10 s on
   the 2-core development machine), one run per round;
3. **scaling** (first round only): seconds per generation of both as the stage count (batch 256)
   and the batch (8 stages) grow, with ``--scaling-generations`` generations per point.

Cost tables are synthetic and seeded (:func:`common.umpipe_search.tables`); search time hardly
depends on the numbers, only on ``P``, ``G``, ``K`` and ``B``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.umpipe_search import per_generation, ratio_pair, search_report, tables, timed
from harness import Context, Experiment, Report, Row, RunInfo, main

from pipetrain.planners.microbatch.ga import GAConfig, tidgap

Setting = tuple[str, int, int]  # (kind, stages, batch)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scaling-generations", type=int, default=50,
                   help="generations per scaling point (default 50; 5 with --quick)")


def settings(ctx: Context) -> list[Setting]:
    if ctx.quick:
        return [("ratio", 4, 32), ("headline", 8, 256), *(("scaling", k, 256) for k in (2, 4)),
                *(("scaling", 8, b) for b in (32, 64))]
    return [("ratio", 4, 64), ("ratio", 8, 256), ("headline", 8, 256),
            *(("scaling", k, 256) for k in (2, 4, 8, 16)), *(("scaling", 8, b) for b in (32, 64, 128, 512, 1024))]


def run(setting: Setting, ctx: Context) -> list[Row]:
    kind, n_stages, batch = setting
    if kind == "ratio":
        config = GAConfig(population=128, generations=5 if ctx.quick else 20)
        return [{"kind": kind, **ratio_pair(n_stages, batch, config, ctx.round)}]
    if kind == "headline":
        config = GAConfig(population=128, generations=20 if ctx.quick else 500)
        seconds, _ = timed(tidgap, tables(n_stages, batch), config, ctx.round)
        return [{"kind": kind, "stages": n_stages, "batch": batch, "population": 128,
                 "generations": config.generations, "tidgap_s": seconds}]
    if ctx.round > 0:
        return []
    generations = 5 if ctx.quick else ctx.args.scaling_generations
    return [{"kind": kind, **per_generation(n_stages, batch, generations, 1 if ctx.quick else 10)}]


def report(rows: list[Row], info: RunInfo) -> Report:
    return search_report(rows)


EXPERIMENT = Experiment(name="search", title="UMPIPE (b): GA search time, TiDGAP against DGAP", settings=settings,
                        run=run, report=report, arguments=arguments, repeats=5)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
