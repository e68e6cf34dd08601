"""BaPipe benchmark (b): heterogeneity-aware exploration on 2 H100 + 2 V100, event-simulated.

    .venv/bin/python benchmarks/bench_hetero.py --out benchmarks/results/hetero
    .venv/bin/python benchmarks/bench_hetero.py --quick --out /tmp/hetero      # smoke run

Cluster (assumptions): two servers, one with 2 H100 (devices 0, 1) and one with 2 V100 (devices 2,
3); NVLink inside a server (150 GB/s, 10 µs), 25 Gbit/s Ethernet between them (3.125 GB/s, 10 µs;
``--inter-gbit`` changes it).
Profiles are *estimated* per device kind (:mod:`pipetrain.profile.estimate`), batch 64. For each
model of the zoo among vgg16, gpt1-14, resnet50 and gnmt it reports, all times from the event
simulator on the real (heterogeneous) cluster:

* ``identical (4 stages)``: the plan that assumes identical devices: the equal planner
  (:func:`~pipetrain.planners.balanced.plan_balanced`, gpipe and 1f1b, every micro-batch count) on the
  cluster taken as 4 V100s (or 4 H100s: the better of the two is kept), one stage per device as
  ``pipetrain plan`` does by default, then simulated on the real cluster;
* ``identical (best S)``: the same for 1..4 stages (ranks 0..S-1, so the H100s first), the stage
  count that is fastest on the real cluster (an oracle choice, generous to the baseline);
* ``bapipe (4 stages)``: :func:`~pipetrain.planners.bapipe.explore` restricted to one stage per device,
  so only the partition and the device order differ from the first baseline;
* ``bapipe``: the full exploration (gpipe, 1f1b and uedp; 1..4 stages; every device order; both
  communication models propose partitions);
* ablations, gpipe and 1f1b only: ``bapipe §4.2 serial`` proposes partitions scored ``F + B + C``
  serially as PAPERS.md §4.2 writes it (``comm="serial"``), ``bapipe overlap`` only with transfers
  on their own link beside compute (``comm="overlap"``).

Output under ``--out``: ``hetero.json`` (every result) and ``hetero.md`` (tables: times, speed-ups,
partitions side by side).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipetrain.cluster import DEVICE_MODELS, Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import MODEL_NAMES, build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import BapipeResult, explore
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

BATCH = 64
KINDS = ("h100", "v100")
NVLINK = Link(1e-5, 1.5e11)
MODELS = ("vgg16", "gpt1-14", "resnet50", "gnmt")
EQUAL = (Method.GPIPE, Method.ONE_F_ONE_B)


@dataclass(frozen=True)
class Row:
    """One planner's plan for one model: event-simulated seconds on the real cluster and its stages."""

    planner: str
    method: str
    iteration_s: float
    n_micro: int
    stages: list[str]  # per stage: "<device kind>:<layer count>"
    search_s: float  # the planner's own search (for the identical baselines: one plan_balanced call)


@dataclass(frozen=True)
class Result:
    model: str
    n_layers: int
    rows: list[Row]


def cluster(inter_gbit: float) -> Cluster:
    h, v = DEVICE_MODELS["h100"], DEVICE_MODELS["v100"]
    devices = (Device("h100", h.memory_bytes, node=0),) * 2 + (Device("v100", v.memory_bytes, node=1),) * 2
    return Cluster(devices, NVLINK, Link(1e-5, inter_gbit * 1e9 / 8), "2xH100+2xV100")


def assumed(real: Cluster, kind: str) -> Cluster:
    """The real cluster's layout and links with every device taken to be ``kind``."""
    d = DEVICE_MODELS[kind]
    devices = tuple(Device(kind, d.memory_bytes, node=x.node) for x in real.devices)
    return Cluster(devices, real.intra_node, real.inter_node, f"4x{kind} (assumed)")


def stages_of(plan: Plan, c: Cluster) -> list[str]:
    return [f"{c.devices[s.ranks[0]].kind}:{len(s.layers)}" for s in plan.stages]


def identical_rows(graph: LayerGraph, profiles: dict[str, Profile], real: CostModel) -> list[Row]:
    """The identical-devices baselines: 4 stages, and the best stage count, on the real cluster."""
    model = ModelRef.of(graph)
    options: dict[int, tuple[float, Plan, float]] = {}
    for n_stages in range(1, min(4, len(graph.names)) + 1):
        for kind in KINDS:
            cost = CostModel(profiles[kind], assumed(real.cluster, kind))
            for method in EQUAL:
                t0 = time.perf_counter()
                problem = PlanningProblem(model, cost, BATCH, constraints=Constraints(method=method, n_stages=n_stages))
                plan = plan_balanced(problem).plan
                search_s = time.perf_counter() - t0
                truth = simulate(build_schedule(plan), plan, real).iteration_s
                if n_stages not in options or truth < options[n_stages][0]:
                    options[n_stages] = (truth, plan, search_s)
    rows = []
    for label, n_stages in (("identical (4 stages)", max(options)),
                            ("identical (best S)", min(options, key=lambda s: options[s][0]))):
        truth, plan, seconds = options[n_stages]
        rows.append(Row(label, plan.method.value, truth, len(plan.stages[0].forward_sizes),
                        stages_of(plan, real.cluster), seconds))
    return rows


