"""Method ``zbv`` (ZB-V, Qi et al. 2024 §6): the V placement, the greedy list-scheduled orders, the
memory bound, the same-rank hand-off (no message between stages ``R − 1`` and ``R``, in the
communication pass, the validator and the simulator), the simulated bubble against 1F1B and
interleaved-zb, and the plan's refusals."""

from __future__ import annotations

from random import Random

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import Placement, local_edges, placed_ranks, v_rank
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.partition import balanced_partition
from pipetrain.planners.partition.v_shape import v_balanced_partition, v_key
from pipetrain.runtime.interp.executor import check_runnable
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.forward_only import forward_only_schedule
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError, dry_run
from pipetrain.schedule.zbv import SCENARIOS, replay_makespan, robust_orders, zbv_bound, zbv_orders
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks
from tests.conftest import flat_profile

FREE = Link(0.0, 1e30)


def plan(n_ranks: int, n_micro: int, method: Method = Method.ZBV) -> Plan:
    """One layer per stage (``2R`` layers), micro-batches of 2 samples; ``method`` ``1f1b``/``zb1``:
    the same layers two per stage on ``R`` stages; looping methods: ``2R`` stages looping."""
    sizes = equal_sizes(2 * n_micro, n_micro)
    names = [f"l{k}" for k in range(2 * n_ranks)]
    if method in (Method.ONE_F_ONE_B, Method.ZB1):
        stages = tuple(StagePlan((names[2 * k], names[2 * k + 1]), (k,), sizes, sizes) for k in range(n_ranks))
    else:
        ranks = placed_ranks(Placement.V if method is Method.ZBV else Placement.LOOPING, 2 * n_ranks, n_ranks)
        assert ranks is not None
        stages = tuple(StagePlan((name,), r, sizes, sizes) for name, r in zip(names, ranks, strict=True))
    return Plan("synthetic", "", 2 * n_micro, method, stages)


def short(order: list[tuple[str, int, int]]) -> str:
    return " ".join(f"{stage}{kind}{j}" for kind, stage, j in order)


