"""UMPIPE's gain on gpt1-14 against a fixed cost per micro-batch on its head (a sensitivity check).

    .venv/bin/python benchmarks/bench_umpipe_fixed.py             # ~20 min on the shared 2-core machine
    .venv/bin/python benchmarks/bench_umpipe_fixed.py --quick     # 4 V100s, x = 1 ms, a tiny GA

The estimated gpt1-14 profile (:mod:`pipetrain.profile.estimate`, loss and host dispatch included)
gets ``x`` more seconds on its last layer's forward and ``2x`` on its backward at every micro-batch
size, for ``x`` in :data:`EXTRA_MS`: a stand-in for per-micro-batch costs the estimate does not
hold (a host sync on the loss's value, a runtime's bookkeeping on the stage that runs the loss, a
slower logits kernel). Each profile is planned as in ``bench_umpipe_sim.py``
(:func:`common.umpipe_plans.plan_all`: the best equal gpipe and 1f1b plans, the paper-style
``gpipe@4K`` and ``1f1b@4K``, tidgap, tidgap with the cuts searched) on 4 and 8 V100s. It says how
large such a cost must be before unequal micro-batches pay on this model; ``x = 0`` is the estimate
itself.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.umpipe_networks import BATCH, V100_CLUSTERS, build
from common.umpipe_plans import best_equal, paper_label, plan_all
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main, pct

from pipetrain.planners.microbatch.ga import GAConfig
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile

EXTRA_MS = (0.0, 0.25, 0.5, 1.0, 2.0)


def with_head_cost(profile: Profile, extra_s: float) -> Profile:
    """``profile`` with ``extra_s`` more per micro-batch on the last layer's forward, twice it on its backward."""
    head = profile.layers[-1]
    head = replace(head, forward_s=tuple(t + extra_s for t in head.forward_s),
                   backward_s=tuple(t + 2 * extra_s for t in head.backward_s))
    return replace(profile, layers=(*profile.layers[:-1], head))


@functools.cache
def _profile() -> Profile:
    return estimate_profile(build("gpt1-14"), "v100", BATCH)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--population", type=int, default=128, help="GA population (default 128; 16 with --quick)")
    p.add_argument("--generations", type=int, default=200, help="GA generations (default 200; 10 with --quick)")


def _ga(info: RunInfo) -> GAConfig:
    return GAConfig(16, 10) if info.quick else GAConfig(info.options["population"], info.options["generations"])


def settings(ctx: Context) -> list[tuple[str, float]]:
    if ctx.quick:
        return [("4xV100", 1.0)]
    return [(cluster, extra) for cluster in V100_CLUSTERS for extra in EXTRA_MS]


def run(setting: tuple[str, float], ctx: Context) -> list[Row]:
    cluster, extra_ms = setting
    config = _ga(ctx.info)
    ga_1f1b = GAConfig(population=min(64, config.population), generations=max(1, config.generations // 4))
    row, _ = plan_all("gpt1-14", cluster, with_head_cost(_profile(), extra_ms / 1e3), config, ga_1f1b, ctx.seed,
                      cut_rounds=1 if ctx.quick else 3)
    return [{"extra_ms": extra_ms, **row}]


def report(rows: list[Row], info: RunInfo) -> Report:
    config = _ga(info)
    lines = [f"gpt1-14, batch {BATCH}, GA population {config.population}, {config.generations} generations, "
             f"seed {info.seed}.", "",
             "| cluster | head + x ms (fwd), 2x (bwd) | best equal ms | tidgap vs best gpipe | tidgap-cuts vs best "
             "gpipe / vs best equal | vs gpipe@4K / 1f1b@4K | cuts: base → searched |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["times_s"]
        best = best_equal(t)
        lines.append(f"| {r['cluster']} | {r['extra_ms']:g} | {1e3 * best:.1f} | {pct(t['gpipe'] / t['tidgap'] - 1)} | "
                     f"{pct(t['gpipe'] / t['tidgap-cuts'] - 1)} / {pct(best / t['tidgap-cuts'] - 1)} | "
                     f"{pct(t[paper_label('gpipe')] / t['tidgap-cuts'] - 1)} / "
                     f"{pct(t[paper_label('1f1b')] / t['tidgap-cuts'] - 1)} | "
                     f"{r['cuts']['base']} → {r['cuts']['tidgap-cuts']} |")
    clusters = list(dict.fromkeys(r["cluster"] for r in rows))
    extras = sorted({r["extra_ms"] for r in rows})

    def gain(cluster: str, extra: float) -> float | None:
        return next((best_equal(r["times_s"]) / r["times_s"]["tidgap-cuts"] for r in rows
                     if (r["cluster"], r["extra_ms"]) == (cluster, extra)), None)

    headlines = tuple(Headline("methods", f"UMPIPE on gpt1-14, {c}, head +{extras[-1]:g} ms per micro-batch: "
                                          "tidgap-cuts over the best equal plan", gain(c, extras[-1]),
                               config=f"simulated, estimated V100 profile, {c}, batch {BATCH}") for c in clusters)
    chart = Chart("methods", "head-cost", "gpt1-14: tidgap-cuts over the best equal plan against a fixed head cost",
                  "bars", "speed-up (×)", x_label="extra ms per micro-batch on the head (forward; 2× on backward)",
                  categories=tuple(f"+{x:g} ms" for x in extras),
                  series=tuple((c, tuple(gain(c, x) for x in extras)) for c in clusters))
    return Report("\n".join(lines), headlines, (chart,))


EXPERIMENT = Experiment(name="umpipe-fixed", title="UMPIPE on gpt1-14 with a fixed cost per micro-batch on the head",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=1)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
