"""Convergence of the asynchronous methods, measured: 1f1b vs pipedream (± vertical sync) vs 2bw.

    .venv/bin/python benchmarks/bench_async.py --out benchmarks/results/async
    .venv/bin/python benchmarks/bench_async.py --quick --out /tmp/async      # smoke run

Two local ranks (gloo, one thread each), two stages (the model's layers cut in half), four equal
micro-batches. Each model trains with every method on the same data, for the same samples, with the
same optimizer (AdamW, warm-up + cosine; no clipping, which the asynchronous methods do not support),
evaluating as it goes (docs/algorithms.md §3.5 has the methods' semantics):

* ``mlp-digits`` on ``digits`` (batch 64), ``gpt-tiny`` on ``text`` (batch 32);
* ``1f1b``: synchronous (a flush per batch, one optimizer step per batch);
* ``pipedream``: no flush, an optimizer step per micro-batch (at ``lr/4``: ``--lr-rule auto``), weight stashing;
* ``pipedream-vsync``: the same with vertical sync;
* ``2bw``: no flush, a step per batch on weights one step old.

Output under ``--out``: ``curves.png`` (eval loss and accuracy against samples, one panel per model
and metric), ``async.json`` (every eval row) and ``async.md`` (final eval accuracy and loss, their
gaps to 1f1b, and time-to-accuracy: wall seconds until the run first reaches the 1f1b run's final
accuracy, "—" if it never does).
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, train_many
from pipetrain.runtime.job.config import StepMetrics

MODELS = {"mlp-digits": ("digits", 64, 200), "gpt-tiny": ("text", 32, 300)}
METHODS = {"1f1b": (Method.ONE_F_ONE_B, False), "pipedream": (Method.PIPEDREAM, False),
           "pipedream-vsync": (Method.PIPEDREAM, True), "2bw": (Method.TWO_BW, False)}
MICRO = 4


@dataclass(frozen=True)
class Outcome:
    model: str
    method: str
    eval_loss: float
    eval_accuracy: float
    wall_s: float
    rows: list[dict[str, float | None]]


def two_stage_plan(graph: LayerGraph, batch: int, method: Method, vertical_sync: bool) -> Plan:
    """The layers cut in half, ranks 0 and 1, ``MICRO`` equal micro-batches, run by ``method``."""
    half, sizes = len(graph.names) // 2, equal_sizes(batch, MICRO)
    stages = (StagePlan(graph.names[:half], (0,), sizes, sizes), StagePlan(graph.names[half:], (1,), sizes, sizes))
    plan = Plan(graph.name, graph.fingerprint(), batch, Method.ONE_F_ONE_B, stages)
    return plan if method is Method.ONE_F_ONE_B else plan.run_by(method, vertical_sync)


def config(data: str, steps: int) -> TrainConfig:
    return TrainConfig(steps=steps, data=data, optimizer="adamw", lr=3e-3, lr_schedule="warmup-cosine",
                       lr_warmup_steps=max(1, steps // 20), eval_every=max(1, steps // 10), progress=False,
                       timeout_s=120, warmup_steps=2)


def run_model(model: str, steps: int | None) -> list[Outcome]:
    data, batch, default_steps = MODELS[model]
    graph = build_model(model)
    cfg = config(data, steps or default_steps)
    jobs = [TrainJob(graph, two_stage_plan(graph, batch, *METHODS[name]), cfg) for name in METHODS]
    outcomes = []
    for name, result in zip(METHODS, train_many(jobs), strict=True):
        evals = [m for m in result.metrics if m.eval_loss is not None]
        last = evals[-1]
        outcomes.append(Outcome(model, name, float(last.eval_loss or 0.0), float(last.eval_accuracy or 0.0),
                                last.wall_s, [_row(m) for m in evals]))
    return outcomes


def _row(m: StepMetrics) -> dict[str, float | None]:
    return {"step": m.step, "samples": m.samples_seen, "wall_s": m.wall_s, "loss": m.loss,
            "eval_loss": m.eval_loss, "eval_accuracy": m.eval_accuracy}


def time_to_accuracy(outcome: Outcome, target: float) -> float | None:
    """Wall seconds until ``outcome`` first evaluates at ``target`` accuracy or better, else None."""
    return next((float(r["wall_s"] or 0.0) for r in outcome.rows if (r["eval_accuracy"] or 0.0) >= target), None)


def table(outcomes: list[Outcome]) -> str:
    lines = ["| model | method | eval accuracy | Δ vs 1f1b (points) | eval loss | Δ vs 1f1b | "
             "time to 1f1b's accuracy (s) | wall (s) |", "|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        runs = [o for o in outcomes if o.model == model]
        if not runs:
            continue
        sync = next(o for o in runs if o.method == "1f1b")
        for o in runs:
            reach = time_to_accuracy(o, sync.eval_accuracy)
            lines.append(f"| {model} | {o.method} | {o.eval_accuracy:.1%} | "
                         f"{100 * (o.eval_accuracy - sync.eval_accuracy):+.1f} | {o.eval_loss:.4f} | "
                         f"{(o.eval_loss / sync.eval_loss - 1):+.1%} | {'—' if reach is None else f'{reach:.1f}'} | "
                         f"{o.wall_s:.1f} |")
    return "\n".join(lines)


def plot(outcomes: list[Outcome], path: Path) -> None:
    models = [m for m in MODELS if any(o.model == m for o in outcomes)]
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 7), squeeze=False)
    for col, model in enumerate(models):
        for o in (o for o in outcomes if o.model == model):
            samples = [r["samples"] for r in o.rows]
            axes[0][col].plot(samples, [r["eval_loss"] for r in o.rows], marker=".", label=o.method)
            axes[1][col].plot(samples, [r["eval_accuracy"] for r in o.rows], marker=".", label=o.method)
        axes[0][col].set_title(f"{model} on {MODELS[model][0]}: eval loss")
        axes[1][col].set_title(f"{model} on {MODELS[model][0]}: eval accuracy")
        axes[1][col].set_xlabel("samples seen")
        axes[0][col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/async"))
    parser.add_argument("--quick", action="store_true", help="20 steps per run (smoke test)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    outcomes = [o for model in args.models for o in run_model(model, 20 if args.quick else None)]
    args.out.mkdir(parents=True, exist_ok=True)
    plot(outcomes, args.out / "curves.png")
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}"
    write_atomic(args.out / "async.json", json.dumps({"machine": machine, "runs": [asdict(o) for o in outcomes]},
                                                     indent=1))
    text = table(outcomes)
    write_atomic(args.out / "async.md", f"machine: {machine}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
