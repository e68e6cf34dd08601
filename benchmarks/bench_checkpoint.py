"""Checkpoint cost: seconds per save and its share of a training step, gpt-tiny and vgg16-32.

    .venv/bin/python benchmarks/bench_checkpoint.py --repeats 3 --steps 12 --out benchmarks/results/checkpoint

Each model trains on 2 local ranks (its balanced 2-stage 1F1B plan, 4 micro-batches, Adam, so the
checkpoint holds two state copies per parameter) in pairs of runs within one launch: without
checkpoints, and with a checkpoint after every step, alternating A and B ``--repeats`` times.
Seconds per save: the median over saves of the slowest rank's time in it (``TrainResult.
checkpoint_s``: building the state, ``torch.save``, hashing, the gather to rank 0 and its
manifest); the share of a step is that over the median step time of the runs without
checkpoints. Also reported: the bytes a checkpoint holds (the sum of its shards).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

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


def measure(name: str, repeats: int, steps: int, folder: Path) -> dict[str, float]:
    data, batch = MODELS[name]
    graph, plan = build_model(name), _plan(name, batch)
    base = TrainConfig(steps=steps, warmup_steps=1, data=data, optimizer="adam", lr=1e-3, progress=False,
                       timeout_s=600, eval_every=10**9)
    jobs = []
    for r in range(repeats):
        jobs.append(TrainJob(graph, plan, replace(base, out=folder / f"{name}-plain-{r}")))
        jobs.append(TrainJob(graph, plan, replace(base, out=folder / f"{name}-ckpt-{r}",
                                                  checkpoint_dir=folder / f"{name}-ckpt-{r}" / "ckpt",
                                                  checkpoint_every=1, keep=2)))
    results = train_many(jobs)
    plain, saving = results[0::2], results[1::2]
    per_save = [t for r in saving for t in r.checkpoint_s]
    step_s = statistics.median(t for r in plain for t in r.step_times_s[1:])
    shards = sorted((folder / f"{name}-ckpt-0" / "ckpt").glob("step-*"))[-1].glob("rank-*.pt")
    return {"save_s": statistics.median(per_save), "step_s": step_s,
            "share": statistics.median(per_save) / step_s, "bytes": sum(p.stat().st_size for p in shards)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/checkpoint"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            rows[name] = measure(name, args.repeats, args.steps, Path(tmp))
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    (args.out / "checkpoint.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    lines = ["| model | checkpoint MiB | s per save | median step (s) | save / step |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        mib = r["bytes"] / 2**20
        lines.append(f"| {name} | {mib:.1f} | {r['save_s']:.4f} | {r['step_s']:.4f} | {r['share']:.1%} |")
    (args.out / "checkpoint.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
