"""Schedule generators: one per method, plain numbers in, compute-only Schedule out (STYLE.md L4).

A generator emits, for every rank, the order of its F, B and STEP actions; the communication pass
(:mod:`pipetrain.schedule.passes`) then inserts the sends and receives. :func:`build_schedule` runs
both and is what the simulator and the runtime consume.

GPipe (Huang et al. 2019), fill-drain with a flush, ``m`` micro-batches on stage ``k``::

    F0 F1 ... F(m-1) B0 B1 ... B(m-1) STEP

Backward runs in forward sample order, the order π of PAPERS.md §1.4, so every stage consumes
gradients in the order its successor produces them.

1F1B with a flush (PipeDream-Flush, Narayanan et al. 2021), ``K`` stages, stage ``k``: ``w =
min(K - k - 1, m)`` warm-up forwards, then alternate one forward and one backward, then drain::

    F0 .. F(w-1) | F(w) B0 F(w+1) B1 ... F(m-1) B(m-w-1) | B(m-w) .. B(m-1) STEP

At most ``w + 1`` micro-batches are in flight on stage ``k`` (GPipe: all ``m``).
"""

from __future__ import annotations

from collections.abc import Callable

from pipetrain.errors import UserError
from pipetrain.plan.plan import Method, Plan, StagePlan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.passes import add_communication
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import validate

__all__ = ["GENERATORS", "build_schedule", "compute_schedule", "gpipe_order", "one_f_one_b_order"]

# (stage index, stage count, forward sizes, backward sizes) -> the stage's compute actions.
StageOrder = Callable[[int, int, tuple[int, ...], tuple[int, ...]], list[Action]]


def _forwards(stage: int, sizes: tuple[int, ...]) -> list[Action]:
    return [Action(ActionKind.F, stage, j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes))]


def _backwards(stage: int, sizes: tuple[int, ...]) -> list[Action]:
    return [Action(ActionKind.B, stage, j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes))]


def gpipe_order(
    stage: int, n_stages: int, forward_sizes: tuple[int, ...], backward_sizes: tuple[int, ...]
) -> list[Action]:
    """All forwards, then all backwards, then the step (fill-drain). Also UMPIPE's order."""
    del n_stages
    return [*_forwards(stage, forward_sizes), *_backwards(stage, backward_sizes), Action(ActionKind.STEP, stage)]


def one_f_one_b_order(
    stage: int, n_stages: int, forward_sizes: tuple[int, ...], backward_sizes: tuple[int, ...]
) -> list[Action]:
    """Warm-up forwards, then one forward / one backward, then the drain, then the step."""
    if forward_sizes != backward_sizes:
        raise UserError(f"stage {stage}: 1F1B needs equal forward and backward micro-batch sizes")
    fwd, bwd = _forwards(stage, forward_sizes), _backwards(stage, backward_sizes)
    m = len(fwd)
    warmup = min(n_stages - stage - 1, m)
    order = fwd[:warmup]
    for j in range(m - warmup):
        order += [fwd[warmup + j], bwd[j]]
    order += bwd[m - warmup:]
    return [*order, Action(ActionKind.STEP, stage)]


GENERATORS: dict[Method, StageOrder] = {
    Method.GPIPE: gpipe_order,
    Method.ONE_F_ONE_B: one_f_one_b_order,
    Method.UEDP: gpipe_order,
}


def compute_schedule(plan: Plan) -> Schedule:
    """Every rank's compute actions (F, B, STEP) for the plan's method, before communication."""
    try:
        order = GENERATORS[plan.method]
    except KeyError:
        known = ", ".join(m.value for m in GENERATORS)
        raise UserError(f"method {plan.method.value!r} has no schedule generator yet; use one of: {known}") from None
    programs: dict[int, list[Action]] = {}
    for k, stage in enumerate(plan.stages):
        _check_single_rank(k, stage)
        programs[stage.ranks[0]] = order(k, plan.n_stages, stage.forward_sizes, stage.backward_sizes)
    return Schedule.from_mapping(programs)


def _check_single_rank(k: int, stage: StagePlan) -> None:
    if len(stage.ranks) != 1:
        raise UserError(
            f"stage {k} is replicated on ranks {list(stage.ranks)}; replicated stages need the "
            "pipedream planner's schedule; give each stage one rank"
        )


def build_schedule(plan: Plan) -> Schedule:
    """The complete, validated, runnable schedule: compute order plus sends and receives."""
    plan.validate()
    schedule = add_communication(compute_schedule(plan), plan)
    validate(schedule, plan.batch_size, plan.rank_stages, plan.n_stages)
    return schedule
