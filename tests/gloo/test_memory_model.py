"""Level (c): the memory model (:mod:`pipetrain.simulate.memory`) against the peaks the runtime measures.

Every job runs in one launch (``train_many``) for 2 steps; the runtime meters the first. Per stage,
the predicted total and, separately, the predicted activations are within 20 % of what the stage's
rank measured (for ``zb1`` the activations include the output gradients a split backward's B keeps
until its W, and with recompute the re-run's graph from B to W); weights and gradients match
exactly, optimizer state up to Adam's step counters. The profile is measured here at the batch size
only, once, untimed in effect (bytes do not depend on timing).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.memory import OptimizerName, StageMemory
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.interp.memory import MeasuredMemory
from pipetrain.simulate.memory import stage_memory
from pipetrain.viz.tables import relative_error

from .models import chain_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 12
TOL = 0.2
MLP = build_model("mlp", n_layers=6, inputs=32, width=64, hidden=128, classes=10)
GPT = build_model("gpt-tiny")
GRAPHS = {"mlp": MLP, "gpt": GPT}


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    plan: Plan
    optimizer: OptimizerName


def _case(model: str, method: Method, n_stages: int, n_micro: int, optimizer: OptimizerName = "sgd",
          recompute: bool = False) -> Case:
    plan = chain_plan(GRAPHS[model], n_stages, BATCH, n_micro, method).with_recompute(None if recompute else ())
    extra = "-recompute" if recompute else "" if optimizer == "sgd" else f"-{optimizer}"
    return Case(f"{model}-{method.value}-{n_stages}stages-{n_micro}micro{extra}", model, plan, optimizer)


def _cases() -> list[Case]:
    cases = [_case(model, method, k, m) for model in GRAPHS for method in (Method.GPIPE, Method.ONE_F_ONE_B)
             for k, m in ((2, 2), (3, 4), (3, 6))]
    cases += [
        _case("mlp", Method.ONE_F_ONE_B, 3, 4, recompute=True),
        _case("gpt", Method.GPIPE, 2, 3, recompute=True),
        _case("mlp", Method.GPIPE, 2, 3, "sgd-momentum"),
        _case("gpt", Method.ONE_F_ONE_B, 3, 4, "sgd-momentum"),
        _case("mlp", Method.ONE_F_ONE_B, 2, 6, "adam"),
        _case("gpt", Method.ONE_F_ONE_B, 2, 4, "adam"),
        _case("mlp", Method.ZB1, 3, 4),  # split backward: B keeps the owners' output gradients until W
        _case("gpt", Method.ZB1, 3, 6),
        _case("gpt", Method.ZB1, 3, 6, recompute=True),  # B re-runs forward, its graph kept until W
    ]
    return cases


CASES = {case.name: case for case in _cases()}


def _config(optimizer: OptimizerName) -> TrainConfig:
    if optimizer == "adam":
        return TrainConfig(steps=2, optimizer="adam", lr=1e-3, progress=False, timeout_s=60)
    return TrainConfig(steps=2, lr=0.01, momentum=0.9 if optimizer == "sgd-momentum" else 0.0, progress=False,
                       timeout_s=60)


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    cases = list(CASES.values())
    jobs = [TrainJob(GRAPHS[c.model], c.plan, _config(c.optimizer)) for c in cases]
    return {c.name: r for c, r in zip(cases, train_many(jobs), strict=True)}


@pytest.fixture(scope="module")
def profiles() -> dict[str, Profile]:
    return {model: measure_profile(graph, BATCH, sizes=(BATCH,), warmup=0, repeats=1)
            for model, graph in GRAPHS.items()}


def _pairs(case: Case, profile: Profile, result: TrainResult) -> list[tuple[StageMemory, MeasuredMemory]]:
    """Per stage, the prediction and the measurement of its rank with the largest total."""
    cost = CostModel(profile, Cluster.local(case.plan.n_ranks))
    measured = {m.rank: m for m in result.memory}
    predicted = stage_memory(case.plan, cost, optimizer=case.optimizer)
    return [(pred, max((measured[r] for r in stage.ranks), key=lambda m: m.total_bytes))
            for pred, stage in zip(predicted, case.plan.stages, strict=True)]


@pytest.mark.parametrize("name", list(CASES))
def test_predicted_memory_within_20_percent(
    results: dict[str, TrainResult], profiles: dict[str, Profile], name: str
) -> None:
    case = CASES[name]
    result = results[name]
    assert sorted(m.rank for m in result.memory) == list(range(case.plan.n_ranks))
    for k, (pred, meas) in enumerate(_pairs(case, profiles[case.model], result)):
        assert (pred.weight_bytes, pred.gradient_bytes) == (meas.weight_bytes, meas.gradient_bytes), k
        assert abs(relative_error(pred.optimizer_state_bytes, meas.optimizer_state_bytes)) <= 0.01, k
        errors = relative_error(pred.total_bytes, meas.total_bytes), relative_error(
            pred.activation_bytes, meas.activation_bytes)
        assert max(map(abs, errors)) <= TOL, f"stage {k}: total {errors[0]:+.1%}, activations {errors[1]:+.1%}"


def test_cases_cover_the_grid() -> None:
    """Guards the grid: both methods, both models, recompute, and every optimizer are measured."""
    cases = CASES.values()
    assert {c.plan.method for c in cases} == {Method.GPIPE, Method.ONE_F_ONE_B, Method.ZB1}
    assert {c.model for c in cases} == {"mlp", "gpt"}
    assert {c.optimizer for c in cases} == {"sgd", "sgd-momentum", "adam"}
    assert any(c.plan.recompute_stages for c in cases)
    assert {len(c.plan.stages[0].forward_sizes) for c in cases} >= {2, 3, 4, 6}
