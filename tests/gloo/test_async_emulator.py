"""The core test of the asynchronous methods (DESIGN.md §5 invariant 6): after 20 steps, the
multi-process runtime's weights equal the single-process emulator's within 1e-5, for pipedream
(weight stashing, with and without vertical sync, 2 and 4 stages, a replicated stage, SGD and Adam,
the learning-rate rule on and off) and 2bw
(2 and 4 stages; replicated stages: 3 ranks = stage 0 × 2 + stage 1, and 4 ranks = 2 × 2, the
paper's parallel pipelines). The emulator applies the methods' staleness from their definitions
(:mod:`pipetrain.reference.asynchronous`), so a version off by one, or a step in another order, fails here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import pytest
import torch

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.reference.asynchronous import emulate_async
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

from .models import chain_plan, mlp_graph, replicated_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 8
STEPS = 20
TOL = 1e-5
SGD = TrainConfig(steps=STEPS, warmup_steps=1, lr=0.05, progress=False, timeout_s=60)
ADAM = replace(SGD, optimizer="adam", lr=1e-2)


@dataclass(frozen=True)
class Case:
    plan: Plan
    config: TrainConfig


def _async(plan: Plan, weights: WeightPolicy) -> Plan:
    method = Method.TWO_BW if weights is WeightPolicy.TWO_BW else Method.PIPEDREAM
    return replace(plan, method=method, weights=weights)


GRAPH: LayerGraph = mlp_graph()
CASES = {
    "pipedream-2stages": Case(_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.STASH), SGD),
    "pipedream-4stages": Case(_async(chain_plan(GRAPH, 4, BATCH, 4), WeightPolicy.STASH), SGD),
    "vertical-sync-2stages": Case(_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.VERTICAL_SYNC), SGD),
    "vertical-sync-4stages": Case(_async(chain_plan(GRAPH, 4, BATCH, 4), WeightPolicy.VERTICAL_SYNC), SGD),
    "pipedream-replicated-2-1-1": Case(_async(replicated_plan(GRAPH, (2, 1, 1), BATCH, 4), WeightPolicy.STASH), SGD),
    "pipedream-2stages-adam": Case(_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.STASH), ADAM),
    "pipedream-2stages-rule-none": Case(_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.STASH),
                                        replace(SGD, lr_rule="none")),
    "2bw-2stages": Case(_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.TWO_BW), SGD),
    "2bw-2stages-adam": Case(_async(chain_plan(GRAPH, 2, BATCH, 4), WeightPolicy.TWO_BW), ADAM),
    "2bw-4stages-adam": Case(_async(chain_plan(GRAPH, 4, BATCH, 4), WeightPolicy.TWO_BW), ADAM),
    "2bw-replicated-2-1": Case(_async(replicated_plan(GRAPH, (2, 1), BATCH, 4), WeightPolicy.TWO_BW), SGD),
    "2bw-replicated-2-2-adam": Case(_async(replicated_plan(GRAPH, (2, 2), BATCH, 4), WeightPolicy.TWO_BW), ADAM),
}
# Evaluations between steps, while micro-batches and their gradients are in flight, change nothing.
DIGITS = mlp_graph(n_blocks=2, width=32, features=64, classes=10)
EVAL_CASE = Case(_async(chain_plan(DIGITS, 3, 16, 4), WeightPolicy.STASH),
                 replace(SGD, data="digits", eval_every=5, lr=0.1))


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, c.plan, c.config, return_state_dict=True) for c in CASES.values()]
    jobs.append(TrainJob(DIGITS, EVAL_CASE.plan, EVAL_CASE.config, return_state_dict=True))
    return dict(zip([*CASES, "eval"], train_many(jobs), strict=True))


def _diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", list(CASES))
def test_runtime_equals_emulator(results: dict[str, TrainResult], name: str) -> None:
    case = CASES[name]
    assert _diff(results[name].state_dict, emulate_async(GRAPH, case.plan, case.config)) <= TOL
    assert len(results[name].losses) == STEPS


@pytest.mark.parametrize("name", ["pipedream-2stages", "pipedream-2stages-adam", "pipedream-replicated-2-1-1",
                                  "pipedream-2stages-rule-none", "2bw-2stages"])
def test_the_rule_s_rate_is_the_one_recorded(results: dict[str, TrainResult], name: str) -> None:
    """metrics.csv's rate is the last stage's effective one: lr × 1/4 for pipedream on 4 micro-batches under
    the default rule (SGD or Adam), the rate as given with ``--lr-rule none`` and for 2bw."""
    case = CASES[name]
    expected = {"pipedream-2stages": 0.25, "pipedream-2stages-adam": 0.25, "pipedream-replicated-2-1-1": 0.25}
    rate = case.config.lr * expected.get(name, 1.0)
    assert [m.lr for m in results[name].metrics] == pytest.approx([rate] * STEPS, rel=1e-12)


def test_staleness_is_visible(results: dict[str, TrainResult]) -> None:
    """Guards the comparison: runs that differ only in their versions (stashing vs vertical sync on the
    same plan and data, pipedream vs 2bw) end far more than the tolerance apart, so a wrong version
    cannot pass unnoticed."""
    for a, b in (("pipedream-4stages", "vertical-sync-4stages"), ("pipedream-2stages", "vertical-sync-2stages"),
                 ("pipedream-2stages", "2bw-2stages"),
                 ("pipedream-2stages", "pipedream-2stages-rule-none")):
        assert _diff(results[a].state_dict, results[b].state_dict) > 100 * TOL, (a, b)


def test_two_bw_replicas_change_nothing_but_the_ranks(results: dict[str, TrainResult]) -> None:
    """2BW's step sums the batch's gradients whichever replica ran them, on the same versions, so the
    2 × 2 run equals the straight 2-stage run of the same stages (to the all-reduce's rounding), loss
    included (the last stage sums it over its replicas)."""
    replicated, straight = results["2bw-replicated-2-2-adam"], results["2bw-2stages-adam"]
    assert _diff(replicated.state_dict, straight.state_dict) <= TOL
    assert replicated.losses == pytest.approx(straight.losses, rel=1e-5)


def test_evaluating_mid_run_equals_emulator(results: dict[str, TrainResult]) -> None:
    result = results["eval"]
    assert _diff(result.state_dict, emulate_async(DIGITS, EVAL_CASE.plan, EVAL_CASE.config)) <= TOL
    accuracies = [m.eval_accuracy for m in result.metrics if m.eval_accuracy is not None]
    assert len(accuracies) == STEPS // 5 and accuracies[-1] > accuracies[0]
