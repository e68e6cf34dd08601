"""Asynchronous pipelines against the papers, simulated: PipeDream vs data parallelism, 2BW vs GPipe.

    .venv/bin/python benchmarks/bench_async_sim.py --out benchmarks/results/async-sim
    .venv/bin/python benchmarks/bench_async_sim.py --quick --out /tmp/async-sim      # smoke run

Profiles are *estimated* for a V100 (:mod:`pipetrain.profile.estimate`); every time is the event
simulator's. Devices are V100-16GB, as in both papers (docs/algorithms.md §3.1).

**PipeDream vs data parallelism** (PipeDream, SOSP'19: up to 5.3× on VGG-16, 5.28× on cluster A;
GNMT-16 2.34× on cluster A and 3.14× on B; time to accuracy on real clusters). vgg16 and gnmt
(zoo) on the paper's two cluster kinds: ``A``: servers of 4 V100 on PCIe (assumed 10 GB/s, 10 µs)
joined by 10 Gbit/s Ethernet; ``B``: servers of 8 V100 on NVLink (150 GB/s, 5 µs) joined by
25 Gbit/s. The batch is 64 samples per device (PipeDream's per-GPU minibatch for VGG-16),
``B = 64 · D``. (The clusters as files, and this comparison by the current planner, which may
answer data parallelism: ``bench_pipedream_paper.py``.)

* ``data parallel``: every layer on every device, micro-batches round-robin, gradients all-reduced
  once per batch (gpipe, ``m`` a multiple of ``D``, the fastest ``m``): seconds per batch;
* ``pipedream``: ``plan --planner pipedream --method pipedream`` (docs/algorithms.md §3.6: the DP's
  steady-state objective, 1F1B-RR), micro-batches of at least 32 samples: steady-state seconds per
  batch (no flush);
* speed-up: data parallel's seconds per batch over pipedream's (the same samples).

**2BW vs GPipe and PipeDream-Flush** (PipeDream-2BW, ICML'21: up to 3.2× over GPipe, GPT on
V100-16GB). GPT sizes of the 2BW paper, built from the zoo's GPT with overrides (context 512,
vocabulary 50257): 1.3B (24 blocks, hidden 2048), 2.2B (24, 2560), 3.8B (32, 3072); batch 512,
Adam; 8 and 16 devices (p3.16xlarge servers of 8, NVLink, 25 Gbit/s).

* ``2bw``: ``plan --planner 2bw`` (depth, micro-batch size, recompute under memory; width 1);
* ``gpipe`` and ``1f1b`` (PipeDream-Flush): the same search space (depth ``1..D`` with idle devices
  allowed, balanced stages, micro-batches of powers of two up to 64 of them, recompute on or off),
  the fastest plan that fits, seconds per batch.

Output under ``--out``: ``async_sim.json`` and ``async_sim.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.counts import candidate_counts, thinned_counts
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.pipedream import PipeDreamReport, plan_pipedream
from pipetrain.planners.score import over_memory
from pipetrain.planners.twobw import TwoBWReport, micro_batch_sizes, plan_2bw, two_bw_plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

GIB = 2**30
V100_16GB = 16 * GIB
CLUSTERS = {  # name: (servers, devices per server, intra link, inter link)
    "A 4x4": (4, 4, Link(1e-5, 10e9), Link(2e-5, 10e9 / 8)),
    "B 2x8": (2, 8, Link(5e-6, 150e9), Link(2e-5, 25e9 / 8)),
}
GPT_SIZES = {"gpt-1.3b": dict(blocks=24, hidden=2048, heads=16), "gpt-2.2b": dict(blocks=24, hidden=2560, heads=20),
             "gpt-3.8b": dict(blocks=32, hidden=3072, heads=24)}
GPT_DEVICES = (8, 16)
GPT_BATCH = 512
P3 = (Link(5e-6, 150e9), Link(2e-5, 25e9 / 8))
PAPER = {("vgg16", "A 4x4"): "5.28×", ("vgg16", "B 2x8"): "up to 5.3× (B's figure not in PAPERS.md)",
         ("gnmt", "A 4x4"): "2.34×", ("gnmt", "B 2x8"): "3.14×"}
PAPER_2BW = "up to 3.2× (vs GPipe)"


@dataclass(frozen=True)
class PipeDreamRow:
    model: str
    cluster: str
    batch: int
    dp_batch_s: float
    dp_micro: int
    pipedream_batch_s: float
    pipedream_config: str
    pipedream_micro: int
    speedup: float
    search_s: float


@dataclass(frozen=True)
class TwoBWRow:
    model: str
    devices: int
    gpipe_s: float
    gpipe_plan: str
    flush_s: float
    flush_plan: str
    twobw_s: float
    twobw_plan: str
    speedup_gpipe: float
    speedup_flush: float
    search_s: float


def cluster(servers: int, per_server: int, intra: Link, inter: Link) -> Cluster:
    """V100-16GB servers (both papers' devices)."""
    base = Cluster.homogeneous("v100", servers, per_server, intra, inter)
    return replace(base, devices=tuple(replace(d, memory_bytes=V100_16GB) for d in base.devices))


def data_parallel_s(graph: LayerGraph, cost: CostModel, batch: int) -> tuple[float, int]:
    """The fastest data-parallel plan's seconds per batch (``m`` a multiple of ``D``) and its ``m``."""
    d = cost.cluster.n_devices
    best = (float("inf"), 0)
    for m in (m for m in candidate_counts(batch) if m % d == 0 and m <= 4 * d):
        sizes = equal_sizes(batch, m)
        plan = Plan(graph.name, graph.fingerprint(), batch, Method.GPIPE,
                    (StagePlan(tuple(graph.names), tuple(range(d)), sizes, sizes),))
        best = min(best, (simulate(build_schedule(plan), plan, cost).iteration_s, m))
    return best


def pipedream_row(name: str, cluster_name: str) -> PipeDreamRow:
    """PipeDream's steady-state plan vs data parallelism for ``name`` on one of :data:`CLUSTERS`."""
    servers, per, intra, inter = CLUSTERS[cluster_name]
    graph = build_model(name)
    batch = 64 * servers * per
    cost = CostModel(estimate_profile(graph, "v100", batch_size=batch), cluster(servers, per, intra, inter))
    dp_s, dp_m = data_parallel_s(graph, cost, batch)
    start = time.perf_counter()
    problem = PlanningProblem(ModelRef.of(graph), cost, batch, constraints=Constraints(method=Method.PIPEDREAM))
    result = plan_pipedream(problem, counts=[m for m in thinned_counts(batch) if batch // m >= 32])
    search_s = time.perf_counter() - start
    assert isinstance(result.report, PipeDreamReport)
    best = result.candidates[0]
    return PipeDreamRow(name, cluster_name, batch, dp_s, dp_m, best.iteration_s, best.label.removeprefix("pipedream "),
                        len(best.plan.stages[0].forward_sizes), dp_s / best.iteration_s, search_s)


def describe(plan: Plan) -> str:
    """``d=8 b=16 recompute``: depth, micro-batch size, recompute."""
    b = plan.batch_size // len(plan.stages[0].forward_sizes)
    return f"d={plan.n_stages} b={b}{' recompute' if plan.recompute_stages else ''}"


def flush_best(problem: PlanningProblem, method: Method) -> tuple[float, str]:
    """The fastest ``method`` (gpipe or 1f1b) plan that fits, over 2BW's search space (module docstring)."""
    best = (float("inf"), "none fits")
    for depth in range(1, min(problem.cost.cluster.n_devices, len(problem.layer_names)) + 1):
        sub, _ = placed_cluster(problem.cost.cluster, range(depth))
        cost = problem.cost.on(sub)
        for b in micro_batch_sizes(problem.batch_size, 1):
            for recompute in (False, True):
                plan = replace(two_bw_plan(problem, depth, b, recompute), method=method, weights=WeightPolicy.SYNC)
                if over_memory(plan, cost, problem.optimizer):
                    continue
                best = min(best, (simulate(build_schedule(plan), plan, cost).iteration_s, describe(plan)))
                break  # recompute only when needed: it is never faster
    return best


def twobw_row(name: str, graph: LayerGraph, devices: int) -> TwoBWRow:
    """2BW's plan vs the best GPipe and PipeDream-Flush plans for one GPT size on ``devices`` V100s."""
    servers, per = max(1, devices // 8), min(devices, 8)
    cost = CostModel(estimate_profile(graph, "v100", batch_size=GPT_BATCH), cluster(servers, per, *P3))
    problem = PlanningProblem(ModelRef.of(graph), cost, GPT_BATCH, optimizer="adam")
    start = time.perf_counter()
    result = plan_2bw(problem)
    search_s = time.perf_counter() - start
    assert isinstance(result.report, TwoBWReport)
    gpipe_s, gpipe_plan = flush_best(problem, Method.GPIPE)
    flush_s, flush_plan = flush_best(problem, Method.ONE_F_ONE_B)
    two = result.candidates[0].iteration_s
    return TwoBWRow(name, devices, gpipe_s, gpipe_plan, flush_s, flush_plan, two, describe(result.plan),
                    gpipe_s / two, flush_s / two, search_s)


def report(pd: list[PipeDreamRow], tb: list[TwoBWRow], seconds: float, command: str) -> str:
    """The Markdown tables of ``async_sim.md``."""
    lines = ["# Asynchronous pipelines, simulated (V100 device model)", "",
             f"`{command}` on {platform.node() or 'this machine'} ({platform.processor() or platform.machine()}), "
             f"{seconds:.0f} s. Profiles estimated for a V100; devices V100-16GB; times from the event simulator.", "",
             "## PipeDream vs data parallelism (seconds per batch of 64 samples per device)", "",
             "| model | cluster | batch | data parallel (s) | pipedream (s) | pipedream config | micro-batches "
             "| ours: speed-up | paper | planner (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in pd:
        lines.append(f"| {r.model} | {r.cluster} | {r.batch} | {r.dp_batch_s:.3f} (m={r.dp_micro}) | "
                     f"{r.pipedream_batch_s:.3f} | {r.pipedream_config} | {r.pipedream_micro} | {r.speedup:.2f}× | "
                     f"{PAPER[(r.model, r.cluster)]} | {r.search_s:.1f} |")
    lines += ["", f"## 2BW vs GPipe and PipeDream-Flush (seconds per batch of {GPT_BATCH}, Adam)", "",
              "| model | devices | gpipe (s) | gpipe plan | 1f1b (s) | 1f1b plan | 2bw (s) | 2bw plan "
              "| ours: vs gpipe | ours: vs 1f1b | paper | planner (s) |", "|---" * 12 + "|"]
    for t in tb:
        lines.append(f"| {t.model} | {t.devices} | {t.gpipe_s:.3f} | {t.gpipe_plan} | {t.flush_s:.3f} | "
                     f"{t.flush_plan} | {t.twobw_s:.3f} | {t.twobw_plan} | {t.speedup_gpipe:.2f}× | "
                     f"{t.speedup_flush:.2f}× | {PAPER_2BW} | {t.search_s:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/async-sim"))
    parser.add_argument("--quick", action="store_true", help="vgg16 on cluster A and gpt-1.3b on 8 devices only")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    pd_cases = [("vgg16", "A 4x4")] if args.quick else [(m, c) for m in ("vgg16", "gnmt") for c in CLUSTERS]
    pd = [pipedream_row(m, c) for m, c in pd_cases]
    for r in pd:
        print(f"{r.model} {r.cluster}: dp {r.dp_batch_s:.3f} s, pipedream {r.pipedream_batch_s:.3f} s "
              f"({r.pipedream_config}), {r.speedup:.2f}×", flush=True)
    tb = []
    for name, sizes in list(GPT_SIZES.items())[:1 if args.quick else None]:
        graph = build_model("gpt1-14", vocab=50257, context=512, **sizes)
        for devices in GPT_DEVICES[:1 if args.quick else None]:
            tb.append(twobw_row(name, graph, devices))
            t = tb[-1]
            print(f"{name} on {devices}: gpipe {t.gpipe_s:.3f} s, 1f1b {t.flush_s:.3f} s, 2bw {t.twobw_s:.3f} s "
                  f"({t.twobw_plan})", flush=True)
    command = "benchmarks/bench_async_sim.py" + (" --quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "async_sim.json",
                 json.dumps({"pipedream": [asdict(r) for r in pd], "2bw": [asdict(t) for t in tb]}, indent=1))
    write_atomic(args.out / "async_sim.md", report(pd, tb, time.perf_counter() - start, command))
    print(f"wrote {args.out}/async_sim.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
