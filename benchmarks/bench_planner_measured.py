"""Planner benchmark (d): does the planners' top prediction match the measured best, on 2 local ranks?

    .venv/bin/python benchmarks/bench_planner_measured.py --repeats 5 --out benchmarks/results/planner-measured
    .venv/bin/python benchmarks/bench_planner_measured.py --quick --out /tmp/planner-measured   # smoke run

Per model (mlp at batch 32; gpt-tiny and optionally gnmt-tiny at 64), from one measured profile and the
local 2-rank cluster (:func:`pipetrain.api.local_cluster`, or a probed one with ``--probes``):

* candidate plans of every planner, all predicted by the event simulator on the same cost model:
  the balanced equal planner (gpipe and 1f1b, 2 stages, every micro-batch count; PAPERS.md §1.3),
  PipeDream's DP (replicated stages included, §2.3–2.4), BaPipe's explorer (1 or 2 stages, §4),
  and plain data parallelism (the whole model replicated on both ranks, two micro-batches);
* deduplicated, then 6–8 kept: each planner's choice, data parallelism, the predicted top few and
  evenly spread slower ones up to ``--max-slowdown`` times the predicted best;
* all kept plans run in one :func:`~pipetrain.runtime.train.train_many` launch (one thread per
  rank, gloo); the launch repeats ``--repeats`` times, the order reversing every other time; a
  plan's measured step time (s) is the median over launches of its median timed step (warm-up
  steps excluded). A plan on one rank leaves rank 1 idle.

Reported per model: the predicted and measured rankings, Kendall's tau-b between them, whether the
predicted best is the measured best and the measured gap between them, and each plan's prediction
error (predicted − measured) / measured. Output under ``--out``: ``planner_measured.json`` (every
launch, rewritten after each) and ``planner_measured.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from harness import bounded
from ranking import kendall_tau_b

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, Prediction, StagePlan, equal_sizes
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import explore
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.pipedream import plan_pipedream
from pipetrain.runtime import TrainConfig, TrainJob, train_many

MODELS = {"mlp": 32, "gpt-tiny": 64, "gnmt-tiny": 64}
TIMED_STEPS = {"mlp": 5, "gpt-tiny": 15, "gnmt-tiny": 10}


@dataclass
class Option:
    """One distinct candidate plan and the planners that proposed it (``"bapipe*"``: its choice)."""

    label: str
    plan: Plan
    predicted_s: float
    chosen_by: dict[str, bool] = field(default_factory=dict)  # planner -> whether it is its choice

    @property
    def sources(self) -> list[str]:
        return [name + ("*" if chosen else "") for name, chosen in self.chosen_by.items()]


@dataclass
class Measurement:
    """One plan in one launch: its median timed step (s) and every step's wall time (s)."""

    model: str
    label: str
    launch: int
    status: str
    step_s: float | None = None
    timeline_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)


@dataclass
class ModelSetup:
    model: str
    batch: int
    steps: int
    graph: LayerGraph
    options: list[Option]  # the kept plans, predicted fastest first
    n_candidates: int  # distinct candidate plans before keeping


# ---- candidates ---------------------------------------------------------------------------------


def describe(plan: Plan) -> str:
    """Short text of a plan, e.g. ``1f1b m=4 [3|3]`` or ``gpipe m=2 [6]×2`` (layers per stage, ×replicas)."""
    parts = [f"{len(s.layers)}" + (f"×{len(s.ranks)}" if len(s.ranks) > 1 else "") for s in plan.stages]
    sizes = plan.stages[0].forward_sizes
    even = equal_sizes(plan.batch_size, len(sizes))
    unequal = any(s.forward_sizes != even or s.backward_sizes != even for s in plan.stages)
    return f"{plan.method.value} m={len(sizes)}{' unequal' if unequal else ''} [{'|'.join(parts)}]"


def _key(plan: Plan) -> tuple[object, ...]:
    return (plan.method, tuple((s.layers, s.ranks, s.forward_sizes, s.backward_sizes, s.recompute)
                               for s in plan.stages))


