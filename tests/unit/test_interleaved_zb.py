"""Method ``interleaved-zb`` (issue 17): interleaved 1F1B (Narayanan et al. 2021 §2.2) with the
backward split into B and deferred W (Qi et al. 2024 §2–3). Orders, the memory bound, validation and
dry run over a grid, the simulator, the planner, the CLI and the plan's refusals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cli.main import main
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, ZeroBubbleParams
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.interleaved import build_interleaved_plan, plan_interleaved
from pipetrain.planners.score import score
from pipetrain.profile.estimate import estimate_profile
from pipetrain.runtime.interp.executor import check_runnable
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule, compute_schedule
from pipetrain.schedule.interleaved_zb import held_bound, interleaved_zb_programs
from pipetrain.schedule.passes import add_communication
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import ScheduleError, validate_for_plan
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks
from tests.conftest import flat_profile

FREE = Link(0.0, 1e30)


def plan(n_ranks: int, chunks: int, n_micro: int, method: Method = Method.INTERLEAVED_ZB) -> Plan:
    """One layer per stage, micro-batches of 2 samples."""
    sizes = equal_sizes(2 * n_micro, n_micro)
    stages = tuple(StagePlan((f"l{k}",), (k % n_ranks,), sizes, sizes) for k in range(n_ranks * chunks))
    return Plan("synthetic", "", 2 * n_micro, method, stages)


def short(p: Plan) -> list[str]:
    return [" ".join(str(a).split("[")[0] for a in program) for program in interleaved_zb_programs(p)]


def test_two_ranks_two_chunks_four_micro_batches() -> None:
    """The module docstring's example: interleaved's F/B order kept, W placed by ZB-H1's rule."""
    assert short(plan(2, 2, 4)) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 2W0 0F3 2B1 2W1 2F2 0B0 0W0 2F3 0B1 0W1 2B2 2W2 2B3 2W3 0B2 0W2 0B3 0W3 "
        "0STEP 2STEP",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 3W0 1F3 1B1 3W1 3F2 3B2 1W0 3F3 3B3 1W1 1B2 3W2 1B3 3W3 1W2 1W3 "
        "1STEP 3STEP",
    ]


def _held_counts(p: Plan) -> list[int]:
    """Per rank, the most (chunk, micro-batch) pairs held from F to W (to B when not split)."""
    cost = CostModel(flat_profile(p.n_stages, saved_bytes=1), Cluster.local(p.n_ranks, link=FREE))
    return [peak // 2 for peak in activation_peaks(p, cost)]  # 2 samples of 1 byte per pair


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4), st.integers(2, 3), st.integers(1, 9))
def test_orders_are_valid_complete_and_within_interleaved_memory(n_ranks: int, chunks: int, n_micro: int) -> None:
    """Any m (also m not divisible by the rank count): the validator and its dry run pass; each stage
    runs F, B and W once per micro-batch, every W after its B and before the STEP; no rank holds more
    pairs than ``H`` nor than the fullest rank under interleaved 1F1B."""
    p = plan(n_ranks, chunks, n_micro)
    schedule = build_schedule(p)  # validates: coverage, W after its B, STEP last, dry run (no deadlock)
    for rank, program in schedule:
        for stage in p.stages_of_rank(rank):
            own = [a for a in program if a.stage == stage]
            for kind in (ActionKind.F, ActionKind.B, ActionKind.W):
                assert sorted(a.microbatch for a in own if a.kind is kind) == list(range(n_micro))
            b_at = {a.microbatch: i for i, a in enumerate(own) if a.kind is ActionKind.B}
            assert all(b_at[a.microbatch] < i for i, a in enumerate(own) if a.kind is ActionKind.W)
            assert own[-1].kind is ActionKind.STEP
    held = _held_counts(p)
    assert max(held) <= min(held_bound(n_ranks, chunks), chunks * n_micro)
    assert max(held) <= max(_held_counts(plan(n_ranks, chunks, n_micro, Method.INTERLEAVED)))


