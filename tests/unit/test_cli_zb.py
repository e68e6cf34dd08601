"""CLI for method zb1 (ZB-H1): plan it, simulate a plan by it or by 1f1b, and refuse what it cannot run."""

from __future__ import annotations

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


def test_zb1_refuses_recompute(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "zb1.json"
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2", "--method", "zb1",
                     "--micro", "4", "--profile", str(tiny_profile), "--out", str(out))
    assert code == 0, text
    out.write_text(out.read_text().replace('"recompute": false', '"recompute": true'))
    code, text = run(capsys, "simulate", "--plan", str(out), "--profile", str(tiny_profile))
    assert code == 2 and "method zb1" in text and "recompute" in text