def bapipe_row(label: str, result: BapipeResult, seconds: float) -> Row:
    best = result.best
    stages = [f"{kind}:{n}" for kind, n in zip(best.placement.kinds, best.layer_counts, strict=True)]
    return Row(label, best.method.value, best.iteration_s, best.n_micro, stages, seconds)


def run_one(name: str, quick: bool, inter_gbit: float) -> Result:
    graph = build_model(name)
    profiles = {kind: estimate_profile(graph, kind, BATCH) for kind in KINDS}
    real = CostModel(profiles, cluster(inter_gbit))
    rows = identical_rows(graph, profiles, real)
    problem = PlanningProblem(ModelRef.of(graph), real, BATCH)
    methods = EQUAL if quick else (*EQUAL, Method.UEDP)
    for label, options in (("bapipe (4 stages)", dict(stage_counts=[min(4, len(graph.names))])),
                           ("bapipe", dict(methods=methods)),
                           ("bapipe §4.2 serial", dict(methods=EQUAL, comm="serial")),
                           ("bapipe overlap", dict(methods=EQUAL, comm="overlap"))):
        t0 = time.perf_counter()
        result = explore(problem, **options)
        rows.append(bapipe_row(label, result, time.perf_counter() - t0))
    return Result(name, len(graph.names), rows)


def report(results: list[Result], seconds: float, args: argparse.Namespace) -> str:
    planners = [r.planner for r in results[0].rows]
    lines = [
        "# BaPipe (b): heterogeneous cluster, 2 H100 + 2 V100 (event-simulated, estimated profiles)", "",
        f"Command: `.venv/bin/python benchmarks/bench_hetero.py{' --quick' if args.quick else ''} --inter-gbit "
        f"{args.inter_gbit:g} --out {args.out}`; batch {BATCH}; NVLink 150 GB/s inside a server, "
        f"{args.inter_gbit:g} Gbit/s between the H100 and the V100 server; "
        f"took {seconds:.0f} s.", "",
        "## Iteration time (ms) and speed-up of bapipe", "",
        "| model | layers | " + " | ".join(planners) + " | bapipe vs identical (4 stages) | bapipe vs identical "
        "(best S) | bapipe (4 stages) vs identical (4 stages) |",
        "|---|---|" + "---|" * (len(planners) + 3),
    ]
    for r in results:
        t = {row.planner: row.iteration_s for row in r.rows}
        four, best = t["identical (4 stages)"], t["identical (best S)"]
        times = " | ".join(f"{1e3 * t[p]:.2f}" for p in planners)
        lines.append(f"| {r.model} | {r.n_layers} | {times} | {four / t['bapipe']:.2f}× | {best / t['bapipe']:.2f}× "
                     f"| {four / t['bapipe (4 stages)']:.2f}× |")
    lines += ["", "## Plans side by side (stages in pipeline order as device:layers)", "",
              "| model | planner | method | micro-batches | stages | search s |", "|---|---|---|---|---|---|"]
    for r in results:
        for row in r.rows:
            lines.append(f"| {r.model} | {row.planner} | {row.method} | {row.n_micro} | {' '.join(row.stages)} | "
                         f"{row.search_s:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hetero"))
    parser.add_argument("--quick", action="store_true", help="vgg16 only, no uedp")
    parser.add_argument("--inter-gbit", type=float, default=25.0,
                        help="bandwidth between the two servers, Gbit/s (default 25)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["vgg16"] if args.quick else [m for m in MODELS if m in MODEL_NAMES]
    results: list[Result] = []
    start = time.perf_counter()
    for name in names:
        result = run_one(name, args.quick, args.inter_gbit)
        results.append(result)
        t = {row.planner: row.iteration_s for row in result.rows}
        print(f"{name:9s} identical(4) {1e3 * t['identical (4 stages)']:8.2f} ms  bapipe(4) "
              f"{1e3 * t['bapipe (4 stages)']:8.2f} ms  bapipe {1e3 * t['bapipe']:8.2f} ms  "
              f"({t['identical (4 stages)'] / t['bapipe']:.2f}×)", flush=True)
        write_atomic(args.out / "hetero.json", json.dumps([asdict(r) for r in results], indent=1))
    seconds = time.perf_counter() - start
    write_atomic(args.out / "hetero.md", report(results, seconds, args))
    print(f"wrote {args.out}/hetero.md ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
