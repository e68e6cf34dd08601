"""Event simulator: closed forms, communication, memory, and the planner on top of it."""

from __future__ import annotations

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.counts import candidate_counts
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from tests.conftest import flat_profile

FREE = Link(0.0, 1e30)


def chain(method: Method, n_stages: int, batch: int, n_micro: int) -> Plan:
    sizes = equal_sizes(batch, n_micro)
    return Plan("synthetic", "", batch, method,
                tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(n_stages)))


@pytest.mark.parametrize("method", [Method.GPIPE, Method.ONE_F_ONE_B])
@pytest.mark.parametrize(("n_stages", "n_micro"), [(1, 1), (2, 1), (4, 4), (4, 2), (3, 7), (8, 16)])
def test_flush_closed_form(method: Method, n_stages: int, n_micro: int) -> None:
    """Uniform stages, free links: T = (m + K - 1)(f + b) for GPipe and 1F1B alike."""
    cost = CostModel(flat_profile(n_stages, 1.0, 2.0), Cluster.local(n_stages, link=FREE))
    plan = chain(method, n_stages, 16, n_micro)
    timeline = simulate(build_schedule(plan), plan, cost)
    assert timeline.iteration_s == pytest.approx((n_micro + n_stages - 1) * 3.0)
    expected_bubble = (n_stages - 1) / (n_micro + n_stages - 1)
    assert timeline.bubble_fraction() == pytest.approx(expected_bubble)


def test_communication_on_the_critical_path() -> None:
    """Two stages, one micro-batch: f0 + c + f1 + b1 + c + b0."""
    profile = flat_profile(2, 1.0, 2.0, output_bytes=1000)
    cost = CostModel(profile, Cluster.local(2, link=Link(0.1, 1e4)))  # 0.1 + 1000/1e4 = 0.2 s
    plan = chain(Method.GPIPE, 2, 1, 1)
    timeline = simulate(build_schedule(plan), plan, cost)
    assert timeline.iteration_s == pytest.approx(1 + 0.2 + 1 + 2 + 0.2 + 2)


def test_link_is_fifo_and_overlaps_compute() -> None:
    """Messages share one channel per link: a slow link becomes the bottleneck."""
    profile = flat_profile(2, 0.1, 0.1, output_bytes=1)
    cost = CostModel(profile, Cluster.local(2, link=Link(1.0, 1e30)))
    plan = chain(Method.GPIPE, 2, 4, 4)
    timeline = simulate(build_schedule(plan), plan, cost)
    # forward messages leave at 0.1, 0.2, ..., but the link serialises them: arrivals 1.1, 2.1, 3.1, 4.1
    recvs = [e for e in timeline.rank_events(1) if e.action.kind.value == "RECV_F"]
    assert [round(e.end_s, 6) for e in recvs] == [1.1, 2.1, 3.1, 4.1]


def test_peak_memory_gpipe_vs_1f1b() -> None:
    profile = flat_profile(4, 1.0, 2.0, saved_bytes=10)
    cost = CostModel(profile, Cluster.local(4, link=FREE))
    peaks = {}
    for method in (Method.GPIPE, Method.ONE_F_ONE_B):
        plan = chain(method, 4, 8, 8)
        peaks[method] = simulate(build_schedule(plan), plan, cost).peak_activation_bytes
    assert peaks[Method.GPIPE] == (80, 80, 80, 80)  # all 8 micro-batches of 1 sample × 10 B
    assert peaks[Method.ONE_F_ONE_B] == (40, 30, 20, 10)  # K - k in flight


def test_speed_scales_compute() -> None:
    profile = flat_profile(1, 1.0, 2.0)
    slow = Cluster.local(1, speed=0.5, link=FREE)
    plan = chain(Method.GPIPE, 1, 2, 1)
    assert simulate(build_schedule(plan), plan, CostModel(profile, slow)).iteration_s == pytest.approx(6.0)


def test_planner_picks_more_microbatches_when_cost_is_per_sample() -> None:
    """With cost proportional to samples and no overhead, more micro-batches shrink the bubble."""
    profile = flat_profile(4, 1.0, 2.0, per_sample=True)
    cost = CostModel(profile, Cluster.local(2, link=FREE))
    problem = PlanningProblem(ModelRef.synthetic(["l0", "l1", "l2", "l3"]), cost, batch_size=16,
                              constraints=Constraints(method=Method.GPIPE, n_stages=2))
    result = plan_balanced(problem)
    plan, candidates = result.plan, list(result.candidates)
    assert len(plan.stages[0].forward_sizes) == 16
    assert plan.stages[0].layers == ("l0", "l1")
    assert plan.prediction is not None
    assert plan.prediction.iteration_s == pytest.approx(candidates[0].iteration_s)


def test_planner_picks_one_microbatch_when_overhead_dominates() -> None:
    profile = flat_profile(2, 1.0, 2.0)  # constant cost per micro-batch, whatever its size
    cost = CostModel(profile, Cluster.local(2, link=FREE))
    problem = PlanningProblem(ModelRef.synthetic(["l0", "l1"]), cost, batch_size=8,
                              constraints=Constraints(method=Method.GPIPE, n_stages=2))
    plan = plan_balanced(problem).plan
    assert plan.stages[0].forward_sizes == (8,)


def test_candidate_counts() -> None:
    assert candidate_counts(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert candidate_counts(256, limit=4) == [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]


def test_processor_sharing_slows_overlapping_compute() -> None:
    """Two ranks at half speed while both compute. GPipe K=2, m=2, f=1, b=2 (hand-derived):
    r0 F0 [0,1]; r0 F1 ‖ r1 F0 at half speed [1,3]; r1 F1 [3,4]; r1 B0 [4,6];
    r0 B0 ‖ r1 B1 at half speed [6,10]; r0 B1 [10,12]."""
    shared = Cluster.local(2, link=FREE, shared_speed=(1.0, 0.5))
    plan = chain(Method.GPIPE, 2, 2, 2)
    timeline = simulate(build_schedule(plan), plan, CostModel(flat_profile(2, 1.0, 2.0), shared))
    assert timeline.iteration_s == pytest.approx(12.0)
    spans = {str(e.action): (e.start_s, e.end_s) for e in timeline.events}
    assert spans["1F0[0:1]"] == pytest.approx((1.0, 3.0))
    assert spans["0B0[0:1]"] == pytest.approx((6.0, 10.0))
    alone = CostModel(flat_profile(2, 1.0, 2.0), Cluster.local(2, link=FREE))
    assert simulate(build_schedule(plan), plan, alone).iteration_s == pytest.approx(9.0)


def test_concurrency_speed_extrapolates_throughput() -> None:
    cluster = Cluster.local(4, shared_speed=(1.0, 0.8))
    assert [cluster.concurrency_speed(n) for n in (1, 2, 4)] == pytest.approx([1.0, 0.8, 0.4])
    assert Cluster.local(2).concurrency_speed(2) == 1.0
