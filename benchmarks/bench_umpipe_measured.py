"""UMPIPE benchmark 7(c): tidgap's plan measured on this machine against the best equal plans and torch.

    .venv/bin/python benchmarks/bench_umpipe_measured.py --repeats 5 --out benchmarks/results/umpipe-measured
    .venv/bin/python benchmarks/bench_umpipe_measured.py --quick --out /tmp/umpipe-measured   # smoke run

Two local ranks (gloo, one thread each), the MLP (batch 128) and gpt-tiny (batch 64) of the Core
benchmark. Per model, from one measured profile and a probed 2-rank cluster:

* ``gpipe`` and ``1f1b``: pipetrain's best equal plan of each (every count simulated);
* ``tidgap``: UMPIPE's dual-chromosome GA on the better one's stages (flush order, recompute costed
  where a stage's backward partition differs from its forward one);
* ``1f1b-ga``: unequal micro-batches under the 1F1B order (pipetrain's extension);
* ``torch gpipe/1f1b m``: torch.distributed.pipelining at the micro-batch counts that were best in
  the Core benchmark (m = 2 and 4).

Every configuration runs once per round, alternating, for ``--repeats`` rounds (the starting
configuration rotates); each result is the median over rounds of samples/s. Predicted times are the
event simulator's for the same plan. Output under ``--out``: ``umpipe_measured.json``, ``.md`` and
``gantt_<model>.png`` (the best equal plan beside tidgap's, predicted and measured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import Run
from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from common.torch_baseline import run_torch_pipelining
from core_report import ratio
from harness import bounded

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.microbatch.ga import GAConfig
from pipetrain.planners.microbatch.uedp import plan_uedp
from pipetrain.runtime import TrainConfig, train
from pipetrain.simulate.timeline import Timeline
from pipetrain.viz.gantt import save_gantt

MODELS = {"mlp": 128, "gpt-tiny": 64}
TORCH = [("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)]
PIPETRAIN = ["gpipe", "1f1b", "zb1", "tidgap", "1f1b-ga"]
EQUAL = ("gpipe", "1f1b", "zb1")


@dataclass
class Setup:
    model: str
    batch: int
    plans: dict[str, Plan]
    predicted_s: dict[str, float]
    predicted: dict[str, Timeline]


def sizes_text(plan: Plan) -> str:
    def short(sizes: tuple[int, ...]) -> str:
        return "[" + ",".join(map(str, sizes)) + "]"
    parts = []
    for k, s in enumerate(plan.stages):
        text = short(s.forward_sizes)
        if s.backward_sizes != s.forward_sizes:
            text += " / B " + short(s.backward_sizes)
        parts.append(f"stage {k}: {text}")
    return "; ".join(parts)


def setup(model: str, batch: int, cluster: Cluster, ga: GAConfig, seed: int) -> Setup:
    graph = build_model(model)
    profile = profile_logged(graph, batch)
    cost = CostModel(profile, cluster)
    plans: dict[str, Plan] = {}
    for method in (Method.GPIPE, Method.ONE_F_ONE_B, Method.ZB1):
        problem = PlanningProblem(ModelRef.of(graph), cost, batch, constraints=Constraints(method=method, n_stages=2))
        plans[method.value] = plan_balanced(problem).plan
    predicted = {label: api.predict(plan, profile, cluster)[1] for label, plan in plans.items()}
    base = plans[min(("gpipe", "1f1b"), key=lambda label: predicted[label].iteration_s)]
    for planner in ("tidgap", "1f1b-ga"):
        t0 = time.perf_counter()
        plans[planner] = plan_uedp(base, cost, planner=planner, seed=seed, config=ga)  # type: ignore[arg-type]
        predicted[planner] = api.predict(plans[planner], profile, cluster)[1]
        print(f"[{model}] {planner} in {time.perf_counter() - t0:.1f} s: {sizes_text(plans[planner])}", flush=True)
    for label, plan in plans.items():
        print(f"[{model}] {label:8s} predicted {predicted[label].iteration_s * 1e3:7.2f} ms  {sizes_text(plan)}")
    return Setup(model, batch, plans, {k: v.iteration_s for k, v in predicted.items()}, predicted)


def run_one(s: Setup, label: str, round_: int, steps: int, timeout_s: float) -> tuple[Run, Timeline | None]:
    run = Run(s.model, label, round_, "ok")
    if label.startswith("torch"):
        _, schedule, m = label.split()
        result = run_torch_pipelining(s.model, s.batch, int(m[2:]), schedule, steps, timeout_s)  # type: ignore[arg-type]
        run.status, run.samples_per_s, run.iteration_s = result.status, result.samples_per_s, result.iteration_s
        run.step_times_s = list(result.step_times_s)
        return run, None
    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                         timeout_s=min(60.0, timeout_s))
    graph = build_model(s.model)
    out, run.status = bounded(lambda: train(graph, s.plans[label], config), timeout_s)
    run.predicted_s = s.predicted_s[label]
    if out is None:
        return run, None
    run.samples_per_s, run.iteration_s = out.samples_per_s, out.timeline.iteration_s
    run.step_times_s = list(out.step_times_s)
    return run, out.timeline


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(setups: list[Setup], runs: list[Run], labels: list[str], meta: dict[str, object]) -> str:
    lines = ["# UMPIPE 7(c): measured on this machine, 2 ranks", "",
             f"Command: `{meta['command']}`; {meta['machine']}; cluster probe {meta['cluster']}; "
             f"{meta['repeats']} alternating rounds; took {meta['seconds']:.0f} s.", ""]
    for s in setups:
        rows = {label: [r for r in runs if r.model == s.model and r.label == label and r.samples_per_s]
                for label in labels}
        sps = {label: median([r.samples_per_s for r in rs if r.samples_per_s]) for label, rs in rows.items()}
        best_equal = max((sps[k] or 0.0, k) for k in EQUAL)
        torch_labels = [k for k in labels if k.startswith("torch")]
        best_torch = max(((sps[k] or 0.0, k) for k in torch_labels), default=(float("nan"), "none run"))
        lines += [f"## {s.model}, batch {s.batch}", "",
                  f"Best equal plan: **{best_equal[1]}** ({sizes_text(s.plans[best_equal[1]])}); "
                  f"best torch: **{best_torch[1]}**.", "",
                  "| configuration | samples/s (median) | min–max | × best equal | × best torch | measured ms "
                  "| predicted ms | pred. error | runs |", "|---|---|---|---|---|---|---|---|---|"]
        for label in labels:
            rs = rows[label]
            if not rs:
                lines.append(f"| {label} | — | failed | | | | | | 0 |")
                continue
            values = [r.samples_per_s for r in rs if r.samples_per_s]
            measured = median([r.iteration_s for r in rs if r.iteration_s])
            predicted = s.predicted_s.get(label)
            error = f"{100 * (predicted - measured) / measured:+.1f}%" if predicted and measured else ""
            lines.append(
                f"| {label} | {sps[label]:.1f} | {min(values):.0f}–{max(values):.0f} | "
                f"{ratio(sps[label], best_equal[0])} | {ratio(sps[label], best_torch[0])} | "
                f"{1e3 * (measured or 0):.2f} | {'' if predicted is None else f'{1e3 * predicted:.2f}'} | {error} "
                f"| {len(rs)} |")
        lines.append("")
        for planner in ("tidgap", "1f1b-ga"):
            lines.append(f"- {planner}: {sizes_text(s.plans[planner])}; predicted gain over best equal "
                         f"{s.predicted_s[best_equal[1]] / s.predicted_s[planner]:.3f}×, measured "
                         f"{(sps[planner] or 0) / best_equal[0]:.3f}×")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/umpipe-measured"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--models", nargs="+", default=[f"{m}:{b}" for m, b in MODELS.items()],
                        help="model:batch pairs (default: mlp:128 gpt-tiny:64)")
    parser.add_argument("--no-torch", action="store_true", help="pipetrain's configurations only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cluster, info = probe_cluster(CPU_ACTION_OVERHEAD_S if args.quick else None, 1 if args.quick else 3)
    ga = GAConfig(population=16, generations=10) if args.quick else GAConfig()
    models = {"mlp-digits": 32} if args.quick else {m: int(b) for m, b in (x.split(":") for x in args.models)}
    setups = [setup(m, b, cluster, ga, args.seed) for m, b in models.items()]
    labels = PIPETRAIN if args.quick or args.no_torch else [*PIPETRAIN, *(f"torch {s} m={m}" for s, m in TORCH)]
    steps = 4 if args.quick else 8
    repeats = 1 if args.quick else args.repeats
    runs: list[Run] = []
    timelines: dict[tuple[str, str], list[tuple[float, Timeline]]] = {}
    jobs = [(s, label) for s in setups for label in labels]
    for r in range(repeats):
        shift = (r * len(jobs)) // repeats
        for s, label in jobs[shift:] + jobs[:shift]:
            run, timeline = run_one(s, label, r, steps, args.timeout)
            runs.append(run)
            if timeline is not None and run.samples_per_s:
                timelines.setdefault((s.model, label), []).append((run.samples_per_s, timeline))
            print(f"round {r + 1} {s.model:9s} {label:16s} {run.status:8s} "
                  f"{run.samples_per_s or 0:8.1f} samples/s", flush=True)
            write_atomic(args.out / "umpipe_measured.json", json.dumps([asdict(x) for x in runs], indent=1))
    for s in setups:
        panels, names = [], []
        for label in ("gpipe", "1f1b", "zb1", "tidgap"):
            measured = sorted(timelines.get((s.model, label), []), key=lambda x: x[0])
            panels.append(s.predicted[label])
            names.append(f"{label} predicted")
            if measured:
                panels.append(measured[len(measured) // 2][1])
                names.append(f"{label} measured (median run)")
        save_gantt(panels, args.out / f"gantt_{s.model}.png", names)
    meta = {"command": " ".join([".venv/bin/python benchmarks/bench_umpipe_measured.py", *(argv or sys.argv[1:])]),
            "machine": "2-core CPU, torch gloo, 1 thread per rank", "cluster": info, "repeats": repeats,
            "seconds": time.perf_counter() - start}
    write_atomic(args.out / "umpipe_measured.md", report(setups, runs, labels, meta))
    print(f"wrote {args.out}/umpipe_measured.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
