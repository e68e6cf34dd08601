"""UMPIPE benchmark 7(c): tidgap's plan measured on this machine against the best equal plans and torch.

    .venv/bin/python benchmarks/bench_umpipe_measured.py                # 5 rounds, ~10 min on a quiet machine
    .venv/bin/python benchmarks/bench_umpipe_measured.py --models vgg16-32:64 --no-torch --repeats 3
    .venv/bin/python benchmarks/bench_umpipe_measured.py --quick        # mlp-digits, a tiny GA, no torch

Two local ranks (gloo, one thread each), the MLP (batch 128) and gpt-tiny (batch 64) of the Core
benchmark. Per model, from one measured profile and a probed 2-rank cluster (its per-action cost
measured too):

* ``gpipe``, ``1f1b`` and ``zb1``: pipetrain's best equal plan of each (every count simulated);
* ``tidgap``: UMPIPE's dual-chromosome GA on the better of gpipe's and 1f1b's stages (flush order,
  recompute costed where a stage's backward partition differs from its forward one);
* ``1f1b-ga``: unequal micro-batches under the 1F1B order (pipetrain's extension);
* ``torch gpipe/1f1b m``: torch.distributed.pipelining at the micro-batch counts that were best in
  the Core benchmark (m = 2 and 4).

Each round trains pipetrain's configurations of a model in one launch (the order reversed every
other round) and each torch configuration in its own; each result is the median over rounds of
samples/s. Predicted times are the event simulator's for the same plan. The run's folder keeps a
Gantt picture of each model's predicted gpipe, 1f1b, zb1 and tidgap plans.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import profile_logged
from common.torch_baseline import run_torch_pipelining
from common.umpipe_measured_report import umpipe_measured_report
from common.zb_measured import Case, this_machine, train_cases
from harness import Context, Experiment, Report, Row, RunInfo, main

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.microbatch.ga import GAConfig
from pipetrain.planners.microbatch.uedp import plan_uedp
from pipetrain.viz.gantt import save_gantt

MODELS = {"mlp": 128, "gpt-tiny": 64}
TORCH = [("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)]
Setting = tuple[Case, ...] | tuple[str, int, str, int]  # a model's pipetrain cases, or (model, batch, schedule, m)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=[f"{m}:{b}" for m, b in MODELS.items()],
                   help="model:batch pairs (default: mlp:128 gpt-tiny:64)")
    p.add_argument("--no-torch", action="store_true", help="pipetrain's configurations only")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds a run may take (default 240)")


def _plans(model: str, batch: int, cluster: Cluster, ctx: Context) -> tuple[Case, ...]:
    """The best equal plans, tidgap's and 1f1b-ga's on the better equal stages; a Gantt of the predictions."""
    graph = build_model(model)
    profile = profile_logged(graph, batch)
    cost = CostModel(profile, cluster)
    plans: dict[str, Plan] = {}
    for method in (Method.GPIPE, Method.ONE_F_ONE_B, Method.ZB1):
        problem = PlanningProblem(ModelRef.of(graph), cost, batch, constraints=Constraints(method=method, n_stages=2))
        plans[method.value] = plan_balanced(problem).plan
    predicted = {label: api.predict(plan, profile, cluster)[1] for label, plan in plans.items()}
    base = plans[min(("gpipe", "1f1b"), key=lambda label: predicted[label].iteration_s)]
    ga = GAConfig(population=16, generations=10) if ctx.quick else GAConfig()
    for planner in ("tidgap", "1f1b-ga"):
        plans[planner] = plan_uedp(base, cost, planner=planner, seed=ctx.seed, config=ga)  # type: ignore[arg-type]
        predicted[planner] = api.predict(plans[planner], profile, cluster)[1]
    shown = ("gpipe", "1f1b", "zb1", "tidgap")
    save_gantt([predicted[k] for k in shown], ctx.artifact(f"gantt_{model}.png"), [f"{k} predicted" for k in shown])
    return tuple(Case(model, label, plan, predicted[label].iteration_s) for label, plan in plans.items())


def settings(ctx: Context) -> list[Setting]:
    cluster = this_machine(ctx.quick, None, 3)
    models = {"mlp-digits": 32} if ctx.quick else {m: int(b) for m, b in (x.split(":") for x in ctx.args.models)}
    out: list[Setting] = [_plans(m, b, cluster, ctx) for m, b in models.items()]
    if not (ctx.quick or ctx.args.no_torch):
        out += [(m, b, schedule, n) for m, b in models.items() for schedule, n in TORCH]
    return out


def run(setting: Setting, ctx: Context) -> list[Row]:
    steps = 4 if ctx.quick else 8
    if isinstance(setting[0], Case):
        cases = [c for c in setting if isinstance(c, Case)][::1 if ctx.round % 2 == 0 else -1]
        rows = train_cases(cases, steps, ctx.args.timeout)
        return [{**row, "sizes": [[list(s.forward_sizes), list(s.backward_sizes)] for s in c.plan.stages]}
                for c, row in zip(cases, rows, strict=True)]
    model, batch, schedule, m = setting
    result = run_torch_pipelining(str(model), int(batch), int(m), schedule, steps, ctx.args.timeout)  # type: ignore[arg-type]
    return [{"model": model, "label": f"torch {schedule} m={m}", "status": result.status,
             "samples_per_s": result.samples_per_s, "iteration_s": result.iteration_s, "predicted_s": None,
             "step_times_s": list(result.step_times_s)}]


def report(rows: list[Row], info: RunInfo) -> Report:
    pairs = (x.split(":") for x in info.options["models"])
    batches = {"mlp-digits": 32} if info.quick else {m: int(b) for m, b in pairs}
    return umpipe_measured_report(rows, batches)


EXPERIMENT = Experiment(name="umpipe-measured",
                        title="UMPIPE (c): measured here, 2 ranks, against the best equal plans and torch",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=5)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
