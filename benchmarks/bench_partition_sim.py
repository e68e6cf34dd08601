"""Partition benchmark (a): PipeDream and BaPipe plans vs data parallelism vs an equal-layer split.

    .venv/bin/python benchmarks/bench_partition_sim.py --out benchmarks/results/partition-sim
    .venv/bin/python benchmarks/bench_partition_sim.py --quick --out /tmp/partition-sim    # smoke run

Clusters (assumptions): 4, 8 and 16 V100s in servers of 4, NVLink inside a server (150 GB/s,
5 µs), 25 Gbit/s Ethernet between servers (3.125 GB/s, 20 µs). Profiles are *estimated*
(:mod:`pipetrain.profile.estimate`) at batch ``--batch`` (default 64). For vgg16, resnet50, gnmt
and gpt1-14 (zoo) on each cluster of ``D`` devices it plans:

* ``data parallel``: one stage with every layer, replicated on all ``D`` ranks; micro-batches go
  round-robin to the replicas (:meth:`~pipetrain.plan.plan.Plan.replica_rank`) and the replicas
  all-reduce at the optimizer step; gpipe with ``m`` equal micro-batches, ``m`` a multiple of ``D``
  (each replica gets ``m / D``), the fastest ``m``;
* ``equal split``: ``min(D, L)`` stages of (nearly) equal layer *counts*, one rank each, gpipe and
  1f1b, every micro-batch count of :func:`~pipetrain.planners.counts.thinned_counts`, the fastest;
* ``pipedream``: :func:`~pipetrain.planners.pipedream.plan_pipedream` (PAPERS.md §2.3–2.4: the
  hierarchical DP's stages and replicas, run synchronously);
* ``pipedream straight``: the same with ``straight=True`` (no replication: PipeDream's straight
  pipeline), the fair yardstick for BaPipe, which never replicates a stage;
* ``bapipe``: :func:`~pipetrain.planners.bapipe.explore` with gpipe and 1f1b (PAPERS.md §4).

Every time is the **event simulator's** iteration time (seconds per mini-batch of ``B`` samples).
Memory is :func:`~pipetrain.simulate.memory.stage_memory`'s ``total_bytes`` (SGD), the peak over stages,
i.e. the most any one device holds; ``fits`` compares it with the V100's 32 GiB. Planner wall times
are one call each on this machine. The papers' claims are beside ours for reference only: PipeDream's
"up to 5.3× over data parallelism" (VGG-16) is time-to-accuracy measured on real clusters with
asynchronous weight updates; BaPipe's "up to 3.2× faster, 4× less memory" is measured on its own
clusters. Ours is simulated iteration time of synchronous schedules.

Output under ``--out``: ``partition_sim.json`` (every row) and ``partition_sim.md`` (tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.clusters import PER_NODE, v100_servers

from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.bapipe import explore
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.planners.counts import candidate_counts, thinned_counts
from pipetrain.planners.pipedream import PipeDreamReport, plan_pipedream
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import stage_memory

MODELS = ("vgg16", "resnet50", "gnmt", "gpt1-14")
DEVICE_COUNTS = (4, 8, 16)
GIB = 2**30
EQUAL = (Method.GPIPE, Method.ONE_F_ONE_B)
PLANNERS = ("data parallel", "equal split", "pipedream", "pipedream straight", "bapipe")
PAPER = ("PipeDream: up to 5.3× over DP (VGG-16, time-to-accuracy, real clusters); "
         "BaPipe: up to 3.2× faster, 4× less memory")


@dataclass(frozen=True)
class Row:
    """One planner's plan for one model on one cluster.

    ``stages`` lists per stage ``<layers>x<ranks>`` (layer count, replicas); ``devices_used`` can be
    below the cluster's when a planner leaves devices idle.
    """

    planner: str
    method: str
    n_micro: int
    stages: list[str]
    devices_used: int
    iteration_s: float
    bubble_fraction: float
    peak_memory_bytes: int
    fits: bool
    search_s: float
    config: str = ""  # pipedream's replication notation, e.g. "15-1"


@dataclass(frozen=True)
class Result:
    model: str
    n_layers: int
    n_devices: int
    batch: int
    rows: list[Row]


def simulated(plan: Plan, cost: CostModel) -> tuple[float, float]:
    """``(iteration seconds, bubble fraction)`` of ``plan`` from the event simulator."""
    timeline = simulate(build_schedule(plan), plan, cost)
    return timeline.iteration_s, timeline.bubble_fraction()


def fastest(plans: list[Plan], cost: CostModel) -> Plan:
    return min(plans, key=lambda p: simulated(p, cost)[0])


def data_parallel(graph: LayerGraph, cost: CostModel, batch: int) -> Plan:
    """One stage of all ``L`` layers on all ``D`` ranks, gpipe, the fastest ``m`` (a multiple of ``D``)."""
    d = cost.cluster.n_devices
    ranks = tuple(range(d))
    plans = [Plan(graph.name, graph.fingerprint(), batch, Method.GPIPE,
                  (StagePlan(tuple(graph.names), ranks, equal_sizes(batch, m), equal_sizes(batch, m)),))
             for m in candidate_counts(batch) if m % d == 0]
    return fastest(plans, cost)


def layer_split(names: list[str], n_stages: int) -> list[tuple[str, ...]]:
    """``names`` cut into ``n_stages`` runs of (nearly) equal counts, the longer runs first."""
    q, r = divmod(len(names), n_stages)
    runs, first = [], 0
    for k in range(n_stages):
        count = q + 1 if k < r else q
        runs.append(tuple(names[first:first + count]))
        first += count
    return runs


def equal_split(graph: LayerGraph, cost: CostModel, batch: int) -> Plan:
    """``min(D, L)`` stages of equal layer counts, one rank each; the fastest of gpipe/1f1b and ``m``."""
    runs = layer_split(list(graph.names), min(cost.cluster.n_devices, len(graph.names)))
    plans = []
    for method in EQUAL:
        for m in thinned_counts(batch):
            sizes = equal_sizes(batch, m)
            stages = tuple(StagePlan(run, (k,), sizes, sizes) for k, run in enumerate(runs))
            plans.append(Plan(graph.name, graph.fingerprint(), batch, method, stages))
    return fastest(plans, cost)


def row(planner: str, plan: Plan, cost: CostModel, search_s: float, config: str = "") -> Row:
    """Simulate ``plan`` on ``cost``'s cluster (the one its ranks index) and measure its memory."""
    iteration_s, bubble = simulated(plan, cost)
    peak = max(m.total_bytes for m in stage_memory(plan, cost))
    capacity = min(d.memory_bytes for d in cost.cluster.devices)
    return Row(planner, plan.method.value, len(plan.stages[0].forward_sizes),
               [f"{len(s.layers)}x{len(s.ranks)}" for s in plan.stages], plan.n_ranks, iteration_s, bubble,
               peak, peak <= capacity, search_s, config)


