"""Convergence of the asynchronous methods, measured: 1f1b vs pipedream (± vertical sync) vs 2bw.

    .venv/bin/python benchmarks/bench_async.py            # results in benchmarks/results/async
    .venv/bin/python benchmarks/bench_async.py --quick    # mlp-digits, a few batches

Two local ranks (gloo, one thread each), two stages (the model's layers cut in half), four equal
micro-batches. Each model trains with every method on the same data, for the same samples, with the
same optimizer (AdamW, warm-up + cosine; no clipping, which the asynchronous methods do not support),
evaluating as it goes (:mod:`common.async_training`; docs/algorithms.md §3.5 has the methods'
semantics):

* ``mlp-digits`` on ``digits`` (batch 64, 200 batches), ``gpt-tiny`` on ``text`` (batch 32, 300);
* ``1f1b``: synchronous (a flush per batch, one optimizer step per batch);
* ``pipedream``: no flush, an optimizer step per micro-batch (at ``lr/4``: ``--lr-rule auto``), weight stashing;
* ``pipedream-vsync``: the same with vertical sync;
* ``2bw``: no flush, a step per batch on weights one step old.

Reported: final eval accuracy and loss, their gaps to 1f1b, and time-to-accuracy: wall seconds until
the run first reaches the 1f1b run's final accuracy ("—" if it never does); eval loss curves.
Target (issue 14): eval accuracy within 1 point of 1f1b's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common.async_training import MODELS, QUICK_STEPS, base_config, curve, loss_charts, two_stage_plan
from harness import Context, Experiment, Headline, Report, Row, RunInfo, Target, main

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainJob, train_many

METHODS = {"1f1b": (Method.ONE_F_ONE_B, False), "pipedream": (Method.PIPEDREAM, False),
           "pipedream-vsync": (Method.PIPEDREAM, True), "2bw": (Method.TWO_BW, False)}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))


def settings(ctx: Context) -> list[str]:
    torch.set_num_threads(1)
    return ["mlp-digits"] if ctx.quick else list(ctx.args.models)


def run(model: str, ctx: Context) -> list[Row]:
    """Every method on ``model``, launched together."""
    data, batch, steps = MODELS[model]
    graph = build_model(model)
    config = base_config(data, QUICK_STEPS if ctx.quick else steps)
    assert config.steps is not None
    jobs = [TrainJob(graph, two_stage_plan(graph, batch, *METHODS[name]), config) for name in METHODS]
    rows = []
    for name, result in zip(METHODS, train_many(jobs), strict=True):
        evals = curve(result)
        last = evals[-1]
        rows.append({"model": model, "method": name, "eval_loss": last["eval_loss"], "eval_accuracy":
                     last["eval_accuracy"], "wall_s": last["wall_s"], "steps": config.steps, "curve": evals})
    return rows


def _time_to(row: Row, accuracy: float) -> str:
    reached = (p["wall_s"] for p in row["curve"] if (p["eval_accuracy"] or 0.0) >= accuracy)
    return next((f"{t:.1f}" for t in reached), "—")


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| model | method | eval accuracy | Δ vs 1f1b (points) | eval loss | Δ vs 1f1b | "
             "time to 1f1b's accuracy (s) | wall (s) |", "|---|---|---|---|---|---|---|---|"]
    headlines = []
    for model, (data, batch, _) in MODELS.items():
        runs = [r for r in rows if r["model"] == model]
        if not runs:
            continue
        sync = next(r for r in runs if r["method"] == "1f1b")
        for r in runs:
            gap = 100 * (r["eval_accuracy"] - sync["eval_accuracy"])
            lines.append(f"| {model} | {r['method']} | {r['eval_accuracy']:.1%} | {gap:+.1f} | {r['eval_loss']:.4f} | "
                         f"{r['eval_loss'] / sync['eval_loss'] - 1:+.1%} | {_time_to(r, sync['eval_accuracy'])} | "
                         f"{r['wall_s']:.1f} |")
            if r["method"] != "1f1b":
                headlines.append(Headline("methods", f"{model}: {r['method']}'s eval accuracy against 1f1b's (points)",
                                          round(gap, 1), unit="", target=Target(">=", -1.0),
                                          config=f"measured, 2 CPU ranks, {data}, batch {batch}, "
                                                 f"{r['steps']} batches"))
    return Report("\n".join(lines), tuple(headlines), loss_charts(rows, "method"))


EXPERIMENT = Experiment(name="async", title="Asynchronous pipelines: convergence of pipedream, vertical sync and 2bw "
                        "against 1f1b, measured", settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
