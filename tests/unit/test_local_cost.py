"""Method local's auxiliary heads in the cost model: simulator, steady state, planner, head profiles."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain import api
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, MethodParams, WeightPolicy
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.local import build_local_plan, plan_local
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.heads import head_profiles
from pipetrain.profile.table import LayerProfile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.steady import steady_state
from tests.conftest import flat_profile
from tests.unit.test_local_schedule import local_chain

FREE = Link(0.0, 1e30)
HEAD_F, HEAD_B, HEAD_STEP = 0.5, 0.7, 0.1


def head(after: str, forward_s: float = HEAD_F, backward_s: float = HEAD_B) -> LayerProfile:
    return LayerProfile(f"aux:{after}", (1, 2), (forward_s, forward_s), (backward_s, backward_s), 0, 0, 0, 0.0,
                        HEAD_STEP)


def costs(n_layers: int, heads: dict[str, LayerProfile]) -> tuple[CostModel, CostModel]:
    """Cost models of ``n_layers`` flat layers (forward 1 s, backward 2 s) without and with ``heads``."""
    plain = CostModel(flat_profile(n_layers), Cluster.local(n_layers, link=FREE))
    return plain, plain.with_heads({"cpu": heads})


def test_the_head_lengthens_forward_backward_and_step_of_its_stage_only() -> None:
    _, with_heads = costs(2, {"l0": head("l0")})
    plan = local_chain(2, 4, 2)
    timeline = simulate(build_schedule(plan), plan, with_heads)
    durations = {(e.rank, e.action.kind): e.end_s - e.start_s for e in timeline.events}
    assert durations[(0, ActionKind.F)] == pytest.approx(1.0 + HEAD_F)
    assert durations[(0, ActionKind.B)] == pytest.approx(2.0 + HEAD_B)
    assert durations[(0, ActionKind.STEP)] == pytest.approx(HEAD_STEP)
    assert durations[(1, ActionKind.F)] == pytest.approx(1.0)  # the last stage has no head
    assert durations[(1, ActionKind.STEP)] == pytest.approx(0.0)


def test_a_local_plans_time_grows_by_the_heads_time() -> None:
    """Stage 0 with its head becomes the bottleneck: 7 micro-batches pay its F + B + head + STEP, then
    the last one's F and head forward feed stage 1 (F + B), which ends the iteration."""
    plain, with_heads = costs(2, {"l0": head("l0")})
    plan = local_chain(2, 8, 8)
    before = simulate(build_schedule(plan), plan, plain).iteration_s
    after = simulate(build_schedule(plan), plan, with_heads).iteration_s
    assert before == pytest.approx(1.0 + 8 * 3.0)
    assert after == pytest.approx(before + 7 * (HEAD_F + HEAD_B + HEAD_STEP) + HEAD_F)


def test_steady_state_is_one_over_the_slowest_stage_with_its_head() -> None:
    plain, with_heads = costs(3, {"l0": head("l0"), "l1": head("l1", 2.0, 2.0)})
    plan = local_chain(3, 8, 4)
    steady = steady_state(plan, with_heads)
    per_micro = 1.0 + 2.0 + 2.0 + 2.0 + HEAD_STEP  # stage 1: forward, backward, its head, the head's step
    assert steady.batch_s == pytest.approx(4 * per_micro)
    assert steady.samples_per_s == pytest.approx(8 / (4 * per_micro))
    assert steady_state(plan, plain).batch_s == pytest.approx(4 * 3.0)


def test_heads_count_for_method_local_only() -> None:
    plain, with_heads = costs(2, {"l0": head("l0")})
    sync = replace(local_chain(2, 8, 8), method=Method.ONE_F_ONE_B, weights=WeightPolicy.SYNC, params=MethodParams())
    assert simulate(build_schedule(sync), sync, with_heads).iteration_s == pytest.approx(
        simulate(build_schedule(sync), sync, plain).iteration_s)


def test_the_planner_moves_layers_off_a_stage_whose_head_is_expensive() -> None:
    """Four equal layers (3 s each) on two stages: 2/2 without heads; a 4.5 s head on stage 0 makes
    1/3 the better cut (max(3 + 4.5, 9) = 9 < max(6 + 4.5, 6))."""
    names = ("l0", "l1", "l2")
    plain, with_heads = costs(4, {n: head(n, 2.0, 2.4) for n in names})
    model = ModelRef.synthetic(["l0", "l1", "l2", "l3"])
    kwargs = {"aux": "dgl", "queue_depth": 2, "n_stages": 2, "batch_size": 8, "n_micro": 8}
    assert [len(s.layers) for s in build_local_plan(model, plain, **kwargs).stages] == [2, 2]  # type: ignore[arg-type]
    assert [len(s.layers) for s in build_local_plan(model, with_heads, **kwargs).stages] == [1, 3]  # type: ignore[arg-type]
    result = plan_local(PlanningProblem(model, with_heads, 8,
                                        constraints=Constraints(n_stages=2, params=LocalParams("dgl", 2))))
    assert [len(s.layers) for s in result.plan.stages] == [1, 3]
    assert result.plan.method is Method.LOCAL and result.plan.params == LocalParams("dgl", 2)
    assert all(c.plan.method is Method.LOCAL for c in result.candidates)


def test_estimated_heads_follow_every_layer_but_the_last() -> None:
    graph = build_model("mlp-digits")
    profile = estimate_profile(graph, "v100", 8)
    linear, dgl = head_profiles(graph, profile, "linear"), head_profiles(graph, profile, "dgl")
    assert list(linear) == list(graph.names)[:-1]
    assert all(h.name == f"aux:{n}" and h.sizes == profile.layers[0].sizes for n, h in dgl.items())
    for name in linear:
        assert 0 < linear[name].forward_at(8) < dgl[name].forward_at(8)
        assert 0 < linear[name].backward_at(8) < dgl[name].backward_at(8)
        assert 0 < linear[name].parameter_bytes < dgl[name].parameter_bytes
    assert head_profiles(graph, profile, "linear", after=["block1"]) == {"block1": linear["block1"]}


def test_measured_heads_are_timed_here() -> None:
    graph = build_model("mlp-digits")
    profile = replace(estimate_profile(graph, "cpu", 4), device="cpu", source="measured on cpu")
    heads = head_profiles(graph, profile, "linear", repeats=1)
    assert all(h.step_s is not None and min(h.forward_s) > 0 and min(h.backward_s) > 0 for h in heads.values())


def test_api_plans_and_predicts_local_with_heads() -> None:
    graph = build_model("vit-digits")
    profile = estimate_profile(graph, "v100", 16)
    cluster, _ = api.estimated_cluster("v100", 2)
    result = api.plan(graph, profile, cluster, batch_size=16, planner="local",
                      constraints=Constraints(n_micro=4, params=LocalParams("dgl")))
    plan = result.plan
    _, predicted = api.predict(plan, profile, cluster, graph=graph)
    assert predicted.iteration_s == pytest.approx(result.candidates[0].iteration_s)
    without = simulate(build_schedule(plan), plan, CostModel(profile, cluster))
    assert predicted.iteration_s > without.iteration_s
    with pytest.raises(UserError, match="pass graph="):
        api.predict(plan, profile, cluster)
