"""The planner benchmarks' reports (benchmarks/common/partition_*, graphpipe_*; bench_plan_scale): headlines
and targets from rows alone, so that a stored run reports the same after ``--rereport``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_plan_scale
from common.graphpipe_report import graphpipe_report
from common.partition_ranking import ranking_report
from common.partition_report import partition_report
from harness import RunInfo
from harness.record import Record, records_in

INFO = RunInfo(quick=False, repeats=1, seed=0)


def _sim(model: str, n: int, planner: str, sps: float, cpu: float) -> dict[str, object]:
    return {"part": "sim", "model": model, "branches": 4, "sweep": False, "n_devices": n, "batch": 32 * n,
            "planner": planner, "method": "graph", "micro_batch": 32, "n_micro": 4, "stages": ["9×2"], "depth": 2,
            "devices_used": n, "iteration_s": 32 * n / sps, "samples_per_s": sps, "search_s": cpu, "cpu_s": cpu,
            "simulate_cpu_s": 0.0}


def test_graphpipe_headlines_carry_issue_29s_targets() -> None:
    rows = [_sim("mmt", n, p, sps, cpu) for n in (8, 16)
            for p, sps, cpu in (("graphpipe", 120.0, 1.0), ("pipedream", 100.0, 4.0), ("pipedream-1f1b", 90.0, 3.0))]
    report = graphpipe_report(rows, INFO)
    gains = [h for h in report.headlines if h.area == "papers"]
    assert [round(h.value or 0, 2) for h in gains] == [1.2, 1.2] and all(h.met for h in gains)
    search = next(h for h in report.headlines if h.area == "search")
    assert search.value == 4.0 and search.met is False  # the target is at least 5× faster
    assert "| mmt | 4 | 16 | 512 | 120 |" in report.markdown


def test_graphpipe_search_headlines_take_the_search_parts_medians_and_own_work() -> None:
    rows = [_sim("mmt", 16, p, sps, cpu) for p, sps, cpu in (("graphpipe", 120.0, 1.0), ("pipedream", 100.0, 4.0),
                                                             ("pipedream-1f1b", 90.0, 3.0))]
    rows += [{"part": "search", "model": "mmt", "n_devices": n, "batch": 32 * n, "graphpipe_s": [1.0, 2.0, 9.0],
              "graphpipe_sim_s": [0.5, 0.5, 0.5], "pipedream_s": [6.0 * k, 8.0 * k, 7.0 * k],
              "pipedream_sim_s": [4.0, 4.0, 5.0],
              "ratio": 0.0} for n, k in ((16, 1), (32, 2))]
    report = graphpipe_report(rows, INFO)
    total, own = [h for h in report.headlines if h.area == "search"]
    assert total.value == 3.5 and "16 GPUs" in total.label and total.met is False  # median 7 / median 2
    assert own.value == 2.0 and own.target is None  # (7 - 4) / (2 - 0.5)
    assert "| mmt | 32 | 1024 | 3 | 2.00 (1.50 + 0.50) | 14.00 (10.00 + 4.00) | **7.00×** | 6.67× | 8.00× |" \
        in report.markdown


def _plan_row(model: str, label: str, predicted: float, measured: float, launch: int) -> dict[str, object]:
    return {"model": model, "batch": 32, "steps": 7, "n_candidates": 9, "cluster": "local", "label": label,
            "sources": ["pipedream*"], "predicted_s": predicted, "launch": launch, "status": "ok", "step_s": measured,
            "timeline_s": measured, "step_times_s": [measured]}


def test_ranking_report_finds_the_predicted_best_and_its_gap() -> None:
    rows = [_plan_row("mlp", label, p, m, k) for k in range(2)
            for label, p, m in (("a", 1.0, 1.1), ("b", 2.0, 1.0), ("c", 3.0, 3.0))]
    tau, gap = ranking_report(rows, INFO).headlines
    assert tau.value is not None and abs(tau.value - 1 / 3) < 1e-9 and tau.met is False
    assert gap.value is not None and abs(gap.value - 10.0) < 1e-6 and gap.met is False


def test_partition_report_takes_the_best_speed_up_over_data_parallelism() -> None:
    rows = []
    for d, dp in ((4, 1.0), (8, 2.0)):
        for planner, t in (("data parallel", dp), ("equal split", 1.5), ("pipedream", 0.5), ("pipedream straight", 0.8),
                           ("bapipe", 0.8)):
            rows.append({"model": "vgg16", "n_layers": 16, "n_devices": d, "batch": 64, "planner": planner,
                         "method": "1f1b", "n_micro": 4, "stages": ["16x1"], "devices_used": d, "iteration_s": t,
                         "bubble_fraction": 0.1, "peak_memory_bytes": 2**30, "fits": True, "search_s": 0.1,
                         "config": ""})
    pipedream, bapipe, _memory = partition_report(rows, INFO).headlines
    assert pipedream.value == 4.0 and "8 V100" in pipedream.label and bapipe.value == 2.5


def test_plan_scale_growth_and_the_512_device_targets() -> None:
    rows = [{"planner": "pipedream", "axis": "devices", "devices": d, "layers": 14, "cpu_s": s, "wall_s": s,
             "method": "1f1b", "micro": 8, "stages": "14×8", "iteration_s": 1.0} for d, s in ((8, 1.0), (512, 8.0))]
    assert bench_plan_scale.growth(rows, "devices") == 0.5
    (headline,) = bench_plan_scale.report(rows, INFO).headlines
    assert headline.value == 8.0 and headline.met is True


def test_a_results_folder_mixing_old_list_results_and_records_yields_the_records(tmp_path: Path) -> None:
    (tmp_path / "partition_sim.json").write_text(json.dumps([{"model": "vgg16"}]))  # from before the harness
    (tmp_path / "2026-11-28-legacy.json").write_text(
        Record("partition-sim", "t", "2026-11-28 00:00", "unknown", "cmd", {}, INFO, complete=True).to_json())
    assert [p.name for p, _ in records_in(tmp_path)] == ["2026-11-28-legacy.json"]
