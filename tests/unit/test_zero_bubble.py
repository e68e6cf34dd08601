"""Method zb1 (ZB-H1, Qi et al. 2024 §2.1): orders, validation, memory, costs and the simulator."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method, ZeroBubbleParams
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.profile.table import DEFAULT_WEIGHT_GRAD_SHARE, Profile
from pipetrain.runtime.interp.executor import check_runnable
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule, compute_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks, stage_memory
from tests.conftest import flat_profile

FREE = Link(0.0, 1e30)


def plan_of(method: Method, partitions: list[tuple[int, ...]]) -> Plan:
    stages = tuple(StagePlan((f"l{k}",), (k,), p, p) for k, p in enumerate(partitions))
    return Plan("synthetic", "", sum(partitions[0]), method, stages)


def equal(method: Method, n_stages: int, n_micro: int, batch: int = 16) -> Plan:
    return plan_of(method, [equal_sizes(batch, n_micro)] * n_stages)


def compact(plan: Plan) -> list[str]:
    """Each rank's compute order as ``F0 F1 B0 W0 ...``."""
    return [" ".join(f"{a.kind.value}{a.microbatch}" if a.kind is not ActionKind.STEP else "STEP" for a in program)
            for _, program in compute_schedule(plan)]


def in_flight(program: list[Action]) -> int:
    """The most micro-batches a rank holds from F to W (to B when it has no W)."""
    release = ActionKind.W if any(a.kind is ActionKind.W for a in program) else ActionKind.B
    held = peak = 0
    for a in program:
        held += (a.kind is ActionKind.F) - (a.kind is release)
        peak = max(peak, held)
    return peak


def test_two_stage_order() -> None:
    assert compact(equal(Method.ZB1, 2, 4, 8)) == [
        "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 STEP",
        "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3 STEP",
    ]


def test_four_stage_order() -> None:
    """Stage k defers at most k W actions; B keeps its 1F1B place."""
    orders = compact(equal(Method.ZB1, 4, 8))
    assert orders[0] == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7 STEP"
    assert orders[3] == ("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7 STEP")
    for zb, one in zip(orders, compact(equal(Method.ONE_F_ONE_B, 4, 8)), strict=True):
        assert [t for t in zb.split() if not t.startswith("W")] == one.split()


@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n_micro", [1, 2, 3, 4, 8, 16])
def test_in_flight_within_1f1b_peak(n_stages: int, n_micro: int) -> None:
    """Every stage holds at most 1F1B's peak (stage 0's, min(m, K)); stage 0 exactly as under 1F1B."""
    zb = build_schedule(equal(Method.ZB1, n_stages, n_micro))
    one = build_schedule(equal(Method.ONE_F_ONE_B, n_stages, n_micro))
    peaks = [in_flight(list(p)) for _, p in zb]
    assert max(peaks) <= max(in_flight(list(p)) for _, p in one) == min(n_micro, n_stages)
    assert peaks[0] == in_flight(list(one.ranks[0]))
    for _, program in zb:
        kinds = [a.kind for a in program]
        assert kinds.count(ActionKind.W) == kinds.count(ActionKind.B) == n_micro


def test_unequal_orders() -> None:
    plan = plan_of(Method.ZB1, [(2,) * 7, (7, 7), (1, 1, 3, 3, 6), (5, 9)])
    schedule = build_schedule(plan)  # validated, deadlock-free
    for _, program in schedule:
        b_at = {(a.lo, a.hi): i for i, a in enumerate(program) if a.kind is ActionKind.B}
        w_at = {(a.lo, a.hi): i for i, a in enumerate(program) if a.kind is ActionKind.W}
        assert b_at.keys() == w_at.keys() and all(b_at[r] < w_at[r] for r in b_at)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.integers(1, 11), max_size=8), min_size=1, max_size=5))
def test_random_unequal_partitions_validate(cuts: list[set[int]]) -> None:
    """Per-stage partitions of 12 samples (each stage cut at its own points) validate and keep W after B."""
    partitions = []
    for points in cuts:
        ends = [*sorted(points), 12]
        partitions.append(tuple(b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)))
    for _, program in build_schedule(plan_of(Method.ZB1, partitions)):
        assert sum(a.kind is ActionKind.W for a in program) == sum(a.kind is ActionKind.B for a in program)