@pytest.mark.parametrize(("n_ranks", "chunks"), [(r, v) for r in (2, 3, 4) for v in (2, 3)])
def test_whole_grid_validates(n_ranks: int, chunks: int) -> None:
    """Every m in 1..9 (the property test above samples the same grid): validator and dry run pass."""
    for n_micro in range(1, 10):
        schedule = build_schedule(plan(n_ranks, chunks, n_micro))
        assert sum(a.kind is ActionKind.W for _, program in schedule for a in program) == n_ranks * chunks * n_micro


def test_strict_memory_variant_holds_each_ranks_interleaved_count() -> None:
    for n_ranks, chunks, n_micro in ((2, 2, 4), (3, 2, 5), (4, 3, 9), (4, 2, 3)):
        p = plan(n_ranks, chunks, n_micro)
        strict = add_communication(compute_schedule(replace(p, params=ZeroBubbleParams(strict_memory=True))), p)
        validate_for_plan(strict, p)
        cost = CostModel(flat_profile(p.n_stages, saved_bytes=1), Cluster.local(n_ranks, link=FREE))
        fused = plan(n_ranks, chunks, n_micro, Method.INTERLEAVED)
        assert activation_peaks(p, cost, strict) == activation_peaks(fused, cost)


def test_f_and_b_keep_interleaved_order() -> None:
    for n_micro in (3, 4, 7):
        zb, fused = (compute_schedule(plan(3, 2, n_micro, m)) for m in (Method.INTERLEAVED_ZB, Method.INTERLEAVED))
        for rank in range(3):
            assert [a for a in zb.ranks[rank] if a.kind is not ActionKind.W] == list(fused.ranks[rank])


def test_validator_rejects_a_w_before_its_b_and_a_stage_left_fused() -> None:
    p = plan(2, 2, 2)
    programs = [list(program) for _, program in build_schedule(p)]
    early = list(programs[0])
    w = next(i for i, a in enumerate(early) if a.kind is ActionKind.W)
    b = max(i for i, a in enumerate(early[:w]) if a.kind is ActionKind.B)
    early[b], early[w] = early[w], early[b]
    with pytest.raises(ScheduleError, match="W before a B"):
        check_runnable(Schedule.from_lists([early, programs[1]]), p)
    stage = programs[0][0].stage  # drop one stage's W actions on rank 0: the rank would split only the other's
    half = [a for a in programs[0] if not (a.kind is ActionKind.W and a.stage == stage)]
    with pytest.raises(ScheduleError, match="has no W actions"):
        check_runnable(Schedule.from_lists([half, programs[1]]), p)


def test_plan_recomputes_per_stage_and_round_trips() -> None:
    p = plan(2, 2, 4)
    assert p.virtual_stages == 2 and Plan.from_json(p.to_json()) == p
    some = p.with_recompute([1, 2])
    some.validate()
    assert Plan.from_json(some.to_json()) == some and [some.recomputes(k) for k in range(4)] == [0, 1, 1, 0]


def test_simulator_fills_interleaved_bubbles_with_w() -> None:
    """F = 1, backward = 2 split evenly into B and W: deferred W fills the waits (R = 2, v = 2, m = 4:
    24 units of work per rank, 27 fused, 25 split)."""
    for n_ranks, chunks, n_micro in ((2, 2, 4), (4, 2, 8), (3, 3, 5)):
        cost = CostModel(flat_profile(n_ranks * chunks, 1.0, 2.0, saved_bytes=1, parameter_bytes=4),
                         Cluster.local(n_ranks, link=FREE))
        fused, zb = (plan(n_ranks, chunks, n_micro, m) for m in (Method.INTERLEAVED, Method.INTERLEAVED_ZB))
        t_fused = simulate(build_schedule(fused), fused, cost)
        t_zb = simulate(build_schedule(zb), zb, cost)
        assert t_zb.iteration_s < t_fused.iteration_s - 1.5
        assert t_zb.peak_activation_bytes == activation_peaks(zb, cost)


