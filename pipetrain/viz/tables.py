"""Text tables of timelines, rendered with rich and returned as plain strings (no printing).

    print(timeline_table(predicted, stage_of_rank))
    print(compare_table(predicted, measured, stage_of_rank))
    print(memory_table(stage_memory(plan, cost), device_memory(plan, cost)))

Times are shown in one unit per table (s, ms or µs, whichever suits the iteration time), named in
the column headers; bytes in the binary unit that suits each value (B, KiB, MiB, GiB). Errors are
signed: positive when the prediction is higher than the measurement.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from pipetrain.plan.memory import StageMemory
from pipetrain.simulate.timeline import Timeline

__all__ = ["byte_text", "compare_table", "memory_table", "relative_error", "time_unit", "timeline_table"]

_MIB = 2**20


def relative_error(pred: float, meas: float) -> float:
    """Signed relative error ``(pred - meas) / meas`` of a prediction against a measurement.

    Returns:
        A fraction (``0.1`` is 10 % too high). When ``meas`` is 0: ``0.0`` if ``pred`` is 0 too,
        else ``±inf`` with the sign of ``pred``.
    """
    if meas == 0:
        return 0.0 if pred == 0 else math.copysign(math.inf, pred)
    return (pred - meas) / abs(meas)


def timeline_table(
    timeline: Timeline, stage_of_rank: Sequence[int] | None = None, *, width: int = 100,
    recompute: Sequence[bool] = (),
) -> str:
    """Per stage: busy time, bubble % and peak activation MiB (and, when some stage recomputes, which
    do); iteration time beneath.

    Args:
        timeline: the timeline to summarise.
        stage_of_rank: ``stage_of_rank[r]`` is rank ``r``'s stage (a replicated stage averages
            its ranks' busy time); by default rank ``r`` runs stage ``r``.
        width: render width in characters.
        recompute: per stage, whether it recomputes (:meth:`~pipetrain.plan.plan.Plan.recomputes`).
    """
    unit, scale = time_unit(timeline.iteration_s)
    table = Table(
        title=_title(timeline),
        caption=f"iteration {_num(timeline.iteration_s * scale)} {unit} · "
        f"mean bubble {timeline.bubble_fraction():.1%}",
        box=box.ROUNDED,
    )
    table.add_column("stage", justify="right")
    table.add_column("ranks", justify="right")
    table.add_column(f"busy ({unit})", justify="right")
    table.add_column("bubble %", justify="right")
    table.add_column("peak act. MiB", justify="right")
    marked = any(recompute)
    if marked:
        table.add_column("recompute", justify="right")
    ranks = _ranks_of_stage(timeline.n_ranks, stage_of_rank)
    for row in timeline.summary(stage_of_rank):
        table.add_row(
            str(row.stage),
            ",".join(map(str, ranks.get(row.stage, []))),
            _num(row.busy_s * scale),
            f"{row.bubble_fraction * 100:.1f}",
            f"{row.peak_activation_bytes / _MIB:.1f}",
            *(("yes" if row.stage < len(recompute) and recompute[row.stage] else "no",) if marked else ()),
        )
    return _render(table, width)


def compare_table(
    predicted: Timeline,
    measured: Timeline,
    stage_of_rank: Sequence[int] | None = None,
    *,
    width: int = 100,
) -> str:
    """Predicted against measured, per stage (busy time, bubble) and for the iteration time.

    Args:
        predicted: the simulator's timeline.
        measured: the runtime's timeline of the same schedule.
        stage_of_rank: ``stage_of_rank[r]`` is rank ``r``'s stage; by default rank ``r`` runs
            stage ``r``.
        width: render width in characters.

    Raises:
        ValueError: the timelines have different numbers of ranks.
    """
    if predicted.n_ranks != measured.n_ranks:
        raise ValueError(
            f"cannot compare a {predicted.n_ranks}-rank prediction with a {measured.n_ranks}-rank "
            "measurement; compare timelines of the same plan"
        )
    unit, scale = time_unit(max(predicted.iteration_s, measured.iteration_s))
    table = _comparison(f"predicted vs measured{_suffix(measured.label)}", unit)
    rows = zip(predicted.summary(stage_of_rank), measured.summary(stage_of_rank), strict=True)
    for pred, meas in rows:
        table.add_row(*_comparison_cells(
            str(pred.stage), (pred.busy_s, meas.busy_s), (pred.bubble_fraction, meas.bubble_fraction), scale))
    table.add_section()
    table.add_row(*_comparison_cells(
        "iteration", (predicted.iteration_s, measured.iteration_s),
        (predicted.bubble_fraction(), measured.bubble_fraction()), scale))
    return _render(table, width)


def _comparison(title: str, unit: str) -> Table:
    """An empty predicted-against-measured table: its columns, times in ``unit``."""
    table = Table(title=title, box=box.ROUNDED)
    table.add_column("stage", justify="right")
    for header in (f"busy pred ({unit})", f"busy meas ({unit})", "error %"):
        table.add_column(header, justify="right")
    table.add_column("bubble pred %", justify="right")
    table.add_column("bubble meas %", justify="right")
    return table


def _comparison_cells(
    label: str, seconds: tuple[float, float], bubbles: tuple[float, float], scale: float
) -> tuple[str, ...]:
    """One row of :func:`_comparison`: ``label``, the predicted and measured ``seconds`` times
    ``scale``, the prediction's signed error, and the two ``bubbles`` (fractions) as percentages."""
    (pred_s, meas_s), (pred_bubble, meas_bubble) = seconds, bubbles
    return (
        label,
        _num(pred_s * scale),
        _num(meas_s * scale),
        _percent(relative_error(pred_s, meas_s)),
        f"{pred_bubble * 100:.1f}",
        f"{meas_bubble * 100:.1f}",
    )


