"""Real models as they are (issue 26): GPT-2 and ResNet-18, pipetrain against torch's ``pipeline()`` and one process.

    .venv/bin/python benchmarks/bench_real_models.py                  # 4 rounds, 10 steps, the top 2 torch kept
    .venv/bin/python benchmarks/bench_real_models.py --quick          # ResNet-18 against torch's 1F1B at m=4, 3 steps

The models, unchanged (:mod:`common.real_models`): transformers' ``GPT2LMHeadModel`` (6 blocks,
width 256, tied head) at batch 16 on Hugging Face token dicts, and torchvision's ResNet-18
structure at 64×64, batch 32. Every side trains on the same batches, the loss summed over samples /
batch, plain SGD, one thread per process, 2 ranks on gloo.

* **pipetrain**, as a user gets it (:mod:`common.real_setup`): capture, ``api.profile_model`` here,
  ``api.plan`` for 2 local ranks with the default planner (``balanced``) and with ``auto``, then
  ``pipetrain.runtime.train``. Plan time = profile time + planner time.
* **torch** (:mod:`common.real_torch`): ``pipeline()`` on the same model split at the same block as
  pipetrain's balanced plan (GPipe, 1F1B), or at pipetrain's own 4-chunk partition for the schedules
  with two chunks per rank; every schedule at each micro-batch count of ``--micro`` torch allows;
  where torch cannot run its own split, the same schedule on stages built by hand from the same
  blocks (labels ending ``captured``); the tied weight's copies summed each step to train one model.
* **single**: the plain model in one process.

A run's samples/s is the batch over its median step after the warm-up steps. Each model is one
setting; its round 0 runs every configuration, later rounds pipetrain's plans, single and the
``--top`` fastest torch configurations of round 0, back to back in an order rotated each round. The
report (:mod:`common.real_report`): ratios are medians of the within-round ratios.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.real_models import MODELS
from common.real_report import real_report
from common.real_setup import CAPTURED, Setup, own_labels, run_label, setup_model
from common.torch_baseline import WARMUP_STEPS
from common.torch_schedules import SCHEDULES
from harness import Context, Experiment, Row, main


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--schedules", nargs="+", choices=list(SCHEDULES), default=list(SCHEDULES),
                   help="torch's schedules to run (default all)")
    p.add_argument("--steps", type=int, default=10, help=f"steps per run, the first {WARMUP_STEPS} untimed")
    p.add_argument("--micro", type=int, nargs="+", default=[4, 8], help="torch's micro-batch counts")
    p.add_argument("--top", type=int, default=2, help="torch configurations kept after round 0")
    p.add_argument("--timeout", type=float, default=150.0, help="wall-clock bound per run (s)")


def _grid(ctx: Context) -> tuple[list[str], list[str], list[int], int]:
    """Models, torch schedules, micro-batch counts and steps: the quick run's, or the command line's."""
    if ctx.quick:
        return ["resnet18"], ["1f1b"], [4], WARMUP_STEPS + 1
    return ctx.args.models, ctx.args.schedules, ctx.args.micro, ctx.args.steps


def settings(ctx: Context) -> list[Setup]:
    """Each model captured, profiled and planned once (the quick run profiles with 1 repeat, not 5)."""
    models, schedules, micro, _ = _grid(ctx)
    return [setup_model(MODELS[name], micro, schedules, 1 if ctx.quick else 5) for name in models]


def run(setup: Setup, ctx: Context) -> list[Row]:
    """One round of one model: round 0 every configuration (a torch schedule whose own split fails
    at its first micro-batch count runs on captured stages from then on), later rounds the kept ones."""
    rows: list[Row] = []

    def one(label: str) -> Row:
        result = run_label(setup, label, _grid(ctx)[3], ctx.args.timeout)
        rows.append({"kind": "run", "model": setup.model.name, "label": label, "round": ctx.round,
                     "status": result.status, "samples_per_s": result.samples_per_s,
                     "step_times_s": list(result.step_times_s), "wall_s": result.wall_s})
        ctx.log(f"round {ctx.round + 1} {setup.model.name:8s} {label:36s} "
                f"{f'{result.samples_per_s:7.1f} samples/s' if result.samples_per_s else result.status}")
        return rows[-1]

    if ctx.round > 0:
        labels = own_labels(setup) + setup.chosen
        shift = ctx.round * len(labels) // ctx.info.repeats
        for label in labels[shift:] + labels[:shift]:
            one(label)
        return rows
    for label in own_labels(setup):
        one(label)
    fastest: dict[str, float] = {}
    for schedule, m in setup.torch_configs:
        label = f"torch {schedule} m={m}"
        failed = any(failure.startswith(f"torch {schedule} ") for failure in setup.pipeline_errors)
        row = one(label + CAPTURED if failed else label)
        if row["status"] not in ("ok", "timeout") and not failed:
            setup.pipeline_errors[label] = row["status"]
            label += CAPTURED
            row = one(label)
        if row["samples_per_s"]:
            fastest[row["label"]] = row["samples_per_s"]
    setup.chosen = sorted(fastest, key=lambda label: -fastest[label])[: ctx.args.top]
    return [setup.row(), *rows]


EXPERIMENT = Experiment(name="real-models", title="Real models as they are: GPT-2 and ResNet-18 against torch's "
                        "pipeline() and one process", settings=settings, run=run, report=real_report,
                        arguments=arguments, repeats=4)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
