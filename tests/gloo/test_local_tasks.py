"""Method ``local`` (PPLL) for any task: heads predict the model's output and score it with the task's loss.

A 4-layer MLP regresses scikit-learn's diabetes data (bundled, standardised; targets ``[b, 1]``
floats) on 2 stages: stage 0's head maps its hidden ``[b, 32]`` to ``[b, 1]`` and is scored with the
job's loss, mse (the model's own) or a user's callable (absolute error). gpt-tiny on random tokens
trains on 2 stages too: stage 0's head maps its tokens ``[b, T, D]`` to next-token logits
``[b, T, V]``. One launch runs every case; each equals local learning run in one process
(:func:`emulate_local`, DESIGN invariant 6) within 1e-5, and the regressors' loss falls.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.reference.local import LocalRun, emulate_local
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many

from .models import chain_plan, regression_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOL = 1e-5
DIABETES = TrainConfig(steps=30, warmup_steps=1, lr=0.02, data="tests.gloo.models:diabetes_data", progress=False,
                       timeout_s=60, eval_every=30)
REGRESSION = {
    "mse-linear": ("linear", DIABETES),
    "mse-dgl-adam": ("dgl", replace(DIABETES, optimizer="adam", lr=3e-3)),
    "user-loss-linear": ("linear", replace(DIABETES, loss="tests.gloo.models:absolute_error", lr=0.1)),
}
TOKENS = TrainConfig(steps=6, warmup_steps=1, optimizer="adam", lr=1e-3, data="synthetic", progress=False,
                     timeout_s=60)  # random tokens: no eval set to evaluate


def local_plan(graph: LayerGraph, aux: str, batch: int, n_micro: int) -> Plan:
    plan = chain_plan(graph, 2, batch, n_micro, Method.LOCAL)
    return replace(plan, weights=WeightPolicy.LOCAL, params=LocalParams(aux))


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[TrainResult, LocalRun]]:
    regression, gpt = regression_graph(), build_model("gpt-tiny")
    jobs = {name: TrainJob(regression, local_plan(regression, aux, 32, 4), config, return_state_dict=True)
            for name, (aux, config) in REGRESSION.items()}
    jobs["gpt-tokens-dgl"] = TrainJob(gpt, local_plan(gpt, "dgl", 8, 2), TOKENS, return_state_dict=True)
    results = train_many(list(jobs.values()))
    return {name: (result, emulate_local(job.graph, job.plan, job.config))
            for (name, job), result in zip(jobs.items(), results, strict=True)}


@pytest.mark.parametrize("name", [*REGRESSION, "gpt-tokens-dgl"])
def test_pipelined_local_learning_equals_the_single_process_emulator(
        name: str, runs: dict[str, tuple[TrainResult, LocalRun]]) -> None:
    result, emulated = runs[name]
    assert set(result.state_dict) == set(emulated.state_dict)
    assert {k for k in emulated.state_dict if k.startswith("aux0.")}  # stage 0's head, trained
    diff = max((result.state_dict[k] - v).abs().max().item() for k, v in emulated.state_dict.items())
    assert diff <= TOL, f"{name}: max parameter difference {diff}"
    assert result.losses == pytest.approx(emulated.losses, rel=1e-6, abs=TOL)
    if name in REGRESSION:
        final = result.final_eval
        assert final is not None and emulated.evaluation is not None
        assert final.eval_loss == pytest.approx(emulated.evaluation.loss, abs=1e-4)


@pytest.mark.parametrize("name", list(REGRESSION))
def test_local_learning_fits_the_diabetes_data(name: str, runs: dict[str, tuple[TrainResult, LocalRun]]) -> None:
    """30 steps of 32 patients: the last stage's training loss, over 5 steps, falls by a quarter or more
    (standardised targets: predicting the mean scores 1 under mse, about 0.8 under absolute error)."""
    losses = runs[name][0].losses
    assert sum(losses[-5:]) < 3 / 4 * sum(losses[:5]), f"{name}: {losses}"
