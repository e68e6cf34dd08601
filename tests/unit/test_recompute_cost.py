"""Recompute per stage, costed (issue 28 item 3): the simulator charges a recomputing stage's forward
again in its backward (a fused B, or a split backward's B; W unchanged), the memory model holds only
its inputs from F to B and the re-run's graph during B (until W under a split backward), and
neither touches the stages that keep their activations. Old plans' top-level flag still loads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.profile.table import Profile
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks, stage_memory
from pipetrain.viz.tables import memory_table, timeline_table
from tests.conftest import flat_profile

BATCH = 12
SAVED, INPUT, HELD = 10, 3, 2  # bytes per sample: saved activations, stage input, split backward's held gradients


def _profile(n_layers: int) -> Profile:
    profile = flat_profile(n_layers, 1.0, 2.0, per_sample=True, saved_bytes=SAVED, output_bytes=INPUT,
                           parameter_bytes=100)
    return replace(profile, layers=tuple(replace(lp, held_grad_bytes_per_sample=HELD) for lp in profile.layers))


def _plan(method: Method, n_stages: int, n_micro: int, recompute: tuple[int, ...]) -> Plan:
    sizes = equal_sizes(BATCH, n_micro)
    stages = tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(n_stages))
    return Plan("synthetic", "", BATCH, method, stages).with_recompute(recompute)


def _durations(plan: Plan, cost: CostModel, kind: ActionKind) -> dict[int, set[float]]:
    """Per stage, the distinct simulated durations of its actions of ``kind``."""
    timeline = simulate(build_schedule(plan), plan, cost)
    out: dict[int, set[float]] = {}
    for e in timeline.events:
        if e.action.kind is kind:
            out.setdefault(e.action.stage, set()).add(round(e.duration_s, 9))
    return out


@pytest.mark.parametrize("method", [Method.GPIPE, Method.ONE_F_ONE_B])
def test_fused_backward_pays_the_forward_again_on_recomputing_stages_only(method: Method) -> None:
    cost = CostModel(_profile(2), Cluster.local(2))
    plan = _plan(method, 2, 4, (1,))
    b = BATCH // 4
    durations = _durations(plan, cost, ActionKind.B)
    assert durations[0] == {round(cost.backward_s(("l0",), b, 0), 9)}
    assert durations[1] == {round(cost.backward_s(("l1",), b, 1) + cost.forward_s(("l1",), b, 1)
                                  - cost.action_overhead_s, 9)}
    slower = simulate(build_schedule(plan), plan, cost).iteration_s
    assert slower > simulate(build_schedule(plan.with_recompute(())), plan.with_recompute(()), cost).iteration_s


@pytest.mark.parametrize("method", [Method.ZB1, Method.ZB2])
def test_split_backward_re_runs_forward_in_b_and_leaves_w_alone(method: Method) -> None:
    cost = CostModel(_profile(2), Cluster.local(2))
    plan = _plan(method, 2, 4, (0,))
    b = BATCH // 4
    bs, ws = _durations(plan, cost, ActionKind.B), _durations(plan, cost, ActionKind.W)
    plain_b = cost.backward_input_s(("l0",), b, 0)
    assert bs[0] == {round(plain_b + cost.forward_s(("l0",), b, 0) - cost.action_overhead_s, 9)}
    assert bs[1] == {round(cost.backward_input_s(("l1",), b, 1), 9)}
    assert ws[0] == {round(cost.weight_grad_s(("l0",), b, 0), 9)}


def test_memory_holds_inputs_on_recomputing_stages_only() -> None:
    """1F1B on 3 stages, 6 micro-batches of 2: stage k holds min(m, K − k) micro-batches; the
    recomputing stage 1 their inputs plus one re-run, the others their saved activations."""
    cost = CostModel(_profile(3), Cluster.local(3))
    plan, b = _plan(Method.ONE_F_ONE_B, 3, 6, (1,)), 2
    memories = stage_memory(plan, cost)
    assert [m.activation_bytes for m in memories] == [3 * SAVED * b, 2 * INPUT * b + SAVED * b, SAVED * b]
    assert activation_peaks(plan, cost) == simulate(build_schedule(plan), plan, cost).peak_activation_bytes
    table = memory_table(memories, [1 << 20] * 3, recompute=[plan.recomputes(k) for k in range(3)])
    assert f"{2 * INPUT * b + SAVED * b} B" in table and f"{3 * SAVED * b} B" in table
    assert "recompute" in table and "recompute" not in memory_table(memories, [1 << 20] * 3)
    timeline = simulate(build_schedule(plan), plan, cost)
    marked = timeline_table(timeline, plan.rank_stages, recompute=[plan.recomputes(k) for k in range(3)])
    assert "recompute" in marked and "recompute" not in timeline_table(timeline, plan.rank_stages)


def test_split_backward_keeps_the_re_run_graph_until_w() -> None:
    """One stage, F0 F1 B0 W0 B1 W1 of 6 samples each: keeping, the peak is both forwards' saved bytes
    plus B0's held gradients; recomputing, the two stashed inputs plus B0's re-run and its gradients."""
    cost = CostModel(_profile(1), Cluster.local(1))
    texts = ("0F0[0:6]", "0F1[6:12]", "0B0[0:6]", "0W0[0:6]", "0B1[6:12]", "0W1[6:12]", "0STEP")
    schedule = Schedule.from_lists([[Action.parse(t) for t in texts]])
    keep = _plan(Method.ZB1, 1, 2, ())
    assert activation_peaks(keep, cost, schedule) == (2 * SAVED * 6 + HELD * 6,)
    recompute = keep.with_recompute()
    assert activation_peaks(recompute, cost, schedule) == (2 * INPUT * 6 + SAVED * 6 + HELD * 6,)
    assert simulate(schedule, recompute, cost).peak_activation_bytes == activation_peaks(recompute, cost, schedule)


def test_interleaved_and_v_plans_cost_recompute_per_chunk() -> None:
    """Looping and V placements: the simulator's iteration grows and the memory of the rank holding
    the recomputing chunk falls, the other rank's memory unchanged."""
    cost = CostModel(_profile(4), Cluster.local(2))
    for method, placed in ((Method.INTERLEAVED_ZB, (0, 1, 0, 1)), (Method.ZBV, (0, 1, 1, 0))):
        sizes = equal_sizes(BATCH, 4)
        stages = tuple(StagePlan((f"l{k}",), (r,), sizes, sizes) for k, r in enumerate(placed))
        keep = Plan("synthetic", "", BATCH, method, stages)
        some = keep.with_recompute([0])  # on rank 0
        kept, recomputed = simulate(build_schedule(keep), keep, cost), simulate(build_schedule(some), some, cost)
        assert recomputed.iteration_s > kept.iteration_s
        assert recomputed.peak_activation_bytes[0] < kept.peak_activation_bytes[0]
        assert recomputed.peak_activation_bytes[1] == kept.peak_activation_bytes[1]


def test_plan_json_per_stage_and_the_old_flag() -> None:
    plan = _plan(Method.ONE_F_ONE_B, 3, 4, (2,))
    assert Plan.from_json(plan.to_json()) == plan and plan.recompute_stages == (2,)
    data = json.loads(plan.to_json())
    assert "recompute" not in data and [s.get("recompute", False) for s in data["stages"]] == [False, False, True]
    old = json.loads(_plan(Method.ONE_F_ONE_B, 3, 4, ()).to_json())
    old["recompute"] = True  # a plan written when recompute was one flag for the whole plan
    assert Plan.from_json(json.dumps(old)).recompute_stages == (0, 1, 2)
