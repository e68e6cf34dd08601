"""The benchmarks' shared report helpers (benchmarks/core_report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from core_report import ratio


def test_ratio_format() -> None:
    assert ratio(3.0, 2.0) == "1.50×"
    assert ratio(1.0, 3.0) == "0.33×"


@pytest.mark.parametrize(("x", "base"), [(None, 2.0), (0.0, 2.0), (2.0, None), (2.0, 0.0), (2.0, -1.0),
                                         (2.0, float("nan")), (float("nan"), 2.0)])
def test_ratio_without_a_run_or_a_base_is_a_dash(x: float | None, base: float | None) -> None:
    assert ratio(x, base) == "—"


def test_benchmarks_use_the_one_ratio() -> None:
    """bench_umpipe_measured formats ratios with core_report's, not its own."""
    import bench_umpipe_measured

    assert bench_umpipe_measured.ratio is ratio
    assert not hasattr(bench_umpipe_measured, "_ratio")
