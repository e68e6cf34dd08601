"""Method ``local`` (PPLL) trains a regressor: heads predict the targets and score them with the task's loss.

A 4-layer MLP regresses scikit-learn's diabetes data (bundled, standardised; targets ``[b, 1]``
floats) on 2 stages. Stage 0's head maps its hidden ``[b, 32]`` to ``[b, 1]`` and is scored with the
job's loss: mse (the model's own), or a user's callable (absolute error). One launch runs every case;
each equals local learning run in one process (:func:`emulate_local`, DESIGN invariant 6) within 1e-5,
and the evaluation loss of the main path falls.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.reference.local import LocalRun, emulate_local
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

from .models import chain_plan, regression_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOL = 1e-5
DIABETES = TrainConfig(steps=30, warmup_steps=1, lr=0.02, data="tests.gloo.models:diabetes_data", progress=False,
                       timeout_s=60, eval_every=30)
CASES = {
    "mse-linear": ("linear", DIABETES),
    "mse-dgl-adam": ("dgl", replace(DIABETES, optimizer="adam", lr=3e-3)),
    "user-loss-linear": ("linear", replace(DIABETES, loss="tests.gloo.models:absolute_error", lr=0.1)),
}


def local_plan(aux: str) -> Plan:
    plan = chain_plan(regression_graph(), 2, 32, 4, Method.LOCAL)
    return replace(plan, weights=WeightPolicy.LOCAL, params=LocalParams(aux))


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[TrainResult, LocalRun]]:
    graph = regression_graph()
    jobs = [TrainJob(graph, local_plan(aux), config, return_state_dict=True) for aux, config in CASES.values()]
    results = train_many(jobs)
    return {name: (result, emulate_local(graph, job.plan, job.config))
            for name, result, job in zip(CASES, results, jobs, strict=True)}


@pytest.mark.parametrize("name", list(CASES))
def test_pipelined_regression_equals_the_single_process_emulator(
        name: str, runs: dict[str, tuple[TrainResult, LocalRun]]) -> None:
    result, emulated = runs[name]
    assert set(result.state_dict) == set(emulated.state_dict)
    assert {k for k in emulated.state_dict if k.startswith("aux0.")}  # stage 0's head, trained
    diff = max((result.state_dict[k] - v).abs().max().item() for k, v in emulated.state_dict.items())
    assert diff <= TOL, f"{name}: max parameter difference {diff}"
    assert result.losses == pytest.approx(emulated.losses, rel=1e-6, abs=TOL)
    final = result.final_eval
    assert final is not None and emulated.evaluation is not None
    assert final.eval_loss == pytest.approx(emulated.evaluation.loss, abs=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_local_learning_fits_the_diabetes_data(name: str, runs: dict[str, tuple[TrainResult, LocalRun]]) -> None:
    """30 steps of 32 patients: the last stage's training loss, over 5 steps, falls by a quarter or more
    (standardised targets: predicting the mean scores 1 under mse, about 0.8 under absolute error)."""
    losses = runs[name][0].losses
    assert sum(losses[-5:]) < 3 / 4 * sum(losses[:5]), f"{name}: {losses}"
