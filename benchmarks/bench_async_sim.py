"""Asynchronous pipelines against the papers, simulated: PipeDream vs data parallelism, 2BW vs GPipe.

    .venv/bin/python benchmarks/bench_async_sim.py            # results in benchmarks/results/async-sim
    .venv/bin/python benchmarks/bench_async_sim.py --quick    # vgg16 on cluster A, a small GPT on 4 devices

Profiles are *estimated* for a V100 (:mod:`pipetrain.profile.estimate`); every time is the event
simulator's. Devices are V100-16GB, as in both papers (docs/algorithms.md §3.1).

**PipeDream vs data parallelism** (PipeDream, SOSP'19: up to 5.3× on VGG-16, 5.28× on cluster A;
GNMT-16 2.34× on cluster A and 3.14× on B; time to accuracy on real clusters). vgg16 and gnmt
(zoo) on the paper's two cluster kinds: ``A``: servers of 4 V100 on PCIe (assumed 10 GB/s, 10 µs)
joined by 10 Gbit/s Ethernet; ``B``: servers of 8 V100 on NVLink (150 GB/s, 5 µs) joined by
25 Gbit/s. The batch is 64 samples per device (PipeDream's per-GPU minibatch for VGG-16),
``B = 64 · D``. (The clusters as files, and this comparison by the current planner, which may
answer data parallelism: ``bench_pipedream_paper.py``.)

* ``data parallel``: every layer on every device, micro-batches round-robin, gradients all-reduced
  once per batch (gpipe, ``m`` a multiple of ``D``, the fastest ``m``): seconds per batch;
* ``pipedream``: ``plan --planner pipedream --method pipedream`` (docs/algorithms.md §3.6: the DP's
  steady-state objective, 1F1B-RR), micro-batches of at least 32 samples: steady-state seconds per
  batch (no flush);
* speed-up: data parallel's seconds per batch over pipedream's (the same samples).

**2BW vs GPipe and PipeDream-Flush** (PipeDream-2BW, ICML'21: up to 3.2× over GPipe, GPT on
V100-16GB; :mod:`common.async_papers`): GPT 1.3B, 2.2B and 3.8B, batch 512, Adam, on 8 and 16
devices (p3.16xlarge servers of 8, NVLink, 25 Gbit/s).

* ``2bw``: ``plan --planner 2bw`` (width × depth, micro-batch size, recompute under memory);
* ``gpipe`` and ``1f1b`` (PipeDream-Flush): the same search space over straight pipelines (depth
  ``1..D`` with idle devices allowed, balanced stages, micro-batches of powers of two up to 64 of
  them, recompute on or off), the fastest plan that fits, seconds per batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.async_papers import GPT_SIZES, QUICK_GPT
from common.async_sim_report import report
from common.async_sim_runs import CLUSTERS, pipedream_row, twobw_row
from harness import Context, Experiment, Row, main


def settings(ctx: Context) -> list[tuple[str, str, object]]:
    """``("pipedream", model, cluster)`` and ``("2bw", gpt size, devices)`` cases."""
    if ctx.quick:
        return [("pipedream", "vgg16", "A 4x4"), ("2bw", next(iter(QUICK_GPT)), 4)]
    return ([("pipedream", m, c) for m in ("vgg16", "gnmt") for c in CLUSTERS]
            + [("2bw", name, devices) for name in GPT_SIZES for devices in (8, 16)])


def run(case: tuple[str, str, object], ctx: Context) -> list[Row]:
    kind, model, where = case
    row = pipedream_row(model, str(where)) if kind == "pipedream" else twobw_row(model, int(str(where)))
    ctx.log(f"{kind} {model} {where}: {row}")
    return [row]


EXPERIMENT = Experiment(name="async-sim", title="Asynchronous pipelines against the PipeDream and 2BW papers, "
                        "simulated on V100s", settings=settings, run=run, report=report)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
