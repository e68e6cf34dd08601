"""Method zb2 (ZB-H2, Qi et al. 2024 §2.2): zb1's split backward with twice the in-flight micro-batches."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.profile.table import Profile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from tests.conftest import flat_profile
from tests.unit.test_zero_bubble import FREE, compact, equal, in_flight, plan_of


def split_profile(n_layers: int, f: float, b: float, w: float) -> Profile:
    """Every layer: forward ``f``, B ``b``, W ``w`` seconds whatever the micro-batch size."""
    profile = flat_profile(n_layers, f, b + w, parameter_bytes=4)
    return replace(profile, layers=tuple(replace(lp, input_grad_s=(b, b), weight_grad_s=(w, w))
                                         for lp in profile.layers))


def iteration_s(method: Method, n_stages: int, n_micro: int, cost: CostModel) -> float:
    plan = equal(method, n_stages, n_micro, batch=2 * n_micro)
    return simulate(build_schedule(plan), plan, cost).iteration_s


def test_two_stage_order() -> None:
    """Stage 0 warms up with 2K - 1 = 3 forwards; W is deferred without a count bound."""
    assert compact(equal(Method.ZB2, 2, 4, 8)) == [
        "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3 STEP",
        "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3 STEP",
    ]


@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("n_micro", [1, 2, 5, 8, 16])
def test_holds_at_most_2k_minus_1_micro_batches(n_stages: int, n_micro: int) -> None:
    """Every stage holds at most 2K − 1 micro-batches from F to W; stage 0 exactly min(m, 2K − 1)."""
    peaks = [in_flight(list(p)) for _, p in build_schedule(equal(Method.ZB2, n_stages, n_micro))]
    assert max(peaks) <= 2 * n_stages - 1
    assert peaks[0] == min(n_micro, 2 * n_stages - 1)


@pytest.mark.parametrize("n_stages", [2, 3, 4, 6])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 0.25), (0.5, 1.0, 1.0),
                                           (1.0, 0.5, 1.5), (0.5, 2.0, 1.0)])
def test_never_slower_than_zb1_and_at_the_synchronous_bound_when_b_le_w(
        n_stages: int, f: float, b: float, w: float) -> None:
    """No order with a synchronous step beats T* = m (F + B + W) + (K − 1) F; zb2 reaches it when B ≤ W."""
    cost = CostModel(split_profile(n_stages, f, b, w), Cluster.local(n_stages, link=FREE))
    for m in (1, n_stages, 2 * n_stages, 3 * n_stages + 1):
        zb1, zb2 = (iteration_s(method, n_stages, m, cost) for method in (Method.ZB1, Method.ZB2))
        bound = m * (f + b + w) + (n_stages - 1) * f
        assert bound - 1e-9 <= zb2 <= zb1 + 1e-9
        if b <= w and m >= 2 * n_stages:
            assert zb2 == pytest.approx(bound)


def test_gains_where_b_costs_more_than_w() -> None:
    """F = 1, B = 1.5, W = 0.5 on 4 stages: zb2 removes half of zb1's excess over T* (3 s of 1.5 s)."""
    cost = CostModel(split_profile(4, 1.0, 1.5, 0.5), Cluster.local(4, link=FREE))
    bound = 8 * 3.0 + 3 * 1.0
    assert iteration_s(Method.ZB1, 4, 8, cost) == pytest.approx(bound + 3.0)
    assert iteration_s(Method.ZB2, 4, 8, cost) == pytest.approx(bound + 1.5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(1, 15), max_size=6), min_size=1, max_size=5))
def test_random_unequal_partitions_validate(cuts: list[set[int]]) -> None:
    """Per-stage unequal partitions of 16 samples build and validate (build_schedule validates): one W
    per micro-batch of each stage's own partition. (A stage may then hold more than 2K − 1: unequal
    1F1B adds the forwards a successor's larger micro-batch needs, as under zb1.)"""
    partitions = [tuple(b - a for a, b in zip([0, *sorted(c)], [*sorted(c), 16], strict=True)) for c in cuts]
    schedule = build_schedule(plan_of(Method.ZB2, partitions))
    for (_, program), partition in zip(schedule, partitions, strict=True):
        assert sum(a.kind is ActionKind.W for a in program) == len(partition)


def test_replicated_stages_are_refused() -> None:
    replicated = Plan("m", "", 8, Method.ZB2, (StagePlan(("a",), (0, 1), (2,) * 4, (2,) * 4),))
    with pytest.raises(UserError, match="replicated"):
        build_schedule(replicated)
