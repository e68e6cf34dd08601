"""``metrics.csv``: one row per optimizer step, appended while training runs.

    with MetricsLog.open(out) as log:                  # a new run: header only
        log.append(row)                                # each step (a StepMetrics or a MetricsRow)
    with MetricsLog.open(out, resume_step=120) as log: # a resumed run: keeps steps 0..119
        ...
    rows = read_metrics(out / "metrics.csv")

The file starts with the header ``step,samples_seen,wall_s,lr,loss,eval_loss,eval_accuracy``; the
evaluation cells are empty for steps that were not evaluated (and the accuracy for a regression
loss). Every row is written with one call and flushed, so a run killed mid-way keeps the rows of the
steps it finished. Floats are written with Python's shortest round-trip form, so reading gives back
exactly the values written.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, TextIO

from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic

__all__ = ["METRICS_FILE", "METRICS_HEADER", "MetricsLog", "MetricsRow", "read_metrics"]

METRICS_FILE: Final = "metrics.csv"
METRICS_HEADER: Final = ("step", "samples_seen", "wall_s", "lr", "loss", "eval_loss", "eval_accuracy")


@dataclass(frozen=True)
class MetricsRow:
    """One row of ``metrics.csv`` (:class:`~pipetrain.runtime.job.config.StepMetrics` adds what the CSV
    leaves out).

    Attributes:
        step: the optimizer step, from 0.
        samples_seen: training samples consumed up to and including this step.
        wall_s: seconds since training started.
        lr: the learning rate of this step.
        loss: the mini-batch loss (mean over samples).
        eval_loss / eval_accuracy: the evaluation after this step, or None (not evaluated; accuracy
            also None for a regression loss).
    """

    step: int
    samples_seen: int
    wall_s: float
    lr: float
    loss: float
    eval_loss: float | None = None
    eval_accuracy: float | None = None


def _format_row(row: MetricsRow) -> str:
    """One CSV line (with its newline) for ``row``; None becomes an empty cell."""
    cells = [row.step, row.samples_seen, row.wall_s, row.lr, row.loss, row.eval_loss, row.eval_accuracy]
    return ",".join("" if c is None else repr(float(c)) if isinstance(c, float) else str(c) for c in cells) + "\n"


class MetricsLog:
    """An open ``metrics.csv`` that rows are appended to, each flushed as it is written."""

    def __init__(self, path: Path, file: TextIO) -> None:
        self.path = path
        self._file = file

    @classmethod
    def open(cls, out: str | Path, resume_step: int | None = None) -> MetricsLog:
        """Open ``out/metrics.csv`` for appending (creating ``out`` if needed).

        Args:
            out: the run's output folder.
            resume_step: None for a new run (the file is replaced by the header alone); for a resumed
                run, the first step it will run: rows of earlier steps are kept, rows with
                ``step >= resume_step`` (written after the checkpoint) are dropped. A resumed run
                without a ``metrics.csv`` starts one.

        Raises:
            UserError: the existing file is not a metrics CSV (when resuming).
        """
        path = Path(out) / METRICS_FILE
        kept: list[MetricsRow] = []
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path) if r.step < resume_step]
        write_atomic(path, ",".join(METRICS_HEADER) + "\n" + "".join(_format_row(r) for r in kept))
        return cls(path, path.open("a", encoding="utf-8", newline=""))

    def append(self, row: MetricsRow) -> None:
        """Write ``row`` as one line and flush it to the OS."""
        self._file.write(_format_row(row))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[MetricsRow]:
    """The rows of a ``metrics.csv``, typed (empty cells as None).

    Raises:
        UserError: the file is missing, has another header, or a malformed line (named by number).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}; give the metrics.csv of a training run's --out") from None
    lines = csv.reader(io.StringIO(text))
    header = next(lines, None)
    if header is None or tuple(header) != METRICS_HEADER:
        raise UserError(f"{path} is not a pipetrain metrics.csv: its header is not {','.join(METRICS_HEADER)}; "
                        "move it away or choose another --out")
    return list(_parse(path, lines))


def _parse(path: str | Path, lines: Iterator[list[str]]) -> Iterator[MetricsRow]:
    for number, cells in enumerate(lines, start=2):
        try:
            step, samples, wall, lr, loss, eval_loss, accuracy = cells
            yield MetricsRow(int(step), int(samples), float(wall), float(lr), float(loss),
                             float(eval_loss) if eval_loss else None, float(accuracy) if accuracy else None)
        except ValueError:
            raise UserError(f"{path} line {number} is not a metrics row ({','.join(cells)}); "
                            f"expected {len(METRICS_HEADER)} cells: {','.join(METRICS_HEADER)}") from None
