"""The CLI and ``auto`` for GraphPipe's method ``graph`` (issue 15): ``plan --method graph`` or
``--planner graphpipe`` makes a DAG of stages, ``simulate`` shows it, and ``auto`` tries graphpipe
beside the sequential planners for a model that branches, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipetrain.cli.main import main
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.plan.stage_graph import validate_for_graph
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.planners.registry import auto_planners
from pipetrain.profile.estimate import estimate_profile
from pipetrain.simulate.timeline import Timeline

MODEL = "branchy-digits"


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    estimate_profile(build_model(MODEL), "cpu", 64).save(path)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("how", [("--method", "graph"), ("--planner", "graphpipe")])
def test_plan_graph_then_simulate(how: tuple[str, str], tmp_path: Path, profile: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code, text = run(capsys, "plan", "--model", MODEL, "--batch", "64", "--ranks", "3", "--profile", str(profile),
                     *how, "--out", str(out))
    assert code == 0, text
    plan = Plan.from_json(out.read_text())
    assert plan.method is Method.GRAPH and plan.prediction is not None
    validate_for_graph(plan, build_model(MODEL))
    sim = tmp_path / "sim"
    cluster = [] if plan.n_ranks == 3 else ["--cluster", str(out.with_suffix(".cluster.json"))]
    code, text = run(capsys, "simulate", "--plan", str(out), "--profile", str(profile), *cluster, "--out-dir", str(sim))
    assert code == 0, text
    assert Timeline.load(sim / "predicted.json").n_ranks == plan.n_ranks


def test_method_graph_takes_only_the_graphpipe_planner(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "plan", "--model", MODEL, "--method", "graph", "--planner", "balanced")
    assert code != 0 and "--method graph is planned by --planner graphpipe" in text


def test_auto_runs_graphpipe_only_for_a_model_that_branches() -> None:
    cluster = Cluster.local(2)
    for name, branches in (("branchy-digits", True), ("mlp-digits", False)):
        graph = build_model(name)
        problem = PlanningProblem(ModelRef.of(graph), CostModel(estimate_profile(graph, "cpu", 16), cluster), 16)
        assert ("graphpipe" in auto_planners(problem)) is branches
