"""Replicated stages: a stage on r ranks takes micro-batches round-robin and all-reduces at STEP.

Plans, schedules (generator, communication pass, validator) and the simulator's costs.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from tests.conftest import flat_profile

FREE = Link(0.0, 1e30)


def replicated_plan(method: Method, replicas: list[int], batch: int, n_micro: int, layers: int = 1) -> Plan:
    """Stage k has ``replicas[k]`` ranks, numbered consecutively, and ``layers`` layers."""
    sizes = equal_sizes(batch, n_micro)
    stages, rank = [], 0
    for k, r in enumerate(replicas):
        names = tuple(f"l{k * layers + i}" for i in range(layers))
        stages.append(StagePlan(names, tuple(range(rank, rank + r)), sizes, sizes))
        rank += r
    return Plan("synthetic", "", batch, method, tuple(stages))


@settings(max_examples=80, deadline=None)
@given(
    method=st.sampled_from([Method.GPIPE, Method.ONE_F_ONE_B]),
    replicas=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    extra=st.integers(0, 6),
)
def test_replicated_schedules_validate(method: Method, replicas: list[int], extra: int) -> None:
    """Every replicated chain builds a schedule the validator accepts (coverage per stage, FIFO links,
    no deadlock), and each replica runs exactly the micro-batches it owns."""
    n_micro = max(replicas) + extra
    plan = replicated_plan(method, replicas, 2 * n_micro, n_micro)
    schedule = build_schedule(plan)
    for k, stage in enumerate(plan.stages):
        for i, rank in enumerate(stage.ranks):
            forwards = [a.microbatch for a in schedule.ranks[rank] if a.kind is ActionKind.F]
            assert forwards == [j for j in range(n_micro) if j % len(stage.ranks) == i]
            assert schedule.ranks[rank][-1].kind is ActionKind.STEP
            for a in schedule.ranks[rank]:
                if a.kind in (ActionKind.SEND_F, ActionKind.RECV_B):
                    assert a.peer == plan.replica_rank(k + 1, a.microbatch)
                if a.kind in (ActionKind.RECV_F, ActionKind.SEND_B):
                    assert a.peer == plan.replica_rank(k - 1, a.microbatch)


def test_replicated_1f1b_in_flight_per_replica() -> None:
    """Stage 0 on 2 ranks ahead of 2 single stages: each replica keeps PipeDream's in-flight count."""
    profile = flat_profile(3, 1.0, 2.0, saved_bytes=10)
    plan = replicated_plan(Method.ONE_F_ONE_B, [2, 1, 1], 8, 8)
    peaks = simulate(build_schedule(plan), plan, CostModel(profile, Cluster.local(4, link=FREE))).peak_activation_bytes
    # PipeDream's warm-up per replica: (4 ranks - 1 - 0 upstream) // 2 replicas + 1 = 2 in flight on each
    assert peaks == (20, 20, 20, 10)


def test_data_parallel_closed_form() -> None:
    """One stage on 2 ranks, 2 micro-batches: each replica runs F + B, then the ring all-reduce and the step."""
    profile = flat_profile(1, 1.0, 2.0, parameter_bytes=1000)
    link = Link(0.01, 1e4)
    cost = CostModel(profile, Cluster.local(2, link=link))
    plan = replicated_plan(Method.GPIPE, [2], 4, 2)
    timeline = simulate(build_schedule(plan), plan, cost)
    allreduce = 2 * 1 * 0.01 + 2 * 1 / 2 * 1000 / 1e4
    assert cost.allreduce_s(1000, (0, 1)) == pytest.approx(allreduce)
    assert timeline.iteration_s == pytest.approx(1.0 + 2.0 + allreduce + cost.step_s(("l0",), 0))


def test_replicas_step_together() -> None:
    """The replica that finishes first waits for the other before the all-reduce; its STEP event spans
    the wait, as the runtime's all-reduce blocks inside the STEP it measures."""
    profile = flat_profile(1, 1.0, 2.0, parameter_bytes=100)
    cost = CostModel(profile, Cluster.local(2, link=FREE))
    plan = replicated_plan(Method.GPIPE, [2], 3, 3)  # rank 0: micro-batches 0, 2; rank 1: micro-batch 1
    timeline = simulate(build_schedule(plan), plan, cost)
    steps = {e.rank: e for e in timeline.events if e.action.kind is ActionKind.STEP}
    step_s = cost.allreduce_s(cost.parameter_bytes(("l0",)), (0, 1)) + cost.step_s(("l0",), 0)
    assert (steps[0].start_s, steps[0].end_s) == pytest.approx((6.0, 6.0 + step_s))
    assert (steps[1].start_s, steps[1].end_s) == pytest.approx((3.0, 6.0 + step_s))  # reached at 3, waited


