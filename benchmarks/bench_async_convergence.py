"""Convergence of the asynchronous methods at equal samples, with the learning-rate rule on and off.

    .venv/bin/python benchmarks/bench_async_convergence.py            # results in benchmarks/results/async-convergence
    .venv/bin/python benchmarks/bench_async_convergence.py --quick    # mlp-digits, a few batches, three runs

The setting of :mod:`common.async_training`: two local ranks, two stages, four equal micro-batches,
AdamW ``lr 3e-3`` with warm-up + cosine, no clipping; ``mlp-digits`` on ``digits`` (batch 64, 200
batches) and ``gpt-tiny`` on ``text`` (batch 32, 300 batches). The runs, per model
(:mod:`common.async_rules`):

* ``1f1b``: synchronous, the reference (the rule leaves its rate as given);
* ``pipedream`` and ``pipedream-vsync`` (vertical sync), each with ``--lr-rule auto`` (the default:
  a step per micro-batch at ``lr × 1/4``, :mod:`pipetrain.runtime.job.lr_rule`) and
  ``--lr-rule none`` (every step at ``lr``);
* ``2bw``: the rule leaves its rate as given (one step per batch, delay 1, as its paper trains), and
  ``2bw, lr ×1/2``: the same at half the rate, which tests the paper's claim that the delay needs no
  smaller rate.

A row as a user runs it from the CLI (the planner's two stages may cut the layers elsewhere)::

    pipetrain plan --model gpt-tiny --ranks 2 --batch 32 --micro 4 --out plan.json
    pipetrain train --plan plan.json --method pipedream --steps 300 --optimizer adamw --lr 3e-3 \\
        --lr-schedule warmup-cosine --warmup-steps 15 --eval-every 30        # add --lr-rule none: rule off

``--steps N`` trains every run for ``N`` batches and ``--only`` keeps the runs of the given labels, e.g.
``--models gpt-tiny --steps 900 --only 1f1b "pipedream-vsync, rule auto" 2bw`` (a longer horizon);
``--sweep`` trains the candidate rates the rule was chosen from instead, each by hand with the rule off.

Targets (issue 27, at equal samples): mlp-digits within 1 point of 1f1b's eval accuracy; gpt-tiny within
2 points and 5 % of 1f1b's eval loss, for pipedream, vertical sync and 2bw with the rule on.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common.async_rules import RUNS, SWEEP, Run
from common.async_training import LR, MODELS, QUICK_STEPS, base_config, curve, loss_charts, two_stage_plan
from harness import Context, Experiment, Headline, Report, Row, RunInfo, Target, main

from pipetrain.graph.zoo import build_model
from pipetrain.runtime import TrainJob, train_many

QUICK_RUNS = ("1f1b", "pipedream, rule auto", "2bw")
TARGETED = ("pipedream, rule auto", "pipedream-vsync, rule auto", "2bw")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--sweep", action="store_true",
                   help="instead of the rule on and off: the candidate rates, by hand with the rule off")
    p.add_argument("--steps", type=int, default=None, help="batches per run instead of each model's default")
    p.add_argument("--only", nargs="+", default=None, metavar="LABEL", help="only the runs with these labels")


def _runs(ctx: Context) -> tuple[Run, ...]:
    only = QUICK_RUNS if ctx.quick else ctx.args.only
    return tuple(r for r in (SWEEP if ctx.args.sweep else RUNS) if only is None or r.label in only)


def settings(ctx: Context) -> list[str]:
    torch.set_num_threads(1)
    return ["mlp-digits"] if ctx.quick else list(ctx.args.models)


def run(model: str, ctx: Context) -> list[Row]:
    """Every run of ``model``, launched together."""
    data, batch, default_steps = MODELS[model]
    graph = build_model(model)
    base = base_config(data, QUICK_STEPS if ctx.quick else ctx.args.steps or default_steps)
    runs = _runs(ctx)
    jobs = [TrainJob(graph, two_stage_plan(graph, batch, r.method, r.vertical_sync),
                     replace(base, lr=LR * r.lr_factor, lr_rule=r.rule)) for r in runs]
    rows = []
    for r, job, result in zip(runs, jobs, train_many(jobs), strict=True):
        evals = curve(result)
        rows.append({"model": model, "label": r.label, "family": r.family, "rule": r.rule, "lr": job.config.lr,
                     "stage_lr": [job.config.lr * s for s in job.config.stage_rates(job.plan).scales],
                     "steps": base.steps, "train_loss": result.losses[-1], "eval_loss": evals[-1]["eval_loss"],
                     "eval_accuracy": evals[-1]["eval_accuracy"], "curve": evals})
    return rows


def _headlines(rows: list[Row]) -> list[Headline]:
    """gpt-tiny's figures against issue 27's targets when it ran (mlp-digits's otherwise)."""
    model = "gpt-tiny" if any(r["model"] == "gpt-tiny" for r in rows) else "mlp-digits"
    data, batch, _ = MODELS[model]
    runs = {r["label"]: r for r in rows if r["model"] == model}
    if "1f1b" not in runs:
        return []
    sync, out = runs["1f1b"], []
    for label in (x for x in TARGETED if x in runs):
        r = runs[label]
        config = f"measured, 2 CPU ranks, {model} on {data}, batch {batch}, {r['steps']} batches"
        out.append(Headline("methods", f"{model}: {label}, eval accuracy against 1f1b's (points)",
                            round(100 * (r["eval_accuracy"] - sync["eval_accuracy"]), 1), unit="",
                            target=Target(">=", -2.0 if model == "gpt-tiny" else -1.0), config=config))
        if model == "gpt-tiny":
            out.append(Headline("methods", f"{model}: {label}, eval loss against 1f1b's",
                                100 * (r["eval_loss"] / sync["eval_loss"] - 1), unit="%",
                                target=Target("<=", 5.0), config=config))
    return out


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| model | run | stage rates | final train loss | eval loss | Δ vs 1f1b | eval accuracy | "
             "Δ vs 1f1b (points) |", "|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        runs = [r for r in rows if r["model"] == model]
        sync = next((r for r in runs if r["label"] == "1f1b"), None)
        for r in runs:
            rates = " / ".join(f"{x:.3g}" for x in r["stage_lr"])
            gaps = (f"— | {r['eval_accuracy']:.1%} | —" if sync is None else
                    f"{r['eval_loss'] / sync['eval_loss'] - 1:+.1%} | {r['eval_accuracy']:.1%} | "
                    f"{100 * (r['eval_accuracy'] - sync['eval_accuracy']):+.1f}")
            lines.append(f"| {model} | {r['label']} | {rates} | {r['train_loss']:.4f} | {r['eval_loss']:.4f} | "
                         f"{gaps} |")
    return Report("\n".join(lines), tuple(_headlines(rows)), loss_charts(rows, "label"))


EXPERIMENT = Experiment(name="async-convergence", title="Asynchronous pipelines: the learning-rate rule, convergence "
                        "at equal samples", settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
