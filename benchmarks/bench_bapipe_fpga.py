"""BaPipe on simulated FPGA clusters (PAPERS.md §4): its exploration against data parallelism, an equal
split and PipeDream's planner, with the ``fpga`` device model.

    .venv/bin/python benchmarks/bench_bapipe_fpga.py            # full: 3 models × 4 clusters
    .venv/bin/python benchmarks/bench_bapipe_fpga.py --quick    # vgg16 on the first cluster

Results go to ``benchmarks/results/bapipe-fpga/``. BaPipe's abstract says only that it was also
evaluated "on simulated FPGA clusters with different configurations" and reached up to 3.2×
speed-up and 4× memory reduction over data- and pipeline-parallel frameworks; the clusters are not
described. Assumed here (:data:`CONFIGS`): U280-class cards (``fpga``: 10 TFLOP/s sustained,
425 GB/s HBM, 8 GiB; pipetrain.cluster), four per server on PCIe 3 peer-to-peer (12 GB/s, 10 µs),
servers joined by 100 Gb/s or 10 Gb/s Ethernet (20 µs), and one mixed cluster whose second server
holds half-speed cards with 4 GiB. Profiles are estimated for the ``fpga`` model
(:func:`~pipetrain.profile.estimate.estimate_profile`, fp32) at ``--batch`` samples; models are
BaPipe's: zoo ``vgg16``, ``resnet50``, ``gnmt``. Per model and cluster: data parallelism (one stage
on every card, gpipe), an equal layer split (gpipe/1f1b, best ``m``), PipeDream's planner (run
synchronously) and BaPipe's :func:`~pipetrain.planners.bapipe.explore` (gpipe and 1f1b)
(:mod:`common.partition_plans`), each timed by the event simulator; memory is the most any card
holds (SGD).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.partition_plans import EQUAL, GIB, data_parallel, equal_split, plan_row
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain.cluster import DEVICE_MODELS, Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.planners.bapipe import explore
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.planners.pipedream import plan_pipedream
from pipetrain.profile.estimate import estimate_profile

MODELS = ("vgg16", "resnet50", "gnmt")
PCIE_P2P = Link(10e-6, 12e9)
CONFIGS: dict[str, tuple[int, Link, bool]] = {  # name: (cards, link between servers, second server half-speed)
    "4 cards, 1 server": (4, PCIE_P2P, False),
    "8 cards, 100 Gb/s": (8, Link(20e-6, 100e9 / 8), False),
    "8 cards, 10 Gb/s": (8, Link(20e-6, 10e9 / 8), False),
    "4 + 4 half-speed, 100 Gb/s": (8, Link(20e-6, 100e9 / 8), True),
}
PLANNERS = ("data parallel", "equal split", "pipedream", "bapipe")
PAPER = "up to 3.2× speed-up and 4× memory reduction over data- and pipeline-parallel frameworks"


def cluster_of(name: str) -> Cluster:
    """The cluster ``name`` of :data:`CONFIGS`: servers of four cards."""
    cards, across, mixed = CONFIGS[name]
    full = DEVICE_MODELS["fpga"].memory_bytes
    devices = tuple(Device("fpga#half", full // 2, 0.5, 1) if mixed and i >= 4 else Device("fpga", full, 1.0, i // 4)
                    for i in range(cards))
    return Cluster(devices, PCIE_P2P, across, name)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=64, help="samples per mini-batch (default 64)")


def settings(ctx: Context) -> list[tuple[str, str]]:
    return [(MODELS[0], next(iter(CONFIGS)))] if ctx.quick else [(m, c) for m in MODELS for c in CONFIGS]


def run(setting: tuple[str, str], ctx: Context) -> list[Row]:
    """The four planners' plans for one model on one cluster, simulated."""
    model, config = setting
    batch = ctx.args.batch
    graph = build_model(model)
    profile = estimate_profile(graph, "fpga", batch)
    cluster = cluster_of(config)
    cost = CostModel({d.kind: profile for d in cluster.devices}, cluster)
    problem = PlanningProblem(ModelRef.of(graph), cost, batch)
    rows = []
    for planner in PLANNERS:
        start = time.perf_counter()
        if planner == "data parallel":
            plan, plan_cost = data_parallel(graph, cost, batch), cost
        elif planner == "equal split":
            plan, plan_cost = equal_split(graph, cost, batch), cost
        else:
            result = plan_pipedream(problem) if planner == "pipedream" else explore(problem, methods=EQUAL)
            plan, plan_cost = result.plan, cost.on(result.cluster)
        rows.append({"model": model, "cluster": config, "batch": batch,
                     **plan_row(planner, plan, plan_cost, time.perf_counter() - start)})
    ctx.log(f"{model}, {config}: " + " ".join(f"{r['planner']} {1e3 * r['iteration_s']:.1f} ms" for r in rows))
    return rows


