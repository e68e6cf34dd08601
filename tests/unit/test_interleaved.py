"""Interleaved 1F1B (method ``interleaved``, issue 17): plans with ``v`` chunks per rank in looping
placement, the generator's order for any micro-batch count, the validator and dry run, the
simulator, the memory model per rank, the planner and the CLI."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.cli.main import main
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import Placement
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.forward_only import forward_only_schedule
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.interleaved import interleaved_programs
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import memory_need, overflows


def plan(n_ranks: int, chunks: int, n_micro: int, batch: int | None = None, names: tuple[str, ...] = ()) -> Plan:
    batch = batch or 2 * n_micro
    sizes = equal_sizes(batch, n_micro)
    layers = names or tuple(f"l{k}" for k in range(n_ranks * chunks))
    per = len(layers) // (n_ranks * chunks)
    stages = tuple(StagePlan(layers[k * per:(k + 1) * per], (k % n_ranks,), sizes, sizes)
                   for k in range(n_ranks * chunks))
    return Plan("toy", "", batch, Method.INTERLEAVED, stages)


def short(p: Plan) -> list[str]:
    return [" ".join(str(a).split("[")[0] for a in program) for program in interleaved_programs(p)]


def test_two_chunks_two_ranks_four_micro_batches_is_megatrons_order() -> None:
    assert short(plan(2, 2, 4)) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3 0STEP 2STEP",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3 1STEP 3STEP",
    ]


@pytest.mark.parametrize(("n_ranks", "chunks"), list(itertools.product([2, 3, 4], [1, 2, 3])))
def test_every_micro_batch_count_gives_a_valid_deadlock_free_schedule(n_ranks: int, chunks: int) -> None:
    """Any m, not only multiples of the rank count (torch's interleaved schedule needs those)."""
    for m in range(1, 3 * n_ranks + 2):
        schedule = build_schedule(plan(n_ranks, chunks, m))  # validates, dry run included
        assert schedule.n_ranks == n_ranks
        for rank, program in schedule:
            assert {a.stage for a in program} == {rank + c * n_ranks for c in range(chunks)}


def test_plans_must_loop_over_the_ranks_with_one_partition_per_stage() -> None:
    good = plan(2, 2, 4)
    assert good.n_ranks == 2 and good.virtual_stages == 2 and good.stages_of_rank(1) == (1, 3)
    swapped = good.stages[1], good.stages[0], *good.stages[2:]
    with pytest.raises(UserError, match="stage s on rank s mod R"):
        Plan("toy", "", 8, Method.INTERLEAVED, tuple(swapped)).validate()
    Plan("toy", "", 8, Method.INTERLEAVED, (StagePlan(("l0",), (0,), (4, 4), (4, 4)), *good.stages[1:])).validate()
    mixed = (StagePlan(("l0",), (0,), (4, 4), (2, 6)), *good.stages[1:])
    with pytest.raises(UserError, match="stage 0 differs"):
        Plan("toy", "", 8, Method.INTERLEAVED, mixed).validate()


def _cost(n_ranks: int, batch: int) -> tuple[CostModel, tuple[str, ...]]:
    graph = build_model("gpt1-14")
    cluster = Cluster.homogeneous("v100", 1, n_ranks, Link(5e-6, 1.5e11), Link(5e-6, 1.2e10))
    return CostModel(estimate_profile(graph, "v100", batch), cluster), graph.names


def test_more_chunks_shrink_the_bubble() -> None:
    """Same layers per rank: 1F1B's fill and drain shrink with v (Narayanan et al. 2021, §2.2)."""
    cost, names = _cost(4, 32)
    layers = names[1:13]  # 12 equal transformer blocks
    times = {}
    for chunks in (1, 3):
        p = plan(4, chunks, 4, 32, layers)
        p = Plan(p.model, "", 32, Method.ONE_F_ONE_B if chunks == 1 else Method.INTERLEAVED, p.stages)
        times[chunks] = simulate(build_schedule(p), p, cost)
    assert times[3].bubble_fraction() < times[1].bubble_fraction()
    assert times[3].iteration_s < times[1].iteration_s


def test_a_rank_holds_all_its_chunks_in_memory() -> None:
    """Devices big enough for every stage alone (rank 0's first holds the rank's activations) but not
    for rank 0's two chunks together overflow, reported on rank 0's first stage."""
    cost, names = _cost(2, 32)
    p = plan(2, 2, 4, 32, names[1:13])
    needs = memory_need(p, cost)
    memory = max(needs) + 1  # every stage alone fits
    assert needs[0] + needs[2] > memory >= needs[1] + needs[3]
    small = replace(cost.cluster, devices=tuple(replace(d, memory_bytes=memory) for d in cost.cluster.devices))
    assert [k for k, _, _ in overflows(p, CostModel(cost.profile, small))] == [0]


def test_forward_only_schedule_keeps_the_interleaved_order() -> None:
    schedule = forward_only_schedule(plan(2, 2, 4), 5)
    assert all(a.kind in (ActionKind.F, ActionKind.SEND_F, ActionKind.RECV_F) for _, p in schedule for a in p)
    assert [str(a).split("[")[0] for a in schedule.ranks[0] if a.kind is ActionKind.F][:3] == ["0F0", "0F1", "2F0"]


def test_planner_searches_chunks_and_micro_batches() -> None:
    cost, names = _cost(2, 16)
    problem = PlanningProblem(ModelRef.synthetic(names, "gpt1-14"), cost, 16)
    result = plan_interleaved(problem)
    assert result.plan.placement is Placement.LOOPING and result.plan.virtual_stages in (2, 3, 4)  # also interleaved-zb
    assert result.candidates[0].iteration_s <= min(c.iteration_s for c in result.candidates)
    fixed = plan_interleaved(PlanningProblem(problem.model, cost, 16, constraints=Constraints(virtual_stages=3)))
    assert {c.plan.virtual_stages for c in fixed.candidates} == {3}


def test_cli_plans_and_refuses_virtual_stages_elsewhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "profile.json"
    estimate_profile(build_model("gpt-tiny"), "cpu", 16).save(profile)
    out = tmp_path / "plan.json"
    code = main(["plan", "--model", "gpt-tiny", "--batch", "16", "--ranks", "2", "--profile", str(profile),
                 "--method", "interleaved", "--virtual-stages", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    saved = Plan.from_json(out.read_text())
    assert saved.method is Method.INTERLEAVED and saved.virtual_stages == 2
    code = main(["plan", "--model", "gpt-tiny", "--virtual-stages", "2"])
    assert code != 0 and "--virtual-stages is for --method interleaved" in capsys.readouterr().err
