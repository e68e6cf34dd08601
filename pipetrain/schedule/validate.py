"""Schedule validation: invariants, with errors that show the whole picture (STYLE.md L5).

:func:`validate` checks a lowered schedule:

1. every action of a rank belongs to the rank's stage;
2. on every stage the forward ranges, and separately the backward ranges, cover the batch once
   (over all of the stage's ranks when it is replicated; each replica back-propagates only samples it
   forwarded);
3. each sample's forward comes before its backward on the stage, and inputs (activations for F,
   gradients for B) have been received before they are used;
4. every send is matched by a receive of the same message, in the same order on each directed link;
5. a dry run, in which sends never block and a receive waits for its send, finishes (no deadlock);
6. a split backward (methods ``zb1``, ``interleaved-zb``, ``zbv``; Qi et al. 2024): each W follows a B
   of exactly its range and stage on the same rank, once; a rank with any W has one for every B of
   every stage it runs (the runtime splits all of a rank's backwards or none);
7. a stage whose neighbour runs on the same rank (ZB-V's stages ``R − 1`` and ``R``) gets no message
   from it: the neighbour's F (activations) or B (gradients) earlier in the rank's program is the
   delivery;
8. STEP is the last action of its stage, after every backward and W (an asynchronous schedule,
   ``steps_anywhere``, steps after its backwards as it goes; :mod:`pipetrain.schedule.versions`
   checks its weight versions).

Local learning (method ``local``, ``local_queue`` given): backward needs no received gradient (it
is the stage's own loss), a STEP may follow every micro-batch, gradient messages (SEND_B, RECV_B)
are refused, and the dry run bounds every link's queue: a send waits while its link holds
``local_queue`` messages not yet received.

A failure raises :class:`ScheduleError` whose message names the rank, step and action and renders
the step × rank grid with the failing cell marked ``>> <<``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule

__all__ = ["ScheduleError", "dry_run", "validate", "validate_for_plan", "validate_run"]

_GRID_ROWS = 40


class ScheduleError(UserError):
    """A schedule breaks an invariant; the message shows where."""


def _fail(schedule: Schedule, rank: int, step: int, why: str) -> ScheduleError:
    action = schedule.ranks[rank][step] if step < len(schedule.ranks[rank]) else None
    grid = schedule.grid(mark=(rank, step), max_steps=max(step + 4, _GRID_ROWS))
    return ScheduleError(f"rank {rank}, step {step} ({action}): {why}\n{grid}")


def validate(schedule: Schedule, batch_size: int, stage_of_rank: Sequence[int], n_stages: int,
             steps_anywhere: bool = False, *, local_queue: int | None = None,
             stage_edges: Sequence[tuple[int, int]] | None = None,
             stages_of_rank: Sequence[Sequence[int]] | None = None) -> None:
    """Check every invariant listed in the module docstring.

    Args:
        schedule: a lowered schedule (with communication).
        batch_size: samples per mini-batch (an asynchronous schedule: of the whole run).
        stage_of_rank: the stage each rank runs.
        n_stages: stage count (stage 0 needs no activations, the last no gradients).
        steps_anywhere: STEP may come before other actions, and more than once (asynchronous methods).
        local_queue: for local learning, the queue depth of every link; None for end-to-end methods.
        stage_edges: the stage graph (method ``graph``): a stage's forward needs activations from
            each predecessor, its backward gradients from each successor; None: the chain.
        stages_of_rank: the stages each rank runs when some run several (method ``interleaved``);
            each stage's actions are then checked as a program of their own; None: ``stage_of_rank``.

    Raises:
        ScheduleError: on the first violation found.
    """
    edges = stage_edges if stage_edges is not None else [(k, k + 1) for k in range(n_stages - 1)]
    coverage: dict[int, tuple[list[int], list[int], int]] = {}
    for rank, program in schedule:
        stages = tuple(stages_of_rank[rank]) if stages_of_rank is not None else (stage_of_rank[rank],)
        _check_all_split(schedule, rank, program)
        for stage in stages:
            needs = (sum(b == stage for _, b in edges),
                     0 if local_queue is not None else sum(a == stage for a, _ in edges))
            local = _Local(frozenset(a for a, b in edges if b == stage and a in stages),
                           frozenset(b for a, b in edges if a == stage and b in stages))
            state = _check_rank(schedule, rank, program, batch_size, (stage, stages), needs, steps_anywhere,
                                local_queue is not None, local)
            fwd, bwd, _ = coverage.setdefault(stage, ([0] * batch_size, [0] * batch_size, rank))
            for total, counts in ((fwd, state.forwarded), (bwd, state.backwarded)):
                for i, c in enumerate(counts):
                    total[i] += c
    for fwd, bwd, rank in coverage.values():
        end = len(schedule.ranks[rank])
        _check_coverage(schedule, rank, end, fwd, "forward")
        _check_coverage(schedule, rank, end, bwd, "backward")
    _check_channels(schedule)
    dry_run(schedule, local_queue)


@dataclass(frozen=True)
class _Local:
    """A stage's neighbours on its own rank: their F (predecessors) or B (successors) delivers in memory."""

    predecessors: frozenset[int] = frozenset()
    successors: frozenset[int] = frozenset()

    def deliver(self, state: _RankState, a: Action) -> None:
        """Count ``a`` of another stage on the rank as the delivery of its output to this stage."""
        if a.kind is ActionKind.F and a.stage in self.predecessors:
            _bump(state.have_act, range(a.lo, a.hi))
        elif a.kind is ActionKind.B and a.stage in self.successors:
            _bump(state.have_grad, range(a.lo, a.hi))


