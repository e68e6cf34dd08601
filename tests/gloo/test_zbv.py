"""Level (c) for ZB-V (method ``zbv``, Qi et al. 2024 §6): two stages per rank in a V, the backward
split into B and W, and the same-rank hand-off between stages ``R − 1`` and ``R`` (no message, a
shared buffer, :meth:`~pipetrain.runtime.interp.ports.ChainPorts.after`). Every rank's parameters
equal single-process training (:func:`reference_train`) within 1e-5 after 3 steps on 2 ranks (m = 1,
3, 4) and 3 ranks (m = 5), on a small GPT; with clipping; a digits model learns and evaluates; a
checkpoint resumes bit for bit and reshards into a 1f1b plan.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.graph.zoo import build_model
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

from .models import check_resume_and_reshard, max_param_diff, mlp_graph, v_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 14
TOL = 1e-5
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
GRAPH = mlp_graph(n_blocks=7)  # 8 layers
GPT = build_model("gpt-tiny", blocks=2)
DIGITS = build_model("mlp-digits")


CASES = {
    "2ranks-1micro": (GRAPH, v_plan(GRAPH, BATCH, 2, 1)),
    "2ranks-3micro": (GRAPH, v_plan(GRAPH, BATCH, 2, 3)),
    "2ranks-4micro": (GRAPH, v_plan(GRAPH, BATCH, 2, 4)),
    "3ranks-5micro": (GRAPH, v_plan(GRAPH, BATCH, 3, 5)),
    "gpt-2ranks-4micro": (GPT, v_plan(GPT, 8, 2, 4)),
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
    last = plan.n_ranks - 1  # stages R-1 and R meet on the last rank without a message between them
    comms = {(a.kind, a.stage) for a in schedule.ranks[last] if a.peer is not None}
    assert not comms & {(ActionKind.SEND_F, last), (ActionKind.RECV_F, last + 1), (ActionKind.SEND_B, last + 1),
                        (ActionKind.RECV_B, last)}
    reference = reference_train(graph, plan.batch_size, SGD)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)


def test_timeline_shows_the_v(results: dict[str, TrainResult]) -> None:
    timeline = results["3ranks-5micro"].timeline
    for rank in range(3):
        assert {e.action.stage for e in timeline.events if e.rank == rank} == {rank, 5 - rank}


def test_clipping_equals_single_process() -> None:
    """Every compute action runs before a rank's first STEP, which clips both of its stages' gradients."""
    config = replace(SGD, clip_grad_norm=0.05)  # small enough to clip every step
    result = train_many([TrainJob(GRAPH, CASES["2ranks-4micro"][1], config, return_state_dict=True)])[0]
    assert max_param_diff(result, reference_train(GRAPH, BATCH, config)) <= TOL
    assert max_param_diff(result, reference_train(GRAPH, BATCH, SGD)) > 1e-3  # the clipping mattered


def test_digits_learns_and_resumes(tmp_path: Path) -> None:
    """Adam on digits: 4 steps + resume 4 equals 8 steps bit for bit (a rank's shard holds both of its
    stages), a zbv checkpoint reshards into a 1f1b plan, and the model evaluates through the V."""
    plan = v_plan(DIGITS, 32, 2, 3)
    unbroken = check_resume_and_reshard(DIGITS, plan, tmp_path, eval_every=4)
    final = unbroken.final_eval
    assert final is not None and final.eval_accuracy is not None and final.eval_accuracy > 0.3
