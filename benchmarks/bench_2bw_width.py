"""PipeDream-2BW's width: parallel pipelines (``w × d``) against straight ones and GPipe, simulated.

    .venv/bin/python benchmarks/bench_2bw_width.py                        # results in benchmarks/results/2bw-width
    .venv/bin/python benchmarks/bench_2bw_width.py --models gpt-1.3b --devices 8
    .venv/bin/python benchmarks/bench_2bw_width.py --quick                # a small GPT on 4 devices

The 2BW paper (Narayanan et al., ICML'21, §5) trains GPT models of 1.3B, 2.2B and 3.8B parameters
on V100-16GB servers (p3.16xlarge) and reports up to 3.2× over GPipe, most of it from running ``w``
parallel pipelines of depth ``d`` (``w · d = N``) with the stages' gradients all-reduced once per
batch. This script plans the same models (:mod:`common.async_papers`: context 512, vocabulary
50257, batch 512, Adam) on 8 and 16 V100-16GB (servers of 8, NVLink inside, 25 Gbit/s between),
with profiles *estimated* for a V100 and every time from the event simulator:

* ``2bw``: ``plan --planner 2bw`` (docs/algorithms.md §3.6: width × depth, micro-batch size,
  recompute under memory); its chosen ``(w, d, b, recompute)`` and steady-state seconds per batch;
* ``2bw w=1``: the fastest straight pipeline of the same search (the planner's candidates with
  ``w = 1``: what the planner chose before replicated 2BW stages could run);
* ``gpipe``: the fastest GPipe plan that fits over the same pairs, stages and micro-batch sizes
  (replicated stages allowed, recompute only when needed), seconds per batch (one flush each);
  ``gpipe w=1`` the same over straight pipelines.

A full run takes 30–60 minutes on 2 shared cores (the 2BW planner simulates every pair).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.async_papers import GPT_SIZES, QUICK_GPT
from common.async_width import report, width_row
from harness import Context, Experiment, Row, main

DEVICES = (8, 16)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", choices=list(GPT_SIZES), default=list(GPT_SIZES),
                   help="GPT sizes to plan (default all three)")
    p.add_argument("--devices", type=int, nargs="+", default=list(DEVICES), help="cluster sizes (servers of 8)")


def settings(ctx: Context) -> list[tuple[str, int]]:
    if ctx.quick:
        return [(next(iter(QUICK_GPT)), 4)]
    return [(m, d) for d in ctx.args.devices for m in ctx.args.models]


def run(case: tuple[str, int], ctx: Context) -> list[Row]:
    row = width_row(*case)
    ctx.log(f"{case[0]} on {case[1]}: 2bw {row['twobw_s']:.3f} s ({row['twobw_plan']}), w=1 {row['straight_s']:.3f} s,"
            f" gpipe {row['gpipe_s']:.3f} s ({row['gpipe_plan']})")
    return [row]


EXPERIMENT = Experiment(name="2bw-width", title="PipeDream-2BW: width × depth against straight pipelines and GPipe, "
                        "simulated on V100s", settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
