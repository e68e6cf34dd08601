"""The ``2bw`` planner (docs/algorithms.md §3.6): width × depth, micro-batch size and recompute under memory."""

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
from pipetrain.planners.twobw import TwoBWReport, micro_batch_sizes, plan_2bw, two_bw_plan, widths_and_depths
from pipetrain.schedule.generators import build_schedule
from tests.conftest import flat_profile

NAMES = ModelRef.synthetic([f"l{i}" for i in range(8)])
MB = 10**6


def problem(memory: int, *, output_bytes: int = 1000, bandwidth: float = 1e9, per_sample: bool = False,
            batch: int = 16, parameter_bytes: int = 10 * MB) -> PlanningProblem:
    """Eight equal layers (1 ms forward, 2 ms backward per micro-batch; 10 MB of weights and 1 MB of
    activations per sample each) on 4 devices of ``memory`` bytes."""
    profile = flat_profile(8, 1e-3, 2e-3, per_sample=per_sample, output_bytes=output_bytes, saved_bytes=MB,
                           parameter_bytes=parameter_bytes)
    cost = CostModel(profile, Cluster.local(4, link=Link(5e-6, bandwidth), memory_bytes=memory))
    return PlanningProblem(NAMES, cost, batch_size=batch)


def test_plan_is_2bw_and_runs() -> None:
    result = run_planner("2bw", problem(1 << 40))
    assert result.plan.method is Method.TWO_BW and result.plan.weights is WeightPolicy.TWO_BW
    assert isinstance(result.report, TwoBWReport)
    build_schedule(result.plan)  # validates
    assert result.plan.prediction is not None and "steady state" in result.plan.prediction.basis
    assert get_planner("2bw").kind == "stages"


def test_micro_batch_sizes_are_powers_of_two_with_enough_micro_batches() -> None:
    assert micro_batch_sizes(16, 4) == [4, 2, 1]
    assert micro_batch_sizes(12, 1) == [4, 2, 1]
    assert micro_batch_sizes(16, 2, width=2) == [4, 2, 1]  # m in {4, 8, 16}: multiples of 2, >= 2 · 2
    assert micro_batch_sizes(16, 4, width=4) == [1]  # m >= 16
    assert micro_batch_sizes(8, 2, width=8) == []


def test_widths_and_depths_are_the_papers_pairs_and_straight_pipelines() -> None:
    assert widths_and_depths(4, 8) == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (4, 1)]
    assert widths_and_depths(6, 2) == [(1, 1), (1, 2), (3, 2), (6, 1)]


def test_chooses_width_where_it_is_faster() -> None:
    """Light weights and costly activations: four replicas of one stage (data parallelism, a cheap
    all-reduce) beat every pipeline; heavy weights on a slow link: a straight pipeline of 4."""
    light = plan_2bw(problem(1 << 40, output_bytes=10**8, bandwidth=1e8, per_sample=True, parameter_bytes=10**4))
    assert isinstance(light.report, TwoBWReport) and (light.report.width, light.report.depth) == (4, 1)
    assert light.plan.stages[0].ranks == (0, 1, 2, 3)
    straight = min(c.iteration_s for c in light.candidates if c.label.startswith("2bw w=1 "))
    assert light.candidates[0].iteration_s < straight / 3
    build_schedule(light.plan)
    heavy = plan_2bw(problem(1 << 40, bandwidth=1e8, per_sample=True))
    assert isinstance(heavy.report, TwoBWReport) and (heavy.report.width, heavy.report.depth) == (1, 4)


def test_a_replicated_plan_pays_its_all_reduce() -> None:
    """The steady state of w = 2, d = 2 grows by the replicas' all-reduce of a stage's weights."""
    cheap, dear = (problem(1 << 40, per_sample=True, parameter_bytes=p) for p in (10**3, 10 * MB))
    plans = [two_bw_plan(p, 2, 4, False, width=2) for p in (cheap, dear)]
    assert [s.ranks for s in plans[0].stages] == [(0, 1), (2, 3)]
    times = [score_steady(plan, p.cost).iteration_s for plan, p in zip(plans, (cheap, dear), strict=True)]
    ring = dear.cost.allreduce_s(4 * 10 * MB, (0, 1))
    assert times[1] - times[0] == pytest.approx(ring, rel=0.05)


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
    for (width, depth), recompute in itertools.product(widths_and_depths(4, 8), (False, True)):
        sub, _ = placed_cluster(p.cost.cluster, range(width * depth))
        for b in (1, 2, 4, 8, 16):
            m = p.batch_size // b
            if m < width * depth or m % width:
                continue
            plan = two_bw_plan(p, depth, b, recompute, width)
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
