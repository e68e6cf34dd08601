"""BaPipe on simulated FPGA clusters (PAPERS.md §4): its exploration against data parallelism, an equal
split and PipeDream's planner, with the ``fpga`` device model.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_bapipe_fpga.py --out benchmarks/results/bapipe-fpga

BaPipe's abstract says only that it was also evaluated "on simulated FPGA clusters with different
configurations" and reached up to 3.2× speed-up and 4× memory reduction over data- and
pipeline-parallel frameworks; the clusters are not described. Assumed here (:data:`CONFIGS`):
U280-class cards (``fpga``: 10 TFLOP/s sustained, 425 GB/s HBM, 8 GiB; pipetrain.cluster), four per
server on PCIe 3 peer-to-peer (12 GB/s, 10 µs), servers joined by 100 Gb/s or 10 Gb/s Ethernet
(20 µs), and one mixed cluster whose second server holds half-speed cards with 4 GiB. Profiles are
estimated for the ``fpga`` model (:func:`~pipetrain.profile.estimate.estimate_profile`, fp32) at
``--batch`` samples; models are BaPipe's: zoo ``vgg16``, ``resnet50``, ``gnmt``. Per model and
cluster, :mod:`bench_partition_sim`'s data parallelism (one stage on every card, gpipe), equal layer
split (gpipe/1f1b, best ``m``) and PipeDream's planner (run synchronously), and BaPipe's
:func:`~pipetrain.planners.bapipe.explore` (gpipe and 1f1b), each timed by the event simulator;
memory is the most any card holds (SGD). ``--quick``: vgg16 on the first cluster.

Output under ``--out``: ``bapipe_fpga.json`` and ``bapipe_fpga.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench_partition_sim import EQUAL, GIB, Row, data_parallel, equal_split, row

from pipetrain.cluster import DEVICE_MODELS, Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
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


@dataclass(frozen=True)
class Result:
    """The four planners' rows for one model on one cluster."""

    model: str
    cluster: str
    rows: list[Row]


def cluster_of(name: str) -> Cluster:
    """The cluster ``name`` of :data:`CONFIGS`: servers of four cards."""
    cards, across, mixed = CONFIGS[name]
    full = DEVICE_MODELS["fpga"].memory_bytes
    devices = tuple(Device("fpga#half", full // 2, 0.5, 1) if mixed and i >= 4 else Device("fpga", full, 1.0, i // 4)
                    for i in range(cards))
    return Cluster(devices, PCIE_P2P, across, name)


def run(model: str, config: str, batch: int) -> list[Row]:
    """The four planners' plans for ``model`` on cluster ``config``, simulated."""
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
        rows.append(row(planner, plan, plan_cost, time.perf_counter() - start))
    return rows


def report(results: list[Result], args: argparse.Namespace) -> str:
    """``bapipe_fpga.md``: times, speed-ups and memory per model and cluster."""
    lines = ["# BaPipe on simulated FPGA clusters", "",
             f"`PYTHONPATH=. .venv/bin/python benchmarks/bench_bapipe_fpga.py{' --quick' if args.quick else ''} "
             f"--batch {args.batch} --out {args.out}`; estimated fpga profiles (U280-class), SGD. "
             f"BaPipe's paper: {PAPER}.", "",
             "| model | cluster | " + " | ".join(f"{p} ms" for p in PLANNERS) + " | bapipe vs DP | bapipe vs equal | "
             "bapipe vs pipedream | GiB: DP, bapipe (DP / bapipe) | bapipe plan |", "|---|---|" + "---|" * 9]
    for r in results:
        rows = {x.planner: x for x in r.rows}
        t = {p: rows[p].iteration_s for p in PLANNERS}
        dp, ba = rows["data parallel"], rows["bapipe"]
        over = {p: "" if rows[p].fits else " (over)" for p in PLANNERS}
        lines.append(
            f"| {r.model} | {r.cluster} | " + " | ".join(f"{1e3 * t[p]:.1f}{over[p]}" for p in PLANNERS)
            + f" | {t['data parallel'] / t['bapipe']:.2f}× | {t['equal split'] / t['bapipe']:.2f}× | "
            f"{t['pipedream'] / t['bapipe']:.2f}× | {dp.peak_memory_bytes / GIB:.2f}, {ba.peak_memory_bytes / GIB:.2f} "
            f"({dp.peak_memory_bytes / ba.peak_memory_bytes:.2f}×) | {ba.method} m={ba.n_micro} "
            f"{' '.join(ba.stages)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bapipe-fpga"), help="output folder")
    parser.add_argument("--batch", type=int, default=64, help="samples per mini-batch (default 64)")
    parser.add_argument("--quick", action="store_true", help="vgg16 on the first cluster only")
    args = parser.parse_args(argv)
    results: list[Result] = []
    for model in MODELS[:1] if args.quick else MODELS:
        for config in list(CONFIGS)[:1] if args.quick else CONFIGS:
            results.append(Result(model, config, run(model, config, args.batch)))
            print(model, config, " ".join(f"{x.planner} {1e3 * x.iteration_s:.1f} ms" for x in results[-1].rows),
                  flush=True)
    text = report(results, args)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"batch": args.batch, "results": [asdict(r) for r in results]}
    write_atomic(args.out / "bapipe_fpga.json", json.dumps(data, indent=1))
    write_atomic(args.out / "bapipe_fpga.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
