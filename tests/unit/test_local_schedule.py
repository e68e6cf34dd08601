"""Method local (PPLL): plan fields, schedule, validator, bounded queues in the simulator."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import LocalParams, Method, MethodParams, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule, compute_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError, validate
from pipetrain.simulate.events import simulate
from tests.conftest import flat_profile

FREE = Link(0.0, 1e30)


def local_chain(n_stages: int, batch: int, n_micro: int, queue_depth: int = 2) -> Plan:
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(n_stages))
    return Plan("synthetic", "", batch, Method.LOCAL, stages, weights=WeightPolicy.LOCAL,
                params=LocalParams("linear", queue_depth))


def test_every_micro_batch_is_forward_local_backward_step() -> None:
    plan = local_chain(3, 6, 3)
    compute = compute_schedule(plan)
    assert [str(a) for a in compute.ranks[1]] == [
        "1F0[0:2]", "1B0[0:2]", "1STEP", "1F1[2:4]", "1B1[2:4]", "1STEP", "1F2[4:6]", "1B2[4:6]", "1STEP"]
    lowered = build_schedule(plan)
    kinds = {a.kind for _, _, a in lowered.actions()}
    assert ActionKind.SEND_B not in kinds and ActionKind.RECV_B not in kinds
    assert [str(a) for a in lowered.ranks[1][:4]] == ["1RECV_F0[0:2]<0", "1F0[0:2]", "1SEND_F0[0:2]>2", "1B0[0:2]"]


def test_plan_round_trips_and_keeps_old_plans_unchanged() -> None:
    plan = local_chain(2, 4, 2, queue_depth=3)
    assert Plan.from_json(plan.to_json()) == plan
    sync = replace(plan, method=Method.ONE_F_ONE_B, weights=WeightPolicy.SYNC, params=MethodParams())
    assert "aux" not in sync.to_json() and "queue_depth" not in sync.to_json()


def test_plans_written_before_params_keep_loading() -> None:
    """A plan file of method local from before ``params`` had its heads and queue depth at the top level."""
    data = json.loads(local_chain(2, 4, 2, queue_depth=3).to_json())
    assert data["params"] == {"aux": "linear", "queue_depth": 3}
    old = {**{k: v for k, v in data.items() if k != "params"}, "aux": "dgl", "queue_depth": 5}
    assert Plan.from_json(json.dumps(old)).params == LocalParams("dgl", 5)
    with pytest.raises(UserError, match="takes no parameter 'depth'"):
        Plan.from_json(json.dumps({**data, "params": {"aux": "linear", "depth": 2}}))
    with pytest.raises(UserError, match="needs its auxiliary heads"):
        Plan.from_json(json.dumps({k: v for k, v in data.items() if k != "params"})).validate()


@pytest.mark.parametrize(("change", "message"), [
    ({"weights": WeightPolicy.SYNC}, "go together"),
    ({"params": LocalParams("nope")}, "needs aux one of linear, dgl, infopro"),
    ({"params": LocalParams("linear", 0)}, "queue_depth >= 1"),
    ({"method": Method.GPIPE, "weights": WeightPolicy.SYNC}, "takes no auxiliary heads"),
])
def test_plan_checks_local_fields(change: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        replace(local_chain(2, 4, 2), **change).validate()  # type: ignore[arg-type]


def test_validator_refuses_gradient_messages_for_local() -> None:
    ok = build_schedule(local_chain(2, 2, 1))
    programs = [list(p) for p in ok.ranks]
    programs[0].insert(-1, Action(ActionKind.RECV_B, 0, 0, 0, 2, peer=1))
    programs[1].insert(-1, Action(ActionKind.SEND_B, 1, 0, 0, 2, peer=0))
    bad = Schedule.from_lists(programs)
    with pytest.raises(ScheduleError, match="sends no gradients"):
        validate(bad, 2, (0, 1), 2, local_queue=2)
    with pytest.raises(ScheduleError, match="STEP"):  # the end-to-end rules: one STEP, last
        validate(ok, 2, (0, 1), 2)


def test_validator_needs_a_final_step() -> None:
    programs = [list(p) for p in build_schedule(local_chain(1, 2, 2)).ranks]
    programs[0].pop()
    with pytest.raises(ScheduleError, match="does not end with STEP"):
        validate(Schedule.from_lists(programs), 2, (0,), 1, local_queue=2)


def test_steady_state_is_the_slowest_stage() -> None:
    """No backward messages: T = fill + m × max_k (f_k + b_k); here stage 1 (f 1, b 3) is the bottleneck,
    fed after stage 0's first forward, and ends last (stage 2 finishes its last micro-batch within it)."""
    cost = CostModel(flat_profile(3, [0.5, 1.0, 0.5], [0.5, 3.0, 0.5]), Cluster.local(3, link=FREE))
    plan = local_chain(3, 8, 8)
    timeline = simulate(build_schedule(plan), plan, cost)
    assert timeline.iteration_s == pytest.approx(0.5 + 8 * 4.0)


@pytest.mark.parametrize(("depth", "lead"), [(1, 2), (2, 3), (8, 8)])
def test_bounded_queue_holds_a_fast_stage_back(depth: int, lead: int) -> None:
    """Stage 0 (1 s per micro-batch) feeds stage 1 (10 s): at the moment stage 1 receives its second
    micro-batch, stage 0 has sent depth + 1 (one taken, depth queued) and waits to send more."""
    cost = CostModel(flat_profile(2, [0.5, 5.0], [0.5, 5.0]), Cluster.local(2, link=FREE))
    plan = local_chain(2, 8, 8, queue_depth=depth)
    timeline = simulate(build_schedule(plan), plan, cost)
    second = next(e for e in timeline.rank_events(1) if e.action.kind is ActionKind.RECV_F and e.action.microbatch == 1)
    sent = [e for e in timeline.rank_events(0) if e.action.kind is ActionKind.SEND_F and e.start_s < second.end_s]
    assert len(sent) == lead
