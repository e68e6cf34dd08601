"""Method ``interleaved-zb`` (issue 17): interleaved 1F1B whose backwards split into B and deferred
W trains exactly like one process. A rank runs ``v`` stages and splits each one's backward
(:mod:`pipetrain.graph.split_backward`); every rank's parameters equal single-process training
(:func:`reference_train`) within 1e-5 after 3 steps, on 2 ranks with 2 chunks and 3 or 4
micro-batches (3 is not a multiple of the ranks), on 3 ranks, on a small GPT, and with clipping.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

from .models import cut, max_param_diff, mlp_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 14
TOL = 1e-5
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
GRAPH = mlp_graph(n_blocks=7)  # 8 layers
GPT = build_model("gpt-tiny", blocks=2)  # transformer blocks: W per linear, layer norm and embedding


def looping_plan(graph: LayerGraph, batch: int, n_ranks: int, chunks: int, n_micro: int) -> Plan:
    """``chunks · n_ranks`` stages, stage ``s`` on rank ``s mod n_ranks``, run by interleaved-zb."""
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan(layers, (k % n_ranks,), sizes, sizes)
                   for k, layers in enumerate(cut(graph.names, n_ranks * chunks)))
    return Plan("interleaved-zb-test", "", batch, Method.INTERLEAVED_ZB, stages)


CASES = {
    "2ranks-2chunks-3micro": (GRAPH, looping_plan(GRAPH, BATCH, 2, 2, 3)),
    "2ranks-2chunks-4micro": (GRAPH, looping_plan(GRAPH, BATCH, 2, 2, 4)),
    "3ranks-2chunks-5micro": (GRAPH, looping_plan(GRAPH, BATCH, 3, 2, 5)),
    "gpt-2ranks-2chunks-4micro": (GPT, looping_plan(GPT, 8, 2, 2, 4)),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(graph, plan, SGD, return_state_dict=True) for graph, plan in CASES.values()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    graph, plan = CASES[name]
    assert all(any(a.kind is ActionKind.W for a in program) for _, program in build_schedule(plan))
    reference = reference_train(graph, plan.batch_size, SGD)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)


def test_timeline_shows_w_on_every_chunk(results: dict[str, TrainResult]) -> None:
    timeline = results["2ranks-2chunks-4micro"].timeline
    for rank in (0, 1):
        assert {e.action.stage for e in timeline.events if e.rank == rank and e.action.kind is ActionKind.W} \
            == {rank, rank + 2}


def test_clipping_equals_single_process() -> None:
    """Every W runs before a rank's first STEP, which clips all of its stages' gradients."""
    config = replace(SGD, clip_grad_norm=0.05)  # small enough to clip every step
    result = train_many([TrainJob(GRAPH, CASES["2ranks-2chunks-4micro"][1], config, return_state_dict=True)])[0]
    assert max_param_diff(result, reference_train(GRAPH, BATCH, config)) <= TOL
    assert max_param_diff(result, reference_train(GRAPH, BATCH, SGD)) > 1e-3  # the clipping mattered
