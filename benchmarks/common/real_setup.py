"""pipetrain's side of the real-models benchmark, as a user gets it, and one run of any configuration.

``api.resolve_model(model, data=...)`` (torch.export capture at block granularity), ``api.profile_model``
here, ``api.plan`` for 2 local ranks with the default planner (``balanced``, what ``pipetrain.train``
uses) and with ``auto`` (every planner, the fastest prediction kept), then ``pipetrain.runtime.train``.
torch's split points come from the same plans: GPipe and 1F1B cut where the balanced plan starts
its second stage; the schedules with two chunks per rank cut at pipetrain's own 4-chunk partition
(looping or V). A configuration is a label: ``pipetrain``, ``pipetrain-auto``, ``single`` or
``torch <schedule> m=<m>[ captured]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from common.real_models import LR, SEED, RealModel, build_gpt2
from common.real_torch import TorchJob, pipeline_failure, single_rank, torch_rank
from common.torch_baseline import N_RANKS, WARMUP_STEPS, TorchRun, launch_timed
from common.torch_schedules import SCHEDULES, schedule_of
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.plan import Plan

__all__ = ["CAPTURED", "Setup", "own_labels", "run_label", "setup_model"]

CAPTURED = " captured"
"""The suffix of a torch configuration run on stages built by hand from pipetrain's captured layers."""


@dataclass
class Setup:
    """What is decided once per model, before the rounds; ``chosen``: the torch configurations kept
    after round 0, ``pipeline_errors``: what torch's own split could not run (configuration → error)."""

    model: RealModel
    graph: LayerGraph
    plans: dict[str, Plan]  # "balanced", "auto"
    seconds: dict[str, float]  # capture, profile, balanced, auto (planner only)
    splits: dict[str, tuple[str, ...]]  # "stages", "loop", "v" -> torch split points
    torch_configs: list[tuple[str, int]]
    pipeline_default: str | None  # what pipeline() says about the model with its default config (GPT-2: a KV cache)
    pipeline_errors: dict[str, str] = field(default_factory=dict)
    chosen: list[str] = field(default_factory=list)

    def describe(self, label: str) -> str:
        plan = self.plans[label]
        stages = " | ".join(f"{s.layers[0]}..{s.layers[-1]}" + (f" ×{len(s.ranks)}" if len(s.ranks) > 1 else "")
                            for s in plan.stages)
        return f"{plan.method.value} m={len(plan.stages[0].forward_sizes)}: {stages}"

    def row(self) -> dict[str, Any]:
        """The setup as a row of the record (``kind: "setup"``)."""
        return {"kind": "setup", "model": self.model.name, "batch": self.model.batch, "data": self.model.data,
                "layers": list(self.graph.names), "seconds": self.seconds,
                "plans": {k: self.describe(k) for k in self.plans},
                "plans_json": {k: json.loads(p.to_json()) for k, p in self.plans.items()},
                "torch_splits": self.splits, "pipeline_with_default_config": self.pipeline_default or "ok",
                "pipeline_errors": self.pipeline_errors}


def setup_model(model: RealModel, micro: Sequence[int], schedules: Sequence[str], profile_repeats: int) -> Setup:
    """Capture, profile and plan ``model`` as a user would (timed), and derive torch's split points and
    configurations (each of ``schedules`` at each micro-batch count of ``micro`` that torch allows)."""
    from pipetrain import api
    from pipetrain.cost import CostModel
    from pipetrain.plan.methods import Method
    from pipetrain.planners.contract import ModelRef
    from pipetrain.planners.interleaved import build_interleaved_plan

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    graph = api.resolve_model(model.build(), data=model.data, name=model.name)
    seconds["capture"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    profile = api.profile_model(graph, model.batch, repeats=profile_repeats)
    seconds["profile"] = time.perf_counter() - t0
    cluster = api.local_cluster(N_RANKS)
    plans = {}
    for planner in ("balanced", "auto"):
        t0 = time.perf_counter()
        plans[planner] = api.plan(graph, profile, cluster, batch_size=model.batch, planner=planner).plan
        seconds[planner] = time.perf_counter() - t0
    balanced = plans["balanced"]
    m = len(balanced.stages[0].forward_sizes)
    splits = {"stages": tuple(s.layers[0] for s in balanced.stages[1:])}
    cost = CostModel(profile, cluster)
    for placement, method in (("loop", Method.INTERLEAVED), ("v", Method.ZBV)):
        chunks = build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=N_RANKS, chunks=2, batch_size=model.batch,
                                        n_micro=m, method=method)
        splits[placement] = tuple(s.layers[0] for s in chunks.stages[1:])
    configs = [(name, n) for name in schedules for n in micro if SCHEDULES[name].allows(n, N_RANKS)]
    default = pipeline_failure(lambda: build_gpt2(use_cache=True), model, splits["stages"][0]) \
        if model.name == "gpt2" else None
    setup = Setup(model, graph, plans, seconds, splits, configs, default)
    print(f"[{model.name}] capture {seconds['capture']:.1f} s, profile {seconds['profile']:.1f} s, "
          f"balanced {seconds['balanced']:.1f} s: {setup.describe('balanced')}; auto {seconds['auto']:.1f} s: "
          f"{setup.describe('auto')}; torch splits {splits}", flush=True)
    return setup


def _run_pipetrain(setup: Setup, planner: str, steps: int, timeout_s: float) -> TorchRun:
    """pipetrain's plan of ``planner`` trained ``steps`` steps on its spawned ranks."""
    from pipetrain.runtime import TrainConfig, train

    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, lr=LR, data=setup.model.data, progress=False,
                         threads_per_rank=1, timeout_s=timeout_s)
    start = time.perf_counter()
    try:
        result = train(setup.graph, setup.plans[planner], config)
    except Exception as e:  # a failed run is a result
        return TorchRun(f"error: {type(e).__name__}: {str(e).splitlines()[0]}", wall_s=time.perf_counter() - start)
    return TorchRun("ok", result.samples_per_s, tuple(result.step_times_s), time.perf_counter() - start)


def run_label(setup: Setup, label: str, steps: int, timeout_s: float) -> TorchRun:
    """One run of the configuration ``label`` (see the module docstring)."""
    name = setup.model.name
    if label.startswith("pipetrain"):
        return _run_pipetrain(setup, "auto" if label == "pipetrain-auto" else "balanced", steps, timeout_s)
    if label == "single":
        return launch_timed(TorchJob(name, steps), setup.model.batch, timeout_s, single_rank, n_ranks=1)
    captured = label.endswith(CAPTURED)
    _, schedule, m = label.removesuffix(CAPTURED).split()
    spec = schedule_of(schedule)
    splits = setup.splits["stages" if not spec.multi else spec.placement]
    job = TorchJob(name, steps, schedule, int(m.removeprefix("m=")), splits, setup.graph if captured else None)
    return launch_timed(job, setup.model.batch, timeout_s, torch_rank)


def own_labels(setup: Setup) -> list[str]:
    """pipetrain's plans (auto's when it differs from the default) and the single process."""
    auto = ["pipetrain-auto"] if setup.plans["auto"] != setup.plans["balanced"] else []
    return ["pipetrain", *auto, "single"]
