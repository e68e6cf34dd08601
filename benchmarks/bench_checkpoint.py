"""Checkpoint cost: seconds per save and its share of a training step, gpt-tiny and vgg16-32.

    .venv/bin/python benchmarks/bench_checkpoint.py --repeats 3

Each model trains on 2 local ranks (its balanced 2-stage 1F1B plan, 4 micro-batches, Adam, so the
checkpoint holds two state copies per parameter), in pairs of runs launched together: without
checkpoints, and with a checkpoint after every step; the pair's order alternates by round.
Seconds per save: the median over saves of the slowest rank's time in it (``TrainResult.
checkpoint_s``: building the state, ``torch.save``, hashing, the gather to rank 0 and its
manifest); the share of a step is that over the median step time of the runs without
checkpoints. Also reported: the bytes a checkpoint holds (the sum of its shards).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, train_many

MODELS = {"gpt-tiny": ("text", 32), "vgg16-32": ("synthetic", 32)}


def _plan(name: str, batch: int) -> Plan:
    graph = build_model(name)
    half = len(graph) // 2
    sizes = equal_sizes(batch, 4)
    stages = (StagePlan(graph.names[:half], (0,), sizes, sizes), StagePlan(graph.names[half:], (1,), sizes, sizes))
    return Plan(graph.name, graph.fingerprint(), batch, Method.ONE_F_ONE_B, stages)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=12, help="steps per run, the first one untimed (default 12)")


def settings(ctx: Context) -> list[str]:
    return list(MODELS)


def run(name: str, ctx: Context) -> list[Row]:
    data, batch = MODELS[name]
    graph, plan = build_model(name), _plan(name, batch)
    steps = 4 if ctx.quick else ctx.args.steps
    base = TrainConfig(steps=steps, warmup_steps=1, data=data, optimizer="adam", lr=1e-3, progress=False,
                       timeout_s=600, eval_every=10**9)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpt = replace(base, out=folder / "ckpt", checkpoint_dir=folder / "ckpt" / "state", checkpoint_every=1, keep=2)
        kinds = [("plain", replace(base, out=folder / "plain")), ("checkpoint", ckpt)]
        kinds = kinds if ctx.round % 2 == 0 else kinds[::-1]
        results = train_many([TrainJob(graph, plan, config) for _, config in kinds])
        shards = sorted((folder / "ckpt" / "state").glob("step-*"))[-1].glob("rank-*.pt")
        size = sum(p.stat().st_size for p in shards)
    return [{"model": name, "kind": kind, "step_s": list(result.step_times_s[1:]),
             "save_s": list(result.checkpoint_s), "bytes": size if kind == "checkpoint" else None}
            for (kind, _), result in zip(kinds, results, strict=True)]


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| model | checkpoint MiB | s per save | median step (s) | save / step |", "|---|---|---|---|---|"]
    headlines = []
    for name in MODELS:
        mine = [r for r in rows if r["model"] == name]
        saves = [t for r in mine if r["kind"] == "checkpoint" for t in r["save_s"]]
        steps = [t for r in mine if r["kind"] == "plain" for t in r["step_s"]]
        if not saves or not steps:
            continue
        save_s, step_s = statistics.median(saves), statistics.median(steps)
        mib = max(r["bytes"] or 0 for r in mine) / 2**20
        lines.append(f"| {name} | {mib:.1f} | {save_s:.4f} | {step_s:.4f} | {save_s / step_s:.1%} |")
        headlines.append(Headline("methods", f"checkpoint after every step, {name}: save time / step time",
                                  100 * save_s / step_s, unit="%", config=f"2 ranks, 1f1b, Adam, {mib:.0f} MiB"))
    return Report("\n".join(lines), tuple(headlines))


EXPERIMENT = Experiment(name="checkpoint", title="Checkpoints: the cost of a save", settings=settings, run=run,
                        report=report, arguments=arguments, repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
