"""Gradient-norm clipping under the asynchronous methods (docs/algorithms.md §3.5): the runtime equals
the single-process emulator with clipping that fires (DESIGN.md §5 invariant 6).

``2bw`` clips batch ``t``'s gradient by its norm over every stage, although stage 0 steps for it one
chunk after the last stage: each stage starts the norm's all-reduce at its STEP and finishes the
step when it is needed (:mod:`pipetrain.runtime.interp.weights`), so these runs also show that no
rank waits across the barrier between chunks (2 and 3 stages, an evaluation between steps).
``pipedream`` clips each update by its own norm over the stage's parameters (stashing and vertical
sync, a replicated stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
import torch

from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.reference.asynchronous import emulate_async
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

from .models import chain_plan, mlp_graph, replicated_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 8
TOL = 1e-5
GRAPH = mlp_graph()
CLIP = TrainConfig(steps=8, warmup_steps=1, lr=0.05, clip_grad_norm=0.05, progress=False, timeout_s=60)


def _async(plan: Plan, weights: WeightPolicy) -> Plan:
    method = Method.TWO_BW if weights is WeightPolicy.TWO_BW else Method.PIPEDREAM
    return replace(plan, method=method, weights=weights)


CASES: dict[str, tuple[Plan, TrainConfig]] = {
    "2bw-2stages": (_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.TWO_BW), CLIP),
    "2bw-3stages-eval": (_async(chain_plan(GRAPH, 3, BATCH, 4), WeightPolicy.TWO_BW),
                         replace(CLIP, optimizer="adam", lr=1e-2, eval_every=3)),
    "pipedream-2stages": (_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.STASH), CLIP),
    "vertical-sync-3stages": (_async(chain_plan(GRAPH, 3, BATCH, 4), WeightPolicy.VERTICAL_SYNC), CLIP),
    "pipedream-replicated-2-1": (_async(replicated_plan(GRAPH, (2, 1), BATCH, 4), WeightPolicy.STASH), CLIP),
}
# With a norm clipping never fires at, 2bw's deferred steps change nothing, not even under a
# learning-rate schedule: each step keeps the rates of its STEP.
UNCLIPPED = replace(CLIP, steps=6, lr_schedule="cosine", clip_grad_norm=None)
SCHEDULED = {"2bw-cosine": (CASES["2bw-3stages-eval"][0], UNCLIPPED),
             "2bw-cosine-clip-1e9": (CASES["2bw-3stages-eval"][0], replace(UNCLIPPED, clip_grad_norm=1e9))}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    runs = {**CASES, **SCHEDULED}
    jobs = [TrainJob(GRAPH, plan, config, return_state_dict=True) for plan, config in runs.values()]
    return dict(zip(runs, train_many(jobs), strict=True))


def _diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", list(CASES))
def test_clipped_runtime_equals_emulator(results: dict[str, TrainResult], name: str) -> None:
    plan, config = CASES[name]
    clipped = emulate_async(GRAPH, plan, config)
    assert _diff(results[name].state_dict, clipped) <= TOL
    # the norm is small enough that clipping changes the weights far beyond the tolerance
    assert _diff(clipped, emulate_async(GRAPH, plan, replace(config, clip_grad_norm=None))) > 100 * TOL
    assert len(results[name].losses) == config.steps


def test_deferred_steps_change_nothing_when_not_clipping(results: dict[str, TrainResult]) -> None:
    assert _diff(results["2bw-cosine"].state_dict, results["2bw-cosine-clip-1e9"].state_dict) == 0.0
    assert results["2bw-cosine"].losses == results["2bw-cosine-clip-1e9"].losses
