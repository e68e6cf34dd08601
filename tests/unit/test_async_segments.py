"""An asynchronous run cut into segments that drain (pipetrain.schedule.segments, docs/algorithms.md §3.5):
one segment is today's schedule; a drained run still validates, its versions are the emulator's with
the same drains, and a segment interrupted anywhere drains by finishing what it began."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.reference.asynchronous import microbatch_version
from pipetrain.runtime import TrainConfig, TrainJob
from pipetrain.runtime.job.checks import check_job
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.segments import drain_points, drain_suffix, segment_start, segmented_schedule
from pipetrain.schedule.validate import ScheduleError, validate_run
from pipetrain.schedule.versions import batch_chunks
from tests.gloo.models import chain_plan, mlp_graph
from tests.unit.test_async_schedules import PLANS, STASH, TWO_BW, plan

STEPS = 7
DRAINS = [(3,), (2, 5), (1, 2, 3, 4, 5, 6)]


def test_drain_points() -> None:
    assert drain_points(8, 0) == ()
    assert drain_points(8, 4) == (4,)
    assert drain_points(8, 3) == (3, 6)
    assert drain_points(8, 4, start=6) == (4, 6)  # a run resumed after an interrupt at 6
    assert drain_points(8, 0, start=4) == (4,)
    assert drain_points(8, 8) == () and drain_points(8, 0, start=8) == ()
    assert segment_start((4, 6), 3) == 0 and segment_start((4, 6), 5) == 4 and segment_start((4, 6), 6) == 6


@pytest.mark.parametrize("name", list(PLANS))
def test_one_segment_is_todays_schedule(name: str) -> None:
    assert segmented_schedule(PLANS[name], STEPS) == build_schedule(PLANS[name], STEPS)


@pytest.mark.parametrize("drains", DRAINS)
@pytest.mark.parametrize("name", list(PLANS))
def test_segments_validate_and_follow_the_emulator(name: str, drains: tuple[int, ...]) -> None:
    """The run validates as one program (segmented_schedule checks versions and chunks itself), every
    F and B runs on the emulator's version with the same drains, and at each drain every rank has
    stepped for every batch before it."""
    p = PLANS[name]
    schedule = segmented_schedule(p, STEPS, drains)
    validate_run(schedule, p.repeated(STEPS))
    for _, program in schedule:
        for a in program:
            if a.kind in (ActionKind.F, ActionKind.B):
                assert a.version == microbatch_version(p, a.stage, a.microbatch, drains), a
    m = len(p.stages[0].forward_sizes)
    for rank, program in schedule:
        chunks = batch_chunks(program, p.batch_size, STEPS)
        stage = p.stage_of_rank(rank)
        per_step = m if p.weights is TWO_BW else len(p.stages[stage].ranks)
        for d in drains:
            steps = sum(a.kind is ActionKind.STEP for c in chunks[:d] for a in c)
            assert steps == d * m // per_step, (rank, d)
            assert all(a.lo >= d * p.batch_size for c in chunks[d:] for a in c if a.kind is not ActionKind.STEP)


def test_a_drain_restarts_the_delay() -> None:
    """Rank 0 of two stages, one micro-batch per batch (the module docstring's picture), and 2bw's first
    batch of a segment on the newest version."""
    def rank0(drains: tuple[int, ...]) -> str:
        schedule = segmented_schedule(plan((1, 1), 1, STASH), 4, drains)
        compute = [a for a in schedule.ranks[0] if a.kind in (ActionKind.F, ActionKind.B, ActionKind.STEP)]
        return " ".join(str(a).split("[")[0] + (f"v{a.version}" if a.version is not None else "") for a in compute)

    assert rank0(()) == "0F0v0 0F1v0 0B0v0 0STEP 0F2v1 0B1v0 0STEP 0F3v2 0B2v1 0STEP 0B3v2 0STEP"
    assert rank0((2,)) == "0F0v0 0F1v0 0B0v0 0STEP 0B1v0 0STEP 0F2v2 0F3v2 0B2v2 0STEP 0B3v2 0STEP"
    two_bw = plan((1, 1), 2, TWO_BW)
    forwards = {a.lo // 8: a.version for a in segmented_schedule(two_bw, 5, (3,)).ranks[1] if a.kind is ActionKind.F}
    assert forwards == {0: 0, 1: 0, 2: 1, 3: 3, 4: 3}  # max(t - 1, 3) from batch 3 on


@pytest.mark.parametrize("drains", DRAINS[:2])
@pytest.mark.parametrize("name", list(PLANS))
def test_an_interrupted_segment_drains(name: str, drains: tuple[int, ...]) -> None:
    """Stopping before any batch ``t``: what each rank ran of its segment begins the segment built up
    to ``t``, and the rest starts no micro-batch (no F) and ends in a STEP."""
    p = PLANS[name]
    schedule = segmented_schedule(p, STEPS, drains)
    chunked = {rank: batch_chunks(program, p.batch_size, STEPS) for rank, program in schedule}
    for t in range(1, STEPS):
        start = segment_start(drains, t - 1)
        for rank, chunks in chunked.items():
            before = sum(a.kind is ActionKind.STEP for c in chunks[:start] for a in c)
            ran = tuple(a for c in chunks[start:t] for a in c)
            rest = drain_suffix(p, ran, rank, start, t, before)
            assert not any(a.kind is ActionKind.F for a in rest), (rank, t)
            if t in drains:
                assert rest == ()
            elif rest:
                assert rest[-1].kind is ActionKind.STEP


def test_drain_suffix_names_a_program_that_did_not_run_the_segment() -> None:
    p = PLANS["pipedream-2"]
    ran = segmented_schedule(p, 3).ranks[0][:4]
    with pytest.raises(ScheduleError, match="cannot drain"):
        drain_suffix(p, ran, 0, 1, 3, 0)  # the segment starts at batch 1, not 0


def test_drains_outside_the_run_are_refused() -> None:
    with pytest.raises(ScheduleError, match="strictly between"):
        segmented_schedule(PLANS["2bw-2"], 4, (4,))


def test_check_job_drains_at_the_checkpoint_steps(tmp_path: Path) -> None:
    """A job that checkpoints every 2 of 5 steps runs the run drained at 2 and 4; a given schedule
    cannot drain, so it is refused with checkpointing."""
    graph = mlp_graph()
    p = replace(chain_plan(graph, 2, 8, 2), method=Method.TWO_BW, weights=TWO_BW)
    config = TrainConfig(steps=5, progress=False, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert check_job(TrainJob(graph, p, config)).schedule == segmented_schedule(p, 5, (2, 4))
    assert check_job(TrainJob(graph, p, replace(config, checkpoint_dir=None))).schedule == build_schedule(p, 5)
    with pytest.raises(UserError, match="leave out --schedule, or --checkpoint-dir"):
        check_job(TrainJob(graph, p, config, schedule=build_schedule(p, 5)))
