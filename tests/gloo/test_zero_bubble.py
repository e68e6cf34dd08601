"""Methods zb1 and zb2 (ZB-H1, ZB-H2; Qi et al. 2024): a split backward (B, then W) trains exactly like one process.

All configurations run in one launch (``train_many``) and each is checked against
:func:`reference_train` after 3 steps: every rank's parameters within 1e-5, on 2 and 4 stages, with
equal and per-stage unequal micro-batches, with SGD and Adam, and on 3 stages of a small GPT.
"""

from __future__ import annotations

import pytest

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

from .models import chain_plan, max_param_diff, mlp_graph, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 14
TOL = 1e-5
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
ADAM = TrainConfig(steps=3, optimizer="adam", lr=1e-3, progress=False, timeout_s=30)
GRAPH = mlp_graph()
GPT = build_model("gpt-tiny", blocks=2)  # transformer blocks: W re-traverses each block's own graph

CASES = {
    "zb1-gpt-3stages": (chain_plan(GPT, 3, 6, 3, Method.ZB1), SGD),
    "zb1-2stages-4micro": (chain_plan(GRAPH, 2, BATCH, 4, Method.ZB1), SGD),
    "zb1-4stages-8micro": (chain_plan(GRAPH, 4, BATCH, 8, Method.ZB1), SGD),
    "zb1-4stages-3micro": (chain_plan(GRAPH, 4, BATCH, 3, Method.ZB1), SGD),
    "zb1-2stages-adam": (chain_plan(GRAPH, 2, BATCH, 5, Method.ZB1), ADAM),
    "zb1-unequal-2stages": (uneven_plan(GRAPH, [(1, 4, 4, 5), (6, 1, 7)], method=Method.ZB1), SGD),
    "zb1-unequal-4stages": (uneven_plan(GRAPH, [(2,) * 7, (7, 7), (1, 1, 3, 3, 6), (5, 9)], method=Method.ZB1), SGD),
    "zb2-4stages-8micro": (chain_plan(GRAPH, 4, BATCH, 8, Method.ZB2), SGD),
    "zb2-gpt-3stages-unequal": (uneven_plan(GPT, [(1, 2, 3), (3, 3), (2, 4)], method=Method.ZB2), SGD),
}


def _graph(name: str) -> LayerGraph:
    return GPT if "gpt" in name else GRAPH


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(_graph(name), plan, config, return_state_dict=True) for name, (plan, config) in CASES.items()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_zero_bubble_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    plan, config = CASES[name]
    assert any(a.kind is ActionKind.W for _, program in build_schedule(plan) for a in program)
    reference = reference_train(_graph(name), plan.batch_size, config)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)
