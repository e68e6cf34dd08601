"""PipeDream partitioner: planning time against layers and devices (PAPERS.md §2.3-§2.4; DESIGN.md §6).

    .venv/bin/python benchmarks/bench_planner_time.py --out benchmarks/results/planner-time
    .venv/bin/python benchmarks/bench_planner_time.py --quick --out /tmp/planner-time     # smoke run

Times :func:`~pipetrain.planners.partition.pipedream.pipedream_partition` (median of ``--repeats``) on
two axes and fits the growth exponent (the slope of log time against log size) to each:

1. **layers** 16 ... 512 on 64 devices (8 servers of 8 GPUs);
2. **devices** 4 ... 1024 at 128 layers, as servers of 8 GPUs (one server of 4 for 4 devices).

Per-layer costs are synthetic and seeded: forward + backward log-uniform in [0.5, 5] ms, output
activations log-uniform in [1, 32] MB, weights log-uniform in [0.1, 200] MB. Links: 300 GB/s and
5 µs inside a server, 12.5 GB/s and 20 µs between servers. Planning time depends on the sizes far
more than on these numbers.

Output under ``--out``: ``planner-time.json`` and ``planner-time.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from pipetrain.fileio import write_atomic
from pipetrain.planners.partition.pipedream import DPResult, Level, pipedream_partition

INTRA = (300e9, 5e-6)
INTER = (12.5e9, 20e-6)
COMPLEXITY = {
    "layers": "O(L^3 M1 + L^2 M1^2 log L) lower level + O(L^2 M2 + L M2^2 log L) top: L^2..L^3",
    "devices": "lower level fixed (M1 = 8); top O(L^2 M2 + L M2^2 log L): D^1..D^2 once it dominates",
}


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
        raise SystemExit(f"{devices} devices do not fill servers of {per_server}")
    return [Level(per_server, *INTRA), Level(devices // per_server, *INTER)]


def timed(n_layers: int, devices: int, repeats: int) -> dict[str, object]:
    compute_s, output_bytes, parameter_bytes = costs(n_layers)
    runs: list[float] = []
    result: DPResult | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = pipedream_partition(compute_s, output_bytes, parameter_bytes, topology(devices))
        runs.append(time.perf_counter() - start)
    assert result is not None
    row: dict[str, object] = {"layers": n_layers, "devices": devices, "median_s": statistics.median(runs),
                              "runs_s": runs, "config": result.config, "bottleneck_s": result.bottleneck_s}
    print(f"  L={n_layers:4d} D={devices:5d}: {row['median_s']:8.3f} s  config {result.config}", flush=True)
    return row


def slopes(rows: list[dict[str, object]], key: str) -> dict[str, float]:
    """Log-log slope of median time against ``key``: over all points and over the last three."""
    x = np.log([float(r[key]) for r in rows])  # type: ignore[arg-type]
    y = np.log([float(r["median_s"]) for r in rows])  # type: ignore[arg-type]
    return {"all": float(np.polyfit(x, y, 1)[0]), "last_3": float(np.polyfit(x[-3:], y[-3:], 1)[0])}


def report(result: dict[str, object], args: argparse.Namespace) -> str:
    lines = [
        "# PipeDream partitioner: planning time", "",
        f"Command: `.venv/bin/python benchmarks/bench_planner_time.py{' --quick' if args.quick else ''} "
        f"--out {args.out}`; {result['machine']}; median of {args.repeats} runs.", "",
    ]
    for axis, fixed in (("layers", "64 devices (8 x 8)"), ("devices", "128 layers, servers of 8")):
        rows = result[axis]
        fit = result[f"{axis}_slope"]
        assert isinstance(rows, list) and isinstance(fit, dict)
        lines += [f"## Against {axis} ({fixed})", "", "| layers | devices | median s | config |", "|---|---|---|---|"]
        lines += [f"| {r['layers']} | {r['devices']} | {r['median_s']:.3f} | `{r['config']}` |" for r in rows]
        lines += ["", f"Growth exponent: **{fit['all']:.2f}** over all points, **{fit['last_3']:.2f}** over the "
                  f"last three; stated complexity {COMPLEXITY[axis]}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/planner-time"))
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    layer_axis: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    device_axis: tuple[int, ...] = (4, 8, 16, 64, 256, 1024)
    if args.quick:
        args.repeats, layer_axis, device_axis = 1, (16, 32, 64), (4, 8, 16)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}"
    print("against layers (64 devices)", flush=True)
    by_layers = [timed(n, 64, args.repeats) for n in layer_axis]
    print("against devices (128 layers)", flush=True)
    by_devices = [timed(128, d, args.repeats) for d in device_axis]
    result: dict[str, object] = {"machine": machine, "layers": by_layers, "devices": by_devices,
                                 "layers_slope": slopes(by_layers, "layers"),
                                 "devices_slope": slopes(by_devices, "devices"), "complexity": COMPLEXITY}
    for axis in ("layers", "devices"):
        fit = result[f"{axis}_slope"]
        assert isinstance(fit, dict)
        print(f"growth exponent vs {axis}: {fit['all']:.2f} (all), {fit['last_3']:.2f} (last 3); "
              f"stated {COMPLEXITY[axis]}")
    write_atomic(args.out / "planner-time.json", json.dumps(result, indent=1))
    write_atomic(args.out / "planner-time.md", report(result, args))
    print(f"wrote {args.out}/planner-time.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
