"""The launching process's progress bar: one row per job with step, loss, eval, samples/s and ETA,
in 80 columns::

    1f1b: 2 stages on 2 ranks, 4 micro-batches of batch 32, 300 steps
    ━╸━━ 120/300 loss 2.1834 eval 2.1518 44.8% 11,563 samples/s ETA 0:01:02

samples/s is ``B / median step time`` over the timed steps seen so far (the warm-up steps left out),
each step's time the slowest rank's: the definition of
:attr:`~pipetrain.runtime.job.config.TrainResult.samples_per_s`, which the summary prints. The last
stage reports its rows; it learns the slowest rank's time of a step at the next step's barrier
(:attr:`~pipetrain.runtime.job.config.StepMetrics.previous_slowest_s`), so the bar's speed lags one step.
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
    ProgressColumn,
    TaskID,
    TextColumn,
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
        if row.previous_slowest_s is not None and row.step - 1 >= config.warmup_steps:
            self.step_s[job].append(row.previous_slowest_s)
        timed = self.step_s[job]
        rate = f"{batch / statistics.median(timed):,.0f}" if timed and statistics.median(timed) > 0 else "-"
        if row.eval_loss is not None:
            accuracy = f" {row.eval_accuracy:.1%}" if row.eval_accuracy is not None else ""
            self.evals[job] = f" eval {row.eval_loss:.4f}{accuracy}"
        self.progress.update(self.tasks[job], completed=row.step + 1, loss=f"{row.loss:.4f}", rate=rate,
                             eval=self.evals[job])


def _describe(job: TrainJob) -> str:
    plan = job.plan
    micro = len(plan.stages[0].forward_sizes)
    return (f"{plan.method.value}: {plan.n_stages} stages on {plan.n_ranks} ranks, {micro} micro-batch"
            f"{'' if micro == 1 else 'es'} of batch {plan.batch_size}, {job.config.steps} steps")


def _columns() -> tuple[ProgressColumn, ...]:
    """The bar's columns: within 80 terminal columns with an evaluation shown, up to 99,999 steps
    (module docstring); each job's description is printed once above its row."""
    return (
        TextColumn("{task.description}"),
        BarColumn(bar_width=4),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}{task.fields[eval]} {task.fields[rate]} samples/s ETA"),
        TimeRemainingColumn(),
    )


@contextmanager
def open_display(jobs: Sequence[TrainJob], *, enabled: bool) -> Iterator[ProgressDisplay]:
    """A rich progress bar over the jobs' steps when ``enabled``, else a display that shows nothing.
    Several jobs get a row each, tagged ``#1``, ``#2``, ... as the lines above them describe them."""
    if not enabled:
        yield _Silent()
        return
    console = Console(stderr=True)
    tags = [f"#{i + 1}" if len(jobs) > 1 else "" for i in range(len(jobs))]
    for tag, job in zip(tags, jobs, strict=True):
        console.print(f"{tag} {_describe(job)}".strip(), highlight=False)
    with Progress(*_columns(), console=console) as progress:
        tasks = [
            progress.add_task(tag, total=job.config.steps, loss="-", rate="-", eval="")
            for tag, job in zip(tags, jobs, strict=True)
        ]
        yield _RichDisplay(progress, tasks, jobs)
