"""Asynchronous schedules (pipedream, 2bw): versions, STEPs, chunks and their validation (PAPERS.md §2.5–2.7)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.reference.asynchronous import microbatch_version, step_group
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError
from pipetrain.schedule.versions import batch_chunks, check_chunks, validate_versions

STASH, VSYNC, TWO_BW = WeightPolicy.STASH, WeightPolicy.VERTICAL_SYNC, WeightPolicy.TWO_BW


def plan(replicas: tuple[int, ...], micro: int, weights: WeightPolicy = STASH, batch: int = 8) -> Plan:
    method = Method.TWO_BW if weights is TWO_BW else Method.PIPEDREAM
    sizes, stages, first = equal_sizes(batch, micro), [], 0
    for k, r in enumerate(replicas):
        stages.append(StagePlan((f"l{k}",), tuple(range(first, first + r)), sizes, sizes))
        first += r
    return Plan("m", "", batch, method, tuple(stages), weights=weights)


PLANS = {
    "pipedream-2": plan((1, 1), 4),
    "pipedream-4": plan((1, 1, 1, 1), 4),
    "vsync-4": plan((1, 1, 1, 1), 4, VSYNC),
    "2bw-2": plan((1, 1), 4, TWO_BW),
    "2bw-4": plan((1, 1, 1, 1), 4, TWO_BW),
    "replicated-2-1-1": plan((2, 1, 1), 4),
    "replicated-1-3-1": plan((1, 3, 1), 6, batch=12),
    "replicated-1-2": plan((1, 2), 4),
    "data-parallel-2": plan((2,), 4),
    "2bw-replicated-2-1": plan((2, 1), 4, TWO_BW),
    "2bw-replicated-2-2": plan((2, 2), 4, TWO_BW),
    "2bw-replicated-1-1-2": plan((1, 1, 2), 4, TWO_BW),
    "2bw-replicated-3-3": plan((3, 3), 6, TWO_BW, batch=12),
}


def compute(schedule: Schedule) -> list[tuple[int, Action]]:
    return [(r, a) for r, program in schedule for a in program if a.kind in (ActionKind.F, ActionKind.B)]


@pytest.mark.parametrize("name", list(PLANS))
def test_versions_follow_the_methods_definition(name: str) -> None:
    """Every F and B carries v(k, j) of the emulator's closed form, the generator counts STEPs."""
    p = PLANS[name]
    schedule = build_schedule(p, 5)
    for _, a in compute(schedule):
        assert a.version == microbatch_version(p, a.stage, a.microbatch), a


