"""PipeDream partitioner: planning time against layers and devices (PAPERS.md §2.3-§2.4; DESIGN.md §6).

    .venv/bin/python benchmarks/bench_planner_time.py            # full: 3 rounds
    .venv/bin/python benchmarks/bench_planner_time.py --quick    # small sizes, 1 round

Results go to ``benchmarks/results/planner-time/``. Times
:func:`~pipetrain.planners.partition.pipedream.pipedream_partition` (median over ``--repeats`` rounds) on
two axes and fits the growth exponent (the slope of log time against log size) to each:

1. **layers** 16 ... 512 on 64 devices (8 servers of 8 GPUs);
2. **devices** 4 ... 1024 at 128 layers, as servers of 8 GPUs (one server of 4 for 4 devices).

``--quick``: 16 ... 128 layers and 4 ... 64 devices, so that it still times the target's point.

Per-layer costs are synthetic and seeded: forward + backward log-uniform in [0.5, 5] ms, output
activations log-uniform in [1, 32] MB, weights log-uniform in [0.1, 200] MB. Links: 300 GB/s and
5 µs inside a server, 12.5 GB/s and 20 µs between servers. Planning time depends on the sizes far
more than on these numbers. Target (BENCHMARKS.md, partitioning (c)): 128 layers on 64 devices under 30 s.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, Target, main

from pipetrain.planners.partition.pipedream import Level, pipedream_partition

INTRA = (300e9, 5e-6)
INTER = (12.5e9, 20e-6)
LAYERS = (16, 32, 64, 128, 256, 512)
DEVICES = (4, 8, 16, 64, 256, 1024)
COMPLEXITY = {
    "layers": "O(L^3 M1 + L^2 M1^2 log L) lower level + O(L^2 M2 + L M2^2 log L) top: L^2..L^3",
    "devices": "lower level fixed (M1 = 8); top O(L^2 M2 + L M2^2 log L): D^1..D^2 once it dominates",
}
FIXED = {"layers": "64 devices (8 x 8)", "devices": "128 layers, servers of 8"}


def costs(n_layers: int, seed: int = 0) -> tuple[list[float], list[float], list[float]]:
    """Seeded per-layer (seconds, output bytes, parameter bytes); see the module docstring."""
    rng = np.random.default_rng(seed)

    def log_uniform(low: float, high: float) -> list[float]:
        return [float(x) for x in np.exp(rng.uniform(np.log(low), np.log(high), n_layers))]

    return log_uniform(0.5e-3, 5e-3), log_uniform(1e6, 32e6), log_uniform(0.1e6, 200e6)


def topology(devices: int) -> list[Level]:
    """Servers of 8 GPUs (one server of ``devices`` when fewer than 8)."""
    per_server = min(devices, 8)
    if devices % per_server:
        raise SystemExit(f"{devices} devices do not fill servers of {per_server}: pick a multiple of 8")
    return [Level(per_server, *INTRA), Level(devices // per_server, *INTER)]


def settings(ctx: Context) -> list[tuple[str, int, int]]:
    """``(axis, layers, devices)`` points."""
    layers, devices = (LAYERS[:4], DEVICES[:4]) if ctx.quick else (LAYERS, DEVICES)
    return [("layers", n, 64) for n in layers] + [("devices", 128, d) for d in devices]


def run(setting: tuple[str, int, int], ctx: Context) -> list[Row]:
    axis, n_layers, devices = setting
    compute_s, output_bytes, parameter_bytes = costs(n_layers)
    start = time.perf_counter()
    result = pipedream_partition(compute_s, output_bytes, parameter_bytes, topology(devices))
    seconds = time.perf_counter() - start
    ctx.log(f"  L={n_layers:4d} D={devices:5d}: {seconds:8.3f} s  config {result.config}")
    return [{"axis": axis, "layers": n_layers, "devices": devices, "seconds": seconds, "config": result.config,
             "bottleneck_s": result.bottleneck_s}]


def medians(rows: list[Row], axis: str) -> list[Row]:
    """One row per point of ``axis``: its median seconds over rounds (``median_s``) and every run (``runs_s``)."""
    points = sorted({(r["layers"], r["devices"]) for r in rows if r["axis"] == axis})
    out = []
    for n, d in points:
        mine = [r for r in rows if r["axis"] == axis and (r["layers"], r["devices"]) == (n, d)]
        runs = [r["seconds"] for r in mine]
        out.append({"layers": n, "devices": d, "median_s": statistics.median(runs), "runs_s": runs,
                    "config": mine[0]["config"]})
    return out


def slopes(points: list[Row], key: str) -> dict[str, float]:
    """Log-log slope of median time against ``key``: over all points and over the last three."""
    x = np.log([float(r[key]) for r in points])
    y = np.log([float(r["median_s"]) for r in points])
    return {"all": float(np.polyfit(x, y, 1)[0]), "last_3": float(np.polyfit(x[-3:], y[-3:], 1)[0])}


def report(rows: list[Row], info: RunInfo) -> Report:
    lines: list[str] = [f"Median of {info.repeats} runs per point.", ""]
    headlines: list[Headline] = []
    charts = []
    for axis, fixed in FIXED.items():
        points = medians(rows, axis)
        if len(points) < 3:
            continue
        fit = slopes(points, axis)
        lines += [f"## Against {axis} ({fixed})", "", "| layers | devices | median s | config |", "|---|---|---|---|"]
        lines += [f"| {r['layers']} | {r['devices']} | {r['median_s']:.3f} | `{r['config']}` |" for r in points]
        lines += ["", f"Growth exponent: **{fit['all']:.2f}** over all points, **{fit['last_3']:.2f}** over the "
                  f"last three; stated complexity {COMPLEXITY[axis]}.", ""]
        headlines.append(Headline("search", f"PipeDream DP: growth exponent of planning time against {axis}",
                                  fit["all"], unit="", config=f"synthetic seeded costs, {fixed}"))
        charts.append(Chart("search", f"by-{axis}", f"PipeDream DP planning time against {axis} ({fixed})", "bars",
                            "median seconds", x_label=axis, categories=tuple(str(r[axis]) for r in points),
                            series=(("pipedream_partition", tuple(r["median_s"] for r in points)),)))
    target = next((r["median_s"] for r in medians(rows, "layers") if (r["layers"], r["devices"]) == (128, 64)), None)
    headlines.insert(0, Headline("search", "PipeDream DP planning time, 128 layers on 64 devices", target, unit="s",
                                 target=Target("<=", 30.0), config="synthetic seeded costs, 8 servers of 8 GPUs"))
    return Report("\n".join(lines), tuple(headlines), tuple(charts))


EXPERIMENT = Experiment(name="planner-time", title="Partitioning (c): the PipeDream DP's planning time",
                        settings=settings, run=run, report=report, repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
