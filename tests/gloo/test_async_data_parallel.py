"""PipeDream's data parallelism and a replicated last stage under ``pipedream`` (1F1B-RR), run by the
multi-process runtime: the weights equal the single-process emulator's
(:mod:`pipetrain.reference.asynchronous`), and the recorded loss counts every micro-batch once.

One stage on both ranks with ``m = r = 2`` is data parallelism: each replica runs F, B and a STEP that
sums the two micro-batch means, so at half the rate (``--lr-rule none``) it equals ``1f1b`` on the same
stage and ranks, which steps once on the batch mean: weights and losses alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
import torch

from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.reference.asynchronous import emulate_async
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

from .models import mlp_graph, replicated_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 8
STEPS = 10
GRAPH = mlp_graph()
SGD = TrainConfig(steps=STEPS, warmup_steps=1, lr=0.05, progress=False, timeout_s=60)
DATA_PARALLEL = replace(replicated_plan(GRAPH, (2,), BATCH, 2), method=Method.PIPEDREAM, weights=WeightPolicy.STASH)
PLANS = {
    "data-parallel": (DATA_PARALLEL, replace(SGD, lr=SGD.lr / 2, lr_rule="none")),
    "replicated-1-2": (replace(replicated_plan(GRAPH, (1, 2), BATCH, 4), method=Method.PIPEDREAM,
                               weights=WeightPolicy.STASH), SGD),
    "synchronous": (replicated_plan(GRAPH, (2,), BATCH, 2, Method.ONE_F_ONE_B), SGD),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, plan, config, return_state_dict=True) for plan, config in PLANS.values()]
    return dict(zip(PLANS, train_many(jobs), strict=True))


def _diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", ["data-parallel", "replicated-1-2"])
def test_runtime_equals_emulator(results: dict[str, TrainResult], name: str) -> None:
    plan, config = PLANS[name]
    assert _diff(results[name].state_dict, emulate_async(GRAPH, plan, config)) <= 1e-5
    assert len(results[name].losses) == STEPS


def test_data_parallel_equals_synchronous_at_half_the_rate(results: dict[str, TrainResult]) -> None:
    """Weights and the recorded loss (the two replicas' micro-batch means, each counted once)."""
    asynchronous, synchronous = results["data-parallel"], results["synchronous"]
    assert _diff(asynchronous.state_dict, synchronous.state_dict) <= 1e-5
    assert asynchronous.losses == pytest.approx(synchronous.losses, rel=1e-5)
