"""Weight versions of asynchronous schedules, and their cut into per-batch chunks (docs/algorithms.md §3.5).

An asynchronous schedule (``pipedream``, ``2bw``) spans the run's ``N`` batches without a flush: its
sample ranges index the run-long batch of ``N·B`` samples (:meth:`~pipetrain.plan.plan.Plan.repeated`)
and every F and B carries the weight version it runs on (``2F5[40:48]v3``). Version ``v`` of a
stage is its weights after ``v`` of its STEPs. A run that checkpoints is several such programs one
after the other, each draining the pipeline (:mod:`pipetrain.schedule.segments`); the checks below
see one program. :func:`validate_versions` checks, per rank:

1. every F and B carries a version, and a B the version of the F of its range;
2. an F's version exists: it is at most the number of STEPs the rank has run;
3. the versions held never exceed the method's allowance: the newest plus every older one that a
   later F or B still needs. ``pipedream`` (stashing) may hold as many as the rank's peak of
   micro-batches in flight; with vertical sync, stage 0's peak (the oldest version a micro-batch
   entering the pipeline can still need); ``2bw`` two.

The runtime runs such a schedule one batch at a time (:func:`batch_chunks`): chunk ``t`` of a rank is
its actions from its first forward-channel action (RECV_F, F, SEND_F) of batch ``t`` up to the
first of batch ``t + 1``; the last chunk also takes the drain. Ranks meet at a barrier between
chunks, so :func:`check_chunks` dry-runs the chunks with that barrier: every receive of chunk ``t``
must be sent in a chunk ``<= t``, and a replicated stage's replicas must run equally many STEPs
(their gradient all-reduces pair up) in every chunk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pipetrain.plan.methods import WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError

__all__ = ["batch_chunks", "check_chunks", "held_versions", "peak_in_flight", "validate_versions", "version_limit"]

_FORWARD_CHANNEL = (ActionKind.RECV_F, ActionKind.F, ActionKind.SEND_F)


def peak_in_flight(program: Sequence[Action]) -> int:
    """The most micro-batches a program holds between their F and their B."""
    held = peak = 0
    for a in program:
        held += (a.kind is ActionKind.F) - (a.kind is ActionKind.B)
        peak = max(peak, held)
    return peak


def version_limit(schedule: Schedule, plan: Plan, rank: int) -> int:
    """The versions ``rank`` may hold under the plan's weight policy (module docstring, rule 3)."""
    if plan.weights is WeightPolicy.TWO_BW:
        return 2
    if plan.weights is WeightPolicy.VERTICAL_SYNC:
        return max(peak_in_flight(schedule.ranks[r]) for r in plan.stages[0].ranks)
    return max(1, peak_in_flight(schedule.ranks[rank]))


def validate_versions(schedule: Schedule, plan: Plan) -> None:
    """Check rules 1–3 of the module docstring on every rank.

    Raises:
        ScheduleError: one line naming the rank, the action and the rule it breaks.
    """
    for rank, program in schedule:
        _check_rank_versions(rank, program, version_limit(schedule, plan, rank))


def held_versions(program: Sequence[Action]) -> list[int]:
    """The versions a rank holds at its start and after each of its STEPs (rule 3: the newest plus
    every older one a later F or B needs)."""
    last_use = {a.version: i for i, a in enumerate(program) if a.kind in (ActionKind.F, ActionKind.B)}
    alive: set[int | None] = set()  # superseded versions a later F or B still needs
    latest, held = 0, [1]
    for i, a in enumerate(program):
        if a.kind is ActionKind.STEP:
            if last_use.get(latest, -1) > i:
                alive.add(latest)
            latest += 1
            held.append(len(alive) + 1)
        elif a.kind in (ActionKind.F, ActionKind.B) and last_use.get(a.version) == i:
            alive.discard(a.version)
    return held


