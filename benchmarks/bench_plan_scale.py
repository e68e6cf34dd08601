"""Planning at scale (issue 30): plan time per planner against devices and layers, growth stated.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_scale.py            # full: 6 planners, both axes
    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_scale.py --quick    # pipedream on 8 devices
    PYTHONPATH=<old tree> .venv/bin/python benchmarks/bench_plan_scale.py --out /tmp/before ...   # a baseline

Results go to ``benchmarks/results/plan-scale/``; ``PYTHONPATH`` picks the pipetrain that plans (the
subprocesses inherit it), so an older tree gives a "before" run to set beside the current one.

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
measured. Targets (issue 30, item 5): every single planner ≤ 10 s and ``auto`` ≤ 60 s on 512 A100s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.partition_scale import BATCH, measure
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, Target, main

PLANNERS = ("balanced", "pipedream", "bapipe", "interleaved", "tidgap", "auto")
DEVICES = (8, 64, 512, 4096)
BLOCKS = (12, 30, 60)
TARGET_DEVICES = 512


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planners", nargs="+", default=list(PLANNERS))
    p.add_argument("--devices", type=int, nargs="+", default=list(DEVICES))
    p.add_argument("--blocks", type=int, nargs="+", default=list(BLOCKS), help="first: the devices axis'")
    p.add_argument("--limit", type=float, default=300.0, help="seconds per point before it is skipped")


def settings(ctx: Context) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """Per planner: the devices axis at the first block count, and the layers axis on 64 devices."""
    a = ctx.args
    planners, devices, blocks = (["pipedream"], [8], [12]) if ctx.quick else (a.planners, a.devices, a.blocks)
    out = []
    for planner in planners:
        out.append((planner, "devices", [(d, blocks[0]) for d in devices]))
        if len(blocks) > 1:
            out.append((planner, "layers", [(64, b) for b in blocks[1:]]))
    return out


def run(setting: tuple[str, str, list[tuple[int, int]]], ctx: Context) -> list[Row]:
    """One planner along one axis, smallest first; after a point over the limit the larger ones are not tried."""
    planner, axis, points = setting
    rows: list[Row] = []
    for devices, blocks in points:
        rows.append({"planner": planner, "axis": axis, "devices": devices, "layers": blocks + 2,
                     **measure(planner, devices, blocks, ctx.args.limit)})
        ctx.log(json.dumps(rows[-1]))
        if str(rows[-1].get("skipped", "")).startswith("over"):
            break  # larger sizes take longer still
    return rows


def growth(rows: list[Row], axis: str) -> float | None:
    """Slope of log CPU seconds against log ``axis`` between the first and last measured row."""
    done = [r for r in rows if "cpu_s" in r]
    if len(done) < 2 or done[0][axis] == done[-1][axis]:
        return None
    a, b = done[0], done[-1]
    return math.log(float(b["cpu_s"]) / float(a["cpu_s"])) / math.log(float(b[axis]) / float(a[axis]))


def table(rows: list[Row], axis: str) -> list[str]:
    lines = [f"| planner | {axis} | CPU s | wall s | plan | predicted s |", "|---|---:|---:|---:|---|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['planner']} | {r[axis]} | skipped: {r['skipped']} | | | |")
        else:
            lines.append(f"| {r['planner']} | {r[axis]} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['method']} "
                         f"×{r['micro']} {r['stages']} | {r['iteration_s']:.4f} |")
    return lines


def report(rows: list[Row], info: RunInfo) -> Report:
    lines: list[str] = []
    headlines = []
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    for planner in planners:
        by_d = [r for r in rows if r["planner"] == planner and r["axis"] == "devices"]
        by_l = [r for r in by_d if r["devices"] == 64] + [r for r in rows if r["planner"] == planner
                                                          and r["axis"] == "layers"]
        slopes = [growth(by_d, "devices"), growth(by_l, "layers")]
        lines += [f"## {planner}", "", *table(by_d, "devices"), ""]
        lines += [*table(by_l, "layers"), ""] if by_l else []
        lines += ["growth exponent (CPU): " + ", ".join(f"{axis} " + ("n/a" if g is None else f"{g:.2f}")
                                                        for axis, g in zip(("devices", "layers"), slopes, strict=True)),
                  ""]
        at = next((r for r in by_d if r["devices"] == TARGET_DEVICES), None)
        if at is not None:
            limit = 60.0 if planner == "auto" else 10.0
            headlines.append(Headline("search", f"plan time of `{planner}`, gpt1-14 on {TARGET_DEVICES} A100s",
                                      at.get("cpu_s"), unit="s", target=Target("<=", limit),
                                      config=f"CPU s of the planning call, batch {BATCH}, estimated profiles"
                                             + (f"; {at['skipped']}" if "skipped" in at else "")))
    devices = sorted({r["devices"] for r in rows if r["axis"] == "devices"})
    cpu = {(r["planner"], r["devices"]): r.get("cpu_s") for r in rows if r["axis"] == "devices"}
    chart = Chart("search", "devices", f"Plan time against devices, gpt1-14 (batch {BATCH}, A100 servers of 8)",
                  "bars", "CPU seconds", x_label="devices", categories=tuple(str(d) for d in devices),
                  series=tuple((p, tuple(cpu.get((p, d)) for d in devices)) for p in planners))
    return Report("\n".join(lines), tuple(headlines), (chart,) if devices else ())


EXPERIMENT = Experiment(name="plan-scale", title="Planning at scale: plan time against devices and layers",
                        settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
