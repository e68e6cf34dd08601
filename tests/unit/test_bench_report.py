"""The Core benchmark's report (benchmarks/common/core_report.py) and its diagnostics' (bench_checkouts,
bench_diag_actions), from rows alone: their tables, the targets they mark, their headlines and charts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common.core_report import report, summarize
from harness import Row, RunInfo

PROBE = {"latency_s": 5e-5, "bandwidth_bytes_per_s": 4e9, "shared_speed": [1.0, 0.97], "action_overhead_s": 9e-5,
         "overhead_measured": True}


def _run(label: str, sps: float | None, predicted: float | None = None, round_: int = 0) -> Row:
    it = None if sps is None else 64 / sps
    return {"row": "run", "model": "gpt-tiny", "label": label, "status": "ok" if sps else "timeout: 150 s",
            "samples_per_s": sps, "iteration_s": it, "predicted_s": predicted, "predicted_alone_s": predicted,
            "step_times_s": [] if it is None else [it] * 5, "round": round_}


def _rows() -> list[Row]:
    model = {"row": "model", "model": "gpt-tiny", "batch": 64, "planned": "1f1b m=2 layers [3, 3]",
             "partition": "every pipetrain partition equals torch's equal-layer split", "calibration": "",
             "micro": [2, 4], "warmup_steps": 2, "probe": PROBE, "round": 0}
    return [model, _run("single", 1000.0, 0.064), _run("single+alloc", 1100.0, 0.064),
            _run("torch gpipe m=2", 1500.0), _run("torch 1f1b m=2", 1600.0), _run("torch zbv m=4", None),
            _run("torch+alloc gpipe m=2", 1650.0), _run("torch+alloc 1f1b m=2", 1750.0),
            _run("pipetrain gpipe m=2", 1700.0, 64 / 1700), _run("pipetrain 1f1b m=2", 1800.0, 64 / 1750),
            _run("pipetrain zb1 m=2", 1900.0, 64 / 1950), _run("planned", 2100.0, 64 / 2000),
            _run("planned-noalloc", 2000.0, 64 / 2000)]


def test_summary_is_the_median_over_rounds_and_says_why_none_ran() -> None:
    runs = [_run("torch gpipe m=2", s, round_=r) for r, s in enumerate((100.0, 300.0, 200.0))]
    s = summarize(runs, "torch gpipe m=2")
    assert s.samples_per_s == 200.0 and s.spread == (100.0, 300.0) and s.n_ok == 3
    failed = summarize([_run("torch zbv m=4", None)], "torch zbv m=4")
    assert failed.samples_per_s is None and failed.status.startswith("timeout")


def test_headlines_mark_the_targets() -> None:
    out = report(_rows(), RunInfo(quick=False, repeats=1, seed=0))
    by = {h.label: h for h in out.headlines}
    fair = by["planned / best torch schedule, both with the allocator setting, gpt-tiny"]
    assert fair.area == "torch" and abs(fair.value - 2100 / 1750) < 1e-9 and fair.met is False  # 1.20× < 1.25×
    assert "torch+alloc 1f1b m=2" in fair.config
    plain = by["planned / best torch schedule, torch without the allocator setting, gpt-tiny"]
    assert abs(plain.value - 2100 / 1600) < 1e-9 and plain.target is None and "torch 1f1b m=2" in plain.config
    assert by["same schedule and m: lowest pipetrain / torch"].value == 1800 / 1600
    worst = by["prediction |error|, worst setting"]
    assert worst.area == "fidelity" and worst.unit == "%" and abs(worst.value - 5.0) < 1e-9  # planned
    assert by["ranking of the settings: Kendall tau-b, lowest model"].value == 1.0


def test_report_tables_and_charts() -> None:
    out = report(_rows(), RunInfo(quick=False, repeats=1, seed=0))
    assert "| torch zbv m=4 | — | timeout: 150 s |" in out.markdown
    assert ("- planned / best torch, both with the allocator setting = 1.20× (target ≥ 1.25×, issue 30): NOT met"
            in out.markdown)
    assert "- planned / best torch without the allocator setting = 1.31×" in out.markdown
    assert "| 1f1b (`Schedule1F1B`) | 1 | 2 | 1600.0 | 1.00× | 1.31× | m=2, 1750.0 |" in out.markdown
    assert "same-setting pipetrain / torch ≥ 1.0× (target): 2 of 2 settings met" in out.markdown
    bars, scatter = out.charts
    assert bars.kind == "bars" and dict(bars.series)["pipetrain (allocator setting)"][-1] == 2100.0
    assert dict(bars.series)["torch"][bars.categories.index("1f1b")] == 1600.0
    assert dict(bars.series)["torch, allocator setting"][bars.categories.index("1f1b")] == 1750.0
    assert scatter.kind == "scatter" and len(scatter.points) == 4  # planned-noalloc is not ranked


def test_checkouts_pair_each_round_after_over_before() -> None:
    from bench_checkouts import report as checkouts_report

    rows = [{"setting": "mlp 128 zb1@2 30", "checkout": c, "step_s": s, "round": r}
            for r, (before, after) in enumerate(((1.0, 1.1), (2.0, 1.8), (1.0, 1.0)))
            for c, s in (("before", before), ("after", after))]
    out = checkouts_report(rows, RunInfo(quick=False, repeats=3, seed=0, options={"before": "b", "after": "a"}))
    assert "| mlp 128 zb1@2 30 | 1000.00 | 1100.00 | 1.000 | 1.100, 0.900, 1.000 |" in out.markdown
    assert out.headlines[0].value == 1.0 and "before b, after a" in out.headlines[0].config


def test_diag_actions_shows_the_median_runs_breakdown() -> None:
    from bench_diag_actions import report as diag_report

    rows = [{"setting": "zbv v=2 m=2", "model": "mlp", "batch": 128, "predicted_s": 0.3, "measured_s": t,
             "predicted_by_kind": {"0 F": 0.1}, "measured_by_kind": {"0 F": t / 3}, "round": r}
            for r, t in enumerate((0.36, 0.30, 0.33))]
    out = diag_report(rows, RunInfo(quick=False, repeats=3, seed=0))
    assert "| | 0 F | 100.00 | 110.00 |" in out.markdown  # the median run, 0.33 s
    assert abs(out.headlines[0].value - 100 * (0.3 / 0.33 - 1)) < 1e-9


def test_action_cost_gives_each_checkouts_median_and_their_ratio() -> None:
    from bench_action_cost import report as action_report

    def row(side: str, overhead_s: float, round_: int) -> Row:
        per_action = {"F": (16, 0.010), "W": (16, 0.008)}
        return {"side": side, "model": "mlp", "batch": 128, "speed": 0.95, "overhead_s": overhead_s,
                "settings": ["1f1b m=1", "zbv m=8"], "measured_s": [0.7, 0.9], "profile_s": 60.0,
                "measured_per_action": per_action, "profiled_per_action": {"F": (16, 0.007), "W": (16, 0.008)},
                "round": round_}

    rows = [row("this", 1e-3, 0), row("base", 3e-3, 0), row("this", 2e-3, 1), row("base", 2e-3, 1)]
    out = action_report(rows, RunInfo(quick=False, repeats=2, seed=0))
    assert "| mlp b=128 | this | 2 | 1500 | 0.950 | 1f1b m=1 700.0, zbv m=8 900.0 |" in out.markdown
    assert "| mlp | base | F | 16 | 10.00 | 7.00 | 3000 |" in out.markdown
    assert [h.value for h in out.headlines[:3]] == [1500, 2500, 0.6]  # calibrated: this, base, this / base
    assert [h.value for h in out.headlines[3:]] == [1.0, 1.0, 1.0]  # zbv iteration, F and W actions
    assert out.headlines[3].label == "zbv m=8 iteration, this / base checkout, mlp"