def data_parallel_plan(graph: LayerGraph, cost: CostModel, batch: int) -> Plan:
    """The whole model replicated on ranks 0 and 1, one micro-batch each (gpipe), simulated."""
    sizes = equal_sizes(batch, 2)
    plan = Plan(graph.name, graph.fingerprint(), batch, Method.GPIPE,
                (StagePlan(tuple(graph.names), (0, 1), sizes, sizes),))
    timeline = api.predict(plan, cost.profiles, cost.cluster)[1]
    return plan.with_prediction(Prediction(timeline.iteration_s, timeline.bubble_fraction(),
                                           timeline.peak_activation_bytes, "simulated: data parallel"))


def candidates(graph: LayerGraph, cost: CostModel, batch: int) -> list[tuple[str, Plan, bool]]:
    """Every planner's simulated candidates as ``(planner, plan, chosen by that planner)``."""
    problem = PlanningProblem(ModelRef.of(graph), cost, batch)
    out: list[tuple[str, Plan, bool]] = []
    for method in (Method.GPIPE, Method.ONE_F_ONE_B):
        equal = plan_balanced(PlanningProblem(ModelRef.of(graph), cost, batch,
                                              constraints=Constraints(method=method, n_stages=2)))
        out += [(f"equal-{method.value}", c.plan, c.plan is equal.plan) for c in equal.candidates]
    pipedream = plan_pipedream(problem)
    out += [("pipedream", c.plan, c.plan is pipedream.plan) for c in pipedream.candidates]
    bapipe = explore(problem)
    out += [("bapipe", c.plan, c.plan is bapipe.plan) for c in bapipe.candidates if c.feasible]
    out.append(("data-parallel", data_parallel_plan(graph, cost, batch), True))
    return out


def distinct(found: Sequence[tuple[str, Plan, bool]]) -> list[Option]:
    """One option per distinct plan (method, stages, ranks, sizes), predicted fastest first."""
    by_key: dict[tuple[object, ...], Option] = {}
    for source, plan, chosen in found:
        assert plan.prediction is not None, f"{source} returned a plan without a prediction"
        option = by_key.setdefault(_key(plan), Option(describe(plan), plan, plan.prediction.iteration_s))
        option.chosen_by[source] = option.chosen_by.get(source, False) or chosen
    options = sorted(by_key.values(), key=lambda o: o.predicted_s)
    labels = [o.label for o in options]
    for o in options:  # same short text for different plans (e.g. ranks swapped): number them
        if labels.count(o.label) > 1:
            o.label += f" #{labels[: options.index(o)].count(o.label) + 1}"
    return options


def keep(options: Sequence[Option], n_plans: int, top: int, max_slowdown: float) -> list[Option]:
    """Each planner's choice, the predicted ``top`` and evenly spread slower ones up to
    ``max_slowdown`` × the predicted best: at most ``n_plans`` (more only if the choices need it)."""
    limit_s = options[0].predicted_s * max_slowdown
    pool = [o for o in options if o.predicted_s <= limit_s]
    kept = [o for o in options if any(o.chosen_by.values())]
    kept += [o for o in pool[:top] if o not in kept]
    rest = [o for o in pool if o not in kept]
    slots = max(0, n_plans - len(kept))
    if rest and slots:
        picks = {round(i * (len(rest) - 1) / max(1, slots - 1)) for i in range(slots)} if slots > 1 else {len(rest) - 1}
        kept += [rest[i] for i in sorted(picks)]
    return sorted(kept, key=lambda o: o.predicted_s)


def setup(model: str, batch: int, steps: int, cluster: Cluster, n_plans: int, max_slowdown: float) -> ModelSetup:
    graph = build_model(model)
    cost = CostModel(profile_logged(graph, batch), cluster)
    t0 = time.perf_counter()
    options = distinct(candidates(graph, cost, batch))
    kept = keep(options, n_plans, top=3, max_slowdown=max_slowdown)
    print(f"[{model}] {len(options)} distinct candidates in {time.perf_counter() - t0:.1f} s; keeping {len(kept)}:")
    for o in kept:
        print(f"[{model}]   {o.label:28s} predicted {o.predicted_s * 1e3:8.2f} ms  {', '.join(o.sources)}", flush=True)
    return ModelSetup(model, batch, steps, graph, kept, len(options))


# ---- measuring ----------------------------------------------------------------------------------


