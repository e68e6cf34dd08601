"""A plan's schedule: its method's generator, then what every method shares (STYLE.md L3, L4).

    build_schedule(plan)        # the complete, validated schedule the simulator and the runtime run
    compute_schedule(plan)      # its compute actions only (F, B, W, STEP), before communication

:func:`build_schedule` reads top to bottom, the same for every method:

1. the run: a plan that flushes schedules one batch; an asynchronous one (its method's ``flush``
   trait is False) the plan :meth:`~pipetrain.plan.plan.Plan.repeated` over ``N`` batches;
2. the method's generator (:data:`~pipetrain.schedule.registry.GENERATORS`) orders the run's
   compute actions, a replicated stage as if it ran on one rank;
3. the replica split: each replica of a stage runs the sub-sequence of the micro-batches it owns
   (:meth:`~pipetrain.plan.plan.Plan.replica_rank`) and the stage's STEPs. Dropping actions from a
   deadlock-free program only removes ordering constraints, so the replicated schedule cannot
   deadlock either (the validator's dry run checks it);
4. an asynchronous run gets its STEPs and weight versions
   (:func:`~pipetrain.schedule.asynchronous.add_steps_and_versions`);
5. the communication pass (:func:`~pipetrain.schedule.passes.add_communication`) inserts the sends
   and receives;
6. validation (:func:`~pipetrain.schedule.validate.validate_run`), and for an asynchronous run its
   weight versions and per-batch chunks (:mod:`pipetrain.schedule.versions`).

Two stages, two micro-batches of 2 samples, ``gpipe``; step 2 gives ``0F0[0:2] 0F1[2:4] 0B0[0:2]
0B1[2:4] 0STEP`` on rank 0, and step 5 makes it::

    0F0[0:2] 0SEND_F0[0:2]>1 0F1[2:4] 0SEND_F1[2:4]>1 0RECV_B0[0:2]<1 0B0[0:2] 0RECV_B1[2:4]<1 0B1[2:4] 0STEP
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.asynchronous import add_steps_and_versions
from pipetrain.schedule.orders import Orders
from pipetrain.schedule.passes import add_communication
from pipetrain.schedule.registry import generator_for
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import validate_run
from pipetrain.schedule.versions import check_chunks, validate_versions

__all__ = [
    "DEFAULT_ASYNC_BATCHES",
    "build_schedule",
    "compute_schedule",
]

DEFAULT_ASYNC_BATCHES = 4
"""Batches an asynchronous schedule spans when no run length is given (plan, simulate, Gantt)."""


def _batches(plan: Plan, batches: int | None) -> int:
    """Step 1 of the module docstring: the batches the schedule spans."""
    if plan.spec.flush:
        return 1
    return DEFAULT_ASYNC_BATCHES if batches is None else batches


def _run(plan: Plan, batches: int) -> Plan:
    """The plan whose single batch the schedule covers: ``plan`` over ``batches`` batches."""
    return plan.repeated(batches) if batches > 1 else plan


def _split_replicas(orders: Orders, run: Plan) -> Schedule:
    """Step 3 of the module docstring: each program on every rank of its stages, a replica keeping
    its own micro-batches' actions and every STEP."""
    programs = {}
    for order in orders:
        own: dict[int, list[Action]] = {rank: [] for rank in run.stages[order[0].stage].ranks}
        for a in order:  # one pass, not one per replica
            if a.kind is ActionKind.STEP:
                for program in own.values():
                    program.append(a)
            elif (keeper := own.get(run.replica_rank(a.stage, a.microbatch))) is not None:
                keeper.append(a)
        programs.update(own)
    return Schedule.from_mapping(programs)


def _compute(plan: Plan, run: Plan) -> Schedule:
    """Steps 2 to 4 of the module docstring."""
    schedule = _split_replicas(generator_for(plan.method)(run), run)
    return schedule if plan.spec.flush else add_steps_and_versions(schedule, plan)


def compute_schedule(plan: Plan) -> Schedule:
    """Every rank's compute actions (F, B, W, STEP) for the plan's method, before communication (an
    asynchronous plan's over :data:`DEFAULT_ASYNC_BATCHES` batches, with versions).

    Raises:
        UserError: a plan its method's generator cannot order (naming the stage and the fix).
    """
    return _compute(plan, _run(plan, _batches(plan, None)))


def build_schedule(plan: Plan, batches: int | None = None) -> Schedule:
    """The complete, validated, runnable schedule: compute order plus sends and receives (module docstring).

    An asynchronous plan's schedule spans ``batches`` batches (default :data:`DEFAULT_ASYNC_BATCHES`)
    and has its versions and per-batch chunks checked (:mod:`pipetrain.schedule.versions`); a
    synchronous plan's is one batch, whatever ``batches`` says.

    Raises:
        UserError: an invalid plan, naming the stage and the fix.
    """
    return _built(plan if plan.prediction is None else replace(plan, prediction=None), batches)


@lru_cache(maxsize=4)
def _built(plan: Plan, batches: int | None) -> Schedule:
    """:func:`build_schedule`, its last few answers kept (a Schedule is immutable): a planner that
    simulates a plan and then replays its memory (:func:`~pipetrain.simulate.memory.memory_need`)
    builds it once (issue 30)."""
    plan.validate()
    n = _batches(plan, batches)
    run = _run(plan, n)
    schedule = add_communication(_compute(plan, run), run)
    validate_run(schedule, run)
    if not plan.spec.flush:
        validate_versions(schedule, plan)
        check_chunks(schedule, plan, n)
    return schedule
