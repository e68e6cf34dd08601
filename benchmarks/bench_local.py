"""Local learning (PPLL, method ``local``) against end-to-end backprop (``1f1b``) on the digits.

For each model (mlp-digits, cnn-digits, resnet-digits, vit-digits), on 2 ranks with the same stages
(the layers cut in two) and micro-batches: eval accuracy at equal epochs and its gap, samples/s of
``local`` and ``1f1b`` (all jobs in one launch, medians over steps) and of local learning run
sequentially in one process (:func:`~pipetrain.reference.local.emulate_local`, identical
weights by construction), and the wall time each pipeline needs to reach the lower of the two final
accuracies (evaluations every ``--eval-every`` steps; evaluation time included).

    PYTHONPATH=. python benchmarks/bench_local.py --epochs 5
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from pipetrain.graph.aux_heads import default_aux
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.reference.local import emulate_local
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

MODELS = ("mlp-digits", "cnn-digits", "resnet-digits", "vit-digits")


def two_stage_plan(model: str, batch: int, n_micro: int, method: Method) -> Plan:
    graph = build_model(model)
    names, sizes = graph.names, equal_sizes(batch, n_micro)
    half = (len(names) + 1) // 2
    stages = (StagePlan(names[:half], (0,), sizes, sizes), StagePlan(names[half:], (1,), sizes, sizes))
    plan = Plan(model, graph.fingerprint(), batch, method, stages)
    if method is Method.LOCAL:
        plan = replace(plan, weights=WeightPolicy.LOCAL, params=LocalParams(default_aux(graph)))
    return plan


def time_to(result: TrainResult, accuracy: float) -> float | None:
    reached = (m.wall_s for m in result.metrics if m.eval_accuracy is not None and m.eval_accuracy >= accuracy)
    return next(reached, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=11)
    args = p.parse_args()
    config = TrainConfig(epochs=args.epochs, data="digits", optimizer="adam", lr=3e-3, warmup_steps=2,
                         eval_every=args.eval_every, progress=False, timeout_s=120)
    jobs = [TrainJob(build_model(m), two_stage_plan(m, args.batch, args.micro, method), config)
            for m in MODELS for method in (Method.ONE_F_ONE_B, Method.LOCAL)]
    results = train_many(jobs)
    print("| model | aux | 1f1b acc | local acc | gap (pp) | 1f1b samples/s | local samples/s | sequential local "
          "samples/s | local / 1f1b | local / sequential | time to acc: 1f1b, local (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, model in enumerate(MODELS):
        e2e, local = results[2 * i], results[2 * i + 1]
        plan = jobs[2 * i + 1].plan
        seq = emulate_local(build_model(model), plan, config)
        seq_rate = args.batch / statistics.median(seq.step_times_s[config.warmup_steps:])
        a, b = e2e.final_eval, local.final_eval
        assert a is not None and b is not None and a.eval_accuracy is not None and b.eval_accuracy is not None
        target = min(a.eval_accuracy, b.eval_accuracy)
        t1, t2 = time_to(e2e, target), time_to(local, target)
        print(f"| {model} | {plan.params.to_json().get('aux')} | {a.eval_accuracy:.3f} | {b.eval_accuracy:.3f} | "
              f"{100 * (b.eval_accuracy - a.eval_accuracy):+.1f} | {e2e.samples_per_s:.0f} | "
              f"{local.samples_per_s:.0f} | "
              f"{seq_rate:.0f} | {local.samples_per_s / e2e.samples_per_s:.2f}× | "
              f"{local.samples_per_s / seq_rate:.2f}× | "
              f"{t1 if t1 is None else round(t1, 2)}, {t2 if t2 is None else round(t2, 2)} (acc {target:.3f}) |")


if __name__ == "__main__":
    main()
