"""The training progress bar (issue 32): the summary's speed (batch / median step of the slowest rank,
warm-up left out) and 80 columns with every number whole."""

from __future__ import annotations

import io
import statistics

import pytest
from rich.console import Console
from rich.progress import Progress

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime import TrainConfig
from pipetrain.runtime.job.config import StepMetrics, TrainJob
from pipetrain.runtime.process.progress import _columns, _RichDisplay


def _job(batch: int = 32) -> TrainJob:
    graph = build_model("mlp-digits")
    names = [layer.name for layer in graph.layers]
    half = len(names) // 2
    plan = Plan(model="mlp-digits", model_fingerprint=graph.fingerprint(), batch_size=batch, method=Method.ONE_F_ONE_B,
                stages=(StagePlan(tuple(names[:half]), (0,), (16, 16), (16, 16)),
                        StagePlan(tuple(names[half:]), (1,), (16, 16), (16, 16))))
    return TrainJob(graph, plan, TrainConfig(steps=300, warmup_steps=2, progress=True))


def _render(progress: Progress) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False, color_system=None)
    console.print(progress.make_tasks_table(progress.tasks))
    return out.getvalue().rstrip("\n").splitlines()


@pytest.mark.parametrize(("tag", "steps"), [("", 300), ("#2", 99_999)])
def test_the_speed_is_the_summarys_and_the_row_fits_80_columns(tag: str, steps: int) -> None:
    job = _job()
    progress = Progress(*_columns(), console=Console(file=io.StringIO(), width=80))
    task = progress.add_task(tag, total=steps, loss="-", rate="-", eval="")
    display = _RichDisplay(progress, [task], [job])
    slowest = [0.5, 0.4, 0.010, 0.012, 0.011, 0.0025]  # steps 0..5; 0 and 1 are warm-up
    for step in range(len(slowest) + 1):
        row = StepMetrics(step=step, samples_seen=(step + 1) * 32, wall_s=float(step), lr=1e-3, loss=2.18341234,
                          step_s=0.001, previous_slowest_s=slowest[step - 1] if step else None,
                          eval_loss=2.15181 if step == len(slowest) else None,
                          eval_accuracy=0.4483 if step == len(slowest) else None)
        display.update(0, row)
    expected = 32 / statistics.median(slowest[2:])  # what TrainResult.samples_per_s computes
    assert progress.tasks[0].fields["rate"] == f"{expected:,.0f}"
    progress.update(task, completed=steps - 1, rate="123,456")  # the widest numbers a row shows
    lines = _render(progress)
    assert len(lines) == 1 and len(lines[0]) <= 80, lines
    for number in (f"{steps - 1}/{steps}", "loss 2.1834", "eval 2.1518 44.8%", "123,456 samples/s", "ETA"):
        assert number in lines[0], lines[0]
    assert "…" not in lines[0]
