"""Gantt charts of timelines: one panel per timeline, one row per rank, a shared time axis.

The main use is the prediction above the measurement of the same schedule::

    save_gantt([predicted, measured], "out/gantt.png", titles=["simulated", "measured on cpu"])

Each rank row holds a compute lane (F, B, W, STEP; micro-batch numbers inside bars wide enough to
hold them) and beneath it two thin lanes: sends (the transfer on the link when simulated, the
posting call when measured) and receives (the time the rank waited). Drawing uses matplotlib's
object API with the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from pipetrain.fileio import write_atomic
from pipetrain.schedule.action import ActionKind
from pipetrain.simulate.timeline import Event, Timeline
from pipetrain.viz.tables import time_unit
from pipetrain.viz.trace import rank_name

__all__ = ["gantt_figure", "save_gantt"]

# (colour, legend label) per kind: F blue, B green, W orange, STEP grey; messages in lighter tones
# of their payload's colour, receives lightest.
_STYLE: dict[ActionKind, tuple[str, str]] = {
    ActionKind.F: ("#3b6fb6", "forward"),
    ActionKind.B: ("#3f9a4b", "backward"),
    ActionKind.W: ("#ee8a2a", "weight grad"),
    ActionKind.STEP: ("#8c8c8c", "optimizer step"),
    ActionKind.SEND_F: ("#7fa9dd", "send activations"),
    ActionKind.RECV_F: ("#c3d7f0", "recv activations (wait)"),
    ActionKind.SEND_B: ("#86c98e", "send gradients"),
    ActionKind.RECV_B: ("#c9e8cc", "recv gradients (wait)"),
}
# Receive (wait) bars are pale; outline them in their payload's send colour so they stay visible.
_EDGE = {
    ActionKind.RECV_F: _STYLE[ActionKind.SEND_F][0],
    ActionKind.RECV_B: _STYLE[ActionKind.SEND_B][0],
}
_DARK_KINDS = frozenset({ActionKind.F, ActionKind.B})
# Vertical extent (offset from the row centre, height) of each lane, in row units; y grows downward.
_COMPUTE_LANE = (-0.42, 0.54)
_SEND_LANE = (0.15, 0.12)
_RECV_LANE = (0.29, 0.12)
_ROW_IN = 0.5  # figure inches per rank row
_PANEL_EXTRA_IN = 0.85  # title, ticks and padding per panel
_CHAR_PX = 6.0  # rough width of one label character at the label font size, in pixels


def gantt_figure(
    timelines: Sequence[Timeline],
    titles: Sequence[str] | None = None,
    *,
    stage_of_rank: Sequence[int] | None = None,
    width_in: float = 12.0,
    dpi: float = 100.0,
) -> Figure:
    """Draw each timeline as a panel, stacked vertically over one shared time axis.

    Args:
        timelines: the timelines, top to bottom (e.g. predicted, then measured).
        titles: one title per timeline; by default its kind and label.
        stage_of_rank: rank -> stage, for the row labels; by default read from the actions.
        width_in: figure width in inches.
        dpi: resolution the figure is meant for (it decides which bars get labels).

    Returns:
        A figure of ``width_in`` by ``0.6 + sum(0.85 + 0.5 * n_ranks)`` inches, on an Agg canvas.

    Raises:
        ValueError: no timelines, or ``titles`` of another length.
    """
    names = _panel_titles(timelines, titles)
    heights = [_PANEL_EXTRA_IN + _ROW_IN * max(1, t.n_ranks) for t in timelines]
    fig = Figure(figsize=(width_in, 0.6 + sum(heights)), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    end_s = max((e.end_s for t in timelines for e in t.events), default=1.0)
    start_s = min(0.0, min((e.start_s for t in timelines for e in t.events), default=0.0))
    unit, scale = time_unit(end_s - start_s)
    px_per_unit = 0.9 * width_in * dpi / max((end_s - start_s) * scale, 1e-12)
    for ax, timeline, name in zip(axes, timelines, names, strict=True):
        _draw_panel(ax, timeline, scale, px_per_unit, stage_of_rank)
        ax.set_title(name, loc="left", fontsize=11, fontweight="bold")
        ax.set_title(
            f"iteration {timeline.iteration_s * scale:.4g} {unit} · "
            f"bubble {timeline.bubble_fraction():.1%}",
            loc="right", fontsize=10,
        )
    axes[-1].set_xlim(start_s * scale, end_s * scale)
    axes[-1].set_xlabel(f"time ({unit})")
    _add_legend(fig, timelines)
    return fig


def save_gantt(
    timelines: Sequence[Timeline],
    path: str | Path,
    titles: Sequence[str] | None = None,
    *,
    stage_of_rank: Sequence[int] | None = None,
    dpi: float = 100.0,
) -> None:
    """Render :func:`gantt_figure` to a PNG at ``path`` (atomically), ``dpi`` pixels per inch."""
    fig = gantt_figure(timelines, titles, stage_of_rank=stage_of_rank, dpi=dpi)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    write_atomic(path, buffer.getvalue())


def _panel_titles(timelines: Sequence[Timeline], titles: Sequence[str] | None) -> list[str]:
    """One title per timeline: ``titles``, or by default each timeline's kind and label.

    Raises:
        ValueError: no timelines, or ``titles`` of another length.
    """
    if not timelines:
        raise ValueError("gantt_figure needs at least one timeline")
    if titles is not None and len(titles) != len(timelines):
        raise ValueError(f"got {len(titles)} titles for {len(timelines)} timelines; give one each")
    return list(titles) if titles is not None else [_default_title(t) for t in timelines]


def _default_title(timeline: Timeline) -> str:
    return timeline.kind + (f": {timeline.label}" if timeline.label else "")


def _add_legend(fig: Figure, timelines: Sequence[Timeline]) -> None:
    """One legend above the panels, with an entry for each kind of event the timelines hold."""
    present = {e.action.kind for t in timelines for e in t.events}
    handles = [
        Patch(facecolor=color, edgecolor=_EDGE.get(kind, color), label=label)
        for kind, (color, label) in _STYLE.items() if kind in present
    ]
    fig.legend(handles=handles, loc="outside upper center", ncols=max(1, len(handles)),
               frameon=False, fontsize=8.5, handlelength=1.6, columnspacing=1.4)


def _lane(kind: ActionKind) -> tuple[float, float]:
    if kind in (ActionKind.SEND_F, ActionKind.SEND_B):
        return _SEND_LANE
    if kind in (ActionKind.RECV_F, ActionKind.RECV_B):
        return _RECV_LANE
    return _COMPUTE_LANE


def _draw_panel(
    ax: Axes,
    timeline: Timeline,
    scale: float,
    px_per_unit: float,
    stage_of_rank: Sequence[int] | None,
) -> None:
    """Bars for every event (one ``broken_barh`` per rank and kind) and labels that fit."""
    groups: dict[tuple[int, ActionKind], list[Event]] = defaultdict(list)
    for event in timeline.events:
        groups[event.rank, event.action.kind].append(event)
    for rank in range(timeline.n_ranks):
        ax.axhspan(rank - 0.46, rank + 0.46, color="#f3f3f3", zorder=0, linewidth=0)
    for (rank, kind), events in groups.items():
        offset, height = _lane(kind)
        spans = [(e.start_s * scale, e.duration_s * scale) for e in events]
        ax.broken_barh(spans, (rank + offset, height), facecolors=_STYLE[kind][0],
                       edgecolor=_EDGE.get(kind, "white"), linewidth=0.6, zorder=2)
    for event in timeline.events:
        _label(ax, event, scale, px_per_unit)
    ax.set_yticks(range(timeline.n_ranks))
    ax.set_yticklabels([rank_name(timeline, r, stage_of_rank) for r in range(timeline.n_ranks)])
    ax.set_ylim(timeline.n_ranks - 0.5, -0.5)  # rank 0 on top
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#d0d0d0", linewidth=0.6, zorder=1)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _label(ax: Axes, event: Event, scale: float, px_per_unit: float) -> None:
    """Write the micro-batch number (``S`` for STEP) inside a compute bar wide enough for it."""
    kind = event.action.kind
    offset, height = _lane(kind)
    if offset != _COMPUTE_LANE[0]:
        return
    text = "S" if kind is ActionKind.STEP else str(event.action.microbatch)
    if event.duration_s * scale * px_per_unit < _CHAR_PX * len(text) + 4:
        return
    ax.text(
        (event.start_s + event.end_s) / 2 * scale, event.rank + offset + height / 2, text,
        ha="center", va="center", fontsize=8, zorder=3,
        color="white" if kind in _DARK_KINDS else "#202020",
    )