def memory_table(
    memories: Sequence[StageMemory],
    device_bytes: Sequence[int],
    *,
    optimizer: str = "sgd",
    width: int = 100,
    recompute: Sequence[bool] = (),
) -> str:
    """Per stage: predicted weights, gradients, optimizer state, activations and their total, the
    device's memory and whether the total fits in it; with a stage that recomputes, which do.

    Args:
        memories: per stage, from :func:`~pipetrain.simulate.memory.stage_memory`.
        device_bytes: per stage, the memory of its smallest device
            (:func:`~pipetrain.planners.microbatch.caps.device_memory`).
        optimizer: the optimizer the state was predicted for (shown in the title).
        width: render width in characters.
        recompute: per stage, whether it recomputes (:meth:`~pipetrain.plan.plan.Plan.recomputes`): its
            activations are its stashed inputs and one re-run; a column when some stage does.

    Raises:
        ValueError: ``memories`` and ``device_bytes`` have different lengths.
    """
    if len(memories) != len(device_bytes):
        raise ValueError(f"{len(memories)} stage memories but {len(device_bytes)} device sizes; give one per stage")
    marked = any(recompute)
    table = Table(title=f"predicted memory per stage ({optimizer})", box=box.ROUNDED)
    for header in ("stage", "weights", "gradients", "optimizer", "activations", "total", "device", "fits",
                   *(("recompute",) if marked else ())):
        table.add_column(header, justify="right")
    for k, (m, device) in enumerate(zip(memories, device_bytes, strict=True)):
        cells = (m.weight_bytes, m.gradient_bytes, m.optimizer_state_bytes, m.activation_bytes, m.total_bytes, device)
        mark = ("yes" if recompute[k] else "no",) if marked else ()
        table.add_row(str(k), *map(byte_text, cells), "yes" if m.total_bytes <= device else "no", *mark)
    return _render(table, width)


def byte_text(n_bytes: int) -> str:
    """``n_bytes`` in the binary unit that suits it: ``"512 B"``, ``"1.5 KiB"``, ``"16.0 GiB"``."""
    for unit, size in (("GiB", 2**30), ("MiB", _MIB), ("KiB", 2**10)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes} B"


def _render(table: Table, width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    lines = console.export_text(styles=False).splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"


def time_unit(span_s: float) -> tuple[str, float]:
    """The unit (``"s"``, ``"ms"`` or ``"µs"``) to show a span of ``span_s`` seconds in, and the
    factor from seconds to it."""
    if span_s >= 1.0:
        return "s", 1.0
    if span_s >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _num(value: float) -> str:
    """Four significant digits, without exponent for the magnitudes a table shows."""
    return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def _percent(fraction: float) -> str:
    """Signed percent with one decimal; ``+0.0`` rather than ``-0.0`` for rounding noise."""
    if not math.isfinite(fraction):
        return "n/a"
    percent = fraction * 100
    return f"{0.0 if abs(percent) < 0.05 else percent:+.1f}"


def _title(timeline: Timeline) -> str:
    return timeline.kind + _suffix(timeline.label)


def _suffix(label: str) -> str:
    return f": {label}" if label else ""


def _ranks_of_stage(n_ranks: int, stage_of_rank: Sequence[int] | None) -> dict[int, list[int]]:
    mapping = list(stage_of_rank) if stage_of_rank is not None else list(range(n_ranks))
    ranks: dict[int, list[int]] = {}
    for rank, stage in enumerate(mapping):
        ranks.setdefault(stage, []).append(rank)
    return ranks
