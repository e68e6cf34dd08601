"""Training curves from ``metrics.csv`` rows: the loss per step and the evaluations.

    save_loss_plot(read_metrics("run/metrics.csv"), "run/loss.png")

The loss panel shows the mini-batch loss of every step as a light line, a smoothed copy of it
(an exponential moving average over about 1/20 of the steps, bias-corrected so it starts at the first
loss; fewer than 40 steps are drawn unsmoothed) as a solid line, and the eval loss as markers. When
the evaluations have an accuracy, a second panel below shows it. The x axis counts training samples
seen; the top axis counts optimizer steps when every step had the same batch size. Drawing uses
matplotlib's object API with the Agg canvas (no pyplot state).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from pipetrain.fileio import write_atomic
from pipetrain.runtime.job.metrics import MetricsRow

__all__ = ["loss_figure", "save_loss_plot", "smoothed"]

_TRAIN_COLOUR = "#3b6fb6"
_EVAL_COLOUR = "#d9622b"
_LOG_SCALE_RATIO = 30.0  # a positive loss spanning more than this factor is drawn on a log axis


def smoothed(values: Sequence[float], window: float) -> list[float]:
    """Bias-corrected exponential moving average of ``values`` over about ``window`` points.

    ``s_t = β s_{t-1} + (1 - β) x_t`` with ``s_{-1} = 0`` and ``β = 1 - 2 / (window + 1)``; the
    result is ``s_t / (1 - β^{t+1})``, so it starts at ``x_0`` rather than near 0.
    """
    beta = 1.0 - 2.0 / (max(window, 1.0) + 1.0)
    state, out = 0.0, []
    for t, x in enumerate(values):
        state = beta * state + (1.0 - beta) * x
        out.append(state / (1.0 - beta ** (t + 1)) if beta > 0 else x)
    return out


def loss_figure(rows: Sequence[MetricsRow], title: str = "training", *, width_in: float = 9.0,
                dpi: float = 100.0) -> Figure:
    """The loss curve (and eval accuracy, when evaluated) of ``rows``, on an Agg canvas.

    Args:
        rows: one per optimizer step, in step order (``metrics.csv``'s, or a result's StepMetrics).
        title: the figure's title; the step and sample counts are added to it.
        width_in: figure width in inches; the height is 4 in, plus 2.2 in for an accuracy panel.

    Raises:
        ValueError: no rows.
    """
    if not rows:
        raise ValueError("no metrics rows to plot: train for at least one step")
    eval_losses = [(r.samples_seen, r.eval_loss) for r in rows if r.eval_loss is not None]
    accuracies = [(r.samples_seen, r.eval_accuracy) for r in rows if r.eval_accuracy is not None]
    heights = [4.0, 2.2] if accuracies else [4.0]
    fig = Figure(figsize=(width_in, sum(heights)), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(heights), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    _draw_losses(axes[0], rows, eval_losses)
    if accuracies:
        _draw_accuracy(axes[1], accuracies)
    axes[-1].set_xlabel("training samples seen")
    _add_step_axis(axes[0], rows)
    last = rows[-1]
    fig.suptitle(f"{title}: {last.step + 1} steps, {last.samples_seen:,} samples")
    return fig


def save_loss_plot(rows: Sequence[MetricsRow], path: str | Path, title: str = "training", *,
                   dpi: float = 100.0) -> None:
    """Render :func:`loss_figure` to a PNG at ``path`` (atomically)."""
    buffer = io.BytesIO()
    loss_figure(rows, title, dpi=dpi).savefig(buffer, format="png", dpi=dpi)
    write_atomic(path, buffer.getvalue())


def _draw_losses(ax: Axes, rows: Sequence[MetricsRow], eval_losses: Sequence[tuple[int, float]]) -> None:
    """Train loss (raw, light; smoothed, solid) and eval loss (markers, ``(samples seen, loss)``)."""
    x = [r.samples_seen for r in rows]
    losses = [r.loss for r in rows]
    window = min(50.0, len(rows) / 20)
    if window < 2:  # too few steps to smooth: the raw curve, solid
        ax.plot(x, losses, ".-", color=_TRAIN_COLOUR, linewidth=1.5, label="train loss (per step)")
    else:
        ax.plot(x, losses, color=_TRAIN_COLOUR, alpha=0.3, linewidth=1.0, label="train loss (per step)")
        ax.plot(x, smoothed(losses, window), color=_TRAIN_COLOUR, linewidth=2.0,
                label=f"train loss (smoothed over ~{window:.0f} steps)")
    if eval_losses:
        ax.plot(*zip(*eval_losses, strict=True), "o-", color=_EVAL_COLOUR, markersize=5, linewidth=1.0,
                label="eval loss")
    shown = losses + [loss for _, loss in eval_losses]
    if min(shown) > 0 and max(shown) / min(shown) > _LOG_SCALE_RATIO:
        ax.set_yscale("log")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")


def _draw_accuracy(ax: Axes, accuracies: Sequence[tuple[int, float]]) -> None:
    """Eval accuracy (markers joined by a line, ``(samples seen, accuracy)``), in percent."""
    ax.plot(*zip(*accuracies, strict=True), "o-", color=_EVAL_COLOUR, markersize=5, linewidth=1.0,
            label="eval accuracy")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_ylabel("eval accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")


def _add_step_axis(ax: Axes, rows: Sequence[MetricsRow]) -> None:
    """A top axis counting optimizer steps (``samples_seen / batch``) when every step had one batch size."""
    batch = rows[0].samples_seen / (rows[0].step + 1)
    if batch <= 0 or any(r.samples_seen != round(batch * (r.step + 1)) for r in rows):
        return
    top = ax.secondary_xaxis("top", functions=(lambda s: np.divide(s, batch), lambda k: np.multiply(k, batch)))
    top.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_xlabel("optimizer steps")