def test_v_placement() -> None:
    assert [v_rank(s, 3) for s in range(6)] == [0, 1, 2, 2, 1, 0]
    p = plan(3, 4)
    assert p.placement is Placement.V and p.virtual_stages == 2
    assert [p.stages_of_rank(r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    assert p.local_edges == frozenset({(2, 3)}) == local_edges(p.stage_edges, [s.ranks for s in p.stages])
    assert plan(2, 4, Method.INTERLEAVED).local_edges == frozenset()
    assert Plan.from_json(p.to_json()) == p


def test_two_ranks_four_micro_batches() -> None:
    """The module docstring's example: chunk 0 then chunk 1 warms up, B first, W fills the gaps."""
    assert [short(list(o)) for o in robust_orders(2, 4)] == [
        "0F0 0F1 3F0 3B0 3F1 3B1 3W0 0B0 3W1 0B1 0F2 0W0 0W1 0F3 3F2 3B2 3W2 3F3 3B3 0B2 3W3 0W2 0B3 0W3",
        "1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1 2W0 1W0 2W1 1F2 2F2 1W1 1F3 2F3 2B2 1B2 2W2 2B3 1B3 1W2 2W3 1W3",
    ]
    assert [short(o)[:15] for o in zbv_orders(2, 4)] == ["0F0 0F1 3F0 3B0", "1F0 2F0 1F1 2F1"]


def test_robust_choice_is_no_worse_than_unit_time_in_any_scenario_by_much() -> None:
    """The chosen orders' worst ratio to the best candidate is at most the unit-time order's, and
    the replay of the unit-time order at unit times is its list scheduler's own makespan."""
    for n_ranks, n_micro in ((2, 4), (3, 7), (4, 8), (4, 16)):
        chosen, unit = robust_orders(n_ranks, n_micro), zbv_orders(n_ranks, n_micro)
        ratios = [replay_makespan(chosen, n_ranks, s) / replay_makespan(unit, n_ranks, s) for s in SCENARIOS]
        assert max(ratios) <= 1.0 + 1e-9 or min(ratios) < 1.0
        assert replay_makespan(unit, n_ranks, SCENARIOS[0]) >= 6 * n_micro + n_ranks - 1


def _held_pairs(p: Plan) -> list[int]:
    """Per rank, the most (stage, micro-batch) pairs held from F to W (one byte per sample, 2 samples)."""
    cost = CostModel(flat_profile(2 * p.n_ranks, saved_bytes=1), Cluster.local(p.n_ranks, link=FREE))
    return [peak // 2 for peak in activation_peaks(p, cost)]


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_grid_validates_within_one_f_one_b_memory(n_ranks: int) -> None:
    """m in 1..9: the validator and its dry run pass; every stage runs F, B and W once per micro-batch,
    each W after its B; no rank holds more than ``2R`` pairs of half a rank's layers, i.e. 1F1B's
    peak (R micro-batches of a whole rank), nor more than 1F1B's peak in bytes."""
    for n_micro in range(1, 10):
        p = plan(n_ranks, n_micro)
        schedule = build_schedule(p)
        for rank, program in schedule:
            assert p.stages_of_rank(rank) == (rank, 2 * n_ranks - 1 - rank)
            for stage in p.stages_of_rank(rank):
                own = [a for a in program if a.stage == stage]
                for kind in (ActionKind.F, ActionKind.B, ActionKind.W):
                    assert [a.microbatch for a in own if a.kind is kind] == list(range(n_micro))
                assert own[-1].kind is ActionKind.STEP
        assert max(_held_pairs(p)) <= min(zbv_bound(n_ranks), 2 * n_micro)
        assert max(_held_pairs(p)) <= 2 * max(_held_pairs(plan(n_ranks, n_micro, Method.ONE_F_ONE_B)))


def test_orders_with_profiled_times_and_a_tight_bound() -> None:
    """Unequal stage times and a bound of 2 still give complete, deadlock-free orders."""
    times = [(1.0 + s, 2.0, 0.5) for s in range(6)]
    for bound in (2, 3, 6):
        orders = zbv_orders(3, 5, times, bound)
        assert all(len(order) == 30 for order in orders)
    with pytest.raises(ValueError, match="bound"):
        zbv_orders(3, 5, bound=1)
    with pytest.raises(ValueError, match="6 stages"):
        zbv_orders(3, 5, times[:4])


def test_same_rank_hand_off_has_no_message() -> None:
    """Stages R-1 and R exchange nothing by message; the validator counts the neighbour's F (B) as the
    delivery, and refuses a stage R forward placed before stage R-1 forwarded its samples."""
    p = plan(3, 4)
    schedule = build_schedule(p)
    last = schedule.ranks[2]
    assert all(a.peer != 2 for a in last)
    assert not [a for a in last if a.peer is not None and (a.stage, a.kind) in
                ((2, ActionKind.SEND_F), (3, ActionKind.RECV_F), (3, ActionKind.SEND_B), (2, ActionKind.RECV_B))]
    first_f2 = next(i for i, a in enumerate(last) if a.kind is ActionKind.F and a.stage == 2)
    first_f3 = next(i for i, a in enumerate(last) if a.kind is ActionKind.F and a.stage == 3)
    assert first_f2 < first_f3
    swapped = list(last)
    swapped.insert(first_f2, swapped.pop(first_f3))
    with pytest.raises(ScheduleError, match="forward before its input activations"):
        check_runnable(Schedule.from_lists([list(schedule.ranks[0]), list(schedule.ranks[1]), swapped]), p)
    b3 = next(i for i, a in enumerate(last) if a.kind is ActionKind.B and a.stage == 3)
    b2 = next(i for i, a in enumerate(last) if a.kind is ActionKind.B and a.stage == 2)
    early = list(last)
    early.insert(b3, early.pop(b2))
    with pytest.raises(ScheduleError, match="backward before its output gradients"):
        check_runnable(Schedule.from_lists([list(schedule.ranks[0]), list(schedule.ranks[1]), early]), p)


def test_forward_only_schedule_runs_through_the_v() -> None:
    p = plan(3, 4)
    schedule = forward_only_schedule(p, 5)
    dry_run(schedule)
    assert {a.stage for a in schedule.ranks[0] if a.kind is ActionKind.F} == {0, 5}
    assert sum(a.kind is ActionKind.F for a in schedule.ranks[2]) == 2 * 3  # 5 samples in micro-batches of 2


def _iteration(p: Plan, n_ranks: int) -> float:
    """F = 1, backward = 2 (B = W = 1) per layer, free links."""
    cost = CostModel(flat_profile(2 * n_ranks, 1.0, 2.0, saved_bytes=1, parameter_bytes=4),
                     Cluster.local(n_ranks, link=FREE))
    return simulate(build_schedule(p), p, cost).iteration_s


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_simulated_bubble_near_zero(n_ranks: int) -> None:
    """Unit costs per chunk: every rank has 6m units of work and rank R-1 cannot start before R-1, so
    no order ends before 6m + R - 1; ZB-V's ends by 6m + 2R - 2 (1F1B: 6(m + R - 1)), so for m >= 2R
    its bubble is under 8 % and half 1F1B's, and it shrinks as 1/m."""
    for n_micro in (2 * n_ranks, 3 * n_ranks, 4 * n_ranks):
        zbv = _iteration(plan(n_ranks, n_micro), n_ranks)
        one_f_one_b = _iteration(plan(n_ranks, n_micro, Method.ONE_F_ONE_B), n_ranks)
        assert one_f_one_b == pytest.approx(6 * (n_micro + n_ranks - 1))
        assert 6 * n_micro + n_ranks - 1 <= zbv <= 6 * n_micro + 2 * n_ranks - 2
        bubble, one_f_one_b_bubble = ((t - 6 * n_micro) / t for t in (zbv, one_f_one_b))
        assert bubble < 0.08 and bubble < one_f_one_b_bubble / 2
        assert zbv <= _iteration(plan(n_ranks, n_micro, Method.INTERLEAVED_ZB), n_ranks) + n_ranks  # at less memory


def test_simulator_peak_equals_replay_and_one_f_one_b() -> None:
    cost = CostModel(flat_profile(8, 1.0, 2.0, saved_bytes=1, parameter_bytes=4), Cluster.local(4, link=FREE))
    p = plan(4, 8)
    timeline = simulate(build_schedule(p), p, cost)
    assert timeline.peak_activation_bytes == activation_peaks(p, cost)
    one_f_one_b = plan(4, 8, Method.ONE_F_ONE_B)
    assert max(timeline.peak_activation_bytes) == max(activation_peaks(one_f_one_b, cost))


def test_plan_refusals() -> None:
    p = plan(2, 4)
    looping = tuple(StagePlan(s.layers, (k % 2,), s.forward_sizes, s.backward_sizes) for k, s in enumerate(p.stages))
    with pytest.raises(UserError, match=r"places stage s on rank s \(s < R\)"):
        Plan(p.model, "", p.batch_size, Method.ZBV, looping).validate()
    six = plan(3, 4)
    six_on_two = tuple(StagePlan(s.layers, (r,), s.forward_sizes, s.backward_sizes)
                       for r, s in zip((0, 1, 1, 0, 0, 1), six.stages, strict=True))
    with pytest.raises(UserError, match="2R stages"):
        Plan(p.model, "", six.batch_size, Method.ZBV, six_on_two).validate()
    p.with_recompute([0]).validate()  # a split backward recomputes before B
    other = tuple(StagePlan(s.layers, s.ranks, (3, 5), (3, 5)) if k == 1 else s for k, s in enumerate(p.stages))
    with pytest.raises(UserError, match="one partition for every stage"):
        Plan(p.model, "", 8, Method.ZBV, other).validate()


def test_v_partition_balances_each_ranks_two_stages() -> None:
    """6 equal layers on 2 ranks: the per-stage min-max cut 2/1/1/2 puts 4 layers on rank 0; the V cut
    gives each rank 3. Random costs: never worse than the per-stage cut in either key."""
    counts = v_balanced_partition([1.0] * 6, 2)
    assert v_key([1.0] * 6, counts) == (3.0, 2.0) and sum(counts) == 6
    rng = Random(0)
    for _ in range(50):
        n_ranks = rng.randint(1, 4)
        costs = [rng.uniform(0.1, 2.0) for _ in range(rng.randint(2 * n_ranks, 16))]
        v = v_balanced_partition(costs, n_ranks)
        assert len(v) == 2 * n_ranks and min(v) >= 1 and sum(v) == len(costs)
        assert v_key(costs, v) <= v_key(costs, balanced_partition(costs, 2 * n_ranks))