@dataclass
class _RankState:
    """What one rank holds while its program is replayed: per-sample counts and flags."""

    forwarded: list[int]
    backwarded: list[int]
    have_act: list[int]  # messages received per sample: one from each predecessor stage ...
    have_grad: list[int]  # ... and one from each successor
    needs: tuple[int, int]  # (predecessors, successors)
    stepped: bool = False
    b_ranges: set[tuple[int, int]] = field(default_factory=set)  # ranges back-propagated (B) ...
    w_ranges: set[tuple[int, int]] = field(default_factory=set)  # ... and their weight gradients (W) done

    def apply(self, a: Action) -> str | None:
        """Replay ``a``; return why it is invalid, or None."""
        samples = range(a.lo, a.hi)
        if a.kind is ActionKind.F:
            if not all(self.have_act[i] >= self.needs[0] for i in samples):
                return "forward before its input activations were received"
            _bump(self.forwarded, samples)
        elif a.kind is ActionKind.B:
            if not all(self.forwarded[i] for i in samples):
                return "backward of samples not yet forwarded on this stage"
            if not all(self.have_grad[i] >= self.needs[1] for i in samples):
                return "backward before its output gradients were received"
            _bump(self.backwarded, samples)
            self.b_ranges.add((a.lo, a.hi))
        elif a.kind is ActionKind.W:
            return self._weight_grad(a)
        elif a.kind is ActionKind.SEND_F and not all(self.forwarded[i] for i in samples):
            return "sends activations that were not computed yet"
        elif a.kind is ActionKind.SEND_B and not all(self.backwarded[i] for i in samples):
            return "sends gradients that were not computed yet"
        elif a.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
            _bump(self.have_act if a.kind is ActionKind.RECV_F else self.have_grad, samples)
        elif a.kind is ActionKind.STEP:
            self.stepped = True
        return None


    def _weight_grad(self, a: Action) -> str | None:
        key = (a.lo, a.hi)
        if key not in self.b_ranges:
            return "W before a B of exactly its range on this rank; put each W after its B"
        if key in self.w_ranges:
            return "a second W of the same range; every B has exactly one W"
        self.w_ranges.add(key)
        return None


def _bump(counts: list[int], samples: range) -> None:
    for i in samples:
        counts[i] += 1


