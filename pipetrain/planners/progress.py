"""Progress bars for long searches (rich, on stderr): GA generations and the explorer's phases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pipetrain.planners.microbatch.ga import OnGeneration

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn, TaskID

__all__ = ["PhaseTicker", "generation_bar", "phase_ticker"]


@contextmanager
def _bar(*columns: ProgressColumn) -> Iterator[Progress]:
    from rich.console import Console
    from rich.progress import Progress

    with Progress(*columns, console=Console(stderr=True)) as bar:
        yield bar


@contextmanager
def generation_bar(planner: str, generations: int, enabled: bool) -> Iterator[OnGeneration | None]:
    """A bar over GA generations with the best iteration time so far; yields None when disabled."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("generations  best {task.fields[best]} ms"), TimeElapsedColumn())
    with _bar(*columns) as bar:
        task = bar.add_task(planner, total=generations, best="-")

        def on_generation(generation: int, best_s: float) -> None:
            bar.update(task, completed=generation, best=f"{best_s * 1e3:.4g}")

        yield on_generation


class PhaseTicker:
    """Progress over a search's phases: one bar per phase, or nothing when ``bar`` is None."""

    def __init__(self, bar: Progress | None) -> None:
        self.bar = bar
        self.task: TaskID | None = None
        self.total = 0

    def phase(self, name: str, total: int) -> None:
        """Close the current phase's bar and open one of ``total`` steps."""
        if self.bar is not None:
            self.finish()
            self.task, self.total = self.bar.add_task(name, total=total), total

    def finish(self) -> None:
        """Show the current phase complete (a phase may stop early)."""
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=self.total)

    def advance(self) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task)


@contextmanager
def phase_ticker(title: str, enabled: bool) -> Iterator[PhaseTicker]:
    """A :class:`PhaseTicker` whose bars read ``{title}: {phase}``."""
    if not enabled:
        yield PhaseTicker(None)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    with _bar(TextColumn(f"{title}: {{task.description}}"), BarColumn(), MofNCompleteColumn(),
              TimeElapsedColumn()) as bar:
        ticker = PhaseTicker(bar)
        yield ticker
        ticker.finish()