def test_replicating_the_bottleneck_raises_throughput() -> None:
    """Stage 0 costs 3x stage 1: three replicas of it balance the pipeline (PipeDream's "3-1")."""
    profile = flat_profile(2, [3.0, 1.0], [6.0, 2.0])
    cost = CostModel(profile, Cluster.local(4, link=FREE))
    straight = replicated_plan(Method.ONE_F_ONE_B, [1, 1], 24, 24)
    hybrid = replicated_plan(Method.ONE_F_ONE_B, [3, 1], 24, 24)
    t_straight = simulate(build_schedule(straight), straight, cost).iteration_s
    t_hybrid = simulate(build_schedule(hybrid), hybrid, cost).iteration_s
    assert t_straight == pytest.approx(24 * 9.0)  # stage 0 never idles: m (f0 + b0)
    assert t_hybrid < 0.45 * t_straight


def test_allreduce_uses_the_slowest_link_of_the_ring() -> None:
    fast, slow = Link(1e-6, 1e11), Link(1e-5, 1e9)
    devices = tuple(Device("v100", 1 << 34, 1.0, node) for node in (0, 0, 1, 1))
    cost = CostModel(flat_profile(1, 1.0, 1.0), Cluster(devices, fast, slow))
    assert cost.allreduce_s(1e9, (0, 1)) == pytest.approx(2e-6 + 1e9 / 1e11)
    assert cost.allreduce_s(1e9, (0, 1, 2, 3)) == pytest.approx(6e-5 + 1.5 * 1e9 / 1e9)
    assert cost.allreduce_s(1e9, (2,)) == 0.0


def test_a_probed_collective_prices_the_all_reduce_of_ranks_on_one_node() -> None:
    """The probe's all-reduce (``Cluster.collective``) replaces the link's on one node, not across nodes."""
    link, collective = Link(1e-6, 1e11), Link(2e-4, 1e9)
    devices = tuple(Device("cpu", 1 << 34, 1.0, node) for node in (0, 0, 0, 1))
    cost = CostModel(flat_profile(1, 1.0, 1.0), Cluster(devices, link, link, collective=collective))
    assert cost.allreduce_s(1e6, (0, 1)) == pytest.approx(2 * 2e-4 + 1e6 / 1e9)
    assert cost.allreduce_s(1e6, (0, 1, 2)) == pytest.approx(4 * 2e-4 + 4 / 3 * 1e6 / 1e9)
    assert cost.allreduce_s(1e6, (2, 3)) == pytest.approx(2e-6 + 1e6 / 1e11)  # two nodes: the links'


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (replicated_plan(Method.GPIPE, [3, 1], 4, 2), "use at least 3 micro-batches"),
        (replicated_plan(Method.UEDP, [2, 1], 4, 2), "cannot run replicated stages"),
    ],
)
def test_bad_replicated_plans_are_refused(plan: Plan, message: str) -> None:
    with pytest.raises(UserError, match=message):
        plan.validate()


def test_replicated_plans_need_one_partition() -> None:
    plan = replicated_plan(Method.ONE_F_ONE_B, [2, 1], 6, 3)
    uneven = replace(plan.stages[1], forward_sizes=(2, 2, 1, 1), backward_sizes=(2, 2, 1, 1))
    with pytest.raises(UserError, match="same micro-batch sizes"):
        replace(plan, stages=(plan.stages[0], uneven)).validate()


def test_replica_rank_is_round_robin() -> None:
    plan = replicated_plan(Method.GPIPE, [1, 3], 12, 6)
    assert [plan.replica_rank(1, j) for j in range(6)] == [1, 2, 3, 1, 2, 3]
    assert {plan.replica_rank(0, j) for j in range(6)} == {0}
    assert plan.replicated and not replicated_plan(Method.GPIPE, [1, 1], 4, 2).replicated
    assert list(itertools.chain.from_iterable(s.ranks for s in plan.stages)) == [0, 1, 2, 3]