def launch(s: ModelSetup, index: int, timeout_s: float) -> list[Measurement]:
    """Every kept plan of ``s`` in one launch; the order reverses on odd launches."""
    order = s.options if index % 2 == 0 else s.options[::-1]
    config = TrainConfig(steps=s.steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                         timeout_s=60.0)
    jobs = [TrainJob(s.graph, o.plan, config) for o in order]
    results, status = bounded(lambda: train_many(jobs), timeout_s)
    if results is None:
        return [Measurement(s.model, o.label, index, status) for o in order]
    return [Measurement(s.model, o.label, index, "ok", s.batch / r.samples_per_s, r.timeline.iteration_s,
                        list(r.step_times_s)) for o, r in zip(order, results, strict=True)]


# ---- analysis -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One plan's medians over launches (seconds per step)."""

    option: Option
    step_s: float | None
    spread_s: tuple[float, float] | None
    timeline_s: float | None
    n_ok: int

    @property
    def error(self) -> float | None:
        return None if self.step_s is None else (self.option.predicted_s - self.step_s) / self.step_s


def rows(s: ModelSetup, runs: Sequence[Measurement]) -> list[Row]:
    out = []
    for o in s.options:
        ok = [r for r in runs if r.model == s.model and r.label == o.label and r.step_s]
        steps = [r.step_s for r in ok if r.step_s]
        timelines = [r.timeline_s for r in ok if r.timeline_s]
        out.append(Row(o, statistics.median(steps) if steps else None, (min(steps), max(steps)) if steps else None,
                       statistics.median(timelines) if timelines else None, len(ok)))
    return out


def summary(table: Sequence[Row]) -> dict[str, object]:
    """Rankings, Kendall's tau-b, whether the predicted best is the measured best, and the gap."""
    measured = [r for r in table if r.step_s is not None]
    if not measured:
        return {"measured_plans": 0}
    predicted_best = min(measured, key=lambda r: r.option.predicted_s)
    measured_best = min(measured, key=lambda r: r.step_s or 0.0)
    errors = [abs(r.error) for r in measured if r.error is not None]
    return {
        "measured_plans": len(measured),
        "kendall_tau_b": kendall_tau_b([r.option.predicted_s for r in measured], [r.step_s or 0.0 for r in measured]),
        "predicted_best": predicted_best.option.label,
        "measured_best": measured_best.option.label,
        "predicted_best_is_measured_best": predicted_best is measured_best,
        "gap": (predicted_best.step_s or 0.0) / (measured_best.step_s or 1.0) - 1.0,
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
    }


# ---- report -------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1e3 * x:.2f}"


