"""Level (c): the runtime executes the Schedule it is given (DESIGN.md §5.1).

A GPipe plan run with the 1F1B order of the same actions (a hand-edited schedule, as a user would
write with ``pipetrain train --schedule``) still equals single-process training, and runs that
order: the measured timeline's actions are the schedule's. Schedules that do not run the plan are
refused before any rank starts, with a message naming the fix.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, reference_train, train
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule

from .models import chain_plan, max_param_diff, mlp_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 12
CONFIG = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)


def test_runs_the_given_schedule_and_matches_single_process() -> None:
    graph = mlp_graph()
    plan = chain_plan(graph, 3, BATCH, 4, Method.GPIPE)
    edited = build_schedule(replace(plan, method=Method.ONE_F_ONE_B))  # same actions, another order
    assert edited != build_schedule(plan)
    result = train(graph, plan, CONFIG, schedule=Schedule.from_csv(edited.to_csv()), return_state_dict=True)
    reference = reference_train(graph, BATCH, CONFIG)
    assert max_param_diff(result, reference) < 1e-5
    for rank, program in edited:
        ran = [e.action for e in result.timeline.events if e.rank == rank]
        assert ran == list(program)


def test_schedule_of_another_plan_is_refused_before_launch() -> None:
    graph = mlp_graph()
    plan = chain_plan(graph, 2, BATCH, 4)
    three = build_schedule(chain_plan(graph, 3, BATCH, 4))
    with pytest.raises(UserError, match="one row per rank"):
        train(graph, plan, CONFIG, schedule=three)


def test_backward_over_other_ranges_needs_recompute() -> None:
    graph = mlp_graph()
    plan = chain_plan(graph, 1, BATCH, 2)
    halves = [Action(ActionKind.F, 0, 0, 0, 6), Action(ActionKind.F, 0, 1, 6, 12),
              Action(ActionKind.B, 0, 0, 0, 4), Action(ActionKind.B, 0, 1, 4, 12), Action(ActionKind.STEP, 0)]
    with pytest.raises(UserError, match='"recompute": true'):
        train(graph, plan, CONFIG, schedule=Schedule.from_lists([halves]))
    result = train(graph, plan.with_recompute(), CONFIG, schedule=Schedule.from_lists([halves]),
                   return_state_dict=True)
    assert max_param_diff(result, reference_train(graph, BATCH, CONFIG)) < 1e-5
