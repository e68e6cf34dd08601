"""The harness's pictures: grouped bars (samples/s against torch's schedules, paper against
pipetrain), predicted-against-measured scatters and lines (a loss against samples), drawn from a
:class:`Chart`'s data."""

from __future__ import annotations

from pathlib import Path

from .experiment import Chart

__all__ = ["draw"]


def draw(chart: Chart, path: Path) -> None:
    """Draw ``chart`` to the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if chart.kind == "bars":
        width = max(6.0, 0.9 * len(chart.categories) * max(1, len(chart.series)) ** 0.5 + 2)
        fig, ax = plt.subplots(figsize=(min(width, 16.0), 4.2))
        n = max(1, len(chart.series))
        bar = 0.8 / n
        for i, (legend, values) in enumerate(chart.series):
            xs = [c + (i - (n - 1) / 2) * bar for c in range(len(chart.categories))]
            ax.bar([x for x, v in zip(xs, values, strict=True) if v is not None],
                   [v for v in values if v is not None], bar, label=legend)
        ax.set_xticks(range(len(chart.categories)), chart.categories, rotation=20 if len(chart.categories) > 4 else 0,
                      ha="right" if len(chart.categories) > 4 else "center")
        if n > 1:
            ax.legend(fontsize=8, ncols=min(n, 4))
    elif chart.kind == "lines":
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for label in dict.fromkeys(p[2] for p in chart.points):
            line = [(x, y) for x, y, name in chart.points if name == label]
            ax.plot([x for x, _ in line], [y for _, y in line], marker=".", label=label)
        ax.legend(fontsize=8)
    else:
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
    ax.set_title(chart.title, fontsize=10)
    ax.set_ylabel(chart.y_label)
    if chart.x_label:
        ax.set_xlabel(chart.x_label)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