@pytest.mark.parametrize("name", list(PLANS))
def test_steps_per_stage_and_chunks(name: str) -> None:
    """pipedream steps once per micro-batch (r micro-batches per replicated step), 2bw once per batch;
    the chunks of a run of 5 batches each hold exactly their batch's forwards."""
    p, batches = PLANS[name], 5
    m = len(p.stages[0].forward_sizes)
    schedule = build_schedule(p, batches)
    for rank, program in schedule:
        k = p.stage_of_rank(rank)
        steps = sum(a.kind is ActionKind.STEP for a in program)
        assert steps == batches * m // len(step_group(p, k, 0))
        for t, chunk in enumerate(batch_chunks(program, p.batch_size, batches)):
            assert {a.lo // p.batch_size for a in chunk if a.kind is ActionKind.F} == {t}


def test_pipedream_weight_stashing_in_text_form() -> None:
    """2 stages, 2 micro-batches: stage 0 stashes version 0 for B1 while it already stepped once."""
    schedule = build_schedule(plan((1, 1), 2, batch=4), 2)
    compute0 = [str(a) for a in schedule.ranks[0] if a.peer is None]
    assert compute0 == ["0F0[0:2]v0", "0F1[2:4]v0", "0B0[0:2]v0", "0STEP", "0F2[4:6]v1", "0B1[2:4]v0", "0STEP",
                        "0F3[6:8]v2", "0B2[4:6]v1", "0STEP", "0B3[6:8]v2", "0STEP"]


def test_two_bw_holds_two_versions_and_delay_one() -> None:
    """2bw: micro-batch k (1-indexed) uses max(⌊(k−1)/m⌋ − 1, 0); never more than two versions."""
    p = PLANS["2bw-4"]
    schedule = build_schedule(p, 6)
    versions = {a.microbatch: a.version for _, a in compute(schedule)}
    assert [versions[j] for j in range(0, 24, 4)] == [0, 0, 1, 2, 3, 4]
    validate_versions(schedule, p)  # the limit of two holds


def test_two_bw_replicas_step_once_per_batch_on_the_same_versions() -> None:
    """2 × 2 (PipeDream-2BW's parallel pipelines): each replica runs its round-robin share of a batch
    on version max(t − 1, 0) and steps after its own last backward of the batch, once per batch."""
    schedule = build_schedule(PLANS["2bw-replicated-2-2"], 2)
    compute_of = {r: " ".join(str(a) for a in program if a.peer is None) for r, program in schedule}
    assert compute_of[0] == ("0F0[0:2]v0 0F2[4:6]v0 0B0[0:2]v0 0F4[8:10]v0 0B2[4:6]v0 0STEP 0F6[12:14]v0 "
                             "0B4[8:10]v0 0B6[12:14]v0 0STEP")
    assert compute_of[1] == compute_of[0].replace("F0[0:2]", "F1[2:4]").replace("B0[0:2]", "B1[2:4]") \
        .replace("F2[4:6]", "F3[6:8]").replace("B2[4:6]", "B3[6:8]").replace("F4[8:10]", "F5[10:12]") \
        .replace("B4[8:10]", "B5[10:12]").replace("F6[12:14]", "F7[14:16]").replace("B6[12:14]", "B7[14:16]")
    assert compute_of[3].startswith("1F1[2:4]v0 1B1[2:4]v0 1F3[6:8]v0 1B3[6:8]v0 1STEP 1F5[10:12]v0")


def test_replicas_that_step_unequally_are_rejected() -> None:
    """Stepping a 2bw stage only on the replica that owns each batch's last micro-batch (one STEP per
    batch on the stage) leaves the other replica's all-reduce without a partner: the chunk check says so."""
    p = PLANS["2bw-replicated-2-1"]
    schedule = build_schedule(p, 2)
    check_chunks(schedule, p, 2)
    programs = [list(program) for _, program in schedule]
    programs[0] = [a for a in programs[0] if a.kind is not ActionKind.STEP]  # rank 0 owns micro-batches 0, 2
    with pytest.raises(ScheduleError, match=r"batch 1: the replicas \[0, 1\] run different numbers of STEPs"):
        check_chunks(Schedule.from_lists(programs), p, 2)


def _smallest_valid(replicas: tuple[int, ...]) -> Plan:
    """The 2bw plan of ``replicas`` with the fewest micro-batches its validation accepts."""
    for m in range(1, 64):
        try:
            p = plan(replicas, m, TWO_BW, batch=2 * m)
            p.validate()
            return p
        except UserError:
            continue
    raise AssertionError(replicas)


@pytest.mark.parametrize("replicas", [r for n in (1, 2, 3) for r in itertools.product((1, 2, 3), repeat=n)])
def test_two_bw_replicated_schedules_validate(replicas: tuple[int, ...]) -> None:
    """Every chain of replicated 2bw stages, at the fewest micro-batches the plan accepts (a multiple of
    every replica count, each replica at least its in-flight count): the schedule's versions validate
    (at most two held, each existing when used), its chunks check (replicas step equally per batch),
    each replica steps once per batch, and every F and B runs on max(t − 1, 0)."""
    p = _smallest_valid(replicas)
    m = len(p.stages[0].forward_sizes)
    batches = 4
    schedule = build_schedule(p, batches)  # validate_versions and check_chunks run here
    for rank, program in schedule:
        assert sum(a.kind is ActionKind.STEP for a in program) == batches, rank
        for a in program:
            if a.kind in (ActionKind.F, ActionKind.B):
                assert a.version == max(a.microbatch // m - 1, 0), a


def test_a_backward_on_another_version_is_rejected() -> None:
    p = PLANS["pipedream-2"]
    schedule = build_schedule(p, 2)
    programs = [list(program) for _, program in schedule]
    i = next(i for i, a in enumerate(programs[0]) if a.kind is ActionKind.B and a.microbatch == 1)
    programs[0][i] = replace(programs[0][i], version=1)
    with pytest.raises(ScheduleError, match="its F used 0; a backward must use its forward's weights"):
        validate_versions(Schedule.from_lists(programs), p)


def test_too_many_versions_are_rejected() -> None:
    """Vertical sync's old versions on a stash plan exceed stage 1's allowance of two."""
    stash, vsync = PLANS["pipedream-4"], PLANS["vsync-4"]
    with pytest.raises(ScheduleError, match="weight versions, more than the"):
        validate_versions(build_schedule(vsync, 3), stash)


def test_a_version_from_the_future_is_rejected() -> None:
    p = PLANS["pipedream-2"]
    programs = [list(program) for _, program in build_schedule(p, 2)]
    i = next(i for i, a in enumerate(programs[1]) if a.kind is ActionKind.F)
    programs[1][i] = replace(programs[1][i], version=3)
    with pytest.raises(ScheduleError, match="only 0 STEPs ran before it"):
        validate_versions(Schedule.from_lists(programs), p)


def test_chunks_that_need_a_later_batch_are_rejected() -> None:
    """A schedule longer than the run is rejected; moving stage 1's backwards of batch 0 to the run's
    end leaves stage 0's chunk 0 waiting, at the barrier, for a gradient sent in chunk 1."""
    p = PLANS["pipedream-2"]
    schedule = build_schedule(p, 2)
    check_chunks(schedule, p, 2)
    with pytest.raises(ScheduleError, match="past the run's 1 batches"):
        check_chunks(schedule, p, 1)
    programs = [list(program) for _, program in schedule]
    late = [a for a in programs[1] if 0 <= a.microbatch < 4 and a.kind in (ActionKind.B, ActionKind.SEND_B)]
    programs[1] = [a for a in programs[1] if a not in late] + late
    with pytest.raises(ScheduleError, match="batch 0: rank 0 waits at 0RECV_B0"):
        check_chunks(Schedule.from_lists(programs), p, 2)


def test_plan_checks_for_async_methods() -> None:
    with pytest.raises(UserError, match="cannot run weight policy 'sync'"):
        plan((1, 1), 4, STASH).__class__.validate(replace(PLANS["pipedream-2"], weights=WeightPolicy.SYNC))
    with pytest.raises(UserError, match="2bw needs at least as many micro-batches as stages"):
        plan((1, 1, 1, 1), 2, TWO_BW).validate()
    with pytest.raises(UserError, match="vertical sync cannot run replicated stages"):
        plan((2, 1), 4, VSYNC).validate()
    plan((1, 2), 4).validate()  # a replicated last stage: its replicas sum the loss added since their last STEP
    plan((2,), 4).validate()  # one stage on every rank: PipeDream's data parallelism
    with pytest.raises(UserError, match="stage 0 on 2 ranks keeps 3 each, so the batch needs at least 6"):
        plan((2, 2, 2), 4, TWO_BW).validate()
    with pytest.raises(UserError, match="do not divide the 10 micro-batches"):
        plan((4, 1), 10, TWO_BW, batch=20).validate()
    with pytest.raises(UserError, match="do not divide the 3 micro-batches"):
        plan((2, 1), 3, batch=6).validate()
    with pytest.raises(UserError, match="versioned weights need method pipedream or 2bw"):
        replace(PLANS["pipedream-2"], method=Method.ONE_F_ONE_B).validate()
