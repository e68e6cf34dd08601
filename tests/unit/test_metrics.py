"""metrics.csv: header, empty evaluation cells, flushing, resume truncation; the loss plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipetrain.errors import UserError
from pipetrain.runtime.job.config import StepMetrics
from pipetrain.runtime.job.metrics import MetricsLog, MetricsRow, read_metrics
from pipetrain.viz.curves import loss_figure, save_loss_plot, smoothed

HEADER = "step,samples_seen,wall_s,lr,loss,eval_loss,eval_accuracy"


def _rows(n: int, batch: int = 8, eval_every: int = 3, accuracy: bool = True) -> list[MetricsRow]:
    rows = []
    for step in range(n):
        evaluated = (step + 1) % eval_every == 0
        rows.append(MetricsRow(step, (step + 1) * batch, 0.1 * (step + 1), 0.01, 2.0 / (step + 1) + 0.05 * (step % 2),
                               1.5 / (step + 1) if evaluated else None,
                               min(1.0, 0.1 * step) if evaluated and accuracy else None))
    return rows


def test_header_and_empty_cells_and_rows_flushed_as_written(tmp_path: Path) -> None:
    log = MetricsLog.open(tmp_path / "run")
    log.append(MetricsRow(0, 8, 0.5, 0.1, 2.25))
    log.append(StepMetrics(1, 16, 1.0, 0.1, 1.5, eval_loss=1.75, eval_accuracy=None, step_s=0.2))
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()  # before close: flushed
    assert lines == [HEADER, "0,8,0.5,0.1,2.25,,", "1,16,1.0,0.1,1.5,1.75,"]
    log.close()


def test_values_read_back_exactly(tmp_path: Path) -> None:
    rows = _rows(7)
    with MetricsLog.open(tmp_path) as log:
        for row in rows:
            log.append(row)
    assert read_metrics(tmp_path / "metrics.csv") == rows


def test_resume_keeps_the_steps_before_it_and_appends(tmp_path: Path) -> None:
    rows = _rows(9)
    with MetricsLog.open(tmp_path) as log:
        for row in rows:
            log.append(row)
    with MetricsLog.open(tmp_path, resume_step=5) as log:
        assert read_metrics(log.path) == rows[:5]
        log.append(MetricsRow(5, 48, 9.0, 0.01, 0.5))
    assert read_metrics(tmp_path / "metrics.csv") == [*rows[:5], MetricsRow(5, 48, 9.0, 0.01, 0.5)]


def test_a_new_run_replaces_the_file_and_a_resume_without_one_starts_it(tmp_path: Path) -> None:
    with MetricsLog.open(tmp_path) as log:
        log.append(MetricsRow(0, 8, 0.5, 0.1, 2.0))
    MetricsLog.open(tmp_path).close()
    assert (tmp_path / "metrics.csv").read_text() == HEADER + "\n"
    MetricsLog.open(tmp_path / "other", resume_step=3).close()
    assert read_metrics(tmp_path / "other" / "metrics.csv") == []


def test_not_a_metrics_file_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match=r"is not a pipetrain metrics\.csv"):
        MetricsLog.open(tmp_path, resume_step=1)
    path.write_text(HEADER + "\n0,8,x,0.1,2.0,,\n")
    with pytest.raises(UserError, match="line 2 is not a metrics row"):
        read_metrics(path)
    with pytest.raises(UserError, match="cannot read"):
        read_metrics(tmp_path / "missing.csv")


def test_smoothing_starts_at_the_first_value_and_follows_a_constant() -> None:
    assert smoothed([4.0, 4.0, 4.0], 10) == pytest.approx([4.0, 4.0, 4.0])
    assert smoothed([1.0, 3.0], 1) == [1.0, 3.0]


@pytest.mark.parametrize("accuracy", [True, False])
def test_loss_plot_is_a_png_with_an_accuracy_panel_when_evaluated(tmp_path: Path, accuracy: bool) -> None:
    rows = _rows(60, accuracy=accuracy)
    figure = loss_figure(rows, "mlp-digits")
    panels = figure.axes
    assert [a.get_ylabel() for a in panels] == (["loss", "eval accuracy"] if accuracy else ["loss"])
    assert panels[-1].get_xlabel() == "training samples seen"
    assert [a.get_xlabel() for a in panels[0].child_axes] == ["optimizer steps"]
    assert [line.get_label() for line in panels[0].lines] == [
        "train loss (per step)", "train loss (smoothed over ~3 steps)", "eval loss"]
    path = tmp_path / "loss.png"
    save_loss_plot(rows, path, "mlp-digits")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_to_plot() -> None:
    with pytest.raises(ValueError, match="no metrics rows"):
        loss_figure([])
