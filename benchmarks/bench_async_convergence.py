"""Convergence of the asynchronous methods at equal samples, with the learning-rate rule on and off.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_async_convergence.py --out benchmarks/results/async-convergence
    PYTHONPATH=. .venv/bin/python benchmarks/bench_async_convergence.py --quick --out /tmp/conv   # smoke run

Two local ranks (gloo, one thread each), two stages (the model's layers cut in half), four equal
micro-batches; every run sees the same batches, for the same number of batches, with the same base
hyper-parameters (AdamW, ``--lr 3e-3``, warm-up + cosine, no clipping): ``mlp-digits`` on ``digits``
(batch 64, 200 batches) and ``gpt-tiny`` on ``text`` (batch 32, 300 batches), evaluated every 10 %
of the run. The runs, per model:

* ``1f1b``: synchronous, the reference (the rule leaves its rate as given);
* ``pipedream`` and ``pipedream-vsync`` (vertical sync), each with ``--lr-rule auto`` (the default:
  a step per micro-batch at ``lr × 1/4``, :mod:`pipetrain.runtime.job.lr_rule`) and
  ``--lr-rule none`` (every step at ``lr``);
* ``2bw``: the rule leaves its rate as given (one step per batch, delay 1, as its paper trains), and
  ``2bw, lr ×1/2``: the same at half the rate, which tests the paper's claim that the delay needs no
  smaller rate.

A run with a rule that changes nothing is the same run, so it is trained once. A row as a user runs
it from the CLI (the planner's two stages may cut the layers elsewhere than in half)::

    pipetrain plan --model gpt-tiny --ranks 2 --batch 32 --micro 4 --out plan.json
    pipetrain train --plan plan.json --method pipedream --steps 300 --optimizer adamw --lr 3e-3 \\
        --lr-schedule warmup-cosine --warmup-steps 15 --eval-every 30        # add --lr-rule none: rule off

``--steps N`` trains every run for ``N`` batches (warm-up and evaluation scale with it) and ``--only``
keeps the runs of the given labels, e.g. the longer horizon in BENCHMARKS.md::

    PYTHONPATH=. .venv/bin/python benchmarks/bench_async_convergence.py --models gpt-tiny --steps 900 \\
        --only 1f1b "pipedream-vsync, rule auto" 2bw --out benchmarks/results/async-convergence/gpt-tiny-900

``--sweep`` trains the candidate rates the rule was chosen from instead, each set by hand with the
rule off: ``pipedream`` and ``pipedream-vsync`` at ``lr × 1, 1/2, 1/4, 1/8``, ``2bw`` at ``lr × 2, 1, 1/2``.

Output under ``--out``: ``runs.json`` (every eval row of every run), ``table.csv`` and ``table.md``
(final train loss, eval loss and eval accuracy per run, gaps to ``1f1b``) and ``curves.png`` (eval
loss against samples, one panel per model, one colour per method: solid its first run (the rule on),
dashed its second (the rule off, or half the rate for 2bw)).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import platform
import sys
from dataclasses import asdict, dataclass, replace
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
from pipetrain.runtime.job.lr_rule import LRRule

MODELS = {"mlp-digits": ("digits", 64, 200), "gpt-tiny": ("text", 32, 300)}
MICRO = 4
LR = 3e-3


@dataclass(frozen=True)
class Run:
    """One row: a method, the rule and a factor on ``--lr`` given by hand."""

    label: str
    method: Method
    vertical_sync: bool
    rule: LRRule
    lr_factor: float = 1.0

    @property
    def family(self) -> str:
        """The method as the plot colours it."""
        return "pipedream-vsync" if self.vertical_sync else self.method.value


PD, TWO_BW, SYNC = Method.PIPEDREAM, Method.TWO_BW, Method.ONE_F_ONE_B
RUNS = (
    Run("1f1b", SYNC, False, "auto"),
    Run("pipedream, rule auto", PD, False, "auto"),
    Run("pipedream, rule none", PD, False, "none"),
    Run("pipedream-vsync, rule auto", PD, True, "auto"),
    Run("pipedream-vsync, rule none", PD, True, "none"),
    Run("2bw", TWO_BW, False, "auto"),
    Run("2bw, lr ×1/2", TWO_BW, False, "none", 0.5),
)
FACTORS = {"1": 1.0, "1/2": 0.5, "1/4": 0.25, "1/8": 0.125}
SWEEP = (  # --sweep: the candidate rates the rule was chosen from, each by hand with the rule off
    Run("1f1b", SYNC, False, "none"),
    *(Run(f"pipedream, lr ×{k}", PD, False, "none", f) for k, f in FACTORS.items()),
    *(Run(f"pipedream-vsync, lr ×{k}", PD, True, "none", f) for k, f in FACTORS.items()),
    *(Run(f"2bw, lr ×{k}", TWO_BW, False, "none", f) for k, f in {"2": 2.0, "1": 1.0, "1/2": 0.5}.items()),
)


@dataclass(frozen=True)
class Outcome:
    model: str
    label: str
    family: str
    rule: str
    lr: float
    stage_lr: list[float]
    train_loss: float
    eval_loss: float
    eval_accuracy: float
    rows: list[dict[str, float | None]]


def two_stage_plan(graph: LayerGraph, batch: int, run: Run) -> Plan:
    """The layers cut in half, ranks 0 and 1, ``MICRO`` equal micro-batches, run by ``run.method``."""
    half, sizes = len(graph.names) // 2, equal_sizes(batch, MICRO)
    stages = (StagePlan(graph.names[:half], (0,), sizes, sizes), StagePlan(graph.names[half:], (1,), sizes, sizes))
    plan = Plan(graph.name, graph.fingerprint(), batch, Method.ONE_F_ONE_B, stages)
    return plan if run.method is Method.ONE_F_ONE_B else plan.run_by(run.method, run.vertical_sync)


def base_config(data: str, steps: int) -> TrainConfig:
    return TrainConfig(steps=steps, data=data, optimizer="adamw", lr=LR, lr_schedule="warmup-cosine",
                       lr_warmup_steps=max(1, steps // 20), eval_every=max(1, steps // 10), progress=False,
                       timeout_s=120, warmup_steps=2)


def run_model(model: str, steps: int | None, runs: tuple[Run, ...]) -> list[Outcome]:
    data, batch, default_steps = MODELS[model]
    graph = build_model(model)
    base = base_config(data, steps or default_steps)
    jobs = []
    for run in runs:
        config = replace(base, lr=LR * run.lr_factor, lr_rule=run.rule)
        jobs.append(TrainJob(graph, two_stage_plan(graph, batch, run), config))
    outcomes = []
    for run, job, result in zip(runs, jobs, train_many(jobs), strict=True):
        evals = [m for m in result.metrics if m.eval_loss is not None]
        last = evals[-1]
        scales = job.config.stage_rates(job.plan).scales
        rates = [job.config.lr * s for s in scales]
        rows: list[dict[str, float | None]] = [
            {"step": m.step, "samples": m.samples_seen, "loss": m.loss, "eval_loss": m.eval_loss,
             "eval_accuracy": m.eval_accuracy} for m in evals]
        outcomes.append(Outcome(model, run.label, run.family, run.rule, job.config.lr, rates, result.losses[-1],
                                float(last.eval_loss or 0.0), float(last.eval_accuracy or 0.0), rows))
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    lines = ["| model | run | stage rates | final train loss | eval loss | Δ vs 1f1b | eval accuracy | "
             "Δ vs 1f1b (points) |", "|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        runs = [o for o in outcomes if o.model == model]
        if not runs:
            continue
        sync = next(o for o in runs if o.label == "1f1b")
        for o in runs:
            rates = " / ".join(f"{r:.3g}" for r in o.stage_lr)
            lines.append(f"| {model} | {o.label} | {rates} | {o.train_loss:.4f} | {o.eval_loss:.4f} | "
                         f"{o.eval_loss / sync.eval_loss - 1:+.1%} | {o.eval_accuracy:.1%} | "
                         f"{100 * (o.eval_accuracy - sync.eval_accuracy):+.1f} |")
    return "\n".join(lines)


def table_csv(outcomes: list[Outcome]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["model", "run", "rule", "lr", "stage_lr", "train_loss", "eval_loss", "eval_accuracy"])
    for o in outcomes:
        writer.writerow([o.model, o.label, o.rule, o.lr, " ".join(f"{r:.6g}" for r in o.stage_lr), o.train_loss,
                         o.eval_loss, o.eval_accuracy])
    return buffer.getvalue()


def plot(outcomes: list[Outcome], path: Path) -> None:
    models = [m for m in MODELS if any(o.model == m for o in outcomes)]
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    colours = {family: f"C{i}" for i, family in enumerate(("1f1b", "pipedream", "pipedream-vsync", "2bw"))}
    for ax, model in zip(axes[0], models, strict=True):
        seen: dict[str, int] = {}
        for o in (o for o in outcomes if o.model == model):
            style = ("-", "--", ":", "-.")[seen.setdefault(o.family, 0) % 4]  # a family's first run solid
            seen[o.family] += 1
            ax.plot([r["samples"] for r in o.rows], [r["eval_loss"] for r in o.rows], style, marker=".",
                    color=colours[o.family], label=o.label)
        ax.set_title(f"{model} on {MODELS[model][0]}: eval loss (AdamW, lr {LR:g}, 4 micro-batches)")
        ax.set_xlabel("samples seen")
        ax.set_ylabel("eval loss (log scale)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/async-convergence"))
    parser.add_argument("--quick", action="store_true", help="20 batches per run (smoke test)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--sweep", action="store_true",
                        help="instead of the rule on and off: the candidate rates, by hand with the rule off")
    parser.add_argument("--steps", type=int, default=None,
                        help="batches per run instead of each model's default (a longer horizon)")
    parser.add_argument("--only", nargs="+", default=None, metavar="LABEL",
                        help="only the runs with these labels (e.g. 1f1b 2bw)")
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    torch.set_num_threads(1)
    runs = tuple(r for r in (SWEEP if args.sweep else RUNS) if args.only is None or r.label in args.only)
    steps = 20 if args.quick else args.steps
    outcomes = [o for model in args.models for o in run_model(model, steps, runs)]
    args.out.mkdir(parents=True, exist_ok=True)
    plot(outcomes, args.out / "curves.png")
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}"
    write_atomic(args.out / "runs.json", json.dumps({"machine": machine, "runs": [asdict(o) for o in outcomes]},
                                                    indent=1))
    write_atomic(args.out / "table.csv", table_csv(outcomes))
    text = table(outcomes)
    write_atomic(args.out / "table.md", f"machine: {machine}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
