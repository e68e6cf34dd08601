"""Asynchronous orders: 1F1B without a flush, STEPs and weight versions (methods ``pipedream``, ``2bw``).

PipeDream (Narayanan et al. 2019) and PipeDream-2BW (2021), docs/algorithms.md §3.5: one 1F1B order
(:mod:`pipetrain.schedule.one_f_one_b`) over the run's ``N·m`` micro-batches without a flush. The
schedule's frame (:func:`~pipetrain.schedule.generators.compute_schedule`) hands the generator,
:func:`asynchronous_orders`, the plan :meth:`~pipetrain.plan.plan.Plan.repeated` ``N`` times, splits
replicated stages, and then runs :func:`add_steps_and_versions`, which gives every F and B its
weight version and places the STEPs by the plan's weight policy (both depend on the replica's own
STEP count and on ``m``, which the run's plan no longer shows). Stage ``k`` of 2 stages, ``m = 2``,
``N = 2``, ``pipedream``::

    stage 0:  F0v0 F1v0 B0v0 STEP F2v1 B1v0 STEP F3v2 B2v1 STEP B3v2 STEP
    stage 1:  F0v0 B0v0 STEP F1v1 B1v1 STEP F2v2 B2v2 STEP F3v3 B3v3 STEP

``pipedream`` steps after every backward (each micro-batch is a mini-batch) and an F runs on the
newest version (weight stashing: its B reuses it); with vertical sync every stage runs micro-batch
``j`` on the version stage 0 chose for it. A replicated stage (1F1B-RR) takes micro-batches
round-robin and each replica steps after each of its backwards, the replicas' ``i``-th STEPs summing
``r`` micro-batches' gradients. ``2bw`` steps after a batch's last backward, and micro-batch ``j``
(0-based) runs on version ``max(⌊j/m⌋ − 1, 0)`` on every stage (delay 1); on a replicated stage
(PipeDream-2BW's ``w`` parallel pipelines) every replica steps once per batch, after its own last
backward of the batch, so the replicas' step ``t`` all-reduces batch ``t``'s gradients. Stage 0 of
``2 × 2``, ``m = 4``, 2 batches (rank 1 runs the odd micro-batches alike)::

    rank 0:  F0v0 F2v0 B0v0 F4v0 B2v0 STEP F6v0 B4v0 B6v0 STEP

:mod:`pipetrain.schedule.versions` checks the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipetrain.plan.methods import WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.one_f_one_b import one_f_one_b_orders
from pipetrain.schedule.orders import Orders
from pipetrain.schedule.schedule import Schedule

__all__ = ["add_steps_and_versions", "asynchronous_orders"]


def asynchronous_orders(run: Plan) -> Orders:
    """Per stage, its 1F1B order over the run's micro-batches (``run``: the plan repeated over the
    run's batches), without a STEP: :func:`add_steps_and_versions` places those."""
    return [order[:-1] for order in one_f_one_b_orders(run)]  # each order ends in its one STEP


def add_steps_and_versions(schedule: Schedule, plan: Plan) -> Schedule:
    """Every F and B of ``schedule`` (a run's F/B programs, replicas split) with its weight version,
    and the STEPs, by ``plan``'s weight policy (module docstring); ``plan`` is the plan of one batch."""
    m = len(plan.stages[0].forward_sizes)
    entered: dict[int, int] = {}  # vertical sync: micro-batch j -> the version stage 0 ran it on
    programs = {}
    for rank in sorted(range(schedule.n_ranks), key=plan.stage_of_rank):  # stage 0 first, for `entered`
        programs[rank] = _versioned(plan.weights, m, plan.stage_of_rank(rank), schedule.ranks[rank], entered)
    return Schedule.from_mapping(programs)


def _versioned(weights: WeightPolicy, m: int, stage: int, program: Sequence[Action],
               entered: dict[int, int]) -> list[Action]:
    """One rank's program with versions and STEPs; ``stage`` is the stage it runs."""
    out: list[Action] = []
    steps, version = 0, {}
    batch_ends = _batch_ends(program, m)
    for i, a in enumerate(program):
        j = a.microbatch
        if a.kind is ActionKind.F:
            version[j] = _forward_version(weights, m, stage, j, steps, entered)
            out.append(replace(a, version=version[j]))
            continue
        out.append(replace(a, version=version.pop(j)))
        if weights is not WeightPolicy.TWO_BW or i in batch_ends:
            out.append(Action(ActionKind.STEP, stage))
            steps += 1
    return out


def _batch_ends(program: Sequence[Action], m: int) -> set[int]:
    """The positions of the rank's last B of each batch (``m`` micro-batches per batch): where a 2BW
    replica steps, every replica of a stage once per batch, whichever micro-batches it ran."""
    last = {a.microbatch // m: i for i, a in enumerate(program) if a.kind is ActionKind.B}
    return set(last.values())


def _forward_version(weights: WeightPolicy, m: int, stage: int, j: int, steps: int, entered: dict[int, int]) -> int:
    """The version micro-batch ``j``'s F runs on, the rank having run ``steps`` STEPs."""
    if weights is WeightPolicy.TWO_BW:
        return max(j // m - 1, 0)
    if weights is WeightPolicy.VERTICAL_SYNC and stage > 0:
        return entered[j]
    if stage == 0:
        entered[j] = steps
    return steps
