"""The harness's pictures: grouped bars (samples/s against torch's schedules, paper against
pipetrain), predicted-against-measured scatters and lines (a loss against samples), drawn from a
:class:`Chart`'s data."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from .experiment import Chart

__all__ = ["draw"]


def _hbars(chart: Chart, plt: Any) -> Any:
    """Bars to the right, one row of bars per category: for many categories or long names."""
    n = max(1, len(chart.series))
    rows = len(chart.categories)
    fig, ax = plt.subplots(figsize=(10.0, max(3.0, 0.22 * rows * n + 1.2)))
    bar = 0.8 / n
    for i, (legend, values) in enumerate(chart.series):
        ys = [r + (i - (n - 1) / 2) * bar for r in range(rows)]
        ax.barh([y for y, v in zip(ys, values, strict=True) if v is not None],
                [v for v in values if v is not None], bar, label=legend)
    ax.set_yticks(range(rows), [textwrap.shorten(c, 90) for c in chart.categories], fontsize=8)
    ax.invert_yaxis()  # the first category on top, as in a table
    ax.set_xlabel(chart.y_label)
    ax.grid(axis="x", alpha=0.3)
    if n > 1:
        ax.legend(fontsize=8, loc="lower right")
    ax.set_title(chart.title, fontsize=10)
    return fig, ax


def _bars(chart: Chart, plt: Any) -> Any:
    if len(chart.categories) > 10 or max((len(c) for c in chart.categories), default=0) > 24:
        return _hbars(chart, plt)
    n = max(1, len(chart.series))
    fig, ax = plt.subplots(figsize=(max(6.0, min(16.0, 1.5 + len(chart.categories) * (0.3 * n + 0.5))), 4.2))
    bar = 0.8 / n
    for i, (legend, values) in enumerate(chart.series):
        xs = [c + (i - (n - 1) / 2) * bar for c in range(len(chart.categories))]
        ax.bar([x for x, v in zip(xs, values, strict=True) if v is not None],
               [v for v in values if v is not None], bar, label=legend)
    tilted = len(chart.categories) > 4
    ax.set_xticks(range(len(chart.categories)), chart.categories, rotation=20 if tilted else 0,
                  ha="right" if tilted else "center")
    if n > 1:  # below the axes, where long names of many series cannot cover the bars
        ax.legend(fontsize=8, ncols=min(n, 3), loc="upper center", frameon=False,
                  bbox_to_anchor=(0.5, -0.2 if tilted else -0.1))
    return fig, ax


def _lines(chart: Chart, plt: Any) -> Any:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label in dict.fromkeys(p[2] for p in chart.points):
        line = [(x, y) for x, y, name in chart.points if name == label]
        ax.plot([x for x, _ in line], [y for _, y in line], marker=".", label=label)
    ax.legend(fontsize=8)
    return fig, ax


def _scatter(chart: Chart, plt: Any) -> Any:
    fig, ax = plt.subplots(figsize=(5.2, 5.0))
    xs = [p[0] for p in chart.points]
    ys = [p[1] for p in chart.points]
    ax.scatter(xs, ys, s=18)
    for x, y, label in chart.points:
        if label:
            ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    top = max([*xs, *ys, 1e-9]) * 1.08
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, linestyle="--", label="y = x")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.legend(fontsize=8)
    return fig, ax


def draw(chart: Chart, path: Path) -> None:
    """Draw ``chart`` to the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = {"bars": _bars, "lines": _lines, "scatter": _scatter}[chart.kind](chart, plt)
    if not ax.get_title():  # horizontal bars label their own axes
        ax.set_title(chart.title, fontsize=10)
        ax.set_ylabel(chart.y_label)
        if chart.x_label:
            ax.set_xlabel(chart.x_label)
        ax.grid(axis="y", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
