"""Level (c) for interleaved 1F1B (method ``interleaved``, issue 17): a rank runs ``v`` stages,
and every rank's parameters equal single-process training within 1e-5 after 3 steps, for micro-batch
counts torch's interleaved schedule refuses (not multiples of the rank count), and with global-norm
clipping; a real task learns; checkpoints hold every stage of a rank and resume exactly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many

from .models import check_resume_and_reshard, cut, max_param_diff, mlp_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 14
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
GRAPH = mlp_graph(n_blocks=7)  # 8 layers
CASES = {"2ranks-2chunks-4micro": (2, 2, 4), "2ranks-2chunks-3micro": (2, 2, 3), "2ranks-4chunks-5micro": (2, 4, 5),
         "3ranks-2chunks-7micro": (3, 2, 7)}
DIGITS = build_model("mlp-digits")
DIGITS_CONFIG = TrainConfig(epochs=2, optimizer="adam", lr=3e-3, data="digits", progress=False, timeout_s=30)


def interleaved_plan(graph_names: tuple[str, ...], batch: int, n_ranks: int, chunks: int, n_micro: int) -> Plan:
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan(layers, (k % n_ranks,), sizes, sizes)
                   for k, layers in enumerate(cut(graph_names, n_ranks * chunks)))
    return Plan("interleaved-test", "", batch, Method.INTERLEAVED, stages)


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, interleaved_plan(GRAPH.names, BATCH, *case), SGD, return_state_dict=True)
            for case in CASES.values()]
    jobs.append(TrainJob(DIGITS, interleaved_plan(DIGITS.names, 64, 2, 2, 4), DIGITS_CONFIG))
    return dict(zip([*CASES, "digits"], train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    reference = reference_train(GRAPH, BATCH, SGD)
    assert max_param_diff(results[name], reference) <= 1e-5
    assert results[name].losses == pytest.approx(reference.losses, abs=1e-5)


def test_timeline_shows_each_rank_running_its_chunks(results: dict[str, TrainResult]) -> None:
    timeline = results["2ranks-4chunks-5micro"].timeline
    for rank in (0, 1):
        assert {e.action.stage for e in timeline.events if e.rank == rank} == {rank, rank + 2, rank + 4, rank + 6}


def test_mlp_digits_learns_and_evaluates_interleaved(results: dict[str, TrainResult]) -> None:
    final = results["digits"].final_eval
    assert final is not None and final.eval_accuracy is not None and final.eval_accuracy >= 0.9


def test_clipping_equals_single_process() -> None:
    """Each rank's first STEP clips all of its stages' gradients as its share of the global norm."""
    config = replace(SGD, clip_grad_norm=0.05)  # small enough to clip every step
    plan = interleaved_plan(GRAPH.names, BATCH, 2, 2, 4)
    result = train_many([TrainJob(GRAPH, plan, config, return_state_dict=True)])[0]
    reference = reference_train(GRAPH, BATCH, config)
    assert max_param_diff(result, reference) <= 1e-5
    assert max_param_diff(result, reference_train(GRAPH, BATCH, SGD)) > 1e-3  # the clipping mattered


def test_resume_equals_an_unbroken_run(tmp_path: Path) -> None:
    """A rank's shard holds all of its stages; 4 steps + resume 4 equals 8 steps bit for bit, Adam state
    included, and an interleaved checkpoint resumes under a plain 1f1b plan (resharded by name)."""
    plan = interleaved_plan(DIGITS.names, 32, 2, 2, 3)
    check_resume_and_reshard(DIGITS, plan, tmp_path)
