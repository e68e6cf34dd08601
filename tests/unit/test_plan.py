"""Plan JSON round trip, validation messages, equal sizes, partition vs brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, Prediction, StagePlan, equal_sizes, ranges
from pipetrain.planners.partition import balanced_partition


def two_stage_plan(sizes: tuple[int, ...] = (3, 3, 2), batch: int = 8) -> Plan:
    return Plan(
        "mlp", "abc123", batch, Method.GPIPE,
        (StagePlan(("a", "b"), (0,), sizes, sizes), StagePlan(("c",), (1,), sizes, sizes)),
        prediction=Prediction(0.5, 0.25, (10, 20), "test"),
    )


@given(st.integers(1, 500), st.data())
def test_equal_sizes(batch: int, data: st.DataObject) -> None:
    m = data.draw(st.integers(1, batch))
    sizes = equal_sizes(batch, m)
    assert sum(sizes) == batch and len(sizes) == m
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)


def test_equal_sizes_rejects_too_many() -> None:
    with pytest.raises(UserError, match="between 1 and 4"):
        equal_sizes(4, 5)


def test_ranges() -> None:
    assert ranges((3, 3, 2)) == ((0, 3), (3, 6), (6, 8))


def test_json_round_trip() -> None:
    plan = two_stage_plan()
    assert Plan.from_json(plan.to_json()) == plan


def test_precision_round_trips_and_fp32_is_left_out() -> None:
    plan = two_stage_plan()
    assert plan.precision == "fp32" and '"precision"' not in plan.to_json()
    bf16 = replace(plan, precision="bf16")
    assert Plan.from_json(bf16.to_json()) == bf16
    with pytest.raises(UserError, match="precision 'fp8' is unknown; use one of fp32, bf16, fp16"):
        Plan.from_json(plan.to_json().replace('"method"', '"precision": "fp8", "method"'))


def test_hand_written_plan_accepted() -> None:
    text = """{"model": "mlp", "batch_size": 4, "method": "1f1b",
               "stages": [{"layers": ["a"], "ranks": [0], "forward_sizes": [2, 2]},
                          {"layers": ["b"], "ranks": [1], "forward_sizes": [2, 2]}]}"""
    plan = Plan.from_json(text)
    plan.validate(["a", "b"], fingerprint="anything")
    assert plan.stages[1].backward_sizes == (2, 2)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be an object"),
        ('{"model": "m", "method": "gpipe", "stages": []}', "lacks the field 'batch_size'"),
        ('{"model": "m", "batch_size": 4, "method": "nope", "stages": []}', "malformed field"),
    ],
)
def test_malformed_json(text: str, match: str) -> None:
    with pytest.raises(UserError, match=match):
        Plan.from_json(text)


def test_validate_messages() -> None:
    plan = two_stage_plan()
    plan.validate(["a", "b", "c"], "abc123")
    with pytest.raises(UserError, match="made for another model"):
        plan.validate(fingerprint="other")
    with pytest.raises(UserError, match=r"missing 'd'"):
        plan.validate(["a", "b", "c", "d"])
    bad = two_stage_plan(sizes=(4, 3))
    with pytest.raises(UserError, match=r"stage 0: forward micro-batch sizes \[4, 3\] sum to 7 but the batch has 8"):
        bad.validate()


def brute_force(costs: list[float], k: int) -> float:
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=9), st.data())
def test_partition_matches_brute_force(costs: list[float], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(costs)))
    sizes = balanced_partition(costs, k)
    assert len(sizes) == k and sum(sizes) == len(costs) and min(sizes) >= 1
    starts = list(itertools.accumulate((0, *sizes)))
    got = max(sum(costs[a:b]) for a, b in itertools.pairwise(starts))
    assert got == pytest.approx(brute_force(costs, k))


def test_partition_too_many_stages() -> None:
    with pytest.raises(UserError, match="cannot cut 3 layers into 4 stages"):
        balanced_partition([1.0, 2.0, 3.0], 4)
