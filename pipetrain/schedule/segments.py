"""An asynchronous run cut into segments that each drain the pipeline (docs/algorithms.md §3.5).

An asynchronous schedule (``pipedream``, ``2bw``; :mod:`pipetrain.schedule.asynchronous`) keeps
micro-batches in flight across steps, and their autograd graphs cannot be saved. So a run that
checkpoints is a sequence of *segments* of batches, each an ordinary asynchronous program built
for its own batches: it fills the pipeline, runs 1F1B without a flush, and drains at its end. At a
segment boundary nothing is in flight and every stage has stepped for every batch before it, so the
state is weights, optimizer state and buffers: what a synchronous checkpoint saves.

    drains = drain_points(steps=8, every=4)              # (4,): a checkpoint after batch 4
    schedule = segmented_schedule(plan, steps=8, drains=drains)

The run's schedule is the concatenation of the segments' programs, segment ``[a, b)`` being
``build_schedule(plan, b - a)`` with its sample ranges (and micro-batch indices) shifted to batches
``a … b − 1`` of the run and each rank's versions shifted by the STEPs that rank ran before ``a``.
Two stages, one micro-batch per batch, ``pipedream``, drains at 2 of 4 batches, rank 0 (ranges and
sends left out)::

    one segment:   F0v0 F1v0 B0v0 STEP F2v1 B1v0 STEP F3v2 B2v1 STEP B3v2 STEP
    drains at 2:   F0v0 F1v0 B0v0 STEP B1v0 STEP | F2v2 F3v2 B2v2 STEP B3v2 STEP

What a drain changes: each segment starts its method's delay afresh. ``pipedream``'s warm-up is
run again (micro-batch 2 above runs on version 2, not 1: the stage has stepped for batch 1 before
it starts), and ``2bw``'s batch ``a`` of a segment starting at ``a`` runs on version ``a`` (the
newest), not ``a − 1``: batch ``t`` uses ``max(t − 1, a)``. The emulator
(:func:`~pipetrain.reference.asynchronous.emulate_async`, ``drains=``) follows the same rule from the
methods' definitions.

Interrupting a segment after batch ``t`` (Ctrl-C at a step's barrier) drains it there: the segment
built for batches ``[a, t)`` begins with what the ranks ran of ``[a, b)`` (:func:`drain_suffix`
checks it), and the rest of it is the drain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError
from pipetrain.schedule.versions import check_chunks, validate_versions

__all__ = ["drain_points", "drain_suffix", "segment_schedule", "segment_start", "segmented_schedule"]


def drain_points(steps: int, every: int, start: int = 0) -> tuple[int, ...]:
    """The batches before which a run of ``steps`` batches drains its pipeline: every multiple of
    ``every`` (0: none) and ``start`` (a resumed run's first batch), strictly between 0 and ``steps``."""
    points = set(range(every, steps, every)) if every > 0 else set()
    if 0 < start < steps:
        points.add(start)
    return tuple(sorted(points))


def segment_start(drains: Sequence[int], step: int) -> int:
    """The first batch of the segment that batch ``step`` belongs to."""
    return max((d for d in drains if d <= step), default=0)


def segment_schedule(plan: Plan, start: int, stop: int, steps_before: Mapping[int, int]) -> Schedule:
    """Batches ``[start, stop)`` of the run as one asynchronous program that fills and drains: its
    ranges and micro-batches those of the run, rank ``r``'s versions after its ``steps_before[r]``
    STEPs (module docstring)."""
    return _shift(build_schedule(plan, stop - start), plan, start, steps_before)


def segmented_schedule(plan: Plan, steps: int, drains: Sequence[int] = ()) -> Schedule:
    """The run's schedule over ``steps`` batches, one segment between consecutive ``drains``
    (:func:`drain_points`); without drains, :func:`~pipetrain.schedule.generators.build_schedule`'s.

    Raises:
        UserError: an invalid plan, naming the stage and the fix.
        ScheduleError: a drain point outside ``(0, steps)``.
    """
    if not plan.asynchronous or not drains:
        return build_schedule(plan, steps)
    bounds = sorted(set(drains))
    if bounds[0] <= 0 or bounds[-1] >= steps:
        raise ScheduleError(f"drain points {bounds} must lie strictly between 0 and the run's {steps} batches")
    programs: dict[int, list[Action]] = {}
    stepped: dict[int, int] = {}  # per rank, its STEPs in the segments so far
    built: dict[int, Schedule] = {}  # segments of one length differ only by their shift: build each length once
    for start, stop in zip([0, *bounds], [*bounds, steps], strict=True):
        if stop - start not in built:
            built[stop - start] = build_schedule(plan, stop - start)
        for rank, program in _shift(built[stop - start], plan, start, dict(stepped)):
            programs.setdefault(rank, []).extend(program)
            stepped[rank] = stepped.get(rank, 0) + sum(a.kind is ActionKind.STEP for a in program)
    schedule = Schedule.from_mapping(programs)
    validate_versions(schedule, plan)
    check_chunks(schedule, plan, steps)
    return schedule


def _shift(segment: Schedule, plan: Plan, start: int, steps_before: Mapping[int, int]) -> Schedule:
    """A segment built from batch 0 moved to batch ``start``, rank ``r``'s versions after its
    ``steps_before[r]`` STEPs."""
    m, samples = len(plan.stages[0].forward_sizes), start * plan.batch_size

    def moved(rank: int, a: Action) -> Action:
        if a.kind is ActionKind.STEP:
            return a
        version = None if a.version is None else a.version + steps_before.get(rank, 0)
        return replace(a, microbatch=a.microbatch + start * m, lo=a.lo + samples, hi=a.hi + samples, version=version)

    return Schedule.from_mapping({rank: [moved(rank, a) for a in program] for rank, program in segment})


def drain_suffix(plan: Plan, ran: Sequence[Action], rank: int, start: int, stop: int,
                 steps_before: int) -> tuple[Action, ...]:
    """What ``rank`` still runs to drain a segment begun at batch ``start`` and interrupted before batch
    ``stop``: the segment built for ``[start, stop)`` (:func:`segment_schedule`, the rank having run
    ``steps_before`` STEPs before it) after ``ran``, what the rank ran of the longer segment.

    Raises:
        ScheduleError: ``ran`` does not begin the shorter segment (the schedule cannot drain there).
    """
    program = segment_schedule(plan, start, stop, {rank: steps_before}).ranks[rank] if stop > start else ()
    if tuple(program[:len(ran)]) != tuple(ran):
        at = next((i for i, (a, b) in enumerate(zip(program, ran, strict=False)) if a != b), len(program))
        raise ScheduleError(f"rank {rank}: the segment from batch {start} cannot drain before batch {stop}: it ran "
                            f"{ran[at]} where the drained segment runs "
                            f"{program[at] if at < len(program) else 'nothing more'}")
    return tuple(program[len(ran):])
