"""The launching process's progress bar: one row per job with step, loss, eval, samples/s and ETA.

samples/s is ``B / median step time`` over the timed steps seen so far (the warm-up steps left
out), the same definition as :attr:`~pipetrain.runtime.job.config.TrainResult.samples_per_s`, measured
on the last stage (the result takes the slowest rank per step, so the two may differ slightly).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from pipetrain.runtime.job.config import StepMetrics, TrainJob

__all__ = ["ProgressDisplay", "open_display"]


class ProgressDisplay(Protocol):
    def update(self, job: int, row: StepMetrics) -> None: ...


class _Silent:
    def update(self, job: int, row: StepMetrics) -> None:
        pass


class _RichDisplay:
    def __init__(self, progress: Progress, tasks: list[TaskID], jobs: Sequence[TrainJob]) -> None:
        self.progress = progress
        self.tasks = tasks
        self.jobs = jobs
        self.step_s: list[list[float]] = [[] for _ in jobs]
        self.evals = ["" for _ in jobs]

    def update(self, job: int, row: StepMetrics) -> None:
        config, batch = self.jobs[job].config, self.jobs[job].plan.batch_size
        if row.step >= config.warmup_steps:
            self.step_s[job].append(row.step_s)
        timed = self.step_s[job]
        rate = f"{batch / statistics.median(timed):,.0f}" if timed and statistics.median(timed) > 0 else "-"
        if row.eval_loss is not None:
            accuracy = f" acc {row.eval_accuracy:.1%}" if row.eval_accuracy is not None else ""
            self.evals[job] = f"  eval {row.eval_loss:.4f}{accuracy}"
        self.progress.update(self.tasks[job], completed=row.step + 1, loss=f"{row.loss:.4f}", rate=rate,
                             eval=self.evals[job])


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
        TextColumn("steps  loss {task.fields[loss]}{task.fields[eval]}  {task.fields[rate]} samples/s (last stage)"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        tasks = [
            progress.add_task(_describe(job), total=job.config.steps, loss="-", rate="-", eval="")
            for job in jobs
        ]
        yield _RichDisplay(progress, tasks, jobs)
