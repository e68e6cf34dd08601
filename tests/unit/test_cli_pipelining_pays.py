"""``pipetrain plan`` says when pipelining pays little (issue 32): a plan of one micro-batch, or one
that leaves devices idle, gets one line with one process's predicted time beside the plan's."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipetrain import api
from pipetrain.cli import main
from pipetrain.graph.zoo import build_model
from pipetrain.profile.estimate import estimate_profile

PLAN = ["plan", "--model", "mlp-digits", "--batch", "32", "--ranks", "2", "--estimate", "cpu",
        "--planner", "balanced"]


def _said(capsys: pytest.CaptureFixture[str], tmp_path: Path, *extra: str) -> str:
    assert main([*PLAN, "--out", str(tmp_path / "plan.json"), *extra]) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_one_micro_batch_says_so_with_one_process_time(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    said = " ".join(_said(capsys, tmp_path, "--micro", "1").split())
    assert "pipelining pays little here: each stage runs the whole batch as one micro-batch" in said
    assert "One process on one device:" in said and "speed-up" in said


def test_idle_devices_say_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    said = " ".join(_said(capsys, tmp_path, "--stages", "1").split())
    assert "the plan leaves 1 of the 2 devices idle" in said and "speed-up 1.00×" in said


def test_a_plan_that_pipelines_says_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "pipelining pays little" not in _said(capsys, tmp_path, "--micro", "4")


def test_single_process_is_the_whole_model_in_one_stage() -> None:
    graph = build_model("mlp-digits")
    profile = estimate_profile(graph, "cpu", 32)
    result = api.plan(graph, profile, api.local_cluster(2), batch_size=32)
    alone = api.single_process(result.plan, profile, api.local_cluster(2))
    assert alone.iteration_s > 0
    one_rank = api.plan(graph, profile, api.local_cluster(1), batch_size=32,
                        constraints=api.Constraints(n_stages=1, n_micro=1))
    assert result.plan.prediction is not None and one_rank.plan.prediction is not None
    assert alone.iteration_s == pytest.approx(one_rank.plan.prediction.iteration_s, rel=1e-9)