def run_one(graph: LayerGraph, profile: Profile, n_devices: int, batch: int) -> Result:
    cost = CostModel(profile, v100_servers(n_devices))
    problem = PlanningProblem(ModelRef.of(graph), cost, batch)
    rows = []
    t0 = time.perf_counter()
    rows.append(row("data parallel", data_parallel(graph, cost, batch), cost, time.perf_counter() - t0))
    t0 = time.perf_counter()
    rows.append(row("equal split", equal_split(graph, cost, batch), cost, time.perf_counter() - t0))
    t0 = time.perf_counter()
    pd = plan_pipedream(problem)
    seconds = time.perf_counter() - t0
    assert isinstance(pd.report, PipeDreamReport)
    rows.append(row("pipedream", pd.plan, CostModel(profile, pd.cluster), seconds, pd.report.config))
    t0 = time.perf_counter()
    straight = plan_pipedream(problem, straight=True)
    seconds = time.perf_counter() - t0
    assert isinstance(straight.report, PipeDreamReport)
    rows.append(row("pipedream straight", straight.plan, CostModel(profile, straight.cluster), seconds,
                    straight.report.config))
    t0 = time.perf_counter()
    ba = explore(problem, methods=EQUAL)
    seconds = time.perf_counter() - t0
    rows.append(row("bapipe", ba.plan, CostModel(profile, ba.cluster), seconds))
    return Result(graph.name, len(graph.names), n_devices, batch, rows)


# ---- report -----------------------------------------------------------------------------------


def slower_with_more_devices(results: list[Result]) -> list[str]:
    """One markdown bullet per (model, planner) whose time grows from one device count to the next."""
    bullets = []
    for a, b in pairwise(results):
        if a.model != b.model:
            continue
        for p in PLANNERS:
            ra = next(x for x in a.rows if x.planner == p)
            rb = next(x for x in b.rows if x.planner == p)
            if rb.iteration_s > ra.iteration_s:
                bullets.append(f"* {a.model}, {p}: {1e3 * ra.iteration_s:.1f} ms on {a.n_devices} → "
                               f"{1e3 * rb.iteration_s:.1f} ms on {b.n_devices} devices (bubble "
                               f"{100 * ra.bubble_fraction:.0f}% → {100 * rb.bubble_fraction:.0f}%, stages "
                               f"{' '.join(rb.stages)}{f' ({rb.config})' if rb.config else ''})")
    return bullets


