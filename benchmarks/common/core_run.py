"""One run of one Core configuration: torch's schedule, pipetrain's plan, or single-process training."""

from __future__ import annotations

import multiprocessing as mp

from harness import Row, bounded

from common.core_setup import Config, ModelSetup
from common.measured import WARMUP_STEPS
from common.torch_baseline import run_torch_pipelining
from pipetrain.graph.zoo import build_model
from pipetrain.runtime import TrainConfig, TrainResult, reference_train, train
from pipetrain.simulate.timeline import Timeline

__all__ = ["run_config"]


def run_config(setup: ModelSetup, config: Config, timeout_s: float) -> tuple[Row, Timeline | None]:
    """Run ``config`` once: its row (status, samples/s, median iteration, every step, the prediction)
    and, for pipetrain, its measured timeline."""
    row: Row = {"row": "run", "model": setup.name, "label": config.label, "status": "ok", "samples_per_s": None,
                "iteration_s": None, "predicted_s": None, "predicted_alone_s": None, "step_times_s": []}
    if config.kind in ("torch", "torch+alloc"):
        result = run_torch_pipelining(setup.name, setup.batch, config.n_micro, config.schedule, setup.steps,
                                      timeout_s, keep_freed_memory=config.kind == "torch+alloc")
        row.update(status=result.status, samples_per_s=result.samples_per_s, iteration_s=result.iteration_s,
                   step_times_s=list(result.step_times_s))
        return row, None
    train_config = TrainConfig(steps=setup.steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                               timeout_s=min(60.0, timeout_s), keep_freed_memory=config.kind in ("single+alloc",
                                                                                                  "pipetrain",
                                                                                                  "planned"))
    if config.kind in ("single", "single+alloc"):
        out, status = bounded(lambda: _fresh_reference(setup, train_config), timeout_s)
    else:
        plan = setup.plans["planned" if config.kind == "planned-noalloc" else config.label]
        out, status = bounded(lambda: train(setup.graph, plan, train_config), timeout_s)
        row["predicted_alone_s"] = setup.predicted_alone_s.get(config.label)
    row.update(status=status, predicted_s=setup.predicted[config.label].iteration_s)
    if out is None:
        return row, None
    row.update(samples_per_s=out.samples_per_s, iteration_s=out.timeline.iteration_s,
               step_times_s=list(out.step_times_s))
    return row, out.timeline


def _reference_child(model: str, batch: int, config: TrainConfig, queue: mp.Queue[object]) -> None:
    queue.put(reference_train(build_model(model), batch, config, return_state_dict=False))


def _fresh_reference(setup: ModelSetup, config: TrainConfig) -> TrainResult:
    """Single-process training in a fresh process: the allocator setting is per process and
    permanent, so the plain baseline must not run where it was applied (profiling applies it)."""
    ctx = mp.get_context("spawn")
    queue: mp.Queue[object] = ctx.Queue()
    child = ctx.Process(target=_reference_child, args=(setup.name, setup.batch, config, queue))
    child.start()
    try:
        result = queue.get()
    finally:
        child.join()
    assert isinstance(result, TrainResult)
    return result
