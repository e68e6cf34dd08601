"""Rank agreement between predicted and measured times, shared by the benchmarks' reports
(benchmarks/bench_planner_measured.py, benchmarks/core_report.py)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["kendall_tau_b"]


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of paired samples: (concordant − discordant) / sqrt((n0 − ties_x)(n0 − ties_y)),
    over the n0 = n(n−1)/2 pairs; 1 when both orders agree, −1 when reversed; nan if either is constant."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 or dy == 0:
                ties_x += dx == 0
                ties_y += dy == 0
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    n0 = len(x) * (len(x) - 1) // 2
    denominator = ((n0 - ties_x) * (n0 - ties_y)) ** 0.5
    return (concordant - discordant) / denominator if denominator else float("nan")
