"""The files a timeline is saved as: JSON, Chrome trace and Gantt PNG (shared by the CLI and demo)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipetrain.fileio import write_atomic
from pipetrain.simulate.timeline import Timeline
from pipetrain.viz.gantt import save_gantt
from pipetrain.viz.trace import write_chrome_trace

__all__ = ["save_comparison", "save_timeline"]


def save_timeline(folder: Path, name: str, timeline: Timeline, stage_of_rank: Sequence[int]) -> None:
    """Write ``name.json``, ``name_trace.json`` (open in https://ui.perfetto.dev) and ``name.png``."""
    write_atomic(folder / f"{name}.json", timeline.to_json())
    write_chrome_trace([timeline], folder / f"{name}_trace.json", stage_of_rank=stage_of_rank)
    save_gantt([timeline], folder / f"{name}.png", [name], stage_of_rank=stage_of_rank)


def save_comparison(path: Path, predicted: Timeline, measured: Timeline, stage_of_rank: Sequence[int]) -> None:
    """One Gantt picture: the predicted timeline above the measured one, same time axis."""
    save_gantt([predicted, measured], path, ["predicted (simulator)", "measured (runtime)"],
               stage_of_rank=stage_of_rank)