def _gpt_cost(n_ranks: int, batch: int) -> tuple[CostModel, tuple[str, ...]]:
    graph = build_model("gpt1-14")
    cluster = Cluster.homogeneous("v100", 1, n_ranks, Link(5e-6, 1.5e11), Link(5e-6, 1.2e10))
    return CostModel(estimate_profile(graph, "v100", batch), cluster), graph.names


def test_planner_scores_both_backwards_and_takes_a_fixed_method() -> None:
    cost, names = _gpt_cost(2, 16)
    model = ModelRef.synthetic(names, "gpt1-14")
    both = plan_interleaved(PlanningProblem(model, cost, 16, constraints=Constraints(virtual_stages=2, n_micro=4)))
    each = {m: score(build_interleaved_plan(model, cost, n_ranks=2, chunks=2, batch_size=16, n_micro=4, method=m),
                     cost).iteration_s
            for m in (Method.INTERLEAVED, Method.INTERLEAVED_ZB, Method.ZBV, Method.DUALPIPEV)}  # m = 4: one per stage
    assert both.plan.prediction is not None and both.plan.prediction.iteration_s == min(each.values())
    assert {c.plan.method for c in both.candidates} <= set(each)  # best first: the slower ones may go unscored
    fixed = Constraints(method=Method.INTERLEAVED_ZB, virtual_stages=2)
    result = plan_interleaved(PlanningProblem(model, cost, 16, constraints=fixed))
    assert {c.plan.method for c in result.candidates} == {Method.INTERLEAVED_ZB}
    with pytest.raises(UserError, match="plans methods interleaved, interleaved-zb, zbv and dualpipev"):
        plan_interleaved(PlanningProblem(model, cost, 16, constraints=Constraints(method=Method.ZB1)))


def test_cli_plans_and_simulates_interleaved_zb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "profile.json"
    estimate_profile(build_model("gpt-tiny"), "cpu", 16).save(profile)
    out = tmp_path / "plan.json"
    code = main(["plan", "--model", "gpt-tiny", "--batch", "16", "--ranks", "2", "--profile", str(profile),
                 "--method", "interleaved-zb", "--virtual-stages", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    saved = Plan.from_json(out.read_text())
    assert saved.method is Method.INTERLEAVED_ZB and saved.virtual_stages == 2
    fused = tmp_path / "fused.json"
    fused.write_text(saved.run_by(Method.INTERLEAVED).to_json())
    code = main(["simulate", "--plan", str(fused), "--method", "interleaved-zb", "--profile", str(profile),
                 "--out-dir", str(tmp_path / "sim")])
    assert code == 0, capsys.readouterr().out
    schedule = Schedule.from_csv((tmp_path / "sim" / "schedule.csv").read_text())
    assert any(a.kind is ActionKind.W for a in schedule.ranks[0])


def test_cli_simulate_recuts_a_plan_into_chunks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --method interleaved-zb --virtual-stages 3`` on a 2-stage 1f1b plan: 6 looping stages."""
    profile = tmp_path / "profile.json"
    estimate_profile(build_model("gpt-tiny"), "cpu", 16).save(profile)
    one = tmp_path / "1f1b.json"
    assert main(["plan", "--model", "gpt-tiny", "--batch", "16", "--ranks", "2", "--profile", str(profile),
                 "--method", "1f1b", "--micro", "4", "--out", str(one)]) == 0, capsys.readouterr().out
    code = main(["simulate", "--plan", str(one), "--method", "interleaved-zb", "--virtual-stages", "3",
                 "--profile", str(profile), "--out-dir", str(tmp_path / "sim")])
    assert code == 0, capsys.readouterr().out
    schedule = Schedule.from_csv((tmp_path / "sim" / "schedule.csv").read_text())
    assert {a.stage for a in schedule.ranks[1] if a.kind is ActionKind.W} == {1, 3, 5}
    assert len({a.microbatch for a in schedule.ranks[0] if a.kind is ActionKind.F}) == 4
    code = main(["simulate", "--plan", str(one), "--virtual-stages", "2", "--profile", str(profile)])
    assert code != 0 and "--virtual-stages is for --method interleaved" in capsys.readouterr().err
