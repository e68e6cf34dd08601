"""pipetrain's ``dualpipev`` (and ``zbv``) against torch.distributed.pipelining's ``ScheduleDualPipeV``
(and ``ScheduleZBVZeroBubble``) on the same model, the same four chunks and the same micro-batches.

    .venv/bin/python benchmarks/bench_dualpipev.py              # mlp and gpt-tiny, m = 4 and 8, 3 rounds
    .venv/bin/python benchmarks/bench_dualpipev.py --quick      # mlp, dualpipev, m = 4, 5 steps, 1 round

Two local ranks (gloo, one thread each), for each model and micro-batch count ``m ≥ 4`` (DualPipeV
needs ``m ≥`` its 4 stages): torch runs the schedule as :mod:`common.torch_baseline` does (stages
built by hand, ``scale_grads=False``, SGD), with glibc's allocator set as pipetrain's runtime sets
it (:mod:`pipetrain.allocator`, here through ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``)
so both sides free and reuse memory alike; pipetrain runs a plan whose stages are torch's chunks
(:func:`common.torch_schedules.chunk_layers`), placed in the V, with equal micro-batches. Each round
runs every setting once, torch and pipetrain back to back, their order alternating between rounds;
a setting's figure is the median over rounds of samples/s (the batch over the median step), its
ratio the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.torch_baseline import layer_weights, run_torch_pipelining
from common.torch_schedules import chunk_layers, schedule_of
from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, bounded, main

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import v_rank
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, train

MODELS = {"mlp": (128, 30), "gpt-tiny": (64, 60)}  # batch, steps
SCHEDULES = {"dualpipev": Method.DUALPIPEV, "zbv": Method.ZBV}
TORCH_CLASS = {"dualpipev": "ScheduleDualPipeV", "zbv": "ScheduleZBVZeroBubble"}
ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}
WARMUP, TIMEOUT_S = 2, 180.0
Setting = tuple[str, str, int]  # model, schedule, m


def v_plan(model: str, batch: int, n_micro: int, schedule: str) -> Plan:
    """pipetrain's plan on torch's chunks of ``schedule`` (4 stages in a V on 2 ranks)."""
    graph = build_model(model)
    chunks = chunk_layers(layer_weights(model), schedule_of(schedule), 2)
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan(tuple(graph.names[i] for i in chunk), (v_rank(k, 2),), sizes, sizes)
                   for k, chunk in enumerate(chunks))
    return Plan(model, graph.fingerprint(), batch, SCHEDULES[schedule], stages)


def _pipetrain(model: str, batch: int, n_micro: int, schedule: str, steps: int) -> float:
    config = TrainConfig(steps=steps, warmup_steps=WARMUP, lr=0.01, progress=False, threads_per_rank=1,
                         timeout_s=TIMEOUT_S)
    result = train(build_model(model), v_plan(model, batch, n_micro, schedule), config)
    return batch / statistics.median(result.step_times_s)


def _torch(model: str, batch: int, n_micro: int, schedule: str, steps: int) -> float:
    saved = {k: os.environ.get(k) for k in ALLOCATOR}
    os.environ.update(ALLOCATOR)  # the spawned ranks inherit it
    try:
        run = run_torch_pipelining(model, batch, n_micro, schedule, steps, timeout_s=TIMEOUT_S)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    if run.samples_per_s is None:
        raise RuntimeError(f"torch {schedule} m={n_micro} on {model}: {run.status}")
    return run.samples_per_s


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--micro", type=int, nargs="+", default=[4, 8], help="micro-batch counts, each ≥ 4 (default 4 8)")


def settings(ctx: Context) -> list[Setting]:
    if ctx.quick:
        return [("mlp", "dualpipev", 4)]
    return [(model, s, m) for model in MODELS for s in SCHEDULES for m in ctx.args.micro]


def run(setting: Setting, ctx: Context) -> list[Row]:
    model, schedule, m = setting
    batch, steps = MODELS[model]
    steps = WARMUP + 3 if ctx.quick else steps
    row: Row = {"model": model, "schedule": schedule, "m": m, "batch": batch, "steps": steps}
    sides = [("torch", _torch), ("pipetrain", _pipetrain)]
    for side, fn in sides if ctx.round % 2 == 0 else sides[::-1]:  # a failed run is a result: None, and why
        row[side], row[f"{side}_status"] = bounded(functools.partial(fn, model, batch, m, schedule, steps),
                                                     TIMEOUT_S + 60)
        ctx.log(f"round {ctx.round} {model} {schedule} m={m} {side}: "
                f"{f'{row[side]:.1f} samples/s' if row[side] else row[f'{side}_status']}")
    return [row]


def _chart(medians: dict[Setting, tuple[float, float]]) -> Chart:
    """samples/s of torch's schedule and pipetrain's method beside it, per model and m."""
    categories = list(dict.fromkeys((model, m) for model, _, m in medians))
    series = [(f"torch {TORCH_CLASS[schedule]}" if side == 0 else f"pipetrain {schedule}",
               tuple(medians[model, schedule, m][side] if (model, schedule, m) in medians else None
                     for model, m in categories))
              for schedule in dict.fromkeys(s for _, s, _ in medians) for side in (0, 1)]
    return Chart("torch", "samples", "DualPipeV and ZB-V: pipetrain against torch's schedules, samples/s", "bars",
                 "samples/s", categories=tuple(f"{model} m={m}" for model, m in categories), series=tuple(series))


def report(rows: list[Row], info: RunInfo) -> Report:
    """Per setting the median samples/s of each side and the median of the paired ratios; DualPipeV's
    ratios are the headlines."""
    lines = ["| model | schedule | m | torch samples/s | pipetrain samples/s | pipetrain / torch (median of pairs) "
             "| pairs |", "|---|---|---:|---:|---:|---:|---|"]
    medians: dict[Setting, tuple[float, float]] = {}
    headlines = []
    for model, schedule, m in dict.fromkeys((r["model"], r["schedule"], r["m"]) for r in rows):
        every = [r for r in rows if (r["model"], r["schedule"], r["m"]) == (model, schedule, m)]
        pairs = [r for r in every if r["torch"] and r["pipetrain"]]
        if not pairs:
            lines.append(f"| {model} | {schedule} | {m} | {every[0]['torch_status']} | {every[0]['pipetrain_status']} "
                         "| — | |")
            continue
        ratios = [r["pipetrain"] / r["torch"] for r in pairs]
        medians[model, schedule, m] = (statistics.median(r["torch"] for r in pairs),
                                       statistics.median(r["pipetrain"] for r in pairs))
        lines.append(f"| {model} | {schedule} | {m} | {medians[model, schedule, m][0]:.1f} | "
                     f"{medians[model, schedule, m][1]:.1f} | {statistics.median(ratios):.3f}× | "
                     f"{', '.join(f'{x:.2f}' for x in ratios)} |")
        if schedule == "dualpipev":
            rounds = f"{len(pairs)} round" + ("s" if len(pairs) != 1 else "")
            headlines.append(Headline("torch", f"DualPipeV: pipetrain / torch's ScheduleDualPipeV, {model} m={m}",
                                      statistics.median(ratios), config=f"measured, 2 ranks × 1 thread (gloo), the "
                                      f"same 4 chunks, batch {pairs[0]['batch']}, {rounds}"))
    return Report("\n".join(lines) + "\n", tuple(headlines), (_chart(medians),))


EXPERIMENT = Experiment(name="dualpipev", title="DualPipeV against torch's ScheduleDualPipeV, measured",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