def _check_rank(
    schedule: Schedule, rank: int, program: Sequence[Action], batch: int, stages: tuple[int, tuple[int, ...]],
    needs: tuple[int, int], steps_anywhere: bool = False, local: bool = False, same_rank: _Local = _Local(),
) -> _RankState:
    """Replay the actions of one stage in ``rank``'s program; the state it ends in (per-sample forward
    and backward counts). ``stages``: that stage, and all the rank runs; ``needs``: the messages a
    sample's F and B wait for (the stage's predecessors and successors); ``same_rank``: its neighbours
    on this rank, whose F and B deliver without a message."""
    stage, allowed = stages
    state = _RankState([0] * batch, [0] * batch, [0] * batch, [0] * batch, needs)
    last = None
    for step, a in enumerate(program):
        if a.stage not in allowed:
            runs = f"stage {stage}" if len(allowed) == 1 else f"stages {', '.join(map(str, allowed))}"
            raise _fail(schedule, rank, step, f"rank {rank} runs {runs}, not stage {a.stage}")
        if a.stage != stage:
            same_rank.deliver(state, a)
            continue
        last = a
        if local and a.kind in (ActionKind.SEND_B, ActionKind.RECV_B):
            raise _fail(schedule, rank, step, "method local sends no gradients between stages; remove the "
                        "SEND_B and RECV_B actions")
        if state.stepped and not (local or steps_anywhere):
            raise _fail(schedule, rank, step, "action after STEP; STEP must come last")
        if a.kind is not ActionKind.STEP and a.hi > batch:
            raise _fail(schedule, rank, step, f"range ends at {a.hi}, past the batch of {batch}")
        why = state.apply(a)
        if why is not None:
            raise _fail(schedule, rank, step, why)
    if not state.stepped or last is None or last.kind is not ActionKind.STEP:
        raise _fail(schedule, rank, len(program), f"the program does not end with STEP (stage {stage})")
    if state.w_ranges and state.w_ranges != state.b_ranges:
        missing = sorted(state.b_ranges - state.w_ranges)
        raise _fail(schedule, rank, len(program), f"the B actions of ranges {missing[:4]} have no W; give every B "
                    "of a split backward one W before the STEP")
    return state


def _check_all_split(schedule: Schedule, rank: int, program: Sequence[Action]) -> None:
    """A rank with any W splits every backward, on each of its stages (invariant 6)."""
    if not any(a.kind is ActionKind.W for a in program):
        return
    split = {a.stage for a in program if a.kind is ActionKind.W}
    for step, a in enumerate(program):
        if a.kind is ActionKind.B and a.stage not in split:
            raise _fail(schedule, rank, step, f"stage {a.stage} has no W actions while rank {rank}'s other stages "
                        "split their backwards; give every B on this rank a W, or remove all of its W actions")


def _check_coverage(schedule: Schedule, rank: int, end: int, counts: list[int], label: str) -> None:
    bad = [i for i, c in enumerate(counts) if c != 1]
    if bad:
        raise _fail(
            schedule, rank, end,
            f"{label} of the stage covers samples {bad[:8]}{'...' if len(bad) > 8 else ''} "
            f"{counts[bad[0]]} times; every sample must be covered exactly once",
        )


def _check_channels(schedule: Schedule) -> None:
    """Sends and receives of each directed link and direction match one to one, in order."""
    sends: dict[tuple[int, int, str], list[tuple[int, Action]]] = defaultdict(list)
    recvs: dict[tuple[int, int, str], list[tuple[int, Action]]] = defaultdict(list)
    for rank, step, a in schedule.actions():
        if a.peer is None:
            continue
        if not 0 <= a.peer < schedule.n_ranks or a.peer == rank:
            raise _fail(schedule, rank, step, f"peer {a.peer} is not another rank of the schedule")
        direction: str = a.channel
        key = (rank, a.peer, direction) if a.is_send else (a.peer, rank, direction)
        (sends if a.is_send else recvs)[key].append((step, a))
    for key in sends.keys() | recvs.keys():
        src, dst, _ = key
        sent, got = sends.get(key, []), recvs.get(key, [])
        for (s_step, s), (r_step, r) in zip(sent, got, strict=False):
            if (s.microbatch, s.lo, s.hi) != (r.microbatch, r.lo, r.hi):
                raise _fail(schedule, dst, r_step, f"receives {r.microbatch}[{r.lo}:{r.hi}] but rank {src} "
                            f"sends {s.microbatch}[{s.lo}:{s.hi}] next (step {s_step})")
        if len(sent) > len(got):
            raise _fail(schedule, src, sent[len(got)][0], f"send is never received by rank {dst}")
        if len(got) > len(sent):
            raise _fail(schedule, dst, got[len(sent)][0], f"receive is never sent by rank {src}")


