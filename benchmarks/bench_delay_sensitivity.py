"""Is 2BW's convergence gap on gpt-tiny the method's delay, or pipetrain? A single-process answer.

    .venv/bin/python benchmarks/bench_delay_sensitivity.py           # results in benchmarks/results/delay-sensitivity
    .venv/bin/python benchmarks/bench_delay_sensitivity.py --only "d=1, β1 = 0.7" --seeds 0
    .venv/bin/python benchmarks/bench_delay_sensitivity.py --quick   # two variants, one seed, a few batches

PipeDream-2BW (Narayanan et al., ICML'21) updates ``W(t+1) = W(t) − ν·∇f(W(t−1))``: every stage applies
a gradient computed one version late. This script trains ``gpt-tiny`` on ``text`` in one process with
plain ``torch.optim.AdamW`` and *no pipeline at all*, computing batch ``t``'s gradient at the weights
of ``d`` steps before (``d = 0``: ordinary training, what ``1f1b`` equals; ``d = 1``: 2BW's semantics),
in the setting of async-convergence (batch 32, 300 batches, ``lr 3e-3``, linear warm-up over 5 % of
the steps then cosine to 0), over three seeds (the seed draws the initial weights and the batches).
Variants of ``d = 1`` that a rule could apply (:mod:`common.async_delay`):

* ``lr ×f``: the peak rate scaled by ``f``;
* ``sync warm-up N``: the first ``1/N`` of the batches without delay (a pipeline drained after every
  batch, as PipeMare's synchronous warm-up epochs), then ``d = 1``;
* ``weight prediction``: the gradient taken at ``W(t−1)`` moved one Adam step ahead,
  ``W(t−1) − ν·m̂/(√v̂ + ε)`` from the optimizer's moments (XPipe's prediction), which estimates the
  ``W(t)`` it is applied to;
* ``β1``, ``β2``: AdamW's moment decays (asynchrony acts as extra momentum, Mitliagkas et al. 2016);
* ``delay compensation λ``: DC-ASGD's first-order correction of the stale gradient (Zheng et al.,
  ICML'17), ``g + λ·g⊙g⊙(W(t) − W(t−1))/√v̂``, normalised by Adam's second moment as DC-ASGD-a is.

Reported: eval loss and accuracy per variant, median over seeds and each seed. About 3 minutes per
variant and seed on 2 shared cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common.async_delay import BATCH, VARIANTS, Variant, train
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main

QUICK_STEPS = 10
NO_DELAY, DELAY = VARIANTS[0].label, VARIANTS[1].label


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=300, help="batches per run (default 300)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default 0 1 2)")
    p.add_argument("--only", nargs="+", metavar="LABEL", help="train only the variants of these labels")


def settings(ctx: Context) -> list[tuple[Variant, int]]:
    torch.set_num_threads(1)
    if ctx.quick:
        return [(v, 0) for v in VARIANTS[:2]]
    variants = [v for v in VARIANTS if not ctx.args.only or v.label in ctx.args.only]
    return [(v, seed) for v in variants for seed in ctx.args.seeds]


def run(setting: tuple[Variant, int], ctx: Context) -> list[Row]:
    variant, seed = setting
    steps = QUICK_STEPS if ctx.quick else ctx.args.steps
    row = {"label": variant.label, "seed": seed, "steps": steps, **asdict(variant), **train(variant, seed, steps)}
    ctx.log(f"{variant.label}, seed {seed}: eval accuracy {row['eval_accuracy']:.1%}, loss {row['eval_loss']:.3f}")
    return [row]


def report(rows: list[Row], info: RunInfo) -> Report:
    seeds = sorted({r["seed"] for r in rows})
    lines = ["| variant | eval accuracy (median) | eval loss (median) | " + " | ".join(
        f"seed {s}: acc / loss" for s in seeds) + " |", "|---" * (3 + len(seeds)) + "|"]
    accuracy: dict[str, float] = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = {r["seed"]: r for r in rows if r["label"] == label}
        accuracy[label] = statistics.median(r["eval_accuracy"] for r in mine.values())
        loss = statistics.median(r["eval_loss"] for r in mine.values())
        cells = [f"{mine[s]['eval_accuracy']:.1%} / {mine[s]['eval_loss']:.3f}" if s in mine else "—" for s in seeds]
        lines.append(f"| {label} | {accuracy[label]:.1%} | {loss:.3f} | " + " | ".join(cells) + " |")
    headlines = []
    if NO_DELAY in accuracy:
        config = (f"gpt-tiny, one process, AdamW, batch {BATCH}, {rows[0]['steps']} batches, "
                  f"median of {len(seeds)} seed(s)")
        gaps = {k: round(100 * (v - accuracy[NO_DELAY]), 1) for k, v in accuracy.items() if k.startswith("d=1")}
        if DELAY in gaps:
            headlines.append(Headline("methods", "a one-step gradient delay (2BW's semantics): eval accuracy "
                                      "against no delay (points)", gaps[DELAY], unit="", config=config))
        if len(gaps) > 1:
            best = max(gaps, key=lambda k: gaps[k])
            headlines.append(Headline("methods", f"the best mitigation of the delay ({best}): eval accuracy against "
                                      "no delay (points)", gaps[best], unit="", config=config))
    chart = Chart("methods", "accuracy", "gpt-tiny with a gradient delay: eval accuracy per variant (median of seeds)",
                  "bars", "eval accuracy (%)", categories=tuple(accuracy),
                  series=(("eval accuracy", tuple(100 * a for a in accuracy.values())),))
    return Report("\n".join(lines), tuple(headlines), (chart,))


EXPERIMENT = Experiment(name="delay-sensitivity", title="Asynchronous pipelines: the one-step delay itself, measured "
                        "without a pipeline", settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
