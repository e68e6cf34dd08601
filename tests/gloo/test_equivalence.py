"""Level (c): pipelined training equals single-process training (DESIGN.md §5.2, STYLE.md L12, L14).

All configurations run in one launch (``train_many``: the ranks start once) and each test checks
one job against :func:`reference_train` after 3 steps: every rank's parameters within 1e-5.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.generators import build_schedule

from .models import chain_plan, max_param_diff, mlp_graph, random_uedp_plan, replicated_plan, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 14
STEPS = 3
TOL = 1e-5
SGD = TrainConfig(steps=STEPS, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)


@dataclass(frozen=True)
class Case:
    name: str
    graph: LayerGraph
    plan: Plan
    config: TrainConfig


def _cases() -> list[Case]:
    graph = mlp_graph()
    cases = [
        Case(f"{method.value}-{k}stages-{m}micro", graph, chain_plan(graph, k, BATCH, m, method), SGD)
        for method in (Method.GPIPE, Method.ONE_F_ONE_B)
        for k in (2, 4)
        for m in (1, 3, 8)
    ]
    cases.append(Case("adam", graph, chain_plan(graph, 2, BATCH, 3, Method.ONE_F_ONE_B),
                      TrainConfig(steps=STEPS, optimizer="adam", lr=1e-3, progress=False, timeout_s=30)))
    cases.append(Case("sgd-momentum", graph, chain_plan(graph, 4, BATCH, 4),
                      TrainConfig(steps=STEPS, momentum=0.9, progress=False, timeout_s=30)))
    digits = mlp_graph(n_blocks=2, width=32, features=64, classes=10)
    cases.append(Case("digits", digits, chain_plan(digits, 3, 16, 4),
                      TrainConfig(steps=STEPS, data="digits", lr=0.1, progress=False, timeout_s=30)))
    # Re-chunking: each stage splits the batch its own way; messages are cut and joined by range.
    cases.append(Case("rechunk", graph, uneven_plan(graph, [(5, 5, 4), (3, 6, 5), (1, 13), (14,)]), SGD))
    # UEDP: random forward and backward partitions (sizes of 1 included); stages whose two differ recompute.
    cases += [Case(f"uedp-random-{k}stages-seed{seed}", graph, random_uedp_plan(graph, k, BATCH, seed), SGD)
              for k in (2, 4) for seed in (0, 1, 2)]
    cases.append(Case("recompute-every-stage", graph,
                      chain_plan(graph, 4, BATCH, 3, Method.ONE_F_ONE_B).with_recompute(), SGD))
    # Unequal micro-batches under the 1F1B order (per-stage partitions, forward = backward).
    cases.append(Case("1f1b-unequal-2stages", graph,
                      uneven_plan(graph, [(1, 4, 4, 5), (6, 1, 7)], method=Method.ONE_F_ONE_B), SGD))
    cases.append(Case("1f1b-unequal-4stages", graph, uneven_plan(
        graph, [(2,) * 7, (7, 7), (1, 1, 3, 3, 6), (5, 9)], method=Method.ONE_F_ONE_B), SGD))
    # Replicated stages: micro-batches round-robin over a stage's ranks, gradients summed at STEP.
    cases += [Case(f"replicated-{'-'.join(map(str, r))}-{method.value}-{m}micro", graph,
                   replicated_plan(graph, r, BATCH, m, method), SGD)
              for r, method, m in [((2, 1), Method.GPIPE, 4), ((1, 3), Method.ONE_F_ONE_B, 7),
                                   ((2, 2), Method.ONE_F_ONE_B, 5), ((4,), Method.GPIPE, 4),
                                   ((3, 1), Method.ONE_F_ONE_B, 14)]]
    cases.append(Case("replicated-adam-recompute", graph,
                      replicated_plan(graph, (1, 2, 1), BATCH, 6).with_recompute(),
                      TrainConfig(steps=STEPS, optimizer="adam", lr=1e-3, progress=False, timeout_s=30)))
    return cases


CASES = {case.name: case for case in _cases()}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    cases = list(CASES.values())
    jobs = [TrainJob(c.graph, c.plan, c.config, return_state_dict=True) for c in cases]
    return {c.name: r for c, r in zip(cases, train_many(jobs), strict=True)}


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    case = CASES[name]
    reference = reference_train(case.graph, case.plan.batch_size, case.config)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)
    assert len(results[name].losses) == STEPS


def test_parameters_change(results: dict[str, TrainResult]) -> None:
    """Guards the comparison itself: training moved the weights away from their start."""
    case = CASES["gpipe-2stages-3micro"]
    start = reference_train(case.graph, BATCH, TrainConfig(steps=1, warmup_steps=0, lr=1e-30, progress=False))
    assert max_param_diff(results[case.name], start) > 1e-3


@pytest.mark.parametrize("name", ["gpipe-4stages-3micro", "1f1b-4stages-8micro", "rechunk"])
def test_timeline_matches_programs(results: dict[str, TrainResult], name: str) -> None:
    """The measured timeline has one event per action of every rank's program, in order."""
    case = CASES[name]
    timeline = results[name].timeline
    schedule = build_schedule(case.plan)
    assert timeline.kind == "measured" and timeline.n_ranks == case.plan.n_ranks
    assert len(timeline.iterations_s) == STEPS - case.config.warmup_steps
    assert len(timeline.peak_activation_bytes) == case.plan.n_ranks
    assert all(b > 0 for b in timeline.peak_activation_bytes)
    for rank, program in schedule:
        events = [e for e in timeline.events if e.rank == rank]
        assert [e.action for e in events] == list(program)
        assert all(0 <= e.start_s <= e.end_s for e in events)
        assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(events))
        assert max(e.end_s for e in events) <= max(timeline.iterations_s) + 1e-9


def test_gpipe_keeps_more_activations_than_1f1b(results: dict[str, TrainResult]) -> None:
    """Stage 0 holds all 8 micro-batches under GPipe, at most 4 under 1F1B on 4 stages."""
    gpipe = results["gpipe-4stages-8micro"].timeline.peak_activation_bytes
    one_f_one_b = results["1f1b-4stages-8micro"].timeline.peak_activation_bytes
    assert one_f_one_b[0] < gpipe[0]
    assert one_f_one_b[-1] <= gpipe[-1]


def test_recompute_keeps_fewer_activations(results: dict[str, TrainResult]) -> None:
    """Stage 0 (3 micro-batches in flight) holds its inputs plus one micro-batch's saved tensors,
    not three micro-batches' saved tensors (PAPERS.md §1.12)."""
    kept = results["1f1b-4stages-3micro"].timeline.peak_activation_bytes
    recomputed = results["recompute-every-stage"].timeline.peak_activation_bytes
    assert recomputed[0] < kept[0]


def test_random_uedp_plans_recompute_somewhere() -> None:
    """Guards the random cases: each recomputes on some stages and keeps activations on others."""
    for name, case in CASES.items():
        if name.startswith("uedp-random"):
            flags = [case.plan.recomputes(k) for k in range(case.plan.n_stages)]
            assert any(flags) and not all(flags), name


def test_samples_per_s(results: dict[str, TrainResult]) -> None:
    result = results["gpipe-2stages-3micro"]
    assert result.samples_per_s > 0
    assert len(result.step_times_s) == STEPS

