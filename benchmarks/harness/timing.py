"""Medians and spreads, A/B pairing, and the few formats every report shares.

Numbers on this shared machine drift by tens of percent between minutes, so comparisons are made
within one run: the candidates alternate (:func:`paired`, and the harness's rotated rounds), and a
figure is the median of its samples with its spread (lowest, highest) beside it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Stats", "kendall_tau_b", "paired", "pct", "ratio", "stats"]


@dataclass(frozen=True)
class Stats:
    """The median of ``n`` samples and their range."""

    median: float
    low: float
    high: float
    n: int

    def text(self, digits: int = 3) -> str:
        """``"12.3 (11.9–13.0, n=5)"``."""
        return f"{self.median:.{digits}g} ({self.low:.{digits}g}–{self.high:.{digits}g}, n={self.n})"


def stats(samples: Iterable[float]) -> Stats | None:
    """:class:`Stats` of the finite samples; None when there are none."""
    finite = [x for x in samples if x is not None and math.isfinite(x)]
    if not finite:
        return None
    return Stats(statistics.median(finite), min(finite), max(finite), len(finite))


def paired(candidates: dict[str, Callable[[], object]], repeats: int) -> dict[str, Stats]:
    """Time each candidate ``repeats`` times, alternating (A B, B A, A B, …), and return each one's
    wall-clock :class:`Stats` in seconds. Alternating spreads the machine's drift over every candidate."""
    names = list(candidates)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            t0 = time.perf_counter()
            candidates[name]()
            samples[name].append(time.perf_counter() - t0)
    return {name: s for name in names if (s := stats(samples[name])) is not None}


def ratio(x: float | None, base: float | None) -> str:
    """``"1.50×"``: ``x / base``, or ``"—"`` when either is missing, zero, negative or nan."""
    if x is None or base is None or not (x > 0 and base > 0):
        return "—"
    return f"{x / base:.2f}×"


def pct(x: float | None) -> str:
    """``"+12.3%"`` for a fraction 0.123; ``"—"`` for None or nan."""
    return "—" if x is None or math.isnan(x) else f"{100 * x:+.1f}%"


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
