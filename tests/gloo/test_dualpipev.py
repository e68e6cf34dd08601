"""Level (c) for DualPipeV (method ``dualpipev``, DeepSeek-V3 §3.2.1, cut in half onto the V): two
stages per rank in a V, backwards full (B then W at once) or split where the order defers W, the
same-rank hand-off between stages ``R − 1`` and ``R``. Every rank's parameters equal single-process
training (:func:`reference_train`) within 1e-5 after 3 steps on 2 ranks (m = 4, 5) and 3 ranks
(m = 6), on a small MLP and a small GPT; a digits model learns, evaluates, resumes bit for bit and
reshards into a 1f1b plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

from .models import check_resume_and_reshard, max_param_diff, mlp_graph, v_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 12
TOL = 1e-5
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
GRAPH = mlp_graph(n_blocks=7)  # 8 layers
GPT = build_model("gpt-tiny", blocks=2)
DIGITS = build_model("mlp-digits")


def dualpipev_plan(graph: LayerGraph, batch: int, n_ranks: int, n_micro: int) -> Plan:
    return v_plan(graph, batch, n_ranks, n_micro, Method.DUALPIPEV)


CASES = {
    "2ranks-4micro": (GRAPH, dualpipev_plan(GRAPH, BATCH, 2, 4)),
    "2ranks-5micro": (GRAPH, dualpipev_plan(GRAPH, 10, 2, 5)),
    "3ranks-6micro": (GRAPH, dualpipev_plan(GRAPH, BATCH, 3, 6)),
    "gpt-2ranks-4micro": (GPT, dualpipev_plan(GPT, 8, 2, 4)),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(graph, plan, SGD, return_state_dict=True) for graph, plan in CASES.values()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    graph, plan = CASES[name]
    schedule = build_schedule(plan)
    assert all(any(a.kind is ActionKind.W for a in program) for _, program in schedule)
    reference = reference_train(graph, plan.batch_size, SGD)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)


def test_timeline_shows_the_v(results: dict[str, TrainResult]) -> None:
    timeline = results["3ranks-6micro"].timeline
    for rank in range(3):
        assert {e.action.stage for e in timeline.events if e.rank == rank} == {rank, 5 - rank}


def test_digits_learns_and_resumes(tmp_path: Path) -> None:
    plan = dualpipev_plan(DIGITS, 32, 2, 4)
    unbroken = check_resume_and_reshard(DIGITS, plan, tmp_path, eval_every=4)
    final = unbroken.final_eval
    assert final is not None and final.eval_accuracy is not None and final.eval_accuracy > 0.3