def dry_run(schedule: Schedule, capacity: int | None = None) -> None:
    """Unit-time execution; sends are buffered (at most ``capacity`` unreceived messages per link
    when given), receives wait for their matching send.

    Raises:
        ScheduleError: some rank waits forever (a deadlock), naming every waiting rank.
    """
    pos = [0] * schedule.n_ranks
    sent: dict[tuple[int, int, str], int] = defaultdict(int)
    received: dict[tuple[int, int, str], int] = defaultdict(int)
    progress = True
    while progress:
        progress = False
        for rank, program in schedule:
            while pos[rank] < len(program):
                a = program[pos[rank]]
                if a.peer is not None and not a.is_send:
                    key = (a.peer, rank, a.channel)
                    if received[key] >= sent[key]:
                        break
                    received[key] += 1
                elif a.peer is not None:
                    key = (rank, a.peer, a.channel)
                    if capacity is not None and sent[key] - received[key] >= capacity:
                        break
                    sent[key] += 1
                pos[rank] += 1
                progress = True
    stuck = [r for r, p in enumerate(schedule.ranks) if pos[r] < len(p)]
    if stuck:
        waits = ", ".join(f"rank {r} at step {pos[r]} ({schedule.ranks[r][pos[r]]})" for r in stuck)
        raise _fail(schedule, stuck[0], pos[stuck[0]], f"deadlock: {waits} wait forever")


def validate_run(schedule: Schedule, run: Plan) -> None:
    """:func:`validate` with the plan's batch, ranks, stages, stage edges and queue bound (local
    learning's); ``run``: an asynchronous plan over the batches the schedule spans
    (:meth:`~pipetrain.plan.plan.Plan.repeated`), whose STEPs come after its backwards as it goes.

    Raises:
        ScheduleError: on the first violation found.
    """
    validate(schedule, run.batch_size, run.rank_stages, run.n_stages, steps_anywhere=run.asynchronous,
             local_queue=run.params.queue_bound, stage_edges=run.stage_edges,
             stages_of_rank=[run.stages_of_rank(r) for r in range(run.n_ranks)])


def validate_for_plan(schedule: Schedule, plan: Plan) -> None:
    """Check a schedule against the plan it is to run (e.g. a hand-edited one): :func:`validate` on
    the plan's ranks, stages and batch, and on every stage that keeps its activations (does not
    recompute, :meth:`~pipetrain.plan.plan.Plan.recomputes`), backward over exactly the sample
    ranges forward ran as micro-batches, since part of one forward's autograd graph cannot be
    back-propagated alone.

    Raises:
        UserError: naming the rank and what to change.
    """
    if schedule.n_ranks != plan.n_ranks:
        raise UserError(f"the schedule has {schedule.n_ranks} ranks but the plan uses {plan.n_ranks}; give a "
                        "schedule with one row per rank of the plan")
    if plan.asynchronous:  # the schedule spans the run's batches (Plan.repeated)
        ends = [a.hi for _, program in schedule for a in program]
        plan = plan.repeated(max(1, -(-max(ends, default=0) // plan.batch_size)))
    validate_run(schedule, plan)
    for rank, program in schedule:
        for stage in plan.stages_of_rank(rank):
            _check_ranges(plan, rank, stage, [a for a in program if a.stage == stage])


def _check_ranges(plan: Plan, rank: int, stage: int, program: Sequence[Action]) -> None:
    """A stage that keeps its activations back-propagates exactly the ranges it forwarded."""
    forward = sorted((a.lo, a.hi) for a in program if a.kind is ActionKind.F)
    backward = sorted((a.lo, a.hi) for a in program if a.kind is ActionKind.B)
    if forward != backward and not plan.recomputes(stage):
        raise UserError(f"rank {rank} (stage {stage}) back-propagates sample ranges it did not forward as one "
                        "micro-batch; give its B actions the ranges of its F actions, or set the stage's "
                        '"recompute": true so that it re-runs forward per backward range')
