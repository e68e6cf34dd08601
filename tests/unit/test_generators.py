"""Every generator over a parameter grid passes the validator (DESIGN.md §5.1, STYLE.md L13)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule, compute_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError, validate

METHODS = [Method.GPIPE, Method.ONE_F_ONE_B]


def chain_plan(method: Method, n_stages: int, batch: int, sizes: tuple[int, ...]) -> Plan:
    stages = tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(n_stages))
    return Plan("m", "", batch, method, stages)


def stage_of(plan: Plan) -> list[int]:
    return [plan.stage_of_rank(r) for r in range(plan.n_ranks)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(("batch", "n_micro"), [(1, 1), (8, 1), (8, 3), (8, 8), (10, 4), (7, 2), (16, 16)])
def test_grid_validates(method: Method, n_stages: int, batch: int, n_micro: int) -> None:
    plan = chain_plan(method, n_stages, batch, equal_sizes(batch, n_micro))
    schedule = build_schedule(plan)
    validate(schedule, batch, stage_of(plan), n_stages)
    for _rank, program in schedule:
        kinds = [a.kind for a in program]
        assert kinds.count(ActionKind.F) == n_micro
        assert kinds.count(ActionKind.B) == n_micro
        assert kinds[-1] is ActionKind.STEP


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(METHODS),
    st.integers(1, 6),
    st.lists(st.integers(1, 5), min_size=1, max_size=12),
)
def test_random_size_vectors_validate(method: Method, n_stages: int, sizes: list[int]) -> None:
    """Unequal (but shared) size vectors, including sizes of 1, validate."""
    plan = chain_plan(method, n_stages, sum(sizes), tuple(sizes))
    validate(build_schedule(plan), sum(sizes), stage_of(plan), n_stages)


def test_gpipe_order_exact() -> None:
    plan = chain_plan(Method.GPIPE, 2, 4, (2, 2))
    assert build_schedule(plan).to_csv() == (
        "0F0[0:2],0SEND_F0[0:2]>1,0F1[2:4],0SEND_F1[2:4]>1,0RECV_B0[0:2]<1,0B0[0:2],"
        "0RECV_B1[2:4]<1,0B1[2:4],0STEP\n"
        "1RECV_F0[0:2]<0,1F0[0:2],1RECV_F1[2:4]<0,1F1[2:4],1B0[0:2],1SEND_B0[0:2]>0,"
        "1B1[2:4],1SEND_B1[2:4]>0,1STEP\n"
    )


def test_one_f_one_b_order_exact() -> None:
    plan = chain_plan(Method.ONE_F_ONE_B, 3, 4, (1, 1, 1, 1))
    compute = compute_schedule(plan)
    assert [str(a) for a in compute.ranks[0]] == [
        "0F0[0:1]", "0F1[1:2]", "0F2[2:3]", "0B0[0:1]", "0F3[3:4]", "0B1[1:2]", "0B2[2:3]", "0B3[3:4]", "0STEP",
    ]
    assert [a.kind.value for a in compute.ranks[2]] == ["F", "B"] * 4 + ["STEP"]


def test_in_flight_bounded_for_1f1b() -> None:
    plan = chain_plan(Method.ONE_F_ONE_B, 4, 16, equal_sizes(16, 16))
    for rank, program in compute_schedule(plan):
        in_flight = peak = 0
        for a in program:
            in_flight += {ActionKind.F: 1, ActionKind.B: -1}.get(a.kind, 0)
            peak = max(peak, in_flight)
        assert peak == 4 - rank


def _classic_1f1b(k: int, n_stages: int, m: int) -> list[str]:
    """The textbook order, written out: warm-up, one forward one backward, drain."""
    w = min(n_stages - k - 1, m)
    order = [f"F{i}" for i in range(w)]
    for j in range(m - w):
        order += [f"F{w + j}", f"B{j}"]
    return [*order, *(f"B{j}" for j in range(m - w, m))]


@pytest.mark.parametrize("n_stages", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(("batch", "n_micro"), [(1, 1), (8, 3), (10, 4), (11, 5), (16, 16), (7, 2)])
def test_equal_1f1b_is_the_textbook_order(n_stages: int, batch: int, n_micro: int) -> None:
    """The unequal-aware generator reproduces classic 1F1B exactly for equal sizes (sizes may differ by 1)."""
    plan = chain_plan(Method.ONE_F_ONE_B, n_stages, batch, equal_sizes(batch, n_micro))
    for k, program in compute_schedule(plan):
        got = [f"{a.kind.value}{a.microbatch}" for a in program if a.kind is not ActionKind.STEP]
        assert got == _classic_1f1b(k, n_stages, n_micro)


partitions = st.lists(st.integers(1, 5), min_size=1, max_size=10)


def _plan(method: Method, forward: list[list[int]], backward: list[list[int]]) -> Plan:
    stages = tuple(StagePlan((f"l{k}",), (k,), tuple(f), tuple(b))
                   for k, (f, b) in enumerate(zip(forward, backward, strict=True)))
    return Plan("m", "", sum(forward[0]), method, stages)


def _reshape(sizes: list[int], batch: int) -> list[int]:
    """``sizes`` cut or padded with ones to sum to ``batch``."""
    out, total = [], 0
    for x in sizes:
        x = min(x, batch - total)
        if x:
            out.append(x)
            total += x
    return out + [1] * (batch - total)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 24), st.lists(partitions, min_size=1, max_size=6), st.lists(partitions, min_size=6, max_size=6))
def test_unequal_partitions_validate(batch: int, forward: list[list[int]], backward: list[list[int]]) -> None:
    """Per-stage partitions (sizes of 1 included): 1F1B (F = B per stage) and uedp (F != B) never deadlock."""
    fwd = [_reshape(x, batch) for x in forward]
    bwd = [_reshape(x, batch) for x in backward[: len(fwd)]]
    for plan in (_plan(Method.ONE_F_ONE_B, fwd, fwd), _plan(Method.UEDP, fwd, bwd)):
        validate(build_schedule(plan), batch, stage_of(plan), plan.n_stages)


def test_unequal_1f1b_warms_up_for_what_the_next_stage_needs() -> None:
    """Stage 1 takes 6 samples at once; stage 0 (micro-batches of 2) must forward all 6 before its B0."""
    plan = _plan(Method.ONE_F_ONE_B, [[2, 2, 2, 2, 2, 2], [6, 6]], [[2, 2, 2, 2, 2, 2], [6, 6]])
    compute = compute_schedule(plan)
    assert [f"{a.kind.value}{a.microbatch}" for a in compute.ranks[0]][:7] == [
        "F0", "F1", "F2", "B0", "B1", "F3", "B2",  # then back to 2 in flight, as 1F1B on 2 stages
    ]
    assert [a.kind.value for a in compute.ranks[1]] == ["F", "B", "F", "B", "STEP"]


def test_1f1b_rejects_different_backward_sizes() -> None:
    plan = _plan(Method.ONE_F_ONE_B, [[2, 2], [4]], [[2, 2], [1, 3]])
    with pytest.raises(UserError, match="stage 1: method 1f1b needs the same micro-batch sizes"):
        build_schedule(plan)


def test_sizes_not_summing_raise_naming_stage() -> None:
    plan = chain_plan(Method.GPIPE, 2, 32, (16, 14))
    with pytest.raises(UserError, match=r"stage 0: forward micro-batch sizes \[16, 14\] sum to 30 .* 32"):
        build_schedule(plan)


def test_validator_marks_unmatched_receive() -> None:
    bad = Schedule.from_csv(
        "0F0[0:2],0RECV_B0[0:2]<1,0B0[0:2],0STEP\n1RECV_F0[0:2]<0,1F0[0:2],1B0[0:2],1SEND_B0[0:2]>0,1STEP\n"
    )
    with pytest.raises(ScheduleError, match="receive is never sent") as info:
        validate(bad, 2, [0, 1], 2)
    assert ">>1RECV_F0[0:2]<0<<" in str(info.value)


def test_validator_detects_deadlock() -> None:
    bad = Schedule.from_csv(
        "0RECV_B0[0:2]<1,0F0[0:2],0SEND_F0[0:2]>1,0B0[0:2],0STEP\n"
        "1RECV_F0[0:2]<0,1F0[0:2],1B0[0:2],1SEND_B0[0:2]>0,1STEP\n"
    )
    with pytest.raises(ScheduleError, match=r"backward before its output gradients|deadlock"):
        validate(bad, 2, [0, 1], 2)


def test_validator_detects_backward_before_forward() -> None:
    bad = Schedule.from_csv("0B0[0:2],0F0[0:2],0STEP\n")
    with pytest.raises(ScheduleError, match="not yet forwarded"):
        validate(bad, 2, [0], 1)


def test_validator_detects_missing_samples() -> None:
    bad = Schedule.from_csv("0F0[0:2],0B0[0:2],0STEP\n")
    with pytest.raises(ScheduleError, match=r"covers samples \[2, 3\] 0 times"):
        validate(bad, 4, [0], 1)


def test_validator_detects_order_mismatch_on_link() -> None:
    bad = Schedule.from_csv(
        "0F0[0:1],0SEND_F0[0:1]>1,0F1[1:2],0SEND_F1[1:2]>1,0RECV_B0[0:1]<1,0B0[0:1],0RECV_B1[1:2]<1,0B1[1:2],0STEP\n"
        "1RECV_F1[1:2]<0,1RECV_F0[0:1]<0,1F0[0:1],1F1[1:2],1B0[0:1],1SEND_B0[0:1]>0,1B1[1:2],1SEND_B1[1:2]>0,1STEP\n"
    )
    with pytest.raises(ScheduleError, match="sends 0"):
        validate(bad, 2, [0, 1], 2)
