"""Level (c) for GraphPipe's method ``graph`` (issue 15): stages that form a DAG train exactly as one
process does, on 2, 3 and 4 ranks, and chain plans run a DAG model by linearising it.

The model is :func:`~tests.gloo.models.branchy_graph`, a diamond (``stem`` → ``a1 → a2`` and ``b1``
→ ``merge`` → ``head``). All jobs run in one launch; each is compared with :func:`reference_train`
after 3 steps: every rank's parameters within 1e-5, and the losses.
"""

from __future__ import annotations

import pytest

from pipetrain.graph.capture import capture
from pipetrain.graph.layer_graph import LossKind, TensorSpec
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

from .models import CLASSES, FEATURES, Towers, branchy_graph, graph_plan, max_param_diff

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 12
TOL = 1e-5
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
GRAPH = branchy_graph()
EQUAL = (3, 3, 3, 3)


def _plans() -> dict[str, Plan]:
    chain = [("stem", "a1"), ("b1", "a2"), ("merge", "head")]  # the cut after a1 carries stem's and a1's outputs
    return {
        # 2 ranks: branch a on rank 0, branch b with the merge on rank 1.
        "graph-2": graph_plan(GRAPH, [("stem", "a1", "a2"), ("b1", "merge", "head")], [(0,), (1,)], [EQUAL] * 2),
        # 3 ranks: stem's stage forks to two stages; the merge stage reads both.
        "graph-3": graph_plan(GRAPH, [("stem",), ("a1", "a2"), ("b1", "merge", "head")], [(0,), (1,), (2,)],
                              [EQUAL] * 3),
        # 4 ranks: the diamond, the two branch stages independent of each other.
        "graph-4": graph_plan(GRAPH, [("stem",), ("a1", "a2"), ("b1",), ("merge", "head")],
                              [(0,), (1,), (2,), (3,)], [EQUAL] * 4),
        # per-stage micro-batch sizes: messages re-chunk at every edge
        "graph-4-unequal": graph_plan(GRAPH, [("stem",), ("a1", "a2"), ("b1",), ("merge", "head")],
                                      [(0,), (1,), (2,), (3,)], [(5, 7), (2, 4, 6), (12,), (1, 3, 3, 5)]),
        # a replicated branch stage (data parallel inside it)
        "graph-replicated": graph_plan(GRAPH, [("stem",), ("a1", "a2"), ("b1", "merge", "head")],
                                       [(0,), (1, 2), (3,)], [EQUAL] * 3),
        # GraphPipe's folded merge: a branch's tail (a2) shares the merge's stage; 3 replicas of a stage
        "graph-fold-tail": graph_plan(GRAPH, [("stem", "a1"), ("b1",), ("a2", "merge", "head")], [(0,), (1,), (2,)],
                                      [EQUAL] * 3),
        "graph-replicated-3": graph_plan(GRAPH, [("stem",), ("a1", "a2"), ("b1", "merge", "head")],
                                         [(0,), (1, 2, 3), (4,)], [EQUAL] * 3),
        # chain methods on the DAG model, linearised
        "1f1b-linearised": Plan(GRAPH.name, "", BATCH, Method.ONE_F_ONE_B,
                                tuple(StagePlan(s, (k,), EQUAL, EQUAL) for k, s in enumerate(chain))),
        "gpipe-linearised": Plan(GRAPH.name, "", BATCH, Method.GPIPE,
                                 tuple(StagePlan(s, (k,), (4, 8), (4, 8)) for k, s in enumerate(
                                     [("stem", "a1", "b1"), ("a2", "merge", "head")]))),
    }


PLANS = _plans()
TOWERS = capture(Towers(), input=TensorSpec((FEATURES,)), target=TensorSpec((), "int64", high=CLASSES),
                 loss=LossKind.CROSS_ENTROPY, name="towers")
TOWERS_PLAN = graph_plan(TOWERS, [("a.0", "a.2"), ("b.0",), ("merge", "head")], [(0,), (1,), (2,)],  # Tanhs join
                         [EQUAL] * 3)
DIGITS = build_model("branchy-digits")
DIGITS_PLAN = graph_plan(DIGITS, [("mlp0", "mlp1", "mlp2"), ("img0", "img1", "img2"), ("concat", "head")],
                         [(0,), (1,), (2,)], [(16, 16, 16, 16)] * 3)
DIGITS_CONFIG = TrainConfig(epochs=2, optimizer="adam", lr=3e-3, data="digits", eval_every=22, progress=False,
                            timeout_s=30)


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, plan, SGD, return_state_dict=True) for plan in PLANS.values()]
    jobs.append(TrainJob(TOWERS, TOWERS_PLAN, SGD, return_state_dict=True))
    jobs.append(TrainJob(DIGITS, DIGITS_PLAN, DIGITS_CONFIG))
    return dict(zip([*PLANS, "towers", "digits"], train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(PLANS))
def test_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    reference = reference_train(GRAPH, BATCH, SGD)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)


def test_a_captured_two_tower_module_runs_as_a_dag(results: dict[str, TrainResult]) -> None:
    """torch.fx capture of a user's module with two towers gives two source layers, and a plan
    with one tower per stage trains it exactly."""
    assert [n for i, n in enumerate(TOWERS.names) if not TOWERS.predecessors(i)] == ["a.0", "b.0"]
    assert TOWERS_PLAN.edges == ((0, 2), (1, 2))
    assert max_param_diff(results["towers"], reference_train(TOWERS, BATCH, SGD)) <= TOL


def test_branchy_digits_learns_and_evaluates_on_a_dag_of_stages(results: dict[str, TrainResult]) -> None:
    """A real task: the two-branch digits classifier on three ranks (each branch its own stage)
    learns, and the evaluation runs the DAG forward-only."""
    result = results["digits"]
    final = result.final_eval
    assert final is not None and final.eval_accuracy is not None
    assert final.eval_accuracy >= 0.9
    assert result.losses[-1] < 0.5 * result.losses[0]


def test_branch_stages_exchange_nothing() -> None:
    """In the diamond the two branch stages (ranks 1 and 2) send each other nothing, and both start
    with stem's first micro-batch: they run at the same time."""
    schedule = build_schedule(PLANS["graph-4"])
    for rank in (1, 2):
        program = schedule.ranks[rank]
        assert {a.peer for a in program if a.peer is not None} == {0, 3}
        assert program[0].kind is ActionKind.RECV_F and program[0].microbatch == 0


def test_graph_warms_up_less_than_the_chain() -> None:
    """Stage 0 of the diamond keeps 3 micro-batches in flight (stages on its longest path to the
    sink), not the 4 of a chain of four stages."""
    programs = build_schedule(PLANS["graph-4"]).ranks[0]
    kinds = [a.kind for a in programs if a.kind in (ActionKind.F, ActionKind.B)]
    assert kinds.index(ActionKind.B) == 3
