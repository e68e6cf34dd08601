"""CLI for method zb1 (ZB-H1): plan it, simulate a plan by it or by 1f1b, with recompute too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.simulate.timeline import Timeline

from .test_cli import run, tiny_profile

__all__ = ["tiny_profile"]


def test_plan_and_simulate_zb1(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "zb1.json"
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2", "--method", "zb1",
                     "--micro", "8", "--profile", str(tiny_profile), "--out", str(out))
    assert code == 0, text
    plan = Plan.from_json(out.read_text())
    assert plan.method is Method.ZB1 and "zb1" in text
    times = {}
    for method in ("zb1", "1f1b"):
        sim = tmp_path / method
        code, text = run(capsys, "simulate", "--plan", str(out), "--profile", str(tiny_profile), "--method", method,
                         "--out-dir", str(sim))
        assert code == 0, text
        times[method] = Timeline.load(sim / "predicted.json").iteration_s
    assert times["zb1"] < times["1f1b"]  # the tiny profile has parameters: W is half of each backward
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2", "--micro", "8",
                     "--profile", str(tiny_profile), "--out", str(tmp_path / "auto.json"))
    assert code == 0 and "zb1" in text, text  # the balanced planner scores zb1 beside gpipe and 1f1b


def test_zb1_recomputes(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A zb1 plan whose (old-style, plan-wide) recompute flag is set simulates every B with its forward
    re-run: slower, and the memory table marks the stages."""
    out, sim = tmp_path / "zb1.json", tmp_path / "sim"
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2", "--method", "zb1",
                     "--micro", "4", "--profile", str(tiny_profile), "--out", str(out))
    assert code == 0, text
    times = []
    for flag in (False, True):
        data = json.loads(out.read_text())
        data["recompute"] = flag
        out.write_text(json.dumps(data))
        code, text = run(capsys, "simulate", "--plan", str(out), "--profile", str(tiny_profile), "--out-dir",
                         str(sim))
        assert code == 0 and ("│ recompute" in text) is flag, text  # the memory table's column
        times.append(Timeline.load(sim / "predicted.json").iteration_s)
    assert times[1] > times[0]
