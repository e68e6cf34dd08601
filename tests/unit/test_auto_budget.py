"""The default planner (issue 30 item 1): ``auto`` within a planning-time budget finds what ``auto``
finds, makes its promising runs first, and skips the rest once the budget is spent, saying so."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.cli import build_parser, main
from pipetrain.cli.planning import plan_request
from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.planners import DEFAULT_PLANNER, DEFAULT_TIME_BUDGET_S, Constraints, ModelRef, PlanningProblem
from pipetrain.planners.auto import SKIPPED_NOTE, AutoReport, plan_auto, skipped
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.registry import AUTO_PLANNERS, AUTO_RUNS
from pipetrain.profile.table import LayerProfile, Profile

BATCH = 16
SMALL_GA = GAConfig(population=8, generations=4)


def _problem(n_layers: int = 6, n_devices: int = 2, memory_bytes: int = 2**30, budget: float | None = None,
             skew: float = 0.0) -> PlanningProblem:
    """``n_layers`` layers, the later ones ``skew`` slower each, on ``n_devices`` CPUs."""
    names = tuple(f"l{i}" for i in range(n_layers))
    layers = tuple(LayerProfile(name, (1, BATCH), (1e-3 * (1 + skew * i), 8e-3 * (1 + skew * i)),
                                (2e-3 * (1 + skew * i), 16e-3 * (1 + skew * i)), 8192, 16384, 4096, 1e6)
                   for i, name in enumerate(names))
    link = Link(1e-4, 1e9)
    cluster = Cluster(tuple(Device("cpu", memory_bytes) for _ in range(n_devices)), link, link, "test")
    cost = CostModel(Profile("synthetic", "", "cpu", "synthetic", 128, layers), cluster)
    return PlanningProblem(ModelRef.synthetic(names), cost, BATCH,
                           constraints=Constraints(ga=SMALL_GA, time_budget_s=budget))


def _ticks(step: float) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += step


@pytest.mark.parametrize("problem", [_problem(n_devices=4, skew=0.3), _problem(memory_bytes=400_000)],
                         ids=["skewed-4", "tight"])
def test_within_its_budget_the_default_finds_autos_plan(problem: PlanningProblem) -> None:
    default = replace(problem.constraints, time_budget_s=DEFAULT_TIME_BUDGET_S)
    budgeted = plan_auto(replace(problem, constraints=default), AUTO_RUNS)
    every = plan_auto(problem, AUTO_RUNS)
    assert budgeted.plan == every.plan
    assert budgeted.plan.prediction and every.plan.prediction
    assert budgeted.plan.prediction.iteration_s <= every.plan.prediction.iteration_s
    assert isinstance(budgeted.report, AutoReport) and not skipped(budgeted.report)


def test_a_spent_budget_skips_the_runs_left_after_the_promising_ones() -> None:
    ran: list[str] = []
    clock = _ticks(1.0)  # each look at the clock: one second later
    result = plan_auto(_problem(budget=2.5), AUTO_RUNS, on_planner=ran.append, clock=lambda: next(clock))
    assert ran == ["balanced", "interleaved"]  # made first under a budget, then the budget is spent
    report = result.report
    assert isinstance(report, AutoReport)
    assert [o.planner for o in report.outcomes] == list(AUTO_PLANNERS[:len(report.outcomes)])  # auto's order
    assert skipped(report) == tuple(label for label in AUTO_PLANNERS if label not in ran and label in
                                    [o.planner for o in report.outcomes])
    assert all(o.plan is None and o.note == SKIPPED_NOTE for o in report.outcomes if o.planner not in ran)
    assert report.winner in ran


def test_the_budget_waits_for_a_plan_that_fits() -> None:
    clock = _ticks(100.0)  # always over budget: the first run that finds a plan still runs
    result = plan_auto(_problem(budget=1.0), AUTO_RUNS, clock=lambda: next(clock))
    assert isinstance(result.report, AutoReport)
    assert result.report.winner == "balanced" and len(skipped(result.report)) == len(result.report.outcomes) - 1


def test_a_budget_is_a_positive_number_of_seconds() -> None:
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(UserError, match="time budget"):
            Constraints(time_budget_s=bad)


def _request(*flags: str) -> tuple[str, float | None]:
    route, constraints = plan_request(build_parser(only=["plan"]).parse_args(["plan", "--model", "mlp", *flags]))
    return route.spec.name, constraints.time_budget_s


def test_plan_without_planner_runs_auto_within_its_budget() -> None:
    assert _request() == (DEFAULT_PLANNER, DEFAULT_TIME_BUDGET_S) == ("auto", 60.0)
    assert _request("--time-budget", "5") == ("auto", 5.0)
    assert _request("--planner", "auto") == ("auto", None)  # every run, as asked
    assert _request("--planner", "auto", "--time-budget", "9") == ("auto", 9.0)
    assert _request("--planner", "balanced") == ("balanced", None)
    assert _request("--method", "zbv") == ("interleaved", None)
    # flags auto does not take go to the balanced planner, as before auto was the default
    assert _request("--stages", "2") == ("balanced", None)
    assert _request("--micro", "4") == ("balanced", None)
    with pytest.raises(UserError, match="--time-budget"):
        _request("--planner", "balanced", "--time-budget", "5")


def test_plan_names_the_runs_its_budget_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = build_model("gpt-tiny")
    layers = tuple(LayerProfile(name, (1, 8), (1e-3, 4e-3), (2e-3, 8e-3), 8192, 16384, 4096, 1e6)
                   for name in graph.names)
    profile = tmp_path / "profile.json"
    Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers).save(profile)
    assert main(["plan", "--model", "gpt-tiny", "--batch", "8", "--ranks", "2", "--profile", str(profile),
                 "--no-probe", "--time-budget", "0.001", "--out", str(tmp_path / "plan.json")]) == 0
    said = " ".join((capsys.readouterr().err).split())
    assert "over the time budget of 0.001 s: skipped tidgap, 1f1b-ga, zb1-ga, pipedream, bapipe" in said