def report(results: list[Result], seconds: float, args: argparse.Namespace) -> str:
    lines = [
        "# Partition (a): PipeDream and BaPipe vs data parallelism vs an equal-layer split "
        "(event-simulated, estimated profiles)", "",
        f"Command: `.venv/bin/python benchmarks/bench_partition_sim.py{' --quick' if args.quick else ''} "
        f"--batch {args.batch} --out {args.out}`; V100s in servers of {PER_NODE}, NVLink 150 GB/s inside, "
        f"25 Gbit/s between servers; took {seconds:.0f} s.", "",
        f"Papers (not comparable: see the script's docstring): {PAPER}.", "",
        "## Iteration time (ms), speed-ups and peak per-device memory", "",
        "Speed-up = T(baseline) / T(planner); memory ratio = peak bytes of data parallel / peak bytes of the planner "
        "(> 1: the planner needs less).", "",
        "| model | D | " + " | ".join(f"{p} ms" for p in PLANNERS)
        + " | pipedream vs DP | bapipe vs DP | pipedream vs equal | bapipe vs equal "
          "| bapipe vs pipedream straight | DP GiB | pipedream GiB (ratio) | bapipe GiB (ratio) |",
        "|---|---|" + "---|" * (len(PLANNERS) + 8),
    ]
    for r in results:
        by = {x.planner: x for x in r.rows}
        t = {p: by[p].iteration_s for p in PLANNERS}
        dp = by["data parallel"]

        def mem(x: Row) -> str:
            return f"{x.peak_memory_bytes / GIB:.2f}{'' if x.fits else ' (over)'}"

        cells = [f"{1e3 * t[p]:.1f}" for p in PLANNERS]
        cells += [f"{t['data parallel'] / t[p]:.2f}×" for p in ("pipedream", "bapipe")]
        cells += [f"{t['equal split'] / t[p]:.2f}×" for p in ("pipedream", "bapipe")]
        cells += [f"{t['pipedream straight'] / t['bapipe']:.2f}×"]
        cells += [mem(dp)] + [f"{mem(by[p])} ({dp.peak_memory_bytes / by[p].peak_memory_bytes:.2f}×)"
                              for p in ("pipedream", "bapipe")]
        lines.append(f"| {r.model} | {r.n_devices} | " + " | ".join(cells) + " |")
    lines += ["", "## Plans (stages in pipeline order as layers x replicas), bubble and planner wall time", "",
              "| model | D | planner | method | m | stages | devices used | bubble | peak GiB | fits 32 GiB | "
              "planner s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for x in r.rows:
            stages = " ".join(x.stages) + (f" ({x.config})" if x.config else "")
            lines.append(f"| {r.model} | {r.n_devices} | {x.planner} | {x.method} | {x.n_micro} | {stages} | "
                         f"{x.devices_used} | {100 * x.bubble_fraction:.0f}% | {x.peak_memory_bytes / GIB:.2f} | "
                         f"{'yes' if x.fits else 'no'} | {x.search_s:.2f} |")
    lines += ["", "## Planners that get slower with more devices", ""]
    slower = slower_with_more_devices(results)
    lines += slower or ["none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/partition-sim"))
    parser.add_argument("--batch", type=int, default=64, help="samples per mini-batch (default 64)")
    parser.add_argument("--quick", action="store_true", help="vgg16 on 4 and 8 devices only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    models, counts = (("vgg16",), (4, 8)) if args.quick else (MODELS, DEVICE_COUNTS)
    results: list[Result] = []
    start = time.perf_counter()
    for name in models:
        graph = build_model(name)
        profile = estimate_profile(graph, "v100", args.batch)
        for n_devices in counts:
            result = run_one(graph, profile, n_devices, args.batch)
            results.append(result)
            t = {x.planner: x.iteration_s for x in result.rows}
            print(f"{name:9s} D={n_devices:2d}  " + "  ".join(f"{p} {1e3 * t[p]:8.1f} ms" for p in PLANNERS)
                  + f"  (pipedream {t['data parallel'] / t['pipedream']:.2f}×, "
                    f"bapipe {t['data parallel'] / t['bapipe']:.2f}× over DP)", flush=True)
            write_atomic(args.out / "partition_sim.json", json.dumps([asdict(r) for r in results], indent=1))
    seconds = time.perf_counter() - start
    write_atomic(args.out / "partition_sim.md", report(results, seconds, args))
    print(f"wrote {args.out}/partition_sim.md ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
