"""The real-models, CLI-flow and DualPipeV benchmarks' reports, from rows alone (``--rereport``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_dualpipev
from common.cli_report import cli_report
from common.real_report import real_report
from harness import RunInfo

INFO = RunInfo(quick=False, repeats=2, seed=0)


def _flow(model: str, mode: str, predicted: float, measured: float) -> dict[str, object]:
    return {"model": model, "mode": mode, "plans": ["1f1b [32×1] 2/2"] * 3, "planned_ms": [predicted] * 3,
            "noise_lines": [], "predicted_ms": predicted, "measured_ms": measured, "measured_runs_ms": [measured],
            "iteration_error": predicted / measured - 1,
            "kinds": {"F": {"predicted_ms": 1.0, "measured_ms": 2.0, "error": -0.5}}}


def test_the_cli_flow_holds_each_iteration_to_its_modes_target() -> None:
    report = cli_report([_flow("gpt-tiny", "uncalibrated", 8.8, 10.0), _flow("gpt-tiny", "calibrated", 8.8, 10.0)],
                        INFO)
    assert [(h.area, round(h.value or 0, 1), h.met) for h in report.headlines] == [
        ("fidelity", -12.0, True), ("fidelity", -12.0, False)]
    assert report.charts[0].kind == "scatter" and report.charts[0].points[0][:2] == (10.0, 8.8)
    assert "0 of 2 are" in report.markdown


def _run(model: str, label: str, r: int, sps: float | None, status: str = "ok") -> dict[str, object]:
    return {"kind": "run", "model": model, "label": label, "round": r, "status": status, "samples_per_s": sps,
            "step_times_s": [], "wall_s": 1.0}


def test_real_models_pairs_pipetrain_with_the_best_torch_schedule_run_every_round() -> None:
    setup = {"kind": "setup", "model": "gpt2", "batch": 16, "seconds": dict.fromkeys(
        ("capture", "profile", "balanced", "auto"), 1.0), "plans": {"balanced": "1f1b m=8: a | b", "auto": "x"},
        "pipeline_with_default_config": "ok", "round": 0}
    rows = [setup, _run("gpt2", "pipetrain", 0, 20.0), _run("gpt2", "single", 0, 10.0),
            _run("gpt2", "torch 1f1b m=4", 0, 30.0), _run("gpt2", "torch zbv m=4", 0, None, "rank 1 error: x"),
            _run("gpt2", "torch zbv m=4 captured", 0, 25.0), _run("gpt2", "pipetrain", 1, 22.0),
            _run("gpt2", "single", 1, 11.0), _run("gpt2", "torch zbv m=4 captured", 1, 22.0)]
    report = real_report(rows, INFO)
    figures = {h.label: (h.area, h.value) for h in report.headlines}
    assert figures == {"GPT-2: pipetrain's default plan / the best torch schedule (torch zbv m=4 captured)":
                       ("torch", 0.9), "GPT-2: pipetrain's default plan / one process": ("methods", 2.0)}
    assert "a \\| b" in report.markdown and "torch zbv m=4: rank 1 error: x" in report.markdown
    assert report.charts[0].categories == ("pipetrain", "one process", "torch 1f1b", "torch zbv")


def test_dualpipev_reports_the_median_of_paired_ratios_and_keeps_failed_runs() -> None:
    row = {"model": "mlp", "schedule": "dualpipev", "m": 4, "batch": 128, "torch_status": "ok",
           "pipetrain_status": "ok"}
    rows = [{**row, "torch": 100.0, "pipetrain": 110.0, "round": 0},
            {**row, "torch": 90.0, "pipetrain": 90.0, "round": 1},
            {**row, "m": 8, "torch": None, "torch_status": "error: x", "pipetrain": 50.0, "round": 0}]
    report = bench_dualpipev.report(rows, INFO)
    assert [(h.label, round(h.value or 0, 2)) for h in report.headlines] == [
        ("DualPipeV: pipetrain / torch's ScheduleDualPipeV, mlp m=4", 1.05)]
    assert "| mlp | dualpipev | 8 | error: x |" in report.markdown
