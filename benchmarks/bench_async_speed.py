"""Steady-state speed of the asynchronous methods, measured on 2 local ranks, predicted beside it.

    .venv/bin/python benchmarks/bench_async_speed.py                 # results in benchmarks/results/async-speed
    .venv/bin/python benchmarks/bench_async_speed.py --quick         # gpt-tiny, profiled once, one round of 4 steps

Two local ranks (gloo, one thread each), the MLP (batch 64) and gpt-tiny (batch 32) of the Core
benchmark. Per model, from one measured profile and a probed 2-rank cluster, one plan: the
balanced planner's two stages with four equal micro-batches, run by ``gpipe``, ``1f1b``,
``pipedream`` (no flush, a step per micro-batch, weight stashing) and ``2bw`` (no flush, a step per
batch on weights one step old), docs/algorithms.md §3.5. Same stages and micro-batches: the
difference is the flush and the version handling.

Every method runs once per round (the harness's rounds rotate the starting run), for ``--repeats``
rounds; a run's samples/s is the batch over the median time of its timed steps (the runtime's
``samples_per_s``, warm-up steps excluded), so an asynchronous run's figure is its steady state;
the result is the median over rounds, and "vs 1f1b (paired)" the median over rounds of the ratio to
1f1b's run in the same round. Predicted: the event simulator's steady state
(:func:`~pipetrain.simulate.steady.steady_state`; a synchronous plan's iteration time). The
runtime runs an asynchronous schedule one batch-chunk at a time with a barrier between chunks
(docs/algorithms.md §3.5), which the simulator does not model. The probed cluster is kept in the
run's folder (``cluster.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.async_speed_report import report
from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from harness import Context, Experiment, Row, bounded, main

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.runtime import TrainConfig, train
from pipetrain.simulate.steady import steady_state

MODELS = {"mlp": 64, "gpt-tiny": 32}
METHODS = (Method.GPIPE, Method.ONE_F_ONE_B, Method.PIPEDREAM, Method.TWO_BW)
MICRO = 4


@dataclass(frozen=True)
class Setting:
    """One model's plan run by one method, and its predicted steady state (samples/s)."""

    model: str
    method: str
    plan: Plan
    predicted: float


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=6, help=f"steps per run, {WARMUP_STEPS} of them warm-up (default 6)")


def _plans(model: str, batch: int, cluster: Cluster, quick: bool) -> list[Setting]:
    """The model's 2-stage plan under every method, and each one's predicted steady state (``quick``: from a
    profile of one repeat per layer and size, not five)."""
    graph = build_model(model)
    cost = CostModel(api.profile_model(graph, batch, repeats=1) if quick else profile_logged(graph, batch), cluster)
    base = build_balanced_plan(ModelRef.of(graph), cost, method=Method.ONE_F_ONE_B, n_stages=2, batch_size=batch,
                               n_micro=MICRO)
    plans = {m.value: base if m is Method.ONE_F_ONE_B else base.run_by(m) for m in METHODS}
    return [Setting(model, name, plan, steady_state(plan, cost).samples_per_s) for name, plan in plans.items()]


def settings(ctx: Context) -> list[Setting]:
    cluster, info = probe_cluster(CPU_ACTION_OVERHEAD_S, 1 if ctx.quick else 3)
    ctx.artifact("cluster.json").write_text(json.dumps(info, indent=1))
    models = [("gpt-tiny", MODELS["gpt-tiny"])] if ctx.quick else MODELS.items()
    return [s for model, batch in models for s in _plans(model, batch, cluster, ctx.quick)]


def run(s: Setting, ctx: Context) -> list[Row]:
    steps = 4 if ctx.quick else ctx.args.steps
    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1, timeout_s=60.0)
    out, status = bounded(lambda: train(build_model(s.model), s.plan, config), 180.0)
    row = {"model": s.model, "method": s.method, "status": status, "steps": steps,
           "samples_per_s": None if out is None else out.samples_per_s, "predicted_samples_per_s": s.predicted}
    ctx.log(f"round {ctx.round + 1} {s.model:9s} {s.method:9s} {status:8s} {row['samples_per_s'] or 0:8.1f} samples/s "
            f"(predicted {s.predicted:.1f})")
    return [row]


EXPERIMENT = Experiment(name="async-speed", title="Asynchronous pipelines: steady-state speed measured on 2 ranks, "
                        "predicted beside it", settings=settings, run=run, report=report, arguments=arguments,
                        repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