def report(rows: list[Row], info: RunInfo) -> Report:
    """Times, speed-ups and memory per model and cluster; BaPipe's best figures beside the paper's."""
    keys = list(dict.fromkeys((r["model"], r["cluster"]) for r in rows))
    lines = [f"Estimated fpga profiles (U280-class), SGD. BaPipe's paper: {PAPER}.", "",
             "| model | cluster | " + " | ".join(f"{p} ms" for p in PLANNERS) + " | bapipe vs DP | bapipe vs equal | "
             "bapipe vs pipedream | GiB: DP, bapipe (DP / bapipe) | bapipe plan |", "|---|---|" + "---|" * 9]
    ratios: dict[str, list[float]] = {"vs DP": [], "vs equal split": [], "vs pipedream": [], "memory": []}
    for model, config in keys:
        by = {r["planner"]: r for r in rows if (r["model"], r["cluster"]) == (model, config)}
        t = {p: by[p]["iteration_s"] for p in PLANNERS}
        dp, ba = by["data parallel"], by["bapipe"]
        for key, base in (("vs DP", "data parallel"), ("vs equal split", "equal split"), ("vs pipedream", "pipedream")):
            ratios[key].append(t[base] / t["bapipe"])
        ratios["memory"].append(dp["peak_memory_bytes"] / ba["peak_memory_bytes"])
        lines.append(
            f"| {model} | {config} | " + " | ".join(f"{1e3 * t[p]:.1f}{'' if by[p]['fits'] else ' (over)'}"
                                                  for p in PLANNERS)
            + "".join(f" | {ratios[k][-1]:.2f}×" for k in ("vs DP", "vs equal split", "vs pipedream")) + " | "
            f"{dp['peak_memory_bytes'] / GIB:.2f}, {ba['peak_memory_bytes'] / GIB:.2f} ({ratios['memory'][-1]:.2f}×) | "
            f"{ba['method']} m={ba['n_micro']} {' '.join(ba['stages'])} |")
    if not keys:
        return Report("No rows.")
    config = f"simulated, estimated fpga (U280-class) profiles, {len({c for _, c in keys})} FPGA clusters, " \
             f"batch {rows[0]['batch']}"
    headlines = (
        Headline("papers", "BaPipe over data parallelism on FPGA clusters, best case", max(ratios["vs DP"]),
                 paper="up to 3.2× speed-up", paper_value=3.2, config=config),
        Headline("papers", "BaPipe over an equal-split pipeline on FPGA clusters, best case",
                 max(ratios["vs equal split"]), paper="up to 3.2× speed-up", paper_value=3.2, config=config),
        Headline("papers", "BaPipe's memory reduction over data parallelism on FPGA clusters, best case",
                 max(ratios["memory"]), paper="4× memory reduction", config=config))
    chart = Chart("papers", "speedup", "BaPipe's speed-up on simulated FPGA clusters", "bars", "bapipe speed-up (×)",
                  categories=tuple(f"{m}, {c}" for m, c in keys),
                  series=tuple((k, tuple(v)) for k, v in ratios.items() if k != "memory"))
    return Report("\n".join(lines), headlines, (chart,))


EXPERIMENT = Experiment(name="bapipe-fpga", title="Partitioning (e): BaPipe on simulated FPGA clusters",
                        settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
