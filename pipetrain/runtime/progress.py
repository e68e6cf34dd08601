"""The launching process's progress bar: one row per job with step, loss and samples/s."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from pipetrain.runtime.config import TrainJob

__all__ = ["ProgressDisplay", "open_display"]


class ProgressDisplay(Protocol):
    def update(self, job: int, step: int, loss: float, samples_per_s: float) -> None: ...


class _Silent:
    def update(self, job: int, step: int, loss: float, samples_per_s: float) -> None:
        pass


class _RichDisplay:
    def __init__(self, progress: Progress, tasks: list[TaskID]) -> None:
        self.progress = progress
        self.tasks = tasks

    def update(self, job: int, step: int, loss: float, samples_per_s: float) -> None:
        self.progress.update(
            self.tasks[job], completed=step + 1, loss=f"{loss:.4f}", rate=f"{samples_per_s:,.0f}"
        )


def _describe(job: TrainJob) -> str:
    plan = job.plan
    return f"{plan.method.value} {plan.n_stages}×{len(plan.stages[0].forward_sizes)}"


@contextmanager
def open_display(jobs: Sequence[TrainJob], *, enabled: bool) -> Iterator[ProgressDisplay]:
    """A rich progress bar over the jobs' steps when ``enabled``, else a display that shows nothing."""
    if not enabled:
        yield _Silent()
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps  loss {task.fields[loss]}  {task.fields[rate]} samples/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        tasks = [
            progress.add_task(_describe(job), total=job.config.steps, loss="-", rate="-")
            for job in jobs
        ]
        yield _RichDisplay(progress, tasks)
