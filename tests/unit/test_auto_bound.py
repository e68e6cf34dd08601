"""Auto skips the runs whose single-rank plans cannot beat a replicated one, and chooses the same plan."""

from __future__ import annotations

import math

import pytest

import pipetrain.planners.auto as auto
from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.planners import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.auto import AutoReport, plan_auto
from pipetrain.planners.auto_bound import single_rank_bound
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.registry import AUTO_RUNS
from pipetrain.profile.table import LayerProfile, Profile

BATCH = 16


def _problem(n_layers: int, n_devices: int) -> PlanningProblem:
    """``n_layers`` equal layers whose work grows with the micro-batch, on ``n_devices`` fast-linked CPUs."""
    names = tuple(f"l{i}" for i in range(n_layers))
    layers = tuple(LayerProfile(name, (1, BATCH), (1e-3, 16e-3), (2e-3, 32e-3), 8192, 16384, 4096, 1e3)
                   for name in names)
    link = Link(1e-6, 1e11)
    cluster = Cluster(tuple(Device("cpu", 2**30) for _ in range(n_devices)), link, link, "test")
    cost = CostModel(Profile("synthetic", "", "cpu", "synthetic", 128, layers), cluster)
    return PlanningProblem(ModelRef.synthetic(names), cost, BATCH,
                           constraints=Constraints(ga=GAConfig(population=8, generations=3)))


def _single_rank_labels() -> set[str]:
    return {run.label for _, run in AUTO_RUNS if run.single_rank}


def test_the_bound_is_below_every_single_rank_plan() -> None:
    problem = _problem(4, 2)
    bound = single_rank_bound(problem.cost, problem.model.layer_names, BATCH)
    report = plan_auto(problem, AUTO_RUNS).report
    assert isinstance(report, AutoReport)
    timed = [o for o in report.outcomes if o.planner in _single_rank_labels() | {"balanced"} and o.plan is not None]
    assert len(timed) >= 4 and not any(o.note.startswith("skipped") for o in report.outcomes)
    assert all(bound <= o.iteration_s for o in timed)
    assert bound >= 0.45 * min(o.iteration_s for o in timed)  # not vacuous: one layer of the two a rank holds


def test_runs_that_cannot_beat_replicated_stages_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _problem(2, 8)  # pipedream replicates each of the 2 layers 4 ways
    result = plan_auto(problem, AUTO_RUNS)
    report = result.report
    assert isinstance(report, AutoReport) and report.winner == "pipedream"
    notes = {o.planner: o.note for o in report.outcomes}
    assert all(notes[label].startswith("skipped: its plans take at least") for label in _single_rank_labels()
               if label in notes)
    assert "tidgap" in notes and "bapipe" in notes
    monkeypatch.setattr(auto, "BOUND_MARGIN", math.inf)  # nothing ruled out: every run made
    every = plan_auto(problem, AUTO_RUNS)
    assert isinstance(every.report, AutoReport) and not any(o.note.startswith("skipped") for o in every.report.outcomes)
    assert every.plan == result.plan
