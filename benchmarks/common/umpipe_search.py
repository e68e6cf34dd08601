"""The GA search-time measurements of ``bench_search.py`` (UMPIPE 7(b)) and their report.

Cost tables are synthetic and seeded: stage ``k`` forward ``f_k(b) = α_k + β_k · max(b, s_k)``
(α log-uniform in [20, 400] µs, β in [2, 40] µs per sample, saturation s_k in {1, ..., 32}),
backward ``2 f_k``, recompute ``3 f_k``, sends ``10 µs + b · 2 µs``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
from harness import Chart, Headline, Report, Row, Target

from pipetrain.planners.microbatch.ga import GAConfig, dgap, tidgap
from pipetrain.planners.microbatch.result import MicrobatchPlan
from pipetrain.simulate.vectorised import StageTables

__all__ = ["per_generation", "ratio_pair", "search_report", "tables", "timed"]

Planner = Callable[..., MicrobatchPlan]


def tables(n_stages: int, batch: int, seed: int = 0) -> StageTables:
    """Seeded affine-with-saturation cost tables ``[K, B + 1]`` (module docstring)."""
    rng = np.random.default_rng(seed)
    b = np.arange(batch + 1, dtype=np.float64)
    alpha = np.exp(rng.uniform(np.log(20e-6), np.log(400e-6), size=(n_stages, 1)))
    beta = rng.uniform(2e-6, 40e-6, size=(n_stages, 1))
    saturation = rng.integers(1, 33, size=(n_stages, 1))
    forward = np.where(b > 0, alpha + beta * np.maximum(b, saturation), 0.0)
    send = np.where(b > 0, 10e-6 + 2e-6 * b, 0.0) * np.ones((n_stages, 1))
    return StageTables(forward, 2 * forward, send, send, np.zeros(n_stages), 3 * forward)


def timed(planner: Planner, table: StageTables, config: GAConfig, seed: int) -> tuple[float, MicrobatchPlan]:
    """Wall seconds of one search, and its plan."""
    start = time.perf_counter()
    result = planner(table, seed=seed, config=config)
    return time.perf_counter() - start, result


def _cpu_timed(planner: Planner, table: StageTables, config: GAConfig,
               seed: int) -> tuple[float, float, MicrobatchPlan]:
    """Wall seconds, this process's CPU seconds (which waiting for a shared core does not inflate), the plan."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = planner(table, seed=seed, config=config)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def ratio_pair(n_stages: int, batch: int, config: GAConfig, round_: int) -> Row:
    """DGAP and TiDGAP once each from seed ``round_``, DGAP first in even rounds; in round 0 one
    untimed warm-up call of each first (numpy's and torch's first calls, caches)."""
    table = tables(n_stages, batch)
    if round_ == 0:
        for planner in (dgap, tidgap):
            planner(table, seed=1, config=GAConfig(population=config.population, generations=1))
    order = (("dgap", dgap), ("tidgap", tidgap)) if round_ % 2 == 0 else (("tidgap", tidgap), ("dgap", dgap))
    out, plans = {}, {}
    for name, planner in order:
        out[f"{name}_s"], out[f"{name}_cpu_s"], plans[name] = _cpu_timed(planner, table, config, round_)
    a, b = plans["dgap"], plans["tidgap"]
    same = (a.forward_sizes, a.backward_sizes, a.iteration_s) == (b.forward_sizes, b.backward_sizes, b.iteration_s)
    return {"stages": n_stages, "batch": batch, "population": config.population, "generations": config.generations,
            **out, "same_plans": same}


def per_generation(n_stages: int, batch: int, generations: int, dgap_generations: int) -> Row:
    """Seconds per generation of TiDGAP and DGAP at ``(stages, batch)``, population 128, generation 0 subtracted."""
    table = tables(n_stages, batch)

    def seconds(planner: Planner, g: int) -> float:
        return timed(planner, table, GAConfig(population=128, generations=g), 0)[0]

    return {"stages": n_stages, "batch": batch,
            "tidgap_s_per_generation": (seconds(tidgap, generations) - seconds(tidgap, 0)) / max(generations, 1),
            "dgap_s_per_generation": (seconds(dgap, dgap_generations) - seconds(dgap, 0)) / max(dgap_generations, 1)}


