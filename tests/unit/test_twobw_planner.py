"""The ``2bw`` planner (docs/algorithms.md §3.6): depth, micro-batch size and recompute under memory."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pipetrain import cli
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.registry import get_planner, run_planner
from pipetrain.planners.score import over_memory, score_steady
from pipetrain.planners.twobw import TwoBWReport, micro_batch_sizes, plan_2bw, two_bw_plan
from pipetrain.schedule.generators import build_schedule
from tests.conftest import flat_profile

NAMES = ModelRef.synthetic([f"l{i}" for i in range(8)])
MB = 10**6


def problem(memory: int, *, output_bytes: int = 1000, bandwidth: float = 1e9, per_sample: bool = False,
            batch: int = 16) -> PlanningProblem:
    """Eight equal layers (1 ms forward, 2 ms backward per micro-batch; 10 MB of weights and 1 MB of
    activations per sample each) on 4 devices of ``memory`` bytes."""
    profile = flat_profile(8, 1e-3, 2e-3, per_sample=per_sample, output_bytes=output_bytes, saved_bytes=MB,
                           parameter_bytes=10 * MB)
    cost = CostModel(profile, Cluster.local(4, link=Link(5e-6, bandwidth), memory_bytes=memory))
    return PlanningProblem(NAMES, cost, batch_size=batch)


def test_plan_is_2bw_and_runs() -> None:
    result = run_planner("2bw", problem(1 << 40))
    assert result.plan.method is Method.TWO_BW and result.plan.weights is WeightPolicy.TWO_BW
    assert isinstance(result.report, TwoBWReport) and result.report.width == 1
    assert any("replicated" in why for _, why in result.report.skipped)
    build_schedule(result.plan)  # validates
    assert result.plan.prediction is not None and "steady state" in result.plan.prediction.basis
    assert get_planner("2bw").kind == "stages"


def test_micro_batch_sizes_are_powers_of_two_with_enough_micro_batches() -> None:
    assert micro_batch_sizes(16, 4) == [4, 2, 1]
    assert micro_batch_sizes(12, 1) == [4, 2, 1]


def test_tight_activation_memory_forces_recompute_or_smaller_micro_batches() -> None:
    free = plan_2bw(problem(1 << 40))
    assert isinstance(free.report, TwoBWReport)
    tight = plan_2bw(problem(65 * MB))
    assert isinstance(tight.report, TwoBWReport)
    assert not over_memory(tight.plan, problem(65 * MB).cost.on(tight.cluster))
    assert tight.report.recompute or tight.report.micro_batch < free.report.micro_batch
    assert (tight.report.recompute, tight.report.micro_batch) != (free.report.recompute, free.report.micro_batch)


def test_tight_weight_memory_forces_more_depth() -> None:
    """Costly activations between stages make one stage fastest; weights that fit only on 4 devices force depth."""
    free = plan_2bw(problem(1 << 40, output_bytes=10**8, bandwidth=1e8))
    assert isinstance(free.report, TwoBWReport) and free.report.depth == 1
    tight = plan_2bw(problem(120 * MB, output_bytes=10**8, bandwidth=1e8))
    assert isinstance(tight.report, TwoBWReport) and tight.report.depth > 1


def test_deterministic() -> None:
    assert plan_2bw(problem(65 * MB)).plan == plan_2bw(problem(65 * MB)).plan


def test_best_of_brute_force() -> None:
    p = problem(65 * MB, per_sample=True)
    best = float("inf")
    for depth, recompute in itertools.product(range(1, 5), (False, True)):
        sub, _ = placed_cluster(p.cost.cluster, range(depth))
        for b in (1, 2, 4, 8, 16):
            if p.batch_size // b < depth:
                continue
            plan = two_bw_plan(p, depth, b, recompute)
            if not over_memory(plan, p.cost.on(sub)):
                best = min(best, score_steady(plan, p.cost.on(sub)).iteration_s)
    # rank_key ties plans within 3 significant digits and prefers the one with less memory
    assert plan_2bw(p).candidates[0].iteration_s == pytest.approx(best, rel=1e-3)
    assert min(c.iteration_s for c in plan_2bw(p).candidates) == pytest.approx(best, rel=1e-12)


def test_refuses_another_method_and_no_fit() -> None:
    with pytest.raises(UserError, match="plans method 2bw"):
        run_planner("2bw", PlanningProblem(NAMES, problem(1 << 40).cost, 16,
                                           constraints=Constraints(method=Method.PIPEDREAM)))
    with pytest.raises(UserError, match="no plan that fits"):
        plan_2bw(problem(MB))


@pytest.mark.parametrize("method", [[], ["--method", "2bw"]])
def test_cli_plans_2bw(tmp_path: Path, method: list[str]) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "gpt-tiny", "--batch", "16", "--estimate", "v100", "--ranks", "2",
                     "--planner", "2bw", *method, "--out", str(out)]) == 0
    plan = Plan.from_json(out.read_text())
    assert plan.method is Method.TWO_BW and plan.prediction is not None


def test_cli_refuses_another_method_with_the_2bw_planner(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--model", "gpt-tiny", "--planner", "2bw", "--method", "pipedream", "--estimate", "v100"])
    assert code == 2 and "--method 2bw" in capsys.readouterr().err
