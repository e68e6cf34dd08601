"""Planner benchmark (d): does the planners' top prediction match the measured best, on 2 local ranks?

    .venv/bin/python benchmarks/bench_planner_measured.py --repeats 5     # full: 5 launches per model
    .venv/bin/python benchmarks/bench_planner_measured.py --quick     # mlp, 1 launch, 3 plans, 2 timed steps

Results go to ``benchmarks/results/planner-measured/``.

Per model (mlp at batch 32; gpt-tiny and optionally gnmt-tiny at 64), from one measured profile and the
local 2-rank cluster (:func:`pipetrain.api.local_cluster`, or a probed one with ``--probes``):

* candidate plans of every planner, all predicted by the event simulator on the same cost model:
  the balanced equal planner (gpipe and 1f1b, 2 stages, every micro-batch count; PAPERS.md §1.3),
  PipeDream's DP (replicated stages included, §2.3–2.4), BaPipe's explorer (1 or 2 stages, §4),
  and plain data parallelism (the whole model replicated on both ranks, two micro-batches);
* deduplicated, then 6–8 kept: each planner's choice, data parallelism, the predicted top few and
  evenly spread slower ones up to ``--max-slowdown`` times the predicted best;
* all kept plans run in one :func:`~pipetrain.runtime.train.train_many` launch (one thread per
  rank, gloo); the launch repeats ``--repeats`` times (the harness's rounds), the order reversing
  every other time; a
  plan's measured step time (s) is the median over launches of its median timed step (warm-up
  steps excluded). A plan on one rank leaves rank 1 idle.

Reported per model: the predicted and measured rankings, Kendall's tau-b between them, whether the
predicted best is the measured best and the measured gap between them, and each plan's prediction
error (predicted − measured) / measured. Targets (issue 17): tau-b ≥ 0.8 on mlp and gpt-tiny, the
predicted best measured within 5% of the measured best.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from common.partition_candidates import Option, candidates, distinct, keep
from common.partition_ranking import ranking_report
from harness import Context, Experiment, Row, bounded, main

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.runtime import TrainConfig, TrainJob, train_many

MODELS = {"mlp": 32, "gpt-tiny": 64, "gnmt-tiny": 64}
TIMED_STEPS = {"mlp": 5, "gpt-tiny": 15, "gnmt-tiny": 10}


@dataclass
class ModelSetup:
    """One model's kept plans (predicted fastest first), ready to launch."""

    model: str
    batch: int
    steps: int
    graph: LayerGraph
    options: list[Option]
    n_candidates: int  # distinct candidate plans before keeping
    cluster: str


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["mlp", "gpt-tiny"], choices=sorted(MODELS))
    p.add_argument("--batch", type=int, help="samples per mini-batch for every model (default: MODELS)")
    p.add_argument("--plans", type=int, default=7, help="plans to keep per model (default 7; 3 with --quick)")
    p.add_argument("--max-slowdown", type=float, default=2.5, help="keep no plan predicted slower than this × best")
    p.add_argument("--probes", type=int, default=0, help="probe the link and contention (median of N); 0: defaults")
    p.add_argument("--timeout", type=float, default=300.0, help="wall-clock bound per launch (s)")


def settings(ctx: Context) -> list[ModelSetup]:
    """Profile each model, plan every candidate on the (probed or default) local cluster, keep a few."""
    args = ctx.args
    if args.probes:
        cluster, _ = probe_cluster(CPU_ACTION_OVERHEAD_S, args.probes)
        cluster_text = f"probed ({args.probes} probes)"
    else:
        cluster = api.local_cluster(2)
        cluster_text = "api.local_cluster(2) defaults (loopback link, no contention)"
    setups = []
    for model in ["mlp"] if ctx.quick else args.models:
        batch = args.batch or MODELS[model]
        graph = build_model(model)
        # a quick run times each (layer, size) once: it checks the pipeline end to end, not the figures
        profile = api.profile_model(graph, batch, repeats=1) if ctx.quick else profile_logged(graph, batch)
        cost = CostModel(profile, cluster)
        t0 = time.perf_counter()
        options = distinct(candidates(graph, cost, batch))
        kept = keep(options, 3 if ctx.quick else args.plans, top=3, max_slowdown=args.max_slowdown)
        ctx.log(f"[{model}] {len(options)} distinct candidates in {time.perf_counter() - t0:.1f} s; keeping "
                + ", ".join(o.label for o in kept))
        steps = WARMUP_STEPS + (2 if ctx.quick else TIMED_STEPS[model])
        setups.append(ModelSetup(model, batch, steps, graph, kept, len(options), cluster_text))
    return setups


def run(s: ModelSetup, ctx: Context) -> list[Row]:
    """Every kept plan of ``s`` in one launch; the order reverses on odd rounds. One row per plan."""
    order = s.options if ctx.round % 2 == 0 else s.options[::-1]
    config = TrainConfig(steps=s.steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                         timeout_s=60.0)
    results, status = bounded(lambda: train_many([TrainJob(s.graph, o.plan, config) for o in order]),
                              ctx.args.timeout)
    rows = []
    for k, o in enumerate(order):
        r = None if results is None else results[k]
        rows.append({"model": s.model, "batch": s.batch, "steps": s.steps, "n_candidates": s.n_candidates,
                     "cluster": s.cluster, "label": o.label, "sources": o.sources, "predicted_s": o.predicted_s,
                     "launch": ctx.round, "status": "ok" if r is not None else status,
                     "step_s": None if r is None else s.batch / r.samples_per_s,
                     "timeline_s": None if r is None else r.timeline.iteration_s,
                     "step_times_s": [] if r is None else list(r.step_times_s)})
    ctx.log(f"launch {ctx.round + 1} [{s.model}]: "
            + ", ".join(f"{r['label']} {r['step_s'] or float('nan'):.4f} s" for r in rows))
    return rows


EXPERIMENT = Experiment(name="planner-measured",
                        title="Partitioning (d): does the planners' top prediction win, measured on 2 ranks",
                        settings=settings, run=run, report=ranking_report, arguments=arguments, repeats=5)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
