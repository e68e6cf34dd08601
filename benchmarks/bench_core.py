"""Core: pipetrain against every torch.distributed.pipelining schedule and single-process training,
and the simulator's predictions against what ran (prediction fidelity).

    .venv/bin/python benchmarks/bench_core.py                   # the full run, 5 rounds (about 45 min on 2 cores)
    .venv/bin/python benchmarks/bench_core.py --quick           # gpt-tiny at batch 16, m=2, 1 round (about 4 min)
    .venv/bin/python benchmarks/bench_core.py --kinds torch --models gpt-tiny    # torch's schedules alone

Throughput on 2 local ranks (gloo, one thread each) for each model: single-process training (one
thread), every torch.distributed.pipelining schedule at the micro-batch counts m of ``--micro`` that
torch allows (:mod:`common.torch_schedules`), pipetrain gpipe/1f1b/zb1 at the same m (its balanced
two-stage partition, checked against torch's equal-layer split) and interleaved and zbv (2 chunks
per rank, looping or in a V), and pipetrain's ``planned`` setting (``auto``: every planner tried,
the fastest prediction kept), planned from a cluster probed on each model's own work (contention)
and calibrated on it (:mod:`pipetrain.calibrate.fit`). Fidelity: the predicted iteration time of
every pipetrain run against the measured one, and the ranking of the settings.

Every configuration runs once per round (the harness rotates the starting one); a configuration's
figure is the median over rounds of its runs' samples/s (each run: the batch over its median timed
step, after 2 warm-up steps). A configuration that times out is not retried; one that fails is.
Single-process training runs in a fresh process twice: plain PyTorch (``single``) and with
pipetrain's allocator setting (``single+alloc``, :mod:`pipetrain.allocator`); ``planned-noalloc`` is
the planned setting without it, so the two effects can be told apart. Each torch schedule runs both
ways too (``torch`` and ``torch+alloc``, issue 30): the target compares pipetrain with torch on the
same allocator.

Artifacts of a run: the probed cluster, each model's calibrated cluster and profile (what its
predictions were made from), and ``gantt_<model>.png``: the planned setting predicted beside its
median measured run.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.core_plans import describe
from common.core_report import report
from common.core_run import run_config
from common.core_setup import KINDS, Config, ModelSetup, configs, setup_model
from common.measured import WARMUP_STEPS, probe_cluster
from harness import Context, Experiment, Row, main

from pipetrain.cluster import CPU_ACTION_OVERHEAD_S
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.simulate.timeline import Timeline
from pipetrain.viz.gantt import save_gantt

BATCH = {"mlp": 128, "gpt-tiny": 64}


@dataclass(frozen=True)
class Job:
    """One configuration of one model: the harness's setting."""

    setup: ModelSetup
    config: Config


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", help="zoo models (default mlp gpt-tiny; --quick: gpt-tiny)")
    p.add_argument("--micro", type=int, nargs="+", help="micro-batch counts (default 1 2 4 8; --quick: 2)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="which configurations (default all)")
    p.add_argument("--mlp-batch", type=int, default=BATCH["mlp"])
    p.add_argument("--gpt-batch", type=int, help=f"gpt-tiny's batch (default {BATCH['gpt-tiny']}; --quick: 16)")
    p.add_argument("--timeout", type=float, default=150.0, help="wall-clock bound per run (s, default 150)")
    p.add_argument("--overhead", type=float, default=None,
                   help=f"cluster action_overhead_s (default: measured by the probe; {CPU_ACTION_OVERHEAD_S} before)")
    p.add_argument("--probes", type=int, default=5, help="link/contention probes, median kept (default 5)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="price with the probe's terms only (default: calibrate speed and overhead on each model)")


def steps_for(model: str, quick: bool) -> int:
    """Steps per run, warm-up included: enough timed steps for a stable median, bounded wall time."""
    if quick:
        return WARMUP_STEPS + (1 if model == "mlp" else 3)
    return WARMUP_STEPS + (5 if model == "mlp" else 20)


def settings(ctx: Context) -> list[Job]:
    """Probe the machine, then each model's own contention; profile, calibrate and plan each model."""
    a = ctx.args
    models = a.models or (["gpt-tiny"] if ctx.quick else ["mlp", "gpt-tiny"])
    micro = a.micro or ([2] if ctx.quick else [1, 2, 4, 8])
    batches = {"mlp": a.mlp_batch, "gpt-tiny": a.gpt_batch or (16 if ctx.quick else BATCH["gpt-tiny"])}
    probes = min(a.probes, 2) if ctx.quick else a.probes
    cluster, probe = probe_cluster(a.overhead, probes)
    write_atomic(ctx.artifact("cluster.json"), cluster.to_json())
    setups = []
    for m in models:  # the contention of each model's own work: two halves at a quarter of its batch
        batch = batches.get(m, 64)
        own, info = probe_cluster(cluster.action_overhead_s, probes, (build_model(m), max(1, batch // 4)), cluster)
        setup = setup_model(m, batch, steps_for(m, ctx.quick), own, micro, a.calibrate, ctx.quick)
        setup.info.update(probe=probe, model_shared_speed=info["shared_speed"], warmup_steps=WARMUP_STEPS,
                          micro=micro)
        write_atomic(ctx.artifact(f"cluster_{m}.json"), setup.cluster.to_json())
        write_atomic(ctx.artifact(f"profile_{m}.json"), setup.profile.to_json())
        setups.append(setup)
    return [Job(s, c) for s in setups for c in configs(micro, a.kinds)]


def run(job: Job, ctx: Context) -> list[Row]:
    """One run of one configuration; the model's setup as a row of its own with its first run."""
    setup, config = job.setup, job.config
    rows: list[Row] = [] if setup.reported else [{"row": "model", **setup.info}]
    setup.reported = True
    if config.label in setup.failed:
        return rows
    t0 = time.perf_counter()
    row, timeline = run_config(setup, config, ctx.args.timeout)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    if row["status"].startswith("timeout"):  # errors are cheap and may be transient: retried each round
        setup.failed.add(config.label)
    if config.kind == "planned" and timeline is not None:
        row["gantt"] = _gantt(setup, row["samples_per_s"], timeline, ctx)
    ctx.log(f"  {setup.name} {config.label}: {row['status']}, {row['samples_per_s'] or 0:.1f} samples/s")
    return [*rows, row]


def _gantt(setup: ModelSetup, samples_per_s: float, timeline: Timeline, ctx: Context) -> str:
    """Draw the planned setting predicted beside its median measured run so far; the picture's path
    relative to the results folder."""
    setup.planned_runs.append((samples_per_s, timeline))
    ordered = sorted(setup.planned_runs, key=lambda p: p[0])
    plan, path = setup.plans["planned"], ctx.artifact(f"gantt_{setup.name}.png")
    save_gantt([setup.predicted["planned"], ordered[(len(ordered) - 1) // 2][1]], path,
               [f"predicted: {setup.name} {describe(plan)}", "measured (median run)"], stage_of_rank=plan.rank_stages)
    return f"{ctx.artifacts.name}/{path.name}"


EXPERIMENT = Experiment(name="core", title="Core: pipetrain against every torch schedule, and prediction fidelity",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=5)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