def _ratio_lines(rows: list[Row]) -> tuple[list[str], dict[tuple[int, int], tuple[float, Row]]]:
    lines = ["| stages | batch | population | generations | dgap s | tidgap s | dgap / tidgap (per-pair range) | "
             "the same, CPU seconds | same plans | pairs |", "|---|---|---|---|---|---|---|---|---|---|"]
    medians = {}
    for key in dict.fromkeys((r["stages"], r["batch"]) for r in rows):
        rs = [r for r in rows if (r["stages"], r["batch"]) == key]
        ratios = [r["dgap_s"] / r["tidgap_s"] for r in rs]
        cpu = statistics.median(r["dgap_cpu_s"] / r["tidgap_cpu_s"] for r in rs)
        medians[key] = (statistics.median(ratios), rs[0])
        same = "yes" if all(r["same_plans"] for r in rs) else "**no**"
        lines.append(f"| {key[0]} | {key[1]} | {rs[0]['population']} | {rs[0]['generations']} | "
                     f"{statistics.median(r['dgap_s'] for r in rs):.3f} | "
                     f"{statistics.median(r['tidgap_s'] for r in rs):.4f} | {medians[key][0]:.1f}× "
                     f"({min(ratios):.1f}–{max(ratios):.1f}) | {cpu:.1f}× | {same} | {len(rs)} |")
    return lines, medians


def search_report(rows: list[Row]) -> Report:
    """The ratio table, the headline run, the scaling table; headlines with their targets (BENCHMARKS.md
    "UMPIPE (b)": DGAP / TiDGAP ≥ 20× at P = 128, G = 20; TiDGAP at 8 × 256, P = 128, G = 500 ≤ 10 s)."""
    lines, medians = _ratio_lines([r for r in rows if r["kind"] == "ratio"])
    headlines = [Headline("search", f"DGAP / TiDGAP wall time, {k} stages, batch {b}, P = {r['population']}, "
                                    f"G = {r['generations']}", ratio,
                          target=Target(">=", 20) if (r["population"], r["generations"]) == (128, 20) else None,
                          config="synthetic cost tables, CPU") for (k, b), (ratio, r) in medians.items()]
    head = [r for r in rows if r["kind"] == "headline"]
    if head:
        h, median = head[0], statistics.median(r["tidgap_s"] for r in head)
        runs = ", ".join(f"{r['tidgap_s']:.2f}" for r in head)
        lines += ["", f"Headline: TiDGAP, {h['stages']} stages, batch {h['batch']}, population {h['population']}, "
                      f"{h['generations']} generations: **{median:.2f} s** "
                      f"(runs: {runs})."]
        headlines.append(Headline("search", f"TiDGAP search, {h['stages']} stages, batch {h['batch']}, "
                                            f"P = {h['population']}, G = {h['generations']}", median, unit="s",
                                  target=Target("<=", 10) if h["generations"] == 500 else None,
                                  config="synthetic cost tables, CPU"))
    scaling = [r for r in rows if r["kind"] == "scaling"]
    lines += ["", "Scaling (ms per generation, population 128):", "", "| stages | batch | tidgap | dgap | ratio |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['stages']} | {r['batch']} | {1e3 * r['tidgap_s_per_generation']:.2f} | "
              f"{1e3 * r['dgap_s_per_generation']:.1f} | "
              f"{r['dgap_s_per_generation'] / r['tidgap_s_per_generation']:.0f}× |" for r in scaling]
    chart = Chart("search", "scaling", "DGAP / TiDGAP time per generation (population 128)", "bars",
                  "DGAP / TiDGAP (×)", x_label="stages × batch",
                  categories=tuple(f"{r['stages']}×{r['batch']}" for r in scaling),
                  series=(("per generation", tuple(r["dgap_s_per_generation"] / r["tidgap_s_per_generation"]
                                                   for r in scaling)),))
    return Report("\n".join(lines), tuple(headlines), (chart,) if scaling else ())
