"""The asynchronous and local-learning benchmarks' reports render from rows alone (benchmarks/common/async_*,
local_*), as ``--rereport`` and the results page need."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_async_speed
import bench_message_cpu
from common.local_messages import fit, per_size
from harness import RunInfo

INFO = RunInfo(quick=False, repeats=2, seed=0)


def _speed_row(method: str, round_: int, measured: float | None, predicted: float) -> dict[str, object]:
    return {"model": "mlp", "method": method, "status": "ok" if measured else "timeout", "steps": 6,
            "samples_per_s": measured, "predicted_samples_per_s": predicted, "round": round_}


def test_async_speed_pairs_each_method_with_1f1b_in_its_round() -> None:
    rows = [_speed_row("1f1b", 0, 10.0, 10.0), _speed_row("2bw", 0, 12.0, 11.0),
            _speed_row("1f1b", 1, 20.0, 10.0), _speed_row("2bw", 1, 22.0, 11.0)]
    report = bench_async_speed.report(rows, INFO)
    assert "| mlp | 2bw | 17.0 | 1.15× | 11.0 | 1.10× |" in report.markdown  # paired: median of 1.2 and 1.1
    (fidelity,) = report.headlines
    assert fidelity.area == "fidelity" and fidelity.unit == "%"
    assert [c.kind for c in report.charts] == ["scatter", "bars"]


def test_async_speed_reports_a_failed_run_as_a_dash() -> None:
    rows = [_speed_row("1f1b", 0, 10.0, 10.0), _speed_row("2bw", 0, None, 11.0)]
    assert "| mlp | 2bw | — | — | 11.0 | 1.10× | — | 0/1 |" in bench_async_speed.report(rows, INFO).markdown


def test_message_cpu_fits_the_median_over_rounds() -> None:
    rows = [{"kind": "message", "bytes": n, "wall_s": 1.0, "send_cpu_s": 1e-5 + n * 1e-10 + noise,
             "recv_cpu_s": 2e-5 + n * 2e-10, "round": r}
            for r, noise in enumerate((0.0, 1e-3, 0.0)) for n in (4096, 65536, 1 << 20)]
    sizes = per_size(rows)
    assert [s["bytes"] for s in sizes] == [4096, 65536, 1 << 20]
    a, b = fit(sizes, "send_cpu_s")
    assert abs(a - 1e-5) < 1e-9 and abs(b - 1e-10) < 1e-14
    rows.append({"kind": "setting", "setting": "zbv m=2", "messages": 8, "bytes": 2.0**21, "predicted_s": 0.4,
                 "round": 0})
    report = bench_message_cpu.report(rows, INFO)
    assert "| zbv m=2 | 8 | 2.0 |" in report.markdown and len(report.headlines) == 3
