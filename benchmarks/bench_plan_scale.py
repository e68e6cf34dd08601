"""Planning at scale (issue 30): plan time per planner against devices and layers, growth stated.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_scale.py --out benchmarks/results/plan-scale
    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_scale.py --quick --out /tmp/plan-scale     # smoke run
    PYTHONPATH=<old tree> .venv/bin/python benchmarks/bench_plan_scale.py --tag before ...          # a baseline

Each point plans zoo ``gpt1-14`` (``--blocks`` transformer blocks, blocks + 2 layers) at batch 512 on
``nodes × 8`` A100s (estimated profiles; NVLink 300 GB/s, 5 µs inside a server, HDR InfiniBand
200 Gb/s, 5 µs between servers: examples/clusters/64x8-a100.yaml) with ``api.plan``, in a fresh
process under a time limit (``--limit``; a point over it is recorded as skipped, and the larger
sizes of that planner are not tried). Two axes:

1. **devices** 8, 64, 512, 4096 at 14 layers;
2. **layers** 14, 32, 62 on 64 devices.

Times are the planning call's CPU seconds (``time.process_time``: the load of a shared machine
inflates wall time, not CPU time) and its wall seconds; the model and profile are built outside it.
The growth exponent is the slope of log CPU time against log size between the first and last point
measured. Output under ``--out``: ``plan-scale-<tag>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipetrain.fileio import write_atomic

PLANNERS = ("balanced", "pipedream", "bapipe", "interleaved", "tidgap", "auto")
DEVICES = (8, 64, 512, 4096)
BLOCKS = (12, 30, 60)
BATCH = 512


def one(planner: str, devices: int, blocks: int) -> dict[str, Any]:
    """Plan once in this process; the plan's summary and the seconds it took."""
    from pipetrain import api
    from pipetrain.cluster import Cluster, Link
    from pipetrain.graph.zoo import build_model

    graph = build_model("gpt1-14", blocks=blocks)
    nodes = max(1, devices // 8)
    cluster = Cluster.homogeneous("a100", nodes, min(devices, 8), Link(5e-6, 300e9), Link(5e-6, 25e9))
    profiles = api.cluster_profiles(graph, cluster, BATCH)
    wall, cpu = time.perf_counter(), time.process_time()
    plan = api.plan(graph, profiles, cluster, batch_size=BATCH, planner=planner).plan
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert plan.prediction is not None
    return {"cpu_s": cpu, "wall_s": wall, "method": plan.method.value, "micro": len(plan.stages[0].forward_sizes),
            "stages": "/".join(s.label for s in plan.stages), "iteration_s": plan.prediction.iteration_s}


def measure(planner: str, devices: int, blocks: int, limit: float) -> dict[str, Any]:
    """:func:`one` in a fresh process, or ``{"skipped": why}`` past ``limit`` seconds."""
    row: dict[str, Any] = {"planner": planner, "devices": devices, "layers": blocks + 2}
    cmd = [sys.executable, __file__, "--one", planner, str(devices), str(blocks)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return {**row, "skipped": f"over {limit:.0f} s"}
    except subprocess.CalledProcessError as e:
        return {**row, "skipped": e.stderr.strip().splitlines()[-1][:200]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def growth(rows: list[dict[str, Any]], axis: str) -> float | None:
    """Slope of log CPU seconds against log ``axis`` between the first and last measured row."""
    done = [r for r in rows if "cpu_s" in r]
    if len(done) < 2:
        return None
    a, b = done[0], done[-1]
    return math.log(float(b["cpu_s"]) / float(a["cpu_s"])) / math.log(float(b[axis]) / float(a[axis]))


def axis_rows(planner: str, points: list[tuple[int, int]], limit: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for devices, blocks in points:
        rows.append(measure(planner, devices, blocks, limit))
        print(json.dumps(rows[-1]), flush=True)
        if "skipped" in rows[-1]:
            break  # larger sizes take longer still
    return rows


def table(rows: list[dict[str, Any]], axis: str) -> list[str]:
    lines = [f"| planner | {axis} | CPU s | wall s | plan | predicted s |", "|---|---:|---:|---:|---|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['planner']} | {r[axis]} | skipped: {r['skipped']} | | | |")
        else:
            plan = f"{r['method']} ×{r['micro']} {r['stages']}"
            lines.append(f"| {r['planner']} | {r[axis]} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {plan} | "
                         f"{r['iteration_s']:.4f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/plan-scale"))
    parser.add_argument("--tag", default="after", help="names the output files (e.g. before, after)")
    parser.add_argument("--quick", action="store_true", help="balanced and pipedream on 8 and 64 devices")
    parser.add_argument("--planners", nargs="+", default=list(PLANNERS))
    parser.add_argument("--devices", type=int, nargs="+", default=list(DEVICES))
    parser.add_argument("--blocks", type=int, nargs="+", default=list(BLOCKS), help="first: the devices axis'")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per point before it is skipped")
    parser.add_argument("--one", nargs=3, metavar=("PLANNER", "DEVICES", "BLOCKS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), int(args.one[2]))))
        return
    planners = ["balanced", "pipedream"] if args.quick else args.planners
    devices = DEVICES[:2] if args.quick else args.devices
    blocks = BLOCKS[:1] if args.quick else args.blocks
    result: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                                 "load_before": os.getloadavg(), "tag": args.tag, "by_devices": [], "by_layers": []}
    lines = [f"# Plan time at scale ({args.tag})", "", f"Load average before: {os.getloadavg()[0]:.1f}", ""]
    for planner in planners:
        by_d = axis_rows(planner, [(d, blocks[0]) for d in devices], args.limit)
        by_l = axis_rows(planner, [(64, b) for b in blocks[1:]], args.limit) if len(blocks) > 1 else []
        by_l = [r for r in by_d if r["devices"] == 64] + by_l
        result["by_devices"] += by_d
        result["by_layers"] += by_l
        slopes = growth(by_d, "devices"), growth(by_l, "layers")
        result[f"growth_{planner}"] = slopes
        lines += [f"## {planner}", "", *table(by_d, "devices"), "", *table(by_l, "layers"), "",
                  "growth exponent (CPU): devices " + ("n/a" if slopes[0] is None else f"{slopes[0]:.2f}")
                  + ", layers " + ("n/a" if slopes[1] is None else f"{slopes[1]:.2f}"), ""]
    result["load_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / f"plan-scale-{args.tag}.json", json.dumps(result, indent=1))
    write_atomic(args.out / f"plan-scale-{args.tag}.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