def test_validator_rejects_misplaced_w() -> None:
    def check(rows: list[str]) -> None:
        from pipetrain.schedule.validate import validate
        validate(Schedule.from_lists([[Action.parse(t) for t in rows]]), 2, [0], 1)

    check(["0F0[0:2]", "0B0[0:2]", "0W0[0:2]", "0STEP"])
    with pytest.raises(ScheduleError, match="W before a B"):
        check(["0F0[0:2]", "0W0[0:2]", "0B0[0:2]", "0STEP"])
    with pytest.raises(ScheduleError, match="second W"):
        check(["0F0[0:2]", "0B0[0:2]", "0W0[0:2]", "0W0[0:2]", "0STEP"])
    with pytest.raises(ScheduleError, match="have no W"):
        check(["0F0[0:1]", "0F1[1:2]", "0B0[0:1]", "0B1[1:2]", "0W0[0:1]", "0STEP"])
    with pytest.raises(ScheduleError, match="STEP must come last"):
        check(["0F0[0:2]", "0B0[0:2]", "0STEP", "0W0[0:2]"])


def test_plan_refusals() -> None:
    plan = equal(Method.ZB1, 2, 4)
    plan.with_recompute([1]).validate()  # a split backward recomputes before B
    with pytest.raises(UserError, match="same micro-batch sizes"):
        replace(plan, stages=(replace(plan.stages[0], backward_sizes=(8, 8)), plan.stages[1])).validate()
    replicated = Plan("m", "", 8, Method.ZB1, (StagePlan(("a",), (0, 1), (2,) * 4, (2,) * 4),))
    with pytest.raises(UserError, match="replicated"):
        build_schedule(replicated)
    check_runnable(build_schedule(plan), replace(plan, method=Method.ONE_F_ONE_B).with_recompute())


def test_simulator_costs_b_and_w() -> None:
    """F = 1, backward 2 split evenly: the split removes part of each stage's bubble."""
    cost = CostModel(flat_profile(4, 1.0, 2.0, parameter_bytes=4), Cluster.local(4, link=FREE))
    one, zb = (equal(m, 4, 8) for m in (Method.ONE_F_ONE_B, Method.ZB1))
    t_one = simulate(build_schedule(one), one, cost).iteration_s
    t_zb = simulate(build_schedule(zb), zb, cost).iteration_s
    assert t_one == pytest.approx((8 + 3) * 3.0)
    assert t_zb < t_one - 2.0


def test_zb1_gains_grow_with_the_weight_share() -> None:
    """The larger W's share of the backward, the more (or as much) ZB-H1 saves over 1F1B; with
    ``T_B = T_W`` it reaches the paper's bubble ``(K-1)(T_F+T_B-T_W) = 3``: 8·3 + 3 = 27 against 33."""
    gains = []
    for share in (0.1, 0.5, 0.9):
        profile = flat_profile(4, 1.0, 2.0, parameter_bytes=4)
        layers = tuple(replace(lp, weight_grad_s=tuple(share * b for b in lp.backward_s)) for lp in profile.layers)
        cost = CostModel(replace(profile, layers=layers), Cluster.local(4, link=FREE))
        one, zb = (equal(m, 4, 8) for m in (Method.ONE_F_ONE_B, Method.ZB1))
        gains.append(simulate(build_schedule(one), one, cost).iteration_s
                     / simulate(build_schedule(zb), zb, cost).iteration_s)
    assert 1.0 <= gains[0] <= gains[1] + 1e-9 <= gains[2] + 2e-9
    assert gains[1] == pytest.approx(33 / 27)


def test_memory_released_at_w() -> None:
    cost = CostModel(flat_profile(4, 1.0, 2.0, saved_bytes=10, parameter_bytes=4), Cluster.local(4, link=FREE))
    one, zb = (equal(m, 4, 8) for m in (Method.ONE_F_ONE_B, Method.ZB1))
    peaks_one, peaks_zb = activation_peaks(one, cost), activation_peaks(zb, cost)
    assert peaks_zb[0] == peaks_one[0] == 4 * 2 * 10
    assert max(peaks_zb) == max(peaks_one)
    assert simulate(build_schedule(zb), zb, cost).peak_activation_bytes == peaks_zb


