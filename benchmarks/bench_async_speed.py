"""Steady-state speed of the asynchronous methods, measured on 2 local ranks, predicted beside it.

    .venv/bin/python benchmarks/bench_async_speed.py --out benchmarks/results/async-speed
    .venv/bin/python benchmarks/bench_async_speed.py --quick --out /tmp/async-speed      # smoke run

Two local ranks (gloo, one thread each), the MLP (batch 64) and gpt-tiny (batch 32) of the Core
benchmark. Per model, from one measured profile and a probed 2-rank cluster, one plan: the
balanced planner's two stages with four equal micro-batches, run by ``gpipe``, ``1f1b``,
``pipedream`` (no flush, a step per micro-batch, weight stashing) and ``2bw`` (no flush, a step per
batch on weights one step old), docs/algorithms.md §3.5. Same stages and micro-batches: the
difference is the flush and the version handling.

Every method runs once per round, alternating (the starting method rotates), for ``--repeats``
rounds; a run's samples/s is the batch over the median time of its timed steps (the runtime's
``samples_per_s``, warm-up steps excluded), so an asynchronous run's figure is its steady state;
the result is the median over rounds. Predicted: the event simulator's steady state
(:func:`~pipetrain.simulate.steady.steady_state`; a synchronous plan's iteration time). The
runtime runs an asynchronous schedule one batch-chunk at a time with a barrier between chunks
(docs/algorithms.md §3.5), which the simulator does not model.

Output under ``--out``: ``async_speed.json`` (every run) and ``async_speed.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from core_report import ratio
from harness import bounded

from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
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


@dataclass
class Measured:
    model: str
    method: str
    round: int
    status: str
    samples_per_s: float | None = None
    predicted_samples_per_s: float | None = None


@dataclass(frozen=True)
class Setup:
    model: str
    plans: dict[str, Plan]
    predicted: dict[str, float]  # samples/s


def setup(model: str, batch: int, cluster: Cluster) -> Setup:
    """The model's 2-stage plan under every method, and each one's predicted steady state."""
    graph = build_model(model)
    cost = CostModel(profile_logged(graph, batch), cluster)
    base = build_balanced_plan(ModelRef.of(graph), cost, method=Method.ONE_F_ONE_B, n_stages=2, batch_size=batch,
                               n_micro=MICRO)
    plans = {m.value: base if m is Method.ONE_F_ONE_B else base.run_by(m) for m in METHODS}
    predicted = {name: steady_state(plan, cost).samples_per_s for name, plan in plans.items()}
    for name in plans:
        print(f"[{model}] {name:9s} predicted {predicted[name]:8.1f} samples/s", flush=True)
    return Setup(model, plans, predicted)


def run_one(s: Setup, method: str, round_: int, steps: int) -> Measured:
    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1, timeout_s=60.0)
    graph = build_model(s.model)
    out, status = bounded(lambda: train(graph, s.plans[method], config), 180.0)
    run = Measured(s.model, method, round_, status, predicted_samples_per_s=s.predicted[method])
    if out is not None:
        run.samples_per_s = out.samples_per_s
    return run


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(setups: list[Setup], runs: list[Measured], meta: dict[str, object]) -> str:
    """Per model and method: measured (median over rounds) and predicted samples/s, each relative to 1f1b."""
    lines = [f"Command: `{meta['command']}`; {meta['machine']}; {meta['rounds']} rounds of {meta['steps']} steps "
             f"({WARMUP_STEPS} warm-up); {meta['seconds']:.0f} s in all. Samples/s: batch / median timed step, median "
             "over rounds.", "",
             "| model | method | measured samples/s | vs 1f1b (paired) | predicted samples/s | vs 1f1b | "
             "measured / predicted | runs ok |", "|---|---|---|---|---|---|---|---|"]
    for s in setups:
        measured = {m: median([r.samples_per_s for r in runs if r.model == s.model and r.method == m
                               and r.samples_per_s]) for m in s.plans}
        base_p = s.predicted["1f1b"]
        for m in s.plans:
            got, want = measured[m], s.predicted[m]
            ok = sum(1 for r in runs if r.model == s.model and r.method == m and r.status == "ok")
            total = sum(1 for r in runs if r.model == s.model and r.method == m)
            lines.append(f"| {s.model} | {m} | {_f(got)} | {_paired(runs, s.model, m)} | {want:.1f} | "
                         f"{ratio(want, base_p)} | {ratio(got, want)} | {ok}/{total} |")
    return "\n".join(lines) + "\n"


def _paired(runs: list[Measured], model: str, method: str) -> str:
    """The median over rounds of ``method``'s samples/s over 1f1b's in the same round (the machine's
    load drifts between rounds; within a round the runs are adjacent)."""
    speed = {(r.round, r.method): r.samples_per_s for r in runs if r.model == model and r.samples_per_s}
    ratios = [v / speed[(k, "1f1b")] for (k, m), v in speed.items() if m == method and (k, "1f1b") in speed]
    return "—" if not ratios else f"{statistics.median(ratios):.2f}×"


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/async-speed"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cluster, info = probe_cluster(CPU_ACTION_OVERHEAD_S, 1 if args.quick else 3)
    setups = [setup(m, b, cluster) for m, b in (list(MODELS.items())[:1] if args.quick else MODELS.items())]
    rounds, steps = (1, 4) if args.quick else (args.repeats, args.steps)
    jobs = [(s, m) for s in setups for m in s.plans]
    runs: list[Measured] = []
    for r in range(rounds):
        shift = (r * len(jobs)) // rounds
        for s, method in jobs[shift:] + jobs[:shift]:
            runs.append(run_one(s, method, r, steps))
            print(f"round {r + 1} {s.model:9s} {method:9s} {runs[-1].status:8s} "
                  f"{runs[-1].samples_per_s or 0:8.1f} samples/s", flush=True)
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, 2 ranks on a shared 2-core machine"
    meta: dict[str, object] = {"command": "benchmarks/bench_async_speed.py" + (" --quick" if args.quick else ""),
                               "machine": machine, "rounds": rounds, "steps": steps, "cluster": info,
                               "seconds": time.perf_counter() - start}
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "async_speed.json", json.dumps({"meta": meta, "runs": [asdict(x) for x in runs]}, indent=1))
    text = report(setups, runs, meta)
    write_atomic(args.out / "async_speed.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
