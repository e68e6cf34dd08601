"""Zero-bubble benchmark: method zb1 (ZB-H1) against 1f1b, simulated at paper scale and measured here.

    .venv/bin/python benchmarks/bench_zb.py --out benchmarks/results/zb
    .venv/bin/python benchmarks/bench_zb.py --quick --out /tmp/zb        # smoke run

**Simulated** (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1, ZB-H1, and §2.2,
ZB-H2, method zb2, which holds up to twice the micro-batches): gpt1-14
(zoo) with an *estimated* V100 profile (:mod:`pipetrain.profile.estimate`, whose backward is split
per kernel into input and weight gradients) on 4 and 8 V100s in servers of 4 (NVLink 150 GB/s, 5 µs
inside a server; 25 Gbit/s Ethernet, 20 µs between servers, as benchmarks/bench_partition_sim.py),
batch ``--batch`` (default 64) in ``m`` = 8, 16, 32 equal micro-batches. Each method's stages come from
the balanced planner's exact min-max layer split at that micro-batch size (the same for both
methods); each row is the event simulator's iteration time and the most activation bytes any rank
holds. The paper's figures for reference: with ``T_F = T_B = T_W`` ZB-H1's bubble is a third of
1F1B's (``(p-1)(T_F+T_B-T_W)`` against ``(p-1)(T_F+T_B+T_W)``, its Figure 3), and its schedules beat
1F1B by up to 23% in throughput at similar memory (abstract; the automatic ZB-1p, measured on
A100 clusters with Megatron-LM).

**Measured** on this machine: 2 local ranks (gloo, one thread each), ``mlp`` (batch 128) and
``gpt-tiny`` (batch 64); the balanced 1f1b plan (measured profile, probed cluster) and the same
stages and micro-batches run by zb1; the two run alternately for ``--repeats`` rounds, each result
the median over rounds of samples/s, with the simulator's prediction beside it.

Output under ``--out``: ``zb.json`` (every row) and ``zb.md`` (tables).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.clusters import v100_servers
from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from harness import bounded

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, ZeroBubbleParams
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan, plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.profile.estimate import estimate_profile
from pipetrain.runtime import TrainConfig, train
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

METHODS = (Method.ONE_F_ONE_B, Method.ZB1)
STRICT = "zb1-strict"  # zb1 with ZeroBubbleParams(strict_memory=True): no more held than 1F1B on every stage
MEASURED = {"mlp": 128, "gpt-tiny": 64}


@dataclass(frozen=True)
class SimRow:
    devices: int
    n_micro: int
    method: str
    iteration_s: float
    bubble_fraction: float
    peak_activation_bytes: int
    stage0_activation_bytes: int


@dataclass(frozen=True)
class MeasuredRow:
    model: str
    method: str
    round: int
    status: str
    samples_per_s: float | None
    predicted_samples_per_s: float


def simulated(batch: int, devices: tuple[int, ...], counts: tuple[int, ...]) -> list[SimRow]:
    """Every (devices, m, method) row of the simulated part (module docstring)."""
    graph = build_model("gpt1-14")
    t0 = time.perf_counter()
    profile = estimate_profile(graph, "v100", batch_size=batch)
    print(f"[gpt1-14] estimated in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for d in devices:
        cost = CostModel(profile, v100_servers(d))
        for m in counts:
            for label in (*(m.value for m in METHODS), Method.ZB2.value, STRICT):
                method = Method.ZB1 if label == STRICT else Method(label)
                plan = build_balanced_plan(ModelRef.of(graph), cost, method=method, n_stages=d, batch_size=batch,
                                           n_micro=m)
                if label == STRICT:
                    plan = replace(plan, params=ZeroBubbleParams(strict_memory=True))
                schedule = build_schedule(plan)
                timeline = simulate(schedule, plan, cost)
                peaks = timeline.peak_activation_bytes
                rows.append(SimRow(d, m, label, timeline.iteration_s, timeline.bubble_fraction(), max(peaks), peaks[0]))
                print(f"  {d} V100  m={m:2d} {label:11s} {timeline.iteration_s * 1e3:8.2f} ms", flush=True)
    return rows


def measured_plans(model: str, batch: int, n_probes: int) -> tuple[dict[str, Plan], dict[str, float]]:
    """The balanced 1f1b plan on 2 ranks and the same stages run by zb1; predicted samples/s of each."""
    cluster, _ = probe_cluster(CPU_ACTION_OVERHEAD_S, n_probes)
    graph = build_model(model)
    profile = profile_logged(graph, batch)
    problem = PlanningProblem(ModelRef.of(graph), CostModel(profile, cluster), batch,
                              constraints=Constraints(method=Method.ONE_F_ONE_B, n_stages=2))
    base = plan_balanced(problem).plan
    plans = {m.value: base.run_by(m) for m in METHODS}
    predicted = {label: batch / api.predict(plan, profile, cluster)[1].iteration_s for label, plan in plans.items()}
    return plans, predicted


def measured(repeats: int, steps: int, models: dict[str, int], n_probes: int) -> list[MeasuredRow]:
    """zb1 and 1f1b alternately, ``repeats`` rounds per model (the first method alternates too)."""
    rows = []
    for model, batch in models.items():
        plans, predicted = measured_plans(model, batch, n_probes)
        graph = build_model(model)
        config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                             timeout_s=60.0)
        for r in range(repeats):
            order = list(plans) if r % 2 == 0 else list(reversed(plans))
            for label in order:
                out, status = bounded(functools.partial(train, graph, plans[label], config), 240.0)
                rate = None if out is None else out.samples_per_s
                rows.append(MeasuredRow(model, label, r, status, rate, predicted[label]))
                print(f"round {r + 1} {model:9s} {label:5s} {status:6s} {rate or 0:8.1f} samples/s", flush=True)
    return rows


def paper_gain(p: int, m: int) -> float:
    """The paper's bubble model with ``T_F = T_B = T_W``: 1F1B takes ``m + p - 1`` micro-batch slots,
    ZB-H1 ``m + (p - 1) / 3`` (its bubble is a third of 1F1B's)."""
    return (m + p - 1) / (m + (p - 1) / 3)


def _sim_table(rows: list[SimRow]) -> list[str]:
    lines = ["| V100s | m | 1f1b ms | zb1 ms | zb1 speed-up | paper's model (T_F=T_B=T_W) | 1f1b bubble | zb1 bubble "
             "| peak act. GiB 1f1b / zb1 | zb1-strict speed-up, peak GiB | zb2 (ZB-H2) speed-up, peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r.devices, r.n_micro, r.method): r for r in rows}
    for d, m in sorted({(r.devices, r.n_micro) for r in rows}):
        one, zb = by[(d, m, "1f1b")], by[(d, m, "zb1")]
        variants = (by.get((d, m, STRICT)), by.get((d, m, "zb2")))
        tail = " | ".join("–" if v is None else f"{one.iteration_s / v.iteration_s:.3f}×, "
                          f"{v.peak_activation_bytes / 2**30:.2f}" for v in variants)
        lines.append(f"| {d} | {m} | {one.iteration_s * 1e3:.2f} | {zb.iteration_s * 1e3:.2f} | "
                     f"{one.iteration_s / zb.iteration_s:.3f}× | {paper_gain(d, m):.3f}× | {one.bubble_fraction:.1%} | "
                     f"{zb.bubble_fraction:.1%} | "
                     f"{one.peak_activation_bytes / 2**30:.2f} / {zb.peak_activation_bytes / 2**30:.2f} | {tail} |")
    return lines


def _measured_table(rows: list[MeasuredRow]) -> list[str]:
    lines = ["| model | method | median samples/s | predicted samples/s | error | runs ok |",
             "|---|---|---|---|---|---|"]
    medians: dict[tuple[str, str], float] = {}
    for model, method in dict.fromkeys((r.model, r.method) for r in rows):
        rates = [r.samples_per_s for r in rows if (r.model, r.method) == (model, method) and r.samples_per_s]
        predicted = next(r.predicted_samples_per_s for r in rows if (r.model, r.method) == (model, method))
        if not rates:
            lines.append(f"| {model} | {method} | – | {predicted:.1f} | – | 0 |")
            continue
        medians[(model, method)] = median = statistics.median(rates)
        lines.append(f"| {model} | {method} | {median:.1f} | {predicted:.1f} | {predicted / median - 1:+.0%} | "
                     f"{len(rates)} |")
    for model in dict.fromkeys(r.model for r in rows):
        if (model, "zb1") in medians and (model, "1f1b") in medians:
            lines.append(f"\n{model}: zb1 / 1f1b measured {medians[(model, 'zb1')] / medians[(model, '1f1b')]:.3f}×")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/zb"))
    parser.add_argument("--batch", type=int, default=64, help="gpt1-14's batch in the simulated part")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-measured", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="rewrite zb.md from --out's zb.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        data = json.loads((args.out / "zb.json").read_text())
        sim_rows = [SimRow(**r) for r in data["simulated"]]
        measured_rows = [MeasuredRow(**r) for r in data["measured"]]
        text = report(sim_rows, measured_rows, data.get("command", ""), data.get("seconds", 0.0))
        write_atomic(args.out / "zb.md", text)
        return 0
    start = time.perf_counter()
    sim = simulated(32 if args.quick else args.batch, (4,) if args.quick else (4, 8),
                    (8,) if args.quick else (8, 16, 32))
    runs = [] if args.skip_measured else measured(1 if args.quick else args.repeats, 4 if args.quick else args.steps,
                                                 {"mlp": 64} if args.quick else MEASURED, 1 if args.quick else 3)
    command = " ".join([".venv/bin/python benchmarks/bench_zb.py", *(argv if argv is not None else sys.argv[1:])])
    seconds = time.perf_counter() - start
    write_atomic(args.out / "zb.json", json.dumps({"command": command, "seconds": seconds,
                                                   "simulated": [asdict(r) for r in sim],
                                                   "measured": [asdict(r) for r in runs]}, indent=1))
    write_atomic(args.out / "zb.md", report(sim, runs, command, seconds))
    print(f"wrote {args.out}/zb.md")
    return 0


def report(sim: list[SimRow], runs: list[MeasuredRow], command: str, seconds: float) -> str:
    text = ["# zb1 (ZB-H1) against 1f1b", "", f"Command: `{command}` ({seconds:.0f} s).", "",
            "## Simulated: gpt1-14, estimated V100 profile", "", *_sim_table(sim), ""]
    if runs:
        text += ["## Measured: 2 local ranks (gloo, 1 thread each), alternating rounds", "", *_measured_table(runs)]
    return "\n".join(text) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
