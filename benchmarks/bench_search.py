"""UMPIPE benchmark 7(b): search time of TiDGAP (vectorised fitness) against DGAP (one plan at a time).

    .venv/bin/python benchmarks/bench_search.py --out benchmarks/results/search
    .venv/bin/python benchmarks/bench_search.py --quick --out /tmp/search     # smoke run

Both GAs run the same operators from the same seed and their evaluators give bit-identical times,
so at equal population and generations they return the same plan; only the fitness call differs:
TiDGAP times the whole population ``[P, K, B]`` in one :func:`~pipetrain.simulate.vectorised.
iteration_times` call per generation, DGAP calls :func:`~pipetrain.simulate.vectorised.
iteration_time` ``P`` times. The script measures:

1. **ratio**: DGAP / TiDGAP wall time at equal ``P`` and ``G`` (target >= 20x), runs alternating,
   median of ``--repeats`` per-pair ratios; also the ratio of the process's CPU seconds, which a
   shared, loaded machine distorts less; it checks that both return the same plan;
2. **headline**: TiDGAP on 8 stages, batch 256, population 128, 500 generations (target <= 10 s on
   the 2-core development machine), median of ``--repeats``;
3. **scaling**: seconds per generation of both as the stage count (batch 256) and the batch
   (8 stages) grow, with ``--scaling-generations`` generations per point.

Cost tables are synthetic and seeded: stage ``k`` forward ``f_k(b) = α_k + β_k · max(b, s_k)``
(α log-uniform in [20, 400] µs, β in [2, 40] µs per sample, saturation s_k in {1, ..., 32}),
backward ``2 f_k``, recompute ``3 f_k``, sends ``10 µs + b · 2 µs``. Search time hardly depends on
the numbers, only on ``P``, ``G``, ``K`` and ``B``.

Output under ``--out``: ``search.json``, ``search.md`` and ``search_scaling.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from pipetrain.fileio import write_atomic
from pipetrain.planners.microbatch.ga import GAConfig, dgap, tidgap
from pipetrain.planners.microbatch.result import MicrobatchPlan
from pipetrain.simulate.vectorised import StageTables

Planner = Callable[..., MicrobatchPlan]


def tables(n_stages: int, batch: int, seed: int = 0) -> StageTables:
    """Seeded affine-with-saturation cost tables ``[K, B + 1]`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    b = np.arange(batch + 1, dtype=np.float64)
    alpha = np.exp(rng.uniform(np.log(20e-6), np.log(400e-6), size=(n_stages, 1)))
    beta = rng.uniform(2e-6, 40e-6, size=(n_stages, 1))
    saturation = rng.integers(1, 33, size=(n_stages, 1))
    forward = np.where(b > 0, alpha + beta * np.maximum(b, saturation), 0.0)
    send = np.where(b > 0, 10e-6 + 2e-6 * b, 0.0) * np.ones((n_stages, 1))
    return StageTables(forward, 2 * forward, send, send, np.zeros(n_stages), 3 * forward)


def timed(planner: Planner, table: StageTables, config: GAConfig, seed: int) -> tuple[float, MicrobatchPlan]:
    start = time.perf_counter()
    result = planner(table, seed=seed, config=config)
    return time.perf_counter() - start, result


def cpu_timed(planner: Planner, table: StageTables, config: GAConfig, seed: int) -> tuple[float, float, MicrobatchPlan]:
    """Wall seconds, this process's CPU seconds (which time spent waiting for a shared core does not
    inflate), and the plan."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = planner(table, seed=seed, config=config)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def ratio(n_stages: int, batch: int, config: GAConfig, repeats: int) -> dict[str, object]:
    """DGAP and TiDGAP alternately, ``repeats`` times each after one untimed warm-up call of each;
    medians (wall and CPU) and whether the plans agree."""
    table = tables(n_stages, batch)
    for planner in (dgap, tidgap):  # untimed: first calls into numpy and torch kernels, caches
        planner(table, seed=repeats, config=GAConfig(population=config.population, generations=1))
    runs: dict[str, list[float]] = {key: [] for key in ("dgap", "tidgap", "dgap_cpu", "tidgap_cpu")}
    same = True
    for seed in range(repeats):
        *t_d, r_d = cpu_timed(dgap, table, config, seed)
        *t_t, r_t = cpu_timed(tidgap, table, config, seed)
        for key, (wall, cpu) in (("dgap", t_d), ("tidgap", t_t)):
            runs[key].append(wall)
            runs[f"{key}_cpu"].append(cpu)
        same &= (r_d.forward_sizes, r_d.backward_sizes, r_d.iteration_s) == (
            r_t.forward_sizes, r_t.backward_sizes, r_t.iteration_s)
    ratios = [s / f for s, f in zip(runs["dgap"], runs["tidgap"], strict=True)]
    cpu_ratios = [s / f for s, f in zip(runs["dgap_cpu"], runs["tidgap_cpu"], strict=True)]
    return {"stages": n_stages, "batch": batch, "population": config.population, "generations": config.generations,
            "dgap_s": statistics.median(runs["dgap"]), "tidgap_s": statistics.median(runs["tidgap"]),
            "ratio": statistics.median(ratios), "cpu_ratio": statistics.median(cpu_ratios), "same_plans": same,
            "ratio_runs": ratios, "cpu_ratio_runs": cpu_ratios, **{f"{key}_runs_s": v for key, v in runs.items()}}


def scaling(points: list[tuple[int, int]], generations: int, dgap_generations: int) -> list[dict[str, float]]:
    """Seconds per generation of TiDGAP and DGAP at each ``(stages, batch)``; population 128."""
    rows = []
    for n_stages, batch in points:
        table = tables(n_stages, batch)
        t_t, _ = timed(tidgap, table, GAConfig(population=128, generations=generations), 0)
        t_0, _ = timed(tidgap, table, GAConfig(population=128, generations=0), 0)
        t_d, _ = timed(dgap, table, GAConfig(population=128, generations=dgap_generations), 0)
        t_d0, _ = timed(dgap, table, GAConfig(population=128, generations=0), 0)
        rows.append({"stages": n_stages, "batch": batch,
                     "tidgap_s_per_generation": (t_t - t_0) / max(generations, 1),
                     "dgap_s_per_generation": (t_d - t_d0) / max(dgap_generations, 1)})
        print(f"  K={n_stages:2d} B={batch:4d}: tidgap {1e3 * rows[-1]['tidgap_s_per_generation']:7.2f} ms/gen, "
              f"dgap {1e3 * rows[-1]['dgap_s_per_generation']:8.1f} ms/gen", flush=True)
    return rows


def plot(by_stages: list[dict[str, float]], by_batch: list[dict[str, float]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, rows, key, label in ((axes[0], by_stages, "stages", "stages K (batch 256)"),
                                 (axes[1], by_batch, "batch", "batch B (8 stages)")):
        x = [r[key] for r in rows]
        for name, style in (("tidgap", "o-"), ("dgap", "s--")):
            ax.plot(x, [1e3 * r[f"{name}_s_per_generation"] for r in rows], style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("ms per generation (population 128)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("GA search time: vectorised fitness (TiDGAP) vs one plan at a time (DGAP)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(result: dict[str, object], args: argparse.Namespace) -> str:
    ratios = result["ratio"]
    headline = result["headline"]
    assert isinstance(ratios, list) and isinstance(headline, dict)
    lines = [
        "# UMPIPE 7(b): GA search time", "",
        f"Command: `.venv/bin/python benchmarks/bench_search.py{' --quick' if args.quick else ''} --out {args.out}`; "
        f"{result['machine']}; medians of {args.repeats} runs, DGAP and TiDGAP alternating.", "",
        "| stages | batch | population | generations | dgap s | tidgap s | dgap / tidgap | the same, CPU seconds "
        "| same plans |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ratios:
        lines.append(f"| {r['stages']} | {r['batch']} | {r['population']} | {r['generations']} | {r['dgap_s']:.2f} | "
                     f"{r['tidgap_s']:.3f} | {r['ratio']:.1f}× | {r['cpu_ratio']:.1f}× | "
                     f"{'yes' if r['same_plans'] else '**no**'} |")
    lines += ["", f"Headline: TiDGAP, {headline['stages']} stages, batch {headline['batch']}, population "
              f"{headline['population']}, {headline['generations']} generations: **{headline['median_s']:.2f} s** "
              f"(runs: {', '.join(f'{t:.2f}' for t in headline['runs_s'])}).", "",
              "Scaling (ms per generation, population 128):", "", "| stages | batch | tidgap | dgap | ratio |",
              "|---|---|---|---|---|"]
    for r in [*result["by_stages"], *result["by_batch"]]:  # type: ignore[misc]
        lines.append(f"| {r['stages']} | {r['batch']} | {1e3 * r['tidgap_s_per_generation']:.2f} | "
                     f"{1e3 * r['dgap_s_per_generation']:.1f} | "
                     f"{r['dgap_s_per_generation'] / r['tidgap_s_per_generation']:.0f}× |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/search"))
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scaling-generations", type=int, default=50)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.scaling_generations = 1, 5
    args.out.mkdir(parents=True, exist_ok=True)
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch "
               f"threads, load average at start {os.getloadavg()[0]:.1f}")
    print("ratio at equal population and generations", flush=True)
    ratio_cases = [(4, 64), (8, 256)] if not args.quick else [(4, 32)]
    ratios = []
    for n_stages, batch in ratio_cases:
        ratios.append(ratio(n_stages, batch, GAConfig(population=128, generations=5 if args.quick else 20),
                            args.repeats))
        print(f"  {ratios[-1]}", flush=True)
    headline_config = GAConfig(population=128, generations=20 if args.quick else 500)
    runs = [timed(tidgap, tables(8, 256), headline_config, seed)[0] for seed in range(args.repeats)]
    headline = {"stages": 8, "batch": 256, "population": 128, "generations": headline_config.generations,
                "median_s": statistics.median(runs), "runs_s": runs}
    print(f"headline {headline}", flush=True)
    dgap_generations = 1 if args.quick else 10
    print("scaling", flush=True)
    by_stages = scaling([(k, 256) for k in ((2, 4) if args.quick else (2, 4, 8, 16))],
                        args.scaling_generations, dgap_generations)
    by_batch = scaling([(8, b) for b in ((32, 64) if args.quick else (32, 64, 128, 256, 512, 1024))],
                       args.scaling_generations, dgap_generations)
    machine += f", at end {os.getloadavg()[0]:.1f}"
    result: dict[str, object] = {"machine": machine, "ratio": ratios, "headline": headline,
                                 "by_stages": by_stages, "by_batch": by_batch}
    write_atomic(args.out / "search.json", json.dumps(result, indent=1))
    write_atomic(args.out / "search.md", report(result, args))
    plot(by_stages, by_batch, args.out / "search_scaling.png")
    print(f"wrote {args.out}/search.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
