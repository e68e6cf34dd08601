"""Every generator over a parameter grid passes the validator (DESIGN.md §5.1, STYLE.md L13).

The grid runs over every method of :data:`~pipetrain.plan.methods.METHODS` (a new method without a
generator fails ``test_grid_validates[<method>-...]``), its plans shaped by the method's traits
(:func:`method_plan`): placement, stage graph, parameters and weight policy.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Backward, LocalParams, Method, MethodParams, StageGraph
from pipetrain.plan.placement import placed_ranks
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import DEFAULT_ASYNC_BATCHES, build_schedule, compute_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError, validate, validate_for_plan

EXAMPLE_PARAMS: dict[type[MethodParams], MethodParams] = {LocalParams: LocalParams("linear")}
"""A value of every parameter type without defaults (a method's ``params`` the grid cannot default)."""


def chain_plan(method: Method, n_stages: int, batch: int, sizes: tuple[int, ...]) -> Plan:
    stages = tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(n_stages))
    return Plan("m", "", batch, method, stages)


def method_plan(method: Method, n_ranks: int, sizes: tuple[int, ...], replicas: int = 1) -> Plan:
    """A plan of ``method`` on ``n_ranks`` ranks (``replicas`` more for stage 0), every stage cutting
    the batch into ``sizes``, shaped by the method's traits: one stage per rank, or two per rank in
    its placement; the chain, or for a DAG method the chain with a skip edge ``k -> k + 2`` from
    every stage; its default weight policy and parameters."""
    spec = METHODS[method]
    n_stages = 2 * n_ranks if spec.multi_stage else n_ranks
    ranks = placed_ranks(spec.placement, n_stages, n_ranks) or tuple(
        tuple(range(replicas)) if k == 0 else (k + replicas - 1,) for k in range(n_stages))
    stages = tuple(StagePlan((f"l{k}",), r, sizes, sizes) for k, r in enumerate(ranks))
    edges = (*((k, k + 1) for k in range(n_stages - 1)), *((k, k + 2) for k in range(n_stages - 2)))
    params = spec.default_params() or EXAMPLE_PARAMS[spec.params]
    return Plan("m", "", sum(sizes), method, stages, edges=tuple(sorted(edges)) if spec.graph is StageGraph.DAG
                else (), weights=spec.weights[0], params=params)


def stage_of(plan: Plan) -> list[int]:
    return [plan.stage_of_rank(r) for r in range(plan.n_ranks)]


def check_counts(plan: Plan, schedule: Schedule) -> None:
    """Every rank forwards and back-propagates each micro-batch of each of its stages once per batch
    (an asynchronous plan's :data:`DEFAULT_ASYNC_BATCHES`), has a W per B under a split backward, and
    ends with a STEP."""
    spec, n_micro = plan.spec, len(plan.stages[0].forward_sizes)
    batches = 1 if spec.flush else DEFAULT_ASYNC_BATCHES
    for rank, program in schedule:
        kinds = [a.kind for a in program]
        replicas = [plan.stages[k].ranks for k in plan.stages_of_rank(rank)]  # round-robin: j % r is the replica
        own = batches * sum(len(range(ranks.index(rank), n_micro, len(ranks))) for ranks in replicas)
        assert kinds.count(ActionKind.F) == own
        assert kinds.count(ActionKind.B) == own
        assert kinds.count(ActionKind.W) == (own if spec.backward is Backward.SPLIT else 0)
        assert kinds[-1] is ActionKind.STEP


@pytest.mark.parametrize("method", list(METHODS), ids=lambda m: m.value)
@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(("batch", "n_micro"), [(1, 1), (8, 1), (8, 3), (8, 8), (10, 4), (7, 2), (16, 16)])
def test_grid_validates(method: Method, n_stages: int, batch: int, n_micro: int) -> None:
    """``n_stages``: the ranks (two stages on each under a multi-stage placement)."""
    plan = method_plan(method, n_stages, equal_sizes(batch, n_micro))
    if plan.spec.microbatches_per_stage and n_micro < plan.n_stages:
        with pytest.raises(UserError, match="at least as many micro-batches as stages"):
            build_schedule(plan)
        return
    schedule = build_schedule(plan)
    validate_for_plan(schedule, plan)  # validate() with the plan's batch, ranks, stages, edges, queue bound
    check_counts(plan, schedule)


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items() if spec.replicas], ids=lambda m: m.value)
@pytest.mark.parametrize(("n_stages", "replicas"), [(2, 2), (3, 2), (3, 3), (4, 2)])
@pytest.mark.parametrize(("batch", "n_micro"), [(8, 4), (12, 6), (7, 6)])
def test_replicated_grid_validates(method: Method, n_stages: int, replicas: int, batch: int, n_micro: int) -> None:
    """Stage 0 replicated: each replica runs its round-robin share of the stage's order (2bw: each replica
    at least as many micro-batches as it keeps in flight, PipeDream's warm-up over all the ranks)."""
    plan = method_plan(method, n_stages, equal_sizes(batch, n_micro), replicas)
    if not plan.spec.flush and n_micro % replicas:
        with pytest.raises(UserError, match="do not divide"):
            build_schedule(plan)
        return
    in_flight = (n_stages + replicas - 2) // replicas + 1  # on each replica of stage 0
    if plan.spec.microbatches_per_stage and n_micro < max(replicas * in_flight, n_stages):
        with pytest.raises(UserError, match="at least as many micro-batches per batch as it keeps in flight"):
            build_schedule(plan)
        return
    schedule = build_schedule(plan)
    validate_for_plan(schedule, plan)
    check_counts(plan, schedule)


@pytest.mark.parametrize("method", list(METHODS), ids=lambda m: m.value)
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(1, 5), min_size=1, max_size=12))
def test_random_size_vectors_validate(method: Method, n_stages: int, sizes: list[int]) -> None:
    """Unequal (but shared) size vectors, including sizes of 1, validate (``n_stages``: the ranks)."""
    plan = method_plan(method, n_stages, tuple(sizes))
    assume(not plan.spec.microbatches_per_stage or len(sizes) >= plan.n_stages)
    validate_for_plan(build_schedule(plan), plan)


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
