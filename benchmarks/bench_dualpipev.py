"""pipetrain's ``dualpipev`` (and ``zbv``) against torch.distributed.pipelining's ``ScheduleDualPipeV``
(and ``ScheduleZBVZeroBubble``) on the same model, the same four chunks and the same micro-batches.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dualpipev.py --rounds 3 --out benchmarks/results/dualpipev

Two local ranks (gloo, one thread each), for each model and micro-batch count ``m ≥ 4`` (DualPipeV
needs ``m ≥`` its 4 stages): torch runs the schedule as :mod:`torch_baseline` does (stages built by
hand, ``scale_grads=False``, SGD), with glibc's allocator set as pipetrain's runtime sets it
(:mod:`pipetrain.allocator`, here through ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``)
so both sides free and reuse memory alike; pipetrain runs a plan whose stages are torch's chunks
(:func:`torch_schedules.chunk_layers`), placed in the V, with equal micro-batches. Each round runs
every configuration once, torch and pipetrain of one setting back to back, their order alternating
between rounds; a configuration's figure is the median over rounds of samples/s (the batch over the
median timed step after 2 warm-up steps), its ratio the median of the paired ratios.

Output under ``--out``: ``dualpipev.json`` (every run) and ``dualpipev.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.torch_baseline import layer_weights, run_torch_pipelining
from common.torch_schedules import chunk_layers, schedule_of

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import v_rank
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, train

MODELS = {"mlp": (128, 30), "gpt-tiny": (64, 60)}  # batch, steps
SCHEDULES = {"dualpipev": Method.DUALPIPEV, "zbv": Method.ZBV}
ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}
WARMUP = 2


def v_plan(model: str, batch: int, n_micro: int, schedule: str) -> Plan:
    """pipetrain's plan on torch's chunks of ``schedule`` (4 stages in a V on 2 ranks)."""
    graph = build_model(model)
    chunks = chunk_layers(layer_weights(model), schedule_of(schedule), 2)
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan(tuple(graph.names[i] for i in chunk), (v_rank(k, 2),), sizes, sizes)
                   for k, chunk in enumerate(chunks))
    return Plan(model, graph.fingerprint(), batch, SCHEDULES[schedule], stages)


def run_pipetrain(model: str, batch: int, n_micro: int, schedule: str, steps: int) -> float:
    config = TrainConfig(steps=steps, warmup_steps=WARMUP, lr=0.01, progress=False, threads_per_rank=1,
                         timeout_s=180.0)
    result = train(build_model(model), v_plan(model, batch, n_micro, schedule), config)
    return batch / statistics.median(result.step_times_s)


def run_torch(model: str, batch: int, n_micro: int, schedule: str, steps: int) -> float:
    saved = {k: os.environ.get(k) for k in ALLOCATOR}
    os.environ.update(ALLOCATOR)  # the spawned ranks inherit it
    try:
        run = run_torch_pipelining(model, batch, n_micro, schedule, steps, timeout_s=180.0)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    if run.samples_per_s is None:
        raise RuntimeError(f"torch {schedule} m={n_micro} on {model}: {run.status}")
    return run.samples_per_s


def report(runs: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| model | schedule | m | torch samples/s | pipetrain samples/s | pipetrain / torch (median of pairs) "
             "| pairs |", "|---|---|---:|---:|---:|---:|---|"]
    for key, by in runs.items():
        ratios = [p / t for t, p in zip(by["torch"], by["pipetrain"], strict=True)]
        model, schedule, m = key.split()
        lines.append(f"| {model} | {schedule} | {m} | {statistics.median(by['torch']):.1f} | "
                     f"{statistics.median(by['pipetrain']):.1f} | {statistics.median(ratios):.3f}× | "
                     f"{', '.join(f'{x:.2f}' for x in ratios)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dualpipev"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    settings = [(model, s, m) for model in MODELS for s in SCHEDULES for m in args.micro]
    runs: dict[str, dict[str, list[float]]] = {f"{mo} {s} {m}": {"torch": [], "pipetrain": []} for mo, s, m in settings}
    sides = {"torch": run_torch, "pipetrain": run_pipetrain}
    args.out.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        for model, schedule, m in settings:
            batch, steps = MODELS[model]
            for side in ("torch", "pipetrain") if r % 2 == 0 else ("pipetrain", "torch"):
                rate = sides[side](model, batch, m, schedule, steps)
                runs[f"{model} {schedule} {m}"][side].append(rate)
                print(f"round {r} {model} {schedule} m={m} {side}: {rate:.1f} samples/s", flush=True)
        (args.out / "dualpipev.json").write_text(json.dumps(runs, indent=2))
    text = report(runs)
    (args.out / "dualpipev.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
