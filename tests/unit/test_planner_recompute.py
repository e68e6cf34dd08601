"""The planners choose recompute under memory pressure (issue 28 item 3): when the best plan does not fit,
they recompute the stages that overflow, cheapest first, and keep the fastest plan that fits; the plan
says which stages recompute and why. With ample memory, or ``recompute="none"``, nothing recomputes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.cli import main
from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import fastest_fitting, plan_balanced
from pipetrain.planners.contract import Candidate, Constraints, ModelRef, PlanningProblem, RecomputeChoice
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.planners.recompute import recomputing
from pipetrain.planners.score import memory_checked, score
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.simulate.memory import memory_need

BATCH = 32
NAMES = tuple(f"l{i}" for i in range(8))
MIB = 2**20


def profile(heavy: tuple[str, ...] = ("l7",)) -> Profile:
    """8 layers with small inputs (128 B per sample); the ``heavy`` ones save 1 MiB per sample."""
    layers = tuple(LayerProfile(name, (1, BATCH), (1e-3, 8e-3), (2e-3, 16e-3), 128,
                                MIB if name in heavy else 256, 4096, 1e6) for name in NAMES)
    return Profile("synthetic", "", "cpu", "synthetic", 128, layers)


def problem(memory: int, *, cap: bool = True, recompute: RecomputeChoice = "auto",
            method: Method = Method.GPIPE) -> PlanningProblem:
    link = Link(1e-4, 1e9)
    cluster = Cluster(tuple(Device("cpu", memory) for _ in range(2)), link, link, "test")
    return PlanningProblem(ModelRef.synthetic(list(NAMES)), CostModel(profile(), cluster), BATCH,
                           constraints=Constraints(method=method, memory_cap=cap, recompute=recompute))


def test_small_memory_recomputes_the_overflowing_stage_only() -> None:
    """GPipe holds every micro-batch's activations: stage 1 (heavy l7) needs 32 MiB whatever the micro-batch
    count; recomputing, its stashed inputs and one micro-batch's re-run fit 8 MiB."""
    small = plan_balanced(problem(8 * MIB)).plan
    assert small.recompute_stages == (1,) and not small.recomputes(0)
    assert small.prediction is not None and "recompute stage 1 (without: stage 1 needs" in small.prediction.basis
    assert max(memory_need(small, CostModel(profile(), problem(8 * MIB).cost.cluster))) <= 8 * MIB
    ample = plan_balanced(problem(2**40)).plan
    assert ample.recompute_stages == ()
    assert ample.prediction is not None and small.prediction.iteration_s > ample.prediction.iteration_s
    with pytest.raises(UserError, match="no balanced plan fits"):
        plan_balanced(problem(8 * MIB, recompute="none"))
    assert plan_balanced(problem(2**40, recompute="all")).plan.recompute_stages == (0, 1)


def test_auto_takes_a_recomputing_plan_when_nothing_else_fits() -> None:
    """auto runs the balanced planner without the cap, then keeps its fastest plan that fits: here one
    that recomputes stage 1."""
    tight = problem(8 * MIB, cap=False)
    result = fastest_fitting(plan_balanced(tight), tight)
    assert result.plan.recompute_stages == (1,)
    with pytest.raises(UserError, match="no equal plan"):
        fastest_fitting(plan_balanced(tight), replace(tight, constraints=replace(tight.constraints, recompute="none")))


def _tight(method: Method) -> tuple[Candidate, CostModel]:
    """Every layer heavy, 2 chunks per rank, 8 micro-batches: the plan over memory on a cluster with room
    between its ranks' needs (or just under them, when they are equal), and that cluster's cost model."""
    cost = CostModel(profile(NAMES), problem(2**40).cost.cluster)
    plan = build_interleaved_plan(ModelRef.synthetic(list(NAMES)), cost, n_ranks=2, chunks=2, batch_size=BATCH,
                                  n_micro=8, method=method)
    need = memory_need(plan, cost)  # per stage; a rank holds its chunks together
    by_rank = [sum(need[k] for k in plan.stages_of_rank(r)) for r in range(2)]
    room = (by_rank[0] + by_rank[1]) // 2 if by_rank[0] != by_rank[1] else by_rank[0] - MIB
    tight = CostModel(profile(NAMES), replace(cost.cluster, devices=tuple(Device("cpu", room) for _ in range(2))))
    over = memory_checked(score(plan, tight), tight, "sgd")
    assert not over.feasible
    return over, tight


def test_chunks_recompute_on_the_overflowing_rank_only() -> None:
    """Interleaved 1F1B: rank 0 holds more micro-batches in flight than rank 1; with memory between the
    two, only rank 0's chunks (stages 0 and 2) recompute, and the plan then fits."""
    over, tight = _tight(Method.INTERLEAVED)
    fitted = recomputing(over, tight, "sgd")
    assert fitted is not None and fitted.feasible
    assert fitted.plan.recompute_stages and set(fitted.plan.recompute_stages) <= {0, 2}


def test_split_backward_chunks_recompute_as_few_as_fit() -> None:
    """Split backward balances the ranks' memory: just under it both ranks overflow, and one chunk each
    (the cheapest, here the first on each rank) recomputing makes interleaved-zb fit."""
    over, tight = _tight(Method.INTERLEAVED_ZB)
    fitted = recomputing(over, tight, "sgd")
    assert fitted is not None and fitted.feasible and fitted.plan.recompute_stages == (0, 1)


def test_recompute_that_frees_nothing_is_no_option() -> None:
    """ZB-V's middle rank peaks while its B's wait for their W's, and a recomputing stage keeps the
    re-run's graph until W: recomputing its chunks frees nothing there, so no variant fits."""
    over, tight = _tight(Method.ZBV)
    assert recomputing(over, tight, "sgd") is None


def test_cli_recompute_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``plan --recompute all`` recomputes every stage and the plan table marks them; a planner that does
    not take the choice refuses it."""
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "mlp-digits", "--batch", "16", "--ranks", "2", "--estimate", "v100",
            "--method", "1f1b", "--micro", "4", "--out", str(out)]
    assert main([*argv, "--recompute", "all"]) == 0
    assert Plan.from_json(out.read_text()).recompute_stages == (0, 1)
    assert "recompute" in capsys.readouterr().out
    assert main(argv) == 0 and Plan.from_json(out.read_text()).recompute_stages == ()  # ample memory
    assert main([*argv[:-4], "--planner", "bapipe", "--recompute", "none", "--out", str(out)]) == 2
    assert "--recompute" in capsys.readouterr().err