def model_report(s: ModelSetup, table: Sequence[Row], facts: dict[str, object]) -> list[str]:
    measured_rank = {id(r): k + 1 for k, r in enumerate(sorted((r for r in table if r.step_s), key=lambda r: r.step_s
                                                                 or 0.0))}
    lines = [f"## {s.model}, batch {s.batch}", "",
             f"{s.n_candidates} distinct candidate plans; {len(s.options)} kept and run, {s.steps - WARMUP_STEPS} "
             f"timed steps each after {WARMUP_STEPS} warm-up. `*`: the planner's own choice.", "",
             "| pred. rank | meas. rank | plan | proposed by | predicted ms | measured ms (median) | min–max "
             "| pred. error | launches |", "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for k, r in enumerate(table):
        spread = f"{_ms(r.spread_s[0])}–{_ms(r.spread_s[1])}" if r.spread_s else "failed"
        error = "—" if r.error is None else f"{r.error:+.1%}"
        lines.append(f"| {k + 1} | {measured_rank.get(id(r), '—')} | {r.option.label} | {', '.join(r.option.sources)} "
                     f"| {_ms(r.option.predicted_s)} | {_ms(r.step_s)} | {spread} | {error} | {r.n_ok} |")
    lines.append("")
    if facts.get("measured_plans"):
        same = facts["predicted_best_is_measured_best"]
        lines += [f"- Kendall's tau-b (predicted vs measured order, {facts['measured_plans']} plans): "
                  f"**{facts['kendall_tau_b']:+.2f}**",
                  f"- predicted best **{facts['predicted_best']}** is {'' if same else 'NOT '}the measured best"
                  + ("" if same else f" (**{facts['measured_best']}**)")
                  + f"; measured gap {facts['gap']:+.1%}",
                  f"- prediction error: median |error| {facts['median_abs_error']:.1%}, "
                  f"worst {facts['worst_abs_error']:.1%}"]
    return [*lines, ""]


def report(setups: Sequence[ModelSetup], runs: Sequence[Measurement], meta: dict[str, object]) -> tuple[str, dict[
        str, object]]:
    lines = ["# Planner benchmark (d): predicted vs measured best plan, 2 local ranks", "",
             f"Command: `{meta['command']}`; torch {meta['torch']}, {meta['cpu_count']} cores, gloo, one thread per "
             f"rank; cluster: {meta['cluster']}; {meta['repeats']} launches (order reversed every other one); "
             f"took {meta['wall_s']:.0f} s. Measured ms: the median over launches of each run's median timed "
             "step. Error: (predicted − measured) / measured. Gap: measured time of the predicted best over "
             "that of the measured best, − 1.", ""]
    facts: dict[str, object] = {}
    for s in setups:
        table = rows(s, runs)
        facts[s.model] = found = summary(table)
        lines += model_report(s, table, found)
    return "\n".join(lines), facts


def save(out: Path, setups: Sequence[ModelSetup], runs: Sequence[Measurement], meta: dict[str, object],
         facts: dict[str, object] | None = None) -> None:
    models = [{"model": s.model, "batch": s.batch, "steps": s.steps, "warmup_steps": WARMUP_STEPS,
               "n_candidates": s.n_candidates,
               "plans": [{"label": o.label, "sources": o.sources, "predicted_s": o.predicted_s,
                          "plan": json.loads(o.plan.to_json())} for o in s.options]} for s in setups]
    data = {"meta": meta, "summary": facts or {}, "models": models, "runs": [asdict(r) for r in runs]}
    write_atomic(out / "planner_measured.json", json.dumps(data, indent=1))


# ---- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/planner-measured"))
    p.add_argument("--models", nargs="+", default=["mlp", "gpt-tiny"], choices=sorted(MODELS))
    p.add_argument("--batch", type=int, help="samples per mini-batch for every model (default: MODELS)")
    p.add_argument("--repeats", type=int, default=5, help="launches over all kept plans (default 5)")
    p.add_argument("--plans", type=int, default=7, help="plans to keep per model (default 7)")
    p.add_argument("--max-slowdown", type=float, default=2.5, help="keep no plan predicted slower than this × best")
    p.add_argument("--probes", type=int, default=0, help="probe the link and contention (median of N); 0: defaults")
    p.add_argument("--timeout", type=float, default=300.0, help="wall-clock bound per launch (s)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 launch, 4 plans, 2 timed steps")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.plans = 1, 4
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.probes:
        cluster, info = probe_cluster(CPU_ACTION_OVERHEAD_S, args.probes)
        cluster_text = f"probed ({args.probes} probes)"
    else:
        cluster, info = api.local_cluster(2), {"action_overhead_s": CPU_ACTION_OVERHEAD_S}
        cluster_text = "api.local_cluster(2) defaults (loopback link, no contention)"
    setups = [setup(m, args.batch or MODELS[m], WARMUP_STEPS + (2 if args.quick else TIMED_STEPS[m]), cluster,
                    args.plans, args.max_slowdown) for m in args.models]
    meta: dict[str, object] = {
        "command": " ".join([".venv/bin/python benchmarks/bench_planner_measured.py", *(argv or sys.argv[1:])]),
        "torch": torch.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "cluster": cluster_text, "cluster_info": info, "repeats": args.repeats,
        "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    runs: list[Measurement] = []
    for index in range(args.repeats):
        for s in setups:
            t0 = time.perf_counter()
            mine = launch(s, index, args.timeout)
            runs += mine
            text = ", ".join(f"{m.label} {_ms(m.step_s)}" for m in mine)
            print(f"launch {index + 1} [{s.model}] {time.perf_counter() - t0:.1f} s: {text}", flush=True)
            save(args.out, setups, runs, meta)
    meta["wall_s"] = time.perf_counter() - start
    text, facts = report(setups, runs, meta)
    save(args.out, setups, runs, meta, facts)
    write_atomic(args.out / "planner_measured.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