def _check_rank_versions(rank: int, program: Sequence[Action], limit: int) -> None:
    steps = 0
    forwarded: dict[tuple[int, int], int | None] = {}
    for a in program:
        steps += a.kind is ActionKind.STEP
        if a.kind not in (ActionKind.F, ActionKind.B):
            continue
        if a.version is None:
            raise ScheduleError(f"rank {rank}: {a} carries no weight version; an asynchronous method's F and B "
                                "need one")
        if a.kind is ActionKind.F:
            if a.version > steps:
                raise ScheduleError(f"rank {rank}: {a} uses version {a.version} but only {steps} STEPs ran before it")
            forwarded[(a.lo, a.hi)] = a.version
        elif forwarded.get((a.lo, a.hi)) != a.version:
            raise ScheduleError(f"rank {rank}: {a} uses version {a.version} but its F used "
                                f"{forwarded.get((a.lo, a.hi))}; a backward must use its forward's weights")
    held = held_versions(program)
    if max(held) > limit:
        raise ScheduleError(f"rank {rank}: after STEP {held.index(max(held))} it holds {max(held)} weight versions, "
                            f"more than the {limit} its method allows")


def batch_chunks(program: Sequence[Action], batch_size: int, batches: int) -> list[tuple[Action, ...]]:
    """``program`` cut into ``batches`` chunks by the batch of its forward-channel actions (module
    docstring); a rank with no forward in some batch gets an empty chunk there."""
    chunks: list[list[Action]] = [[] for _ in range(batches)]
    current = 0
    for a in program:
        if a.kind in _FORWARD_CHANNEL:
            current = max(current, min(a.lo // batch_size, batches - 1))
        chunks[current].append(a)
    return [tuple(c) for c in chunks]


def check_chunks(schedule: Schedule, plan: Plan, batches: int) -> None:
    """Dry-run the per-batch chunks with a barrier after each (module docstring); sends are buffered,
    a receive waits for its send.

    Raises:
        ScheduleError: a chunk waits for a message of a later chunk, or replicas step unequally.
    """
    end = max((a.hi for _, program in schedule for a in program), default=0)
    if end > batches * plan.batch_size:
        raise ScheduleError(f"the schedule reaches sample {end}, past the run's {batches} batches of "
                            f"{plan.batch_size}; build it for {batches} batches")
    chunked = [batch_chunks(program, plan.batch_size, batches) for _, program in schedule]
    sent: Counter[tuple[int, int, str]] = Counter()
    received: Counter[tuple[int, int, str]] = Counter()
    for t in range(batches):
        pos = [0] * schedule.n_ranks
        progress = True
        while progress:
            progress = False
            for rank, chunks in enumerate(chunked):
                while pos[rank] < len(chunks[t]):
                    a = chunks[t][pos[rank]]
                    if a.peer is not None:
                        key = (rank, a.peer, a.channel) if a.is_send else (a.peer, rank, a.channel)
                        if not a.is_send and received[key] >= sent[key]:
                            break
                        (sent if a.is_send else received)[key] += 1
                    pos[rank] += 1
                    progress = True
        stuck = [r for r, chunks in enumerate(chunked) if pos[r] < len(chunks[t])]
        if stuck:
            raise ScheduleError(f"batch {t}: rank {stuck[0]} waits at {chunked[stuck[0]][t][pos[stuck[0]]]} for a "
                                "message of a later batch; the chunk cannot finish before the barrier")
        _check_replica_steps(plan, chunked, t)


def _check_replica_steps(plan: Plan, chunked: list[list[tuple[Action, ...]]], t: int) -> None:
    for stage in plan.stages:
        steps = Counter(sum(a.kind is ActionKind.STEP for a in chunked[r][t]) for r in stage.ranks)
        if len(steps) > 1:
            raise ScheduleError(f"batch {t}: the replicas {list(stage.ranks)} run different numbers of STEPs "
                                f"({dict(steps)}); their gradient all-reduces would not pair up")