def test_held_gradients_count_from_b_to_w() -> None:
    """B keeps the output gradients W needs (``G(b)``, 3 bytes per sample here) until W. Stage 0 runs
    ``F0 F1 B0 W0 …``: its peak of two micro-batches' activations gains one ``G(b)``; stage 1 defers
    each W past the next B, ``F1 B1 W0``: two ``G(b)``. Fused 1F1B holds none."""
    flat = flat_profile(2, 1.0, 2.0, saved_bytes=10, parameter_bytes=4)
    held = replace(flat, layers=tuple(replace(lp, held_grad_bytes_per_sample=3) for lp in flat.layers))
    cost, cost_held = (CostModel(p, Cluster.local(2, link=FREE)) for p in (flat, held))
    zb, one = equal(Method.ZB1, 2, 4, 8), equal(Method.ONE_F_ONE_B, 2, 4, 8)
    g = 3 * 2  # G(b), b = 2 samples
    assert activation_peaks(zb, cost) == (2 * 20, 2 * 20)
    assert activation_peaks(zb, cost_held) == (2 * 20 + g, 2 * 20 + 2 * g)
    assert activation_peaks(one, cost_held) == activation_peaks(one, cost)
    assert simulate(build_schedule(zb), zb, cost_held).peak_activation_bytes == activation_peaks(zb, cost_held)
    assert [m.activation_bytes for m in stage_memory(zb, cost_held)] == [2 * 20 + g, 2 * 20 + 2 * g]


def test_profile_default_split_and_json() -> None:
    profile = flat_profile(2, 1.0, 2.0, parameter_bytes=4)
    data = json.loads(profile.to_json())
    for layer in data["layers"]:
        del layer["weight_grad_s"]  # a profile written before the split existed
    old = Profile.from_json(json.dumps(data))
    assert old.layers[0].weight_grad_at(1) == pytest.approx(DEFAULT_WEIGHT_GRAD_SHARE * 2.0)
    assert old.layers[0].input_grad_at(1) + old.layers[0].weight_grad_at(1) == pytest.approx(2.0)
    no_params = flat_profile(1, 1.0, 2.0).layers[0]
    assert no_params.weight_grad_at(1) == 0.0
    split = replace(profile, layers=tuple(replace(lp, weight_grad_s=(0.5, 3.0)) for lp in profile.layers))
    again = Profile.from_json(split.to_json())
    assert again == split and again.layers[0].weight_grad_at(2) == 2.0  # clamped to the backward
    data["layers"][0]["weight_grad_s"] = [1.0]
    with pytest.raises(UserError, match="weight_grad_s"):
        Profile.from_json(json.dumps(data))


def test_measured_split_prices_b_and_w_as_timed() -> None:
    """A measured split (B and W both timed) is taken as it is: B + W may exceed the backward."""
    profile = flat_profile(2, 1.0, 2.0, parameter_bytes=4)
    split = replace(profile, layers=tuple(replace(lp, input_grad_s=(1.5, 3.0), weight_grad_s=(1.0, 2.5))
                                          for lp in profile.layers))
    layer = Profile.from_json(split.to_json()).layers[0]
    assert (layer.input_grad_at(2), layer.weight_grad_at(2)) == (3.0, 2.5)  # 5.5 > the backward's 4.0
    data = json.loads(split.to_json())
    data["layers"][1]["input_grad_s"] = [-1.0, 1.0]
    with pytest.raises(UserError, match="input_grad_s"):
        Profile.from_json(json.dumps(data))


@pytest.mark.parametrize("n_stages", [2, 4, 5])
@pytest.mark.parametrize("n_micro", [1, 3, 8])
def test_strict_memory_variant_holds_1f1b_counts(n_stages: int, n_micro: int) -> None:
    """The memory-strict variant holds no more than 1F1B on every stage, and validates."""
    from pipetrain.schedule.passes import add_communication
    from pipetrain.schedule.validate import validate

    plan = replace(equal(Method.ZB1, n_stages, n_micro), params=ZeroBubbleParams(strict_memory=True))
    compute = compute_schedule(plan)
    schedule = add_communication(compute, plan)
    validate(schedule, plan.batch_size, plan.rank_stages, plan.n_stages)
    one = build_schedule(equal(Method.ONE_F_ONE_B, n_stages, n_micro))
    for (_, strict), (_, fused) in zip(schedule, one, strict=True):
        assert in_flight(list(strict)) == in_flight(list(fused))
