"""Local learning (PPLL, method ``local``) against end-to-end backprop (``1f1b``) on the digits, measured.

    .venv/bin/python benchmarks/bench_local.py               # results in benchmarks/results/local
    .venv/bin/python benchmarks/bench_local.py --epochs 2
    .venv/bin/python benchmarks/bench_local.py --quick       # mlp-digits, a few steps

For each model (mlp-digits, cnn-digits, resnet-digits, vit-digits), on 2 local ranks (gloo, one
thread each) with the same stages (the layers cut in two) and ``--micro`` micro-batches of a
``--batch``-sample batch, Adam at lr 3e-3, ``--epochs`` epochs: the two pipelines launched together,
then local learning run sequentially in one process (:func:`~pipetrain.reference.local.emulate_local`,
whose weights equal the pipeline's, so its accuracy is the ``local`` column). Reported: eval accuracy
at equal epochs and its gap, samples/s of ``local`` and ``1f1b`` (median step) and of sequential local
learning, and the wall time each pipeline needs to reach the lower of the two final accuracies
(evaluations every ``--eval-every`` steps, evaluation time included).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, main, ratio

from pipetrain.graph.aux_heads import default_aux
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.reference.local import emulate_local
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

MODELS = ("mlp-digits", "cnn-digits", "resnet-digits", "vit-digits")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=5, help="epochs of the digits (default 5)")
    p.add_argument("--batch", type=int, default=32, help="samples per batch (default 32)")
    p.add_argument("--micro", type=int, default=4, help="micro-batches per batch (default 4)")
    p.add_argument("--eval-every", type=int, default=11, help="steps between evaluations (default 11)")


def two_stage_plan(model: str, batch: int, n_micro: int, method: Method) -> Plan:
    """The layers cut in two (the first stage takes the odd one), ranks 0 and 1, equal micro-batches."""
    graph = build_model(model)
    names, sizes = graph.names, equal_sizes(batch, n_micro)
    half = (len(names) + 1) // 2
    stages = (StagePlan(names[:half], (0,), sizes, sizes), StagePlan(names[half:], (1,), sizes, sizes))
    plan = Plan(model, graph.fingerprint(), batch, method, stages)
    if method is Method.LOCAL:
        plan = replace(plan, weights=WeightPolicy.LOCAL, params=LocalParams(default_aux(graph)))
    return plan


def _time_to(result: TrainResult, accuracy: float) -> float | None:
    reached = (m.wall_s for m in result.metrics if m.eval_accuracy is not None and m.eval_accuracy >= accuracy)
    return next(reached, None)


def settings(ctx: Context) -> list[str]:
    return ["mlp-digits"] if ctx.quick else list(MODELS)


def run(model: str, ctx: Context) -> list[Row]:
    a = ctx.args
    length = {"steps": 6, "eval_every": 3} if ctx.quick else {"epochs": a.epochs, "eval_every": a.eval_every}
    config = TrainConfig(data="digits", optimizer="adam", lr=3e-3, warmup_steps=2, progress=False, timeout_s=120,
                         **length)
    jobs = [TrainJob(build_model(model), two_stage_plan(model, a.batch, a.micro, m), config)
            for m in (Method.ONE_F_ONE_B, Method.LOCAL)]
    e2e, local = train_many(jobs)
    seq = emulate_local(build_model(model), jobs[1].plan, config)
    e2e_eval, local_eval = e2e.final_eval, local.final_eval
    if e2e_eval is None or local_eval is None or e2e_eval.eval_accuracy is None or local_eval.eval_accuracy is None:
        raise RuntimeError(f"{model}: a run ended without an evaluation; give --eval-every at most its steps")
    target = min(e2e_eval.eval_accuracy, local_eval.eval_accuracy)
    return [{"model": model, "aux": jobs[1].plan.params.to_json().get("aux"), "steps": len(e2e.losses),
             "e2e_accuracy": e2e_eval.eval_accuracy, "local_accuracy": local_eval.eval_accuracy,
             "e2e_samples_per_s": e2e.samples_per_s, "local_samples_per_s": local.samples_per_s,
             "sequential_samples_per_s": a.batch / statistics.median(seq.step_times_s[config.warmup_steps:]),
             "target_accuracy": target, "e2e_time_to_s": _time_to(e2e, target),
             "local_time_to_s": _time_to(local, target)}]


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| model | aux | 1f1b acc | local acc | gap (pp) | 1f1b samples/s | local samples/s | sequential local "
             "samples/s | local / 1f1b | local / sequential | time to acc: 1f1b, local (s) |", "|---" * 11 + "|"]
    headlines = []
    for r in rows:
        gap, local = 100 * (r["local_accuracy"] - r["e2e_accuracy"]), r["local_samples_per_s"]
        lines.append(f"| {r['model']} | {r['aux']} | {r['e2e_accuracy']:.3f} | {r['local_accuracy']:.3f} | "
                     f"{gap:+.1f} | {r['e2e_samples_per_s']:.0f} | {local:.0f} | "
                     f"{r['sequential_samples_per_s']:.0f} | {ratio(local, r['e2e_samples_per_s'])} | "
                     f"{ratio(local, r['sequential_samples_per_s'])} | {_s(r['e2e_time_to_s'])}, "
                     f"{_s(r['local_time_to_s'])} (acc {r['target_accuracy']:.3f}) |")
        headlines.append(Headline("methods", f"{r['model']}: local learning's eval accuracy against 1f1b's (points)",
                                  round(gap, 1), unit="",
                                  config=f"measured, 2 CPU ranks, {r['aux']} heads, {r['steps']} steps"))
    chart = Chart("methods", "samples", "Local learning against backprop on the digits: samples/s", "bars",
                  "samples/s", categories=tuple(r["model"] for r in rows),
                  series=tuple((name, tuple(r[key] for r in rows)) for name, key in (
                      ("1f1b", "e2e_samples_per_s"), ("local", "local_samples_per_s"),
                      ("sequential local", "sequential_samples_per_s"))))
    return Report("\n".join(lines), tuple(headlines), (chart,))


EXPERIMENT = Experiment(name="local", title="Local learning (PPLL) against backprop on the digits, measured",
                        settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
